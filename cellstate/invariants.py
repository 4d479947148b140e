"""The store's safety invariants, checked over a snapshot (tests, `omega check`)."""

from __future__ import annotations

from cellstate.cell import CellReader, alloc_holds, alloc_placed, scheduler_usage, task_view
from cellstate.model import TaskState, UsageRecord, sum_resources


def violations(cell: CellReader) -> list[str]:
    """Every broken invariant, as a sentence; empty when the cell is sound."""
    out: list[str] = []
    placed_on: dict[str, str] = {}
    for m in cell.machines.values():
        held = sum_resources(a.resources for a in m.allocations.values()
                             if alloc_holds(a, cell.gangs))
        dim = held.exceeding(m.capacity)
        if dim is not None:
            out.append(f"machine {m.id} over-committed in {dim}: {held.get(dim):g} > "
                       f"{m.capacity.get(dim):g}")
        for a in m.allocations.values():
            if not alloc_placed(a, cell.gangs):
                continue
            if a.task in placed_on:
                out.append(f"task {a.task} placed on both {placed_on[a.task]} and {m.id}")
            placed_on[a.task] = m.id
            if a.job not in cell.jobs:
                out.append(f"machine {m.id} runs task {a.task} of unknown job {a.job}")
    for tid in {*cell.tasks.keys(), *placed_on}:
        view = task_view(cell, tid)
        where = placed_on.get(tid)
        if view.state is TaskState.RUNNING and where != view.machine:
            out.append(f"task {tid} is running on {view.machine} but holds "
                       f"{where or 'no machine'}")
        if view.state is not TaskState.RUNNING and where is not None:
            out.append(f"task {tid} is {view.state.value} but still placed on {where}")
        job = cell.jobs.get(view.job)
        if job is not None and view.index >= job.task_count:
            out.append(f"task {tid} is beyond job {job.id}'s {job.task_count} tasks")
    for name, rec in cell.usage.items():
        if not isinstance(rec, UsageRecord):
            continue
        lim = cell.config.limits_for(name)
        if lim is None or lim.max_resources is None or rec.base_revision != cell.config.revision:
            continue
        actual = scheduler_usage(cell, name)
        if (actual - rec.used) or (rec.used - actual):
            out.append(f"usage counter of {name} says {rec.used}, machines say {actual}")
        dim = actual.exceeding_limit(lim.max_resources)
        if dim is not None:
            out.append(f"scheduler {name} holds {actual.get(dim):g} {dim}, past its limit")
    return out


def placed_tasks_of(cell: CellReader, job: str) -> int:
    """How many of ``job``'s tasks count as running."""
    return sum(
        1
        for m in cell.machines.values()
        for a in m.allocations.values()
        if a.job == job and alloc_placed(a, cell.gangs)
    )

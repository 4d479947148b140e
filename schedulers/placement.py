"""Placement helpers shared by policies: whether a machine can take a task of a job.

They mirror the store's fine-grained checks (cellstate/validation.py) on the policy's
view, so a policy proposes claims the store will accept unless someone else got there
first. The store stays the judge."""

from __future__ import annotations

from collections.abc import Iterable

from cellstate.cell import alloc_holds
from cellstate.model import Job, Machine, MachineState, Resources, selector_matches_labels
from schedulers.api import CellView


def matches_selector(job: Job, m: Machine) -> bool:
    return all(r.matches(m.label(r.key)) for r in job.constraints.machine_selector)


def affinity_ok(view: CellView, job: Job, m: Machine, leaving: Iterable[str] = ()) -> bool:
    """Per-machine rules that depend on the other tasks there."""
    c = job.constraints
    gone = set(leaving)
    neighbours = [a for a in m.allocations.values()
                  if a.task not in gone and alloc_holds(a, view.gangs)]
    if c.max_per_machine and sum(1 for a in neighbours if a.job == job.id) >= c.max_per_machine:
        return False
    seen_affinity = not c.affinity
    for other_id in {a.job for a in neighbours if a.job != job.id}:
        other = view.jobs.get(other_id)
        if other is None:
            continue
        if c.anti_affinity and selector_matches_labels(c.anti_affinity, other.labels):
            return False
        oa = other.constraints.anti_affinity
        if oa and selector_matches_labels(oa, job.labels):
            return False
        if c.affinity and selector_matches_labels(c.affinity, other.labels):
            seen_affinity = True
    return seen_affinity


def can_host(view: CellView, job: Job, m: Machine, freed: Resources | None = None,
             leaving: Iterable[str] = ()) -> bool:
    """Whether one more task of ``job`` may go on ``m`` now (after ``leaving`` go)."""
    if m.state is not MachineState.UP or not matches_selector(job, m):
        return False
    if not view.fits(m.id, job.task_resources, freed):
        return False
    return affinity_ok(view, job, m, leaving)


def impossible(view: CellView, job: Job) -> str | None:
    """Why no state of this cell could ever place a task of ``job`` (None if it could):
    no machine matches its selector, or none is big enough even when empty."""
    machines = list(view.snap.machines.values())
    if not machines:
        return "the cell has no machines"
    matching = ([m for m in machines if matches_selector(job, m)]
                if job.constraints.machine_selector else machines)
    if not matching:
        return "no machine in the cell matches the job's machine selector"
    if not any(job.task_resources.fits_in(m.capacity) for m in matching):
        biggest: dict[str, float] = {}
        for m in matching:
            for name, amount in m.capacity.amounts:
                biggest[name] = max(biggest.get(name, 0.0), amount)
        short = job.task_resources.exceeding(Resources(tuple(sorted(biggest.items()))))
        if short is None:
            return "no machine has all the resources a task needs at once"
        return (f"each task needs {job.task_resources.get(short):g} {short}; the largest "
                f"machine has {biggest.get(short, 0.0):g}")
    return None

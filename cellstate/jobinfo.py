"""What users ask about jobs and the cell, computed from one snapshot."""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs

from cellstate.cell import CellSnapshot, machine_used, task_view
from cellstate.model import PLACEABLE, Job, MachineState, Resources, TaskState


@attrs.frozen
class JobSummary:
    job: Job
    state: str  # pending, running, finished, failed, abandoned, killed
    reason: str
    task_states: dict[str, int]


def job_summary(snap: CellSnapshot, job: Job) -> JobSummary:
    status = snap.statuses.get(job.id)
    counts = Counter(task_view(snap, f"{job.id}/{i}").state for i in range(job.task_count))
    states = {s.value: n for s, n in sorted(counts.items(), key=lambda kv: kv[0].value)}
    if status is not None:
        return JobSummary(job, status.state.value, status.reason, states)
    if counts[TaskState.FINISHED] == job.task_count:
        state = "finished"
    elif counts[TaskState.FAILED] and not counts[TaskState.RUNNING] and not any(
        counts[s] for s in PLACEABLE
    ):
        state = "failed"  # failed tasks are not retried: nothing more will happen
    elif counts[TaskState.RUNNING] or counts[TaskState.FINISHED]:
        state = "running"
    else:
        state = "pending"
    return JobSummary(job, state, "", states)


def cell_totals(snap: CellSnapshot) -> dict[str, Any]:
    """Machines up and down, capacity and use of the machines that are up, jobs and
    tasks by state."""
    up = [m for m in snap.machines.values() if m.state is not MachineState.DOWN]
    capacity = Resources()
    used = Resources()
    for m in up:
        capacity = capacity + m.capacity
        used = used + machine_used(m, snap.gangs)
    jobs: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    for j in snap.jobs.values():
        s = job_summary(snap, j)
        jobs[s.state] += 1
        tasks.update(s.task_states)
    return {
        "revision": snap.revision,
        "machines_up": len(up),
        "machines_down": len(snap.machines) - len(up),
        "capacity": capacity.as_dict(),
        "used": used.as_dict(),
        "jobs": dict(sorted(jobs.items())),
        "tasks": dict(sorted(tasks.items())),
        "agents": len(snap.agents),
    }

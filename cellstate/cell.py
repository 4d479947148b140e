"""Reading the cell state: snapshots and the one place that interprets staged records.

A :class:`CellReader` is anything with the mappings below; an immutable
:class:`CellSnapshot` from a replica is one, and so is the store's working view. The
functions here are the only code that knows how gang-staged allocations read (see
docs/architecture.md, "Gangs larger than one etcd txn"), so every reader agrees.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

import attrs
import immutables

from cellstate.model import (
    AgentRecord,
    Allocation,
    CellConfig,
    GangRecord,
    GangState,
    InstanceRecord,
    Job,
    JobStatus,
    Machine,
    Resources,
    SchedulerRecord,
    TaskRecord,
    TaskState,
    split_task_id,
    sum_resources,
)

# Enum members as globals on hot paths (why: cellstate/validation.py).
_RUNNING = TaskState.RUNNING


class CellReader(Protocol):
    @property
    def revision(self) -> int: ...
    @property
    def config(self) -> CellConfig: ...
    @property
    def machines(self) -> Mapping[str, Machine]: ...
    @property
    def jobs(self) -> Mapping[str, Job]: ...
    @property
    def tasks(self) -> Mapping[str, TaskRecord]: ...
    @property
    def gangs(self) -> Mapping[str, GangRecord]: ...
    @property
    def usage(self) -> Mapping[str, object]: ...
    @property
    def statuses(self) -> Mapping[str, JobStatus]: ...


# The record tables of a snapshot, in the order of CellSnapshot's fields.
TABLES = (
    "machines", "jobs", "tasks", "gangs", "usage", "statuses", "instances", "schedulers", "agents"
)


@attrs.frozen(slots=True)
class CellSnapshot:
    """A consistent, read-only view of a whole cell at one revision. Cheap to take:
    it shares structure with the replica's maps (HAMTs) instead of copying them."""

    revision: int
    config: CellConfig
    machines: immutables.Map[str, Machine]
    jobs: immutables.Map[str, Job]
    tasks: immutables.Map[str, TaskRecord]
    gangs: immutables.Map[str, GangRecord]
    usage: immutables.Map[str, object]
    statuses: immutables.Map[str, JobStatus]
    instances: immutables.Map[str, InstanceRecord]  # "scheduler/instance" -> record
    schedulers: immutables.Map[str, SchedulerRecord]
    agents: immutables.Map[str, AgentRecord]

    @classmethod
    def empty(cls) -> CellSnapshot:
        m: immutables.Map = immutables.Map()  # type: ignore[type-arg]
        return cls(0, CellConfig(), *([m] * len(TABLES)))

    def live_instances(self, scheduler: str) -> list[str]:
        """Instance ids of ``scheduler`` that hold a live lease, sorted."""
        return sorted(i.instance for i in self.instances.values() if i.scheduler == scheduler)


def alloc_holds(a: Allocation, gangs: Mapping[str, GangRecord], own_gang: str = "") -> bool:
    """Whether an allocation holds its machine's resources right now.

    A gang-staged hold counts while its gang's record exists (preparing or committed;
    an absent record means the gang aborted, and gang ids are never reused). A task
    marked for eviction by a gang keeps its hold until that gang commits. ``own_gang``
    is the gang being validated, whose staged evictions count as done."""
    if a.gang and a.gang != own_gang and a.gang not in gangs:
        return False
    if a.evicted_by:
        if a.evicted_by == own_gang:
            return False
        g = gangs.get(a.evicted_by)
        if g is not None and g.state is GangState.COMMITTED:
            return False
    return True


def alloc_placed(a: Allocation, gangs: Mapping[str, GangRecord]) -> bool:
    """Whether the allocation's task counts as running on the machine."""
    if not alloc_holds(a, gangs):
        return False
    if a.gang:
        g = gangs.get(a.gang)
        return g is not None and g.state is GangState.COMMITTED
    return True


def holding(
    m: Machine, gangs: Mapping[str, GangRecord], own_gang: str = ""
) -> Iterator[Allocation]:
    for a in m.allocations.values():
        if alloc_holds(a, gangs, own_gang):
            yield a


def machine_used(m: Machine, gangs: Mapping[str, GangRecord], own_gang: str = "") -> Resources:
    if not m.has_tags:
        return m.settled_used
    return sum_resources(a.resources for a in holding(m, gangs, own_gang))


@attrs.frozen(slots=True)
class TaskView:
    """A task as a reader should see it, whatever stage its records are in."""

    job: str
    index: int
    state: TaskState
    machine: str = ""
    reserved_by: str = ""  # a gang in flight holds it


def task_view(reader: CellReader, tid: str) -> TaskView:
    job, index = split_task_id(tid)
    rec = reader.tasks.get(tid)
    if rec is None:
        return TaskView(job, index, TaskState.PENDING)
    if rec.gang:
        g = reader.gangs.get(rec.gang)
        if g is None:
            # The gang aborted: the task was claimable before it, and still is.
            return TaskView(job, index, TaskState.PENDING)
        if g.state is GangState.PREPARING:
            return TaskView(job, index, TaskState.PENDING, reserved_by=g.id)
    if rec.state is TaskState.RUNNING:
        m = reader.machines.get(rec.machine)
        a = m.allocations.get(tid) if m is not None else None
        if a is not None and a.evicted_by:
            g = reader.gangs.get(a.evicted_by)
            if g is not None and g.state is GangState.COMMITTED:
                return TaskView(job, index, TaskState.PREEMPTED, rec.machine)
    return TaskView(job, index, rec.state, rec.machine)


def task_state(reader: CellReader, tid: str) -> TaskState:
    """``task_view(reader, tid).state`` without building the view (a scheduler asks it
    of every task of a job to know whether the job waits): only a task staged by a
    gang, or one running where a gang may have evicted it, needs the full reading."""
    rec = reader.tasks.get(tid)
    if rec is None:
        return TaskState.PENDING
    if rec.gang or (rec.state is _RUNNING and reader.gangs):
        return task_view(reader, tid).state
    return rec.state


def scheduler_usage(reader: CellReader, scheduler: str) -> Resources:
    """What ``scheduler`` holds across the cell, summed from the machines (the slow,
    always-correct way; the store keeps counters only for limited schedulers)."""
    return sum_resources(
        a.resources
        for m in reader.machines.values()
        for a in m.allocations.values()
        if a.scheduler == scheduler and alloc_placed(a, reader.gangs)
    )

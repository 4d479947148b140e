"""What waits to be placed, in the units the Aladdin network moves.

A *unit* is what one unit of flow carries: a whole task, or a whole affinity group
(the paper's virtual vertex V_j, §3.4): a job whose labels match its own affinity
selector and none of whose tasks runs yet is one unit needing all its tasks'
resources on one machine, placed all or nothing, its first claim founding the group
(``cellstate.fit.self_affine``). Tasks are never split: a unit goes to one machine.

A job is *free* when nothing but its resources decides where it may go, or may
leave: no machine selector, no affinity, anti-affinity or tasks-per-machine rule, not
a gang, and no live job's anti-affinity or affinity selector matches its labels (the
store checks anti-affinity both ways, so such a rule keeps it off machines too; and a
task another job's affinity counts on must not be moved away by repacking). Free jobs
of one shape share a task-class vertex; every other job is *constrained* and gets
arcs of its own, only to machines its rules allow (the per-machine blacklist of §3.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from cellstate.model import Job, Labels, Resources, Selector, SelectorOp
from schedulers.api import CellView
from schedulers.placement import founds_group


@attrs.frozen
class Unit:
    job: Job
    indices: tuple[int, ...]  # the tasks it carries: one, or a whole affinity group
    demand: Resources  # what it needs on its one machine
    founding: bool = False  # an affinity group: its first claim founds the group


@attrs.define
class Work:
    """A job's waiting units (all of the same demand)."""

    job: Job
    units: list[Unit]
    constrained: bool

    @property
    def demand(self) -> Resources:
        return self.units[0].demand

    @property
    def all_or_nothing(self) -> bool:
        return self.job.gang and len(self.units) > 1


def times(res: Resources, n: int) -> Resources:
    return Resources(tuple((d, a * n) for d, a in res.amounts))


def work_of(view: CellView, job: Job, reverse: RuleIndex) -> Work | None:
    """The job's waiting units, or None if nothing of it waits."""
    pending = view.pending_tasks(job)
    if not pending:
        return None
    if founds_group(view, job):
        units = [Unit(job, tuple(pending), times(job.task_resources, len(pending)), True)]
    else:
        units = [Unit(job, (i,), job.task_resources) for i in pending]
    return Work(job, units, constrained(job) or reverse.matches(job.labels))


def constrained(job: Job) -> bool:
    c = job.constraints
    return bool(c.machine_selector or c.affinity or c.anti_affinity or c.max_per_machine
                or job.gang)


class RuleIndex:
    """The anti-affinity and affinity selectors of the live jobs, to ask whether a
    job's labels are matched by one (which makes that job constrained). Selectors of
    the usual form ``key in (values)`` are indexed by (key, value); the others are
    tried in turn."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self._in: dict[tuple[str, str], int] = {}
        self._other: list[Selector] = []
        self.selectors = 0
        for j in jobs:
            for sel in (j.constraints.anti_affinity, j.constraints.affinity):
                if sel:
                    self._add(sel)

    def _add(self, sel: Selector) -> None:
        self.selectors += 1
        first = sel[0]
        if len(sel) == 1 and first.op is SelectorOp.IN:
            for v in first.values:
                self._in[(first.key, v)] = self._in.get((first.key, v), 0) + 1
        else:
            self._other.append(sel)

    def matches(self, labels: Labels) -> bool:
        if not self.selectors:
            return False
        if self._in and labels and any((k, v) in self._in for k, v in labels):
            return True
        if self._other:
            lookup: Mapping[str, str] = dict(labels)
            return any(all(r.matches(lookup.get(r.key)) for r in sel) for sel in self._other)
        return False

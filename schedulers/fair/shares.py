"""Cumulative Resource Share (Cook): how much of the cell a task's owner holds with
work at least as important as that task.

Each user orders their own tasks (``task_order``), as Cook does: the job's priority,
higher first; within a priority, running tasks by when they started (earliest first)
and waiting tasks after every running one; then submission, the job and the task.
Across users nothing is compared but shares. Ordering running tasks by start makes a
user's most recently started task the one with the highest CRS, so it is the one
preempted first: the victim loses the least work (ordered by submission instead, a
task of the user's newest job went first however long it had run, and Cook's
experiment lost hours of batch work per preemption).
A task's CRS is the resources of its owner's running tasks that come no later than it
in that order (itself included), as a share of the cell, divided by the owner's
weight. A waiting task's CRS counts itself as if it ran.

Several resource dimensions combine by the dominant share: the largest of the
per-dimension shares (as DRF and Cook's "DRU" do). A sum or a mean would let a user
who takes all of one scarce resource (every GPU) look small because they take little
of the others, and the work that needs that resource would wait while the user's
share looks fair; the dominant share charges each user for what they most deny others.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import attrs

from cellstate.cell import alloc_placed
from cellstate.fit import machine_up
from cellstate.model import Job, Resources, split_task_id, sum_resources
from schedulers.api import CellView

#: A task's place in its owner's own order (smaller comes first).
OrderKey = tuple[int, float, float, str, int]

#: The start of a task that waits: after every running task of its priority.
WAITING = math.inf


def task_order(job: Job, index: int, started: float = WAITING) -> OrderKey:
    """``started``: when the task started running (``WAITING`` if it waits)."""
    return (-job.priority, started, job.submitted_at, job.id, index)


def dominant_share(amounts: Mapping[str, float], totals: Mapping[str, float]) -> float:
    """The largest share of any dimension the cell has (dimensions it lacks count 0:
    nothing can run on them anyway)."""
    return max((amounts.get(d, 0.0) / t for d, t in totals.items() if t > 0), default=0.0)


@attrs.define
class _UserTasks:
    keys: list[OrderKey] = attrs.field(factory=list)
    tasks: list[str] = attrs.field(factory=list)
    needs: list[Resources] = attrs.field(factory=list)
    # Cumulative amounts and CRS of the first positions; a change drops those from its
    # position on, and they are extended again lazily (placing a user's tasks one by
    # one, mostly at the end of their order, costs O(1) each rather than O(tasks)).
    cum: list[dict[str, float]] = attrs.field(factory=list)
    crs: list[float] = attrs.field(factory=list)


class ShareBook:
    """Every user's running tasks in the user's own order, and the cell's resources:
    the CRS of any task, running or waiting. Changes (:meth:`add`, :meth:`remove`)
    model a decision's own placements and evictions as it makes them."""

    def __init__(self, totals: Resources, weights: Mapping[str, float] | None = None,
                 default_weight: float = 1.0) -> None:
        self.totals = {d: a for d, a in totals.amounts if a > 0}
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self._users: dict[str, _UserTasks] = {}
        self._owner: dict[str, str] = {}

    def weight(self, user: str) -> float:
        return self.weights.get(user, self.default_weight)

    def users(self) -> list[str]:
        return sorted(u for u, t in self._users.items() if t.tasks)

    def add(self, user: str, key: OrderKey, task: str, need: Resources) -> None:
        if task in self._owner:
            raise ValueError(f"task {task} is in the book already")
        ut = self._users.setdefault(user, _UserTasks())
        at = bisect.bisect_left(ut.keys, key)
        ut.keys.insert(at, key)
        ut.tasks.insert(at, task)
        ut.needs.insert(at, need)
        del ut.cum[at:], ut.crs[at:]
        self._owner[task] = user

    def load(self, user: str, entries: Iterable[tuple[OrderKey, str, Resources]]) -> None:
        """Add many running tasks of one user at once (sorted once, not one by one)."""
        ut = self._users.setdefault(user, _UserTasks())
        rows = sorted([*zip(ut.keys, ut.tasks, ut.needs, strict=True), *entries])
        for _, task, _ in rows:
            if self._owner.setdefault(task, user) != user:
                raise ValueError(f"task {task} is in the book already")
        ut.keys = [r[0] for r in rows]
        ut.tasks = [r[1] for r in rows]
        ut.needs = [r[2] for r in rows]
        ut.cum, ut.crs = [], []

    def remove(self, task: str) -> None:
        user = self._owner.pop(task)
        ut = self._users[user]
        at = ut.tasks.index(task)
        del ut.keys[at], ut.tasks[at], ut.needs[at]
        del ut.cum[at:], ut.crs[at:]

    def owner(self, task: str) -> str | None:
        return self._owner.get(task)

    def running(self, user: str) -> Resources:
        """The resources the user's running tasks hold."""
        ut = self._users.get(user)
        if ut is None or not ut.tasks:
            return Resources()
        return Resources(tuple(sorted(self._cum(ut)[-1].items())))

    def share(self, user: str) -> float:
        """The user's whole weighted dominant share (the CRS of their last task)."""
        ut = self._users.get(user)
        if ut is None or not ut.tasks:
            return 0.0
        return dominant_share(self._cum(ut)[-1], self.totals) / self.weight(user)

    def crs(self, task: str) -> float:
        """The CRS of a running task in the book."""
        user = self._owner[task]
        ut = self._users[user]
        at = ut.tasks.index(task)
        return dominant_share(self._cum(ut, at + 1)[at], self.totals) / self.weight(user)

    def crs_of_all(self, user: str) -> list[tuple[str, float]]:
        """(task, CRS) of every running task of the user, in the user's order (so in
        order of CRS too: it only grows along the order)."""
        ut = self._users.get(user)
        if ut is None:
            return []
        return list(zip(ut.tasks, self._crs(ut), strict=True))

    def above(self, user: str, threshold: float) -> list[tuple[str, float]]:
        """(task, CRS) of the user's running tasks whose CRS exceeds ``threshold``: the
        tail of their order."""
        ut = self._users.get(user)
        if ut is None:
            return []
        crs = self._crs(ut)
        start = bisect.bisect_right(crs, threshold)
        return list(zip(ut.tasks[start:], crs[start:], strict=True))

    def crs_waiting(self, user: str, key: OrderKey, need: Resources) -> float:
        """The CRS a waiting task would have: its owner's running tasks that come
        before it, plus itself."""
        ut = self._users.get(user)
        amounts = dict(need.amounts)
        if ut is not None and ut.tasks:
            before = bisect.bisect_left(ut.keys, key)
            if before:
                for d, a in self._cum(ut, before)[before - 1].items():
                    amounts[d] = amounts.get(d, 0.0) + a
        return dominant_share(amounts, self.totals) / self.weight(user)

    def _crs(self, ut: _UserTasks) -> list[float]:
        crs = ut.crs
        if len(crs) < len(ut.tasks):
            w = self.weight(self._owner[ut.tasks[0]])
            cum = self._cum(ut)
            crs.extend(dominant_share(c, self.totals) / w for c in cum[len(crs):])
        return crs

    def _cum(self, ut: _UserTasks, upto: int | None = None) -> list[dict[str, float]]:
        """The user's cumulative amounts, correct at least for the first ``upto``
        positions (default: all)."""
        cum = ut.cum
        stop = len(ut.needs) if upto is None else upto
        run = cum[-1] if cum else {}
        for need in ut.needs[len(cum):stop]:
            run = dict(run)
            for d, a in need.amounts:
                run[d] = run.get(d, 0.0) + a
            cum.append(run)
        return cum


@attrs.define
class CellShares:
    """The fair scheduler's running tasks as a share book, with where each runs, what
    they hold in all and the scheduler's resource limit (its pool), if it has one."""

    book: ShareBook
    where: dict[str, str]  # task -> machine
    gang_sizes: dict[str, int]  # gang job -> its running tasks
    held: Resources = attrs.field(factory=Resources)
    quota: Resources | None = None

    def over_quota(self, need: Resources, freed: Resources | None = None) -> bool:
        """Whether holding ``need`` more (once ``freed`` is given back) would break the
        scheduler's resource limit."""
        return (self.quota is not None
                and (self.held - (freed or Resources()) + need).exceeding_limit(self.quota)
                is not None)


def read_shares(view: CellView, scheduler: str, weights: Mapping[str, float] | None = None,
                default_weight: float = 1.0,
                started: Callable[[str], float] | None = None) -> CellShares:
    """The share book of ``scheduler``'s users: every task it placed that runs (or
    that this decision claimed), against the resources it may use: those of the
    machines that are up, or less where the scheduler's resource limit says so (a fair
    scheduler given a pool of the cell shares the pool, as Cook shares its cluster).

    ``started``: when a running task started (the cell does not record it; the
    scheduler knows when it first saw each task run). Without it, every running task
    counts as started at 0, so a user's running tasks are in submission order."""
    start = started or (lambda _task: 0.0)
    cell = sum_resources(m.capacity for m in view.machines() if machine_up(m) is None)
    limits = view.snap.config.limits_for(scheduler)
    quota = limits.max_resources if limits is not None else None
    pool = cell
    if quota is not None:
        pool = Resources(tuple((d, min(a, quota.get(d)) if quota.get(d) > 0 else a)
                               for d, a in cell.amounts))
    book = ShareBook(pool, weights, default_weight)
    where: dict[str, str] = {}
    gangs: Counter[str] = Counter()
    held: list[Resources] = []
    entries: dict[str, list[tuple[OrderKey, str, Resources]]] = {}
    for m in view.machines():
        for a in m.allocations.values():
            if a.scheduler != scheduler or a.evicted_by:
                continue
            if not (view.claimed(a.task) or alloc_placed(a, view.gangs)):
                continue
            job = view.jobs.get(a.job)
            if job is None:
                continue
            entries.setdefault(job.owner, []).append(
                (task_order(job, split_task_id(a.task)[1], start(a.task)), a.task,
                 a.resources))
            where[a.task] = m.id
            held.append(a.resources)
            if job.gang:
                gangs[job.id] += 1
    for user, rows in entries.items():
        book.load(user, rows)
    return CellShares(book, where, dict(gangs), sum_resources(held), quota)

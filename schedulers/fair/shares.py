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
import numpy as np

from cellstate.cell import alloc_placed
from cellstate.fit import machine_up, quota
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
    rows: list[tuple[float, ...]] = attrs.field(factory=list)  # needs on the book's dims
    # Cumulative amounts (one row per position, one column per dimension of the book)
    # and CRS of the first ``valid`` positions; a change at a position drops the rest,
    # and they are extended again lazily, on arrays: a preemption in the middle of a
    # user's order then costs one vectorized pass, not a dict per later task.
    cum: np.ndarray = attrs.field(factory=lambda: np.zeros((0, 0)))
    crs: np.ndarray = attrs.field(factory=lambda: np.zeros(0))
    valid: int = 0
    version: int = 0  # grows with every change: what was computed from it is stale
    changes: list[int] = attrs.field(factory=list)  # the first position each change moved

    def changed_at(self, at: int) -> None:
        self.valid = min(self.valid, at)
        self.version += 1
        self.changes.append(at)


class ShareBook:
    """Every user's running tasks in the user's own order, and the cell's resources:
    the CRS of any task, running or waiting. Changes (:meth:`add`, :meth:`remove`)
    model a decision's own placements and evictions as it makes them."""

    def __init__(self, totals: Resources, weights: Mapping[str, float] | None = None,
                 default_weight: float = 1.0) -> None:
        self.totals = {d: a for d, a in totals.amounts if a > 0}
        self._dims = tuple(self.totals)
        self._per = np.array([self.totals[d] for d in self._dims], dtype=float)
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self._users: dict[str, _UserTasks] = {}
        self._owner: dict[str, str] = {}

    def weight(self, user: str) -> float:
        return self.weights.get(user, self.default_weight)

    def users(self) -> list[str]:
        return sorted(u for u, t in self._users.items() if t.tasks)

    def _row(self, need: Resources) -> tuple[float, ...]:
        return tuple(need.get(d) for d in self._dims)

    def add(self, user: str, key: OrderKey, task: str, need: Resources) -> None:
        if task in self._owner:
            raise ValueError(f"task {task} is in the book already")
        ut = self._users.setdefault(user, _UserTasks())
        at = bisect.bisect_left(ut.keys, key)
        ut.keys.insert(at, key)
        ut.tasks.insert(at, task)
        ut.needs.insert(at, need)
        ut.rows.insert(at, self._row(need))
        ut.changed_at(at)
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
        ut.rows = [self._row(r[2]) for r in rows]
        ut.changed_at(0)

    def remove(self, task: str) -> None:
        user = self._owner.pop(task)
        ut = self._users[user]
        at = ut.tasks.index(task)
        del ut.keys[at], ut.tasks[at], ut.needs[at], ut.rows[at]
        ut.changed_at(at)

    def version(self, user: str) -> int:
        """Changes so far to the user's tasks (what is derived from them at one version
        holds until the next)."""
        ut = self._users.get(user)
        return -1 if ut is None else ut.version

    def size(self, user: str) -> int:
        ut = self._users.get(user)
        return 0 if ut is None else len(ut.tasks)

    def changed_since(self, user: str, version: int) -> int:
        """The first position of the user's order that moved since ``version``: the
        positions before it hold the same tasks with the same CRS."""
        ut = self._users[user]
        since = ut.changes[version:] if 0 <= version <= ut.version else [0]
        return min(since, default=len(ut.tasks))

    def owner(self, task: str) -> str | None:
        return self._owner.get(task)

    def running(self, user: str) -> Resources:
        """The resources the user's running tasks hold."""
        ut = self._users.get(user)
        if ut is None or not ut.tasks:
            return Resources()
        return sum_resources(ut.needs)

    def share(self, user: str) -> float:
        """The user's whole weighted dominant share (the CRS of their last task)."""
        ut = self._users.get(user)
        if ut is None or not ut.tasks:
            return 0.0
        return float(self._crs(ut)[-1])

    def crs(self, task: str) -> float:
        """The CRS of a running task in the book."""
        ut = self._users[self._owner[task]]
        return float(self._crs(ut)[ut.tasks.index(task)])

    def crs_of_all(self, user: str) -> list[tuple[str, float]]:
        """(task, CRS) of every running task of the user, in the user's order (so in
        order of CRS too: it only grows along the order)."""
        ut = self._users.get(user)
        if ut is None:
            return []
        return list(zip(ut.tasks, self._crs(ut).tolist(), strict=True))

    def above(self, user: str, threshold: float) -> list[tuple[str, float]]:
        """(task, CRS) of the user's running tasks whose CRS exceeds ``threshold``: the
        tail of their order."""
        ut = self._users.get(user)
        if ut is None:
            return []
        crs = self._crs(ut)
        start = int(np.searchsorted(crs, threshold, side="right"))
        return list(zip(ut.tasks[start:], crs[start:].tolist(), strict=True))

    def crs_waiting(self, user: str, key: OrderKey, need: Resources) -> float:
        """The CRS a waiting task would have: its owner's running tasks that come
        before it, plus itself."""
        ut = self._users.get(user)
        amounts = dict(need.amounts)
        if ut is not None and ut.tasks:
            before = bisect.bisect_left(ut.keys, key)
            if before:
                self._crs(ut)
                for d, a in zip(self._dims, ut.cum[before - 1].tolist(), strict=True):
                    amounts[d] = amounts.get(d, 0.0) + a
        return dominant_share(amounts, self.totals) / self.weight(user)

    def _crs(self, ut: _UserTasks) -> np.ndarray:
        """The user's CRS at every position (and their cumulative amounts in ``cum``),
        brought up to date from the first changed position on."""
        n = len(ut.tasks)
        if ut.valid < n or len(ut.crs) != n:
            start = ut.valid
            base = ut.cum[start - 1] if start else np.zeros(len(self._dims))
            # One sequential cumsum from the last good row: the same additions in the
            # same order as adding the needs one by one.
            tail = np.cumsum(np.vstack([base, np.array(ut.rows[start:], dtype=float)
                                        .reshape(n - start, len(self._dims))]), axis=0)[1:]
            cum = np.empty((n, len(self._dims)))
            cum[start:] = tail
            w = self.weight(self._owner[ut.tasks[0]]) if n else 1.0
            crs = np.empty(n)
            if start:
                cum[:start] = ut.cum[:start]
                crs[:start] = ut.crs[:start]
            if len(self._dims):
                crs[start:] = (tail / self._per).max(axis=1) / w
            else:
                crs[start:] = 0.0
            ut.cum, ut.crs, ut.valid = cum, crs, n
        return ut.crs


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
                and quota(self.held - (freed or Resources()), need, self.quota) is not None)


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
        capped = dict(quota.amounts)  # a dimension the limit does not name is not capped
        pool = Resources(tuple((d, min(a, capped[d]) if d in capped else a)
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

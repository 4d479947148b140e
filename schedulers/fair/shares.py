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
A task's CRS (Cook's DRU) is the resources of its owner's running tasks that come no
later than it in that order (itself included), each dimension divided by what the
owner is entitled to of it (:class:`Entitlement`), the largest of those quotients. A
CRS of 1 is the owner's whole entitled share; Cook never preempts a task below its
``safe_threshold`` (1 by default), so a user inside their share keeps their tasks. A
waiting task's CRS counts itself as if it ran.

Several resource dimensions combine by the dominant share: the largest of the
per-dimension quotients (as DRF and Cook's DRU do). A sum or a mean would let a user
who takes all of one scarce resource look small because they take little of the
others. Which dimensions count is the DRU mode, as Cook has it: ``default`` counts
every dimension but GPUs, ``gpu`` only GPUs (Cook's GPU pools), ``dominant`` every
dimension (this project's former rule, GPUs folded into the dominant share).
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
from cellstate.model import (
    DEFAULT_USER,
    Job,
    Resources,
    SchedulerLimits,
    TaskState,
    split_task_id,
    sum_resources,
)
from schedulers.api import CellView

#: A task's place in its owner's own order (smaller comes first).
OrderKey = tuple[int, float, float, str, int]

#: The start of a task that waits: after every running task of its priority.
WAITING = math.inf

#: Which dimensions a CRS counts (Cook's ``pool.dru-mode``), by mode name.
DRU_MODES = ("default", "gpu", "dominant")
GPU = "gpu"


def dru_dims(mode: str, dims: Iterable[str]) -> tuple[str, ...]:
    if mode == "gpu":
        return tuple(d for d in dims if d == GPU)
    if mode == "default":
        return tuple(d for d in dims if d != GPU)
    if mode == "dominant":
        return tuple(dims)
    raise ValueError(f"DRU mode {mode!r} is not one of {', '.join(DRU_MODES)}")


@attrs.frozen
class Entitlement:
    """What each user is entitled to of each resource: Cook's DRU divisors.

    A user's configured share (``shares``: their own entry, else ``default``'s) names
    amounts of some dimensions; a dimension it does not name is not counted for them,
    as Cook's missing share is infinite. With no configured share, a user is entitled
    to the pool split among the users with work (running or waiting tasks) in
    proportion to their weights: with N users of weight 1, a CRS of 1 is 1/N of the
    pool. Weights scale a configured share too (a weight of 2: twice the share)."""

    pool: Mapping[str, float]
    dims: tuple[str, ...]  # the dimensions a CRS counts (the DRU mode's)
    shares: Mapping[str, Resources] = attrs.field(factory=dict)
    weights: Mapping[str, float] = attrs.field(factory=dict)
    default_weight: float = 1.0
    active_weight: float = 0.0  # the weights of the users with work, summed

    def weight(self, user: str) -> float:
        return self.weights.get(user, self.default_weight)

    def of(self, user: str) -> dict[str, float]:
        """The amount of each counted dimension the user is entitled to (absent: not
        counted)."""
        w = self.weight(user)
        share = self.shares.get(user, self.shares.get(DEFAULT_USER))
        if share is not None:
            return {d: share.get(d) * w for d in self.dims if share.get(d) > 0}
        split = w / self.active_weight if self.active_weight > 0 else 1.0
        return {d: self.pool[d] * split for d in self.dims if self.pool.get(d, 0) > 0}

    def divisors(self, user: str) -> np.ndarray:
        """The entitlement over ``dims`` (infinite where not counted)."""
        ent = self.of(user)
        return np.array([ent.get(d, math.inf) for d in self.dims], dtype=float)


def entitlement(pool: Resources, limits: SchedulerLimits | None, users: Iterable[str],
                weights: Mapping[str, float] | None = None, default_weight: float = 1.0,
                mode: str = "default") -> Entitlement:
    """The entitlement of a fair scheduler's users over its pool, ``users`` being
    those with work now."""
    weights = dict(weights or {})
    amounts = {d: a for d, a in pool.amounts if a > 0}
    return Entitlement(amounts, dru_dims(mode, amounts),
                       dict(limits.shares) if limits is not None else {}, weights,
                       default_weight,
                       sum(weights.get(u, default_weight) for u in set(users)))


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

    def __init__(self, totals: Resources | Entitlement,
                 weights: Mapping[str, float] | None = None,
                 default_weight: float = 1.0) -> None:
        """``totals``: the entitlement; or a pool that every user is entitled to
        whole (``weights`` then scale it), so that a CRS is a share of the pool."""
        if isinstance(totals, Resources):
            amounts = {d: a for d, a in totals.amounts if a > 0}
            totals = Entitlement(amounts, tuple(amounts), {DEFAULT_USER: Resources(
                tuple(sorted(amounts.items())))}, dict(weights or {}), default_weight)
        self.entitled = totals
        self._dims = totals.dims
        self._div: dict[str, np.ndarray] = {}
        self._users: dict[str, _UserTasks] = {}
        self._owner: dict[str, str] = {}

    def weight(self, user: str) -> float:
        return self.entitled.weight(user)

    def divisors(self, user: str) -> np.ndarray:
        div = self._div.get(user)
        if div is None:
            div = self._div[user] = self.entitled.divisors(user)
        return div

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
        if not self._dims:
            return 0.0
        amounts = np.array(self._row(need), dtype=float)
        if ut is not None and ut.tasks:
            before = bisect.bisect_left(ut.keys, key)
            if before:
                self._crs(ut)
                amounts = ut.cum[before - 1] + amounts
        return float((amounts / self.divisors(user)).max())

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
            crs = np.empty(n)
            if start:
                cum[:start] = ut.cum[:start]
                crs[:start] = ut.crs[:start]
            if len(self._dims) and n:
                crs[start:] = (tail / self.divisors(self._owner[ut.tasks[0]])).max(axis=1)
            else:
                crs[start:] = 0.0
            ut.cum, ut.crs, ut.valid = cum, crs, n
        return ut.crs


@attrs.define
class CellShares:
    """The fair scheduler's running tasks as a share book, with where each runs, what
    they hold in all, the scheduler's resource limit (its pool), if it has one, and
    its users' quotas."""

    book: ShareBook
    where: dict[str, str]  # task -> machine
    gang_sizes: dict[str, int]  # gang job -> its running tasks
    held: Resources = attrs.field(factory=Resources)
    quota: Resources | None = None
    limits: SchedulerLimits | None = None

    def over_quota(self, need: Resources, freed: Resources | None = None) -> bool:
        """Whether holding ``need`` more (once ``freed`` is given back) would break the
        scheduler's resource limit."""
        return (self.quota is not None
                and quota(self.held - (freed or Resources()), need, self.quota) is not None)

    def over_user_quota(self, user: str, need: Resources, freed: Resources | None = None,
                        freed_tasks: int = 0) -> str | None:
        """Why running one more task needing ``need`` (once the user's own
        ``freed_tasks`` tasks holding ``freed`` are given back) would break the user's
        quota (Cook's count, cpus, mem and gpus per user), or None."""
        q = self.limits.quota_of(user) if self.limits is not None else None
        if q is None:
            return None
        count = self.book.size(user) - freed_tasks
        if q.count is not None and count + 1 > q.count:
            return f"{user}'s quota of {q.count} running task(s) is reached ({count} run)"
        if q.resources.amounts:
            held = self.book.running(user) - (freed or Resources())
            dim = (held + need).exceeding_limit(q.resources)
            if dim is not None:
                return (f"{user}'s quota of {q.resources.get(dim):g} {dim} is reached "
                        f"({held.get(dim):g} held, the task needs {need.get(dim):g})")
        return None


def read_shares(view: CellView, scheduler: str, weights: Mapping[str, float] | None = None,
                default_weight: float = 1.0,
                started: Callable[[str], float] | None = None,
                waiting: Iterable[str] = (), mode: str = "default") -> CellShares:
    """The share book of ``scheduler``'s users: every task it placed that runs (or
    that this decision claimed), against what each user is entitled to
    (:func:`entitlement`) of the resources it may use: those of the machines that are
    up, or less where the scheduler's resource limit says so (a fair scheduler given a
    pool of the cell shares the pool, as Cook shares its cluster). ``waiting``: the
    users with waiting tasks (with those running, they split the pool when no share
    is configured).

    ``started``: when a running task started (:func:`start_times` reads it from the
    cell). Without it, every running task counts as started at 0, so a user's running
    tasks are in submission order."""
    start = started or (lambda _task: 0.0)
    cell = sum_resources(m.capacity for m in view.machines() if machine_up(m) is None)
    limits = view.snap.config.limits_for(scheduler)
    cap = limits.max_resources if limits is not None else None
    pool = cell
    if cap is not None:
        capped = dict(cap.amounts)  # a dimension the limit does not name is not capped
        pool = Resources(tuple((d, min(a, capped[d]) if d in capped else a)
                               for d, a in cell.amounts))
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
    book = ShareBook(entitlement(pool, limits, {*entries, *waiting}, weights,
                                 default_weight, mode))
    for user, rows in entries.items():
        book.load(user, rows)
    return CellShares(book, where, dict(gangs), sum_resources(held), cap, limits)


def start_times(view: CellView, fallback: Callable[[str], float]) -> Callable[[str], float]:
    """When each running task started, as the commit that placed it recorded it (the
    task record's ``placed_at``, dated by the committing store's clock), so a restarted
    instance and a task placed again are judged by the cell; ``fallback`` for a task
    the record does not date (a claim of this instance still in flight, a record
    written before start times were kept)."""
    tasks = view.snap.tasks

    def started(task: str) -> float:
        rec = tasks.get(task)
        if rec is not None and rec.placed_at and rec.state is TaskState.RUNNING \
                and not view.claimed(task):
            return rec.placed_at
        return fallback(task)

    return started

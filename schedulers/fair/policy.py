"""The fair scheduler: Cook's fair preemptive scheduling on the shared cell.

Each decision takes every waiting job of its queue (the runtime hands it the whole
queue at every ``interval``: see ``Policy.requeue_interval``). Each user's waiting
tasks form a queue in the user's own order (``shares.task_order``); the scheduler
repeatedly serves the user whose next task would have the lowest CRS, so resources go
first to the users who hold least. A task goes where there is free room (randomized
first fit); where there is none, it may preempt running tasks of this scheduler's
users whose CRS exceeds its own by more than ``delta`` (``victims.choose``), within the
guards against preemption storms (``guard.PreemptionGuard``). A gang job is one unit:
all its waiting tasks are placed, or none.

Preemptions are claims with evictions, which the store judges like any other: it
accepts victims of lower precedence than the task, or of equal precedence that this
scheduler placed itself, and the scheduler's precedence limit caps what its jobs
carry. So work of other schedulers at the same or higher precedence is out of reach.

Cook's rules, as its rebalancer has them: a task's CRS is over what its owner is
entitled to (``shares``: the shares and quotas of the scheduler's users live in the
cell's config, ``omega limits NAME --share/--quota``, changed live; with none, the
pool split among the users with work by weight); no task whose CRS is below
``safe_threshold`` is ever a victim (a user inside their share keeps their tasks);
a user past their quota places nothing from free room and preempts only their own
tasks, and never exceeds the quota; at most ``max_preemptions_per_round`` preemption
decisions per round (Cook's ``max-preemption``).

Options (``--option NAME=VALUE``; ``weights.alice=2``):

* ``weights``: a table of user -> weight (default ``default_weight``, 1): a user of
  weight 2 is entitled to twice the share; their CRS is halved.
* ``delta`` (0.05): how much unfairness to tolerate, in CRS (Cook's ``min-dru-diff``).
* ``safe_threshold`` (1.0): Cook's ``safe-dru-threshold``; 0 lets any task go.
* ``dru_mode`` (``default``): which resources a CRS counts, as Cook's pools have it:
  ``default`` every one but GPUs, ``gpu`` only GPUs, ``dominant`` every one.
* ``min_runtime`` (60 s), ``max_preemptions_per_round`` (10 decisions),
  ``max_preemptions_per_minute`` (60 tasks): the storm guards (``guard``).
* ``preempt`` (true): false makes it a fair queue that never preempts (the baseline
  Cook's experiment compares against).
* ``interval`` (1 s): how often waiting jobs are reconsidered.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from cellstate.fit import FitTally
from cellstate.model import (
    Constraints,
    Job,
    Resources,
    split_task_id,
    sum_resources,
    task_precedence,
)
from schedulers.api import CellView, Context, Plan, Policy, Unplaced
from schedulers.fair.guard import PreemptionGuard
from schedulers.fair.shares import (
    DRU_MODES,
    CellShares,
    OrderKey,
    ShareBook,
    read_shares,
    start_times,
    task_order,
)
from schedulers.fair.victims import Kept, RoundMemo, Victim, choose, eligible, threshold_of
from schedulers.options import OptionError, Options
from schedulers.placement import impossible, why_not

OPTIONS = ("weights", "default_weight", "delta", "safe_threshold", "dru_mode", "min_runtime",
           "max_preemptions_per_round", "max_preemptions_per_minute", "preempt", "interval")
_REPORTED_USERS = 20  # per-user entries in the report (its size is capped)


class FairOptionError(OptionError):
    pass


@attrs.frozen
class FairConfig:
    weights: Mapping[str, float] = attrs.field(factory=dict)
    default_weight: float = 1.0
    delta: float = 0.05
    safe_threshold: float = 1.0
    dru_mode: str = "default"
    min_runtime: float = 60.0
    max_preemptions_per_round: int = 10
    max_preemptions_per_minute: int = 60
    preempt: bool = True
    interval: float = 1.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> FairConfig:
        o = Options(options, "fair scheduler", OPTIONS, FairOptionError)
        weights = {}
        for user, w in o.table("weights").items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w <= 1e6:
                raise FairOptionError(f"fair scheduler: option weights.{user} must be a "
                                      f"number above 0 and at most 1e6, got {w!r}")
            weights[str(user)] = float(w)
        return cls(
            weights=weights,
            default_weight=o.number("default_weight", 1.0, 1e-6, 1e6),
            delta=o.number("delta", 0.05, 0.0, 1e6),
            safe_threshold=o.number("safe_threshold", 1.0, 0.0, 1e6),
            dru_mode=o.choice("dru_mode", "default", DRU_MODES),
            min_runtime=o.number("min_runtime", 60.0, 0.0, 1e7),
            max_preemptions_per_round=o.integer("max_preemptions_per_round", 10, 0, 10**6),
            max_preemptions_per_minute=o.integer("max_preemptions_per_minute", 60, 0, 10**6),
            preempt=o.boolean("preempt", True),
            interval=o.number("interval", 1.0, 0.01, 3600.0),
        )


@attrs.define
class _Unit:
    """What is placed whole: one task, or every waiting task of a gang job."""

    job: Job
    indexes: list[int]

    @property
    def key(self) -> OrderKey:
        return task_order(self.job, self.indexes[0])

    @property
    def need(self) -> Resources:
        return sum_resources([self.job.task_resources] * len(self.indexes))


@attrs.define
class _Round:
    placed: int = 0
    preemptions: int = 0  # claims that evict (decisions)
    preempted: int = 0  # tasks whose work a preemption ended
    capped: int = 0  # units refused a preemption by a storm guard


class FairPolicy(Policy):
    name = "fair"
    handles_limits = True  # it divides its pool (its quota) among users, preempting

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config = FairConfig.from_options(options)
        self.requeue_interval = self.config.interval
        c = self.config
        self.guard = PreemptionGuard(c.min_runtime, c.max_preemptions_per_round,
                                     c.max_preemptions_per_minute)
        self._totals: Counter[str] = Counter()
        self._report: Mapping[str, float | int] = {}

    def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        view, c = ctx.view, self.config
        now = ctx.now
        queues, waiting = _queues(view, jobs)
        # A task neither dated by the cell nor seen running before started now.
        started = start_times(view, lambda task: self.guard.first_seen(task, now))
        shares = read_shares(view, ctx.scheduler, c.weights, c.default_weight,
                             started=started, waiting=queues, mode=c.dru_mode)
        self.guard.begin_round(now, shares.where, started)
        r = _Round()
        failed: dict[str, str] = {}  # job -> why its next task could not be placed
        # users whose CRS is already too high to preempt -> why (what kept victims out)
        no_victims: dict[str, str] = {}
        unplaced: Counter[str] = Counter()
        placed: set[str] = set()  # jobs this round placed tasks of
        free: dict[str, list[str]] = {}  # job (or shape) -> machines not yet found full
        tallies: dict[str, FitTally] = defaultdict(FitTally)
        memo = RoundMemo(view, shares, self.guard.old_enough, c.safe_threshold)
        while (head := self._next(shares.book, queues)) is not None:
            q = queues[head]
            unit = q.popleft()
            jid = unit.job.id
            why = self._place(ctx, shares, unit, r, free, tallies[jid], no_victims, memo)
            if why is None:
                placed.add(jid)
            else:
                failed[jid] = why
                # The job's other waiting tasks follow in the queue (they share its
                # place in the order) and would fail alike: drop them at once, not one
                # choice of user at a time (a backlog of thousands of waiting tasks
                # made every round cost that many choices).
                n = len(unit.indexes)
                while q and q[0].job.id == jid:
                    n += len(q.popleft().indexes)
                unplaced[jid] += n
            if not q:
                del queues[head]
        out = []
        for jid, n in sorted(unplaced.items()):
            job = view.jobs[jid]
            # None of its tasks ran before this round, nor did this round place any
            # (counted rather than read from the view again: that costs a look at
            # every task of every waiting job, each round).
            untouched = waiting[jid] == job.task_count and jid not in placed
            never = impossible(view, job) if untouched else None
            if never is not None:
                out.append(Unplaced(jid, never, n, permanent=True))
            else:
                # A tally only where this round looked at machines for the job itself
                # (a job of a shape already found to fit nowhere was not looked at again).
                report = tallies[jid].report()
                out.append(Unplaced(jid, failed[jid], n, fit=report if report.machines else None))
        self._record(r, shares.book)
        return Plan(view.claims, tuple(out))

    def _next(self, book: ShareBook, queues: Mapping[str, deque[_Unit]]) -> str | None:
        """The user whose next waiting unit would have the lowest CRS."""
        best: tuple[float, str] | None = None
        for user, q in queues.items():
            unit = q[0]
            crs = book.crs_waiting(user, unit.key, unit.need)
            if best is None or (crs, user) < best:
                best = (crs, user)
        return None if best is None else best[1]

    def _place(self, ctx: Context, shares: CellShares, unit: _Unit, r: _Round,
               free: dict[str, list[str]], tally: FitTally, no_victims: dict[str, str],
               memo: RoundMemo) -> str | None:
        """Claim every task of the unit (or none); None if it was placed, else why not."""
        view, job, book = ctx.view, unit.job, shares.book
        user, need = job.owner, job.task_resources
        mark = view.mark()
        held_before = shares.held
        added: list[str] = []
        removed: list[tuple[str, OrderKey, str, Resources, str]] = []
        decisions = lost = 0
        why: str | None = None
        for index in unit.indexes:
            # Past its pool (the scheduler's resource limit) or past its owner's quota,
            # free room is no use: only a preemption gives back what the task takes.
            past_quota = shares.over_user_quota(user, need)
            full = shares.over_quota(need) or past_quota is not None
            mid = None if full else self._free_fit(ctx, job, free, tally)
            evict: tuple[Victim, ...] = ()
            if mid is None:
                found, why = self._preemption(ctx, shares, job, index, no_victims, memo,
                                              past_quota)
                if found is None:
                    break
                mid, evict = found.machine, found.victims
                on = view.machine(mid)
                assert on is not None  # the victims were found on it
                freed = sum_resources(on.allocations[v.task].resources for v in evict)
                if shares.over_quota(need, freed):
                    why = (f"the scheduler's resource limit is reached, and preempting "
                           f"{len(evict)} task(s) on {mid} would not give back enough")
                    break
                if past_quota is not None:  # its own tasks only (see _preemption)
                    still = shares.over_user_quota(user, need, freed, len(evict))
                    if still is not None:
                        why = (f"{past_quota}, and preempting {len(evict)} of their own "
                               f"task(s) on {mid} would not give back enough")
                        break
                shares.held = shares.held - freed
                for v in evict:
                    removed.append((view.jobs[v.job].owner,
                                    task_order(view.jobs[v.job], split_task_id(v.task)[1],
                                               self.guard.started(v.task)),
                                    v.task, on.allocations[v.task].resources,
                                    shares.where.pop(v.task)))
                    book.remove(v.task)
                self.guard.spend(found.lost)
                decisions += 1
                lost += found.lost
                r.preemptions += 1
                r.preempted += found.lost
                for machines in free.values():
                    if mid not in machines:
                        machines.append(mid)  # the victims may leave room over
            c = view.claim(job, index, mid, [v.task for v in evict])
            # It starts now: after the user's tasks running already, in their order.
            book.add(user, task_order(job, index, ctx.now), c.task, need)
            shares.held = shares.held + need
            shares.where[c.task] = mid
            added.append(c.task)
        else:
            r.placed += len(unit.indexes)
            return None
        # A gang that did not fit whole: take back what it claimed and preempted.
        view.rollback(mark)
        shares.held = held_before
        for task in added:
            book.remove(task)
            shares.where.pop(task, None)
        memo.forget(added)
        for owner, key, task, res, mid in removed:
            book.add(owner, key, task, res)
            shares.where[task] = mid
        if decisions:
            self.guard.refund(decisions)
            r.preemptions -= decisions
            r.preempted -= lost
        return why

    def _free_fit(self, ctx: Context, job: Job, free: dict[str, list[str]],
                  tally: FitTally) -> str | None:
        view = ctx.view
        # Jobs without constraints fit the same machines if their tasks and labels are
        # alike, so a full cell is found full once per shape, not once per job.
        key = (repr((job.task_resources, job.labels)) if job.constraints == Constraints()
               else job.id)
        candidates = free.get(key)
        if candidates is None:
            candidates = free[key] = view.machine_ids()
        while candidates:
            i = ctx.rng.randrange(len(candidates))
            m = view.machine(candidates[i])
            if m is not None:
                miss = why_not(view, job, m)
                if miss is None:
                    return m.id
                tally.add(miss)
            candidates[i] = candidates[-1]
            candidates.pop()
        return None

    def _preemption(self, ctx: Context, shares: CellShares, job: Job, index: int,
                    no_victims: dict[str, str], memo: RoundMemo, past_quota: str | None,
                    ) -> tuple[Any, str]:
        c, book = self.config, shares.book
        if not c.preempt:
            return None, ((f"{past_quota} (this fair scheduler does not preempt)")
                          if past_quota else
                          "no machine has room now (this fair scheduler does not preempt)")
        user = job.owner
        crs = book.crs_waiting(user, task_order(job, index), job.task_resources)
        threshold = threshold_of(crs, c.delta)
        if user in no_victims:
            return None, _waiting(crs, c.delta, no_victims[user])
        if self.guard.decisions_left() <= 0:
            return None, _waiting(crs, c.delta, f"the preemption cap is reached "
                                  f"({c.max_preemptions_per_round} decisions per round)")
        budget = self.guard.tasks_left()
        if budget <= 0:
            return None, _waiting(crs, c.delta, f"the preemption cap is reached "
                                  f"({c.max_preemptions_per_minute} tasks per minute)")
        precedence = task_precedence(job, index)
        by_machine, kept = eligible(ctx.view, shares, precedence, threshold,
                                    self.guard.old_enough, memo,
                                    only=user if past_quota is not None else None)
        if not by_machine:
            why = none_above(kept, precedence, c.safe_threshold, c.min_runtime)
            if past_quota is not None:
                why = f"{past_quota}; {why}"
            if not kept.young:
                # The user's later tasks have a CRS no lower, a precedence no higher
                # and a quota no further from reach: none of them finds a victim either.
                no_victims[user] = why
            return None, _waiting(crs, c.delta, why)
        found = choose(ctx.view, job, by_machine, budget)
        if found is None:
            return None, _waiting(crs, c.delta, "no machine frees enough room by preempting "
                                  f"only tasks above it (within the cap of {budget} tasks)"
                                  + (f"; {kept.text(precedence, c.safe_threshold, c.min_runtime)}"
                                     if kept else ""))
        return found, ""

    def _record(self, r: _Round, book: ShareBook) -> None:
        t = self._totals
        t["rounds"] += 1
        t["placed"] += r.placed
        t["preemptions"] += r.preemptions
        t["preempted"] += r.preempted
        report: dict[str, float | int] = {
            **t, "last_placed": r.placed, "last_preempted": r.preempted,
            **config_report(self.config)}
        users = sorted(book.users(), key=lambda u: -book.share(u))[:_REPORTED_USERS]
        for u in users:
            report[f"share.{u}"] = round(book.share(u), 6)
        for u, w in sorted(self.config.weights.items())[:_REPORTED_USERS]:
            report[f"weight.{u}"] = w
        self._report = report  # a new mapping: report() is read from another thread

    def report(self) -> Mapping[str, float | int]:
        """Totals since the start (``rounds``, ``placed``, ``preemptions``: claims that
        evict, ``preempted``: tasks whose work they end, gangs counted whole), the last
        round's, the configured ``delta``, ``min_runtime`` and ``weight.USER``, and
        each user's weighted dominant share (``share.USER``)."""
        return self._report


def config_report(c: FairConfig) -> dict[str, float | int]:
    """The settings a share view needs to judge as the instance does (``omega shares``
    reads them back with :func:`config_from_report`)."""
    return {"delta": c.delta, "safe_threshold": c.safe_threshold,
            "min_runtime": c.min_runtime, "default_weight": c.default_weight,
            "preempt": int(c.preempt), f"dru_mode.{c.dru_mode}": 1}


def config_from_report(report: Mapping[str, Any]) -> FairConfig:
    """The settings an instance's report gives (its weights only as far as the report
    lists them: the first few users)."""
    d = FairConfig()
    mode = next((k.removeprefix("dru_mode.") for k in report if k.startswith("dru_mode.")),
                d.dru_mode)
    return FairConfig(
        weights={k.removeprefix("weight."): float(v) for k, v in report.items()
                 if k.startswith("weight.")},
        default_weight=float(report.get("default_weight", d.default_weight)),
        delta=float(report.get("delta", d.delta)),
        safe_threshold=float(report.get("safe_threshold", d.safe_threshold)),
        dru_mode=mode, min_runtime=float(report.get("min_runtime", d.min_runtime)),
        preempt=bool(report.get("preempt", d.preempt)))


def none_above(kept: Kept, precedence: int, safe: float, min_runtime: float) -> str:
    """Why no running task can be preempted, naming every filter with its count."""
    if not kept:
        return "no running task's CRS is above that"
    return f"no running task above it may go: {kept.text(precedence, safe, min_runtime)}"


def _waiting(crs: float, delta: float, rest: str) -> str:
    return (f"waiting for its fair share: its CRS would be {crs:.3f}; it preempts only "
            f"tasks above {crs + delta:.3f} (delta {delta:g}), and {rest}")


def _queues(view: CellView, jobs: Iterable[Job]
            ) -> tuple[dict[str, deque[_Unit]], dict[str, int]]:
    """Each user's waiting units in the user's own order, and each job's waiting
    tasks."""
    units: dict[str, list[_Unit]] = defaultdict(list)
    waiting: dict[str, int] = {}
    for job in jobs:
        pending = view.pending_tasks(job)
        if not pending:
            continue
        waiting[job.id] = len(pending)
        if job.gang:
            units[job.owner].append(_Unit(job, pending))
        else:
            units[job.owner].extend(_Unit(job, [i]) for i in pending)
    return {u: deque(sorted(us, key=lambda x: x.key)) for u, us in units.items()}, waiting

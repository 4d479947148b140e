"""The MapReduce-elastic scheduler (Omega §6): grows running MapReduce jobs into idle
resources.

New jobs are placed like the batch scheduler places its jobs (randomized first fit),
but only the workers a job asked for (``MapReduceSpec.workers``); those are required,
run at the job's precedence and are retried until placed. Every ``interval`` seconds
(:meth:`MapReducePolicy.propose`) the scheduler looks at the whole cell and adds
*extra* workers to its running jobs:

1. for each job, the workers it runs now and, by the linear speedup model
   (``cellstate/mapreduce.py``), the work it has left (followed from round to round);
2. one worker at a time, to the job whose predicted finish the next worker brings
   forward the most (per unit of the cell it takes), placed by randomized first fit
   on what is free, while the policy allows:

   * ``max-parallel``: while a worker still brings a job's finish forward (up to the
     point where every activity of its phase runs at once);
   * ``global-cap``: as max-parallel, but nothing that would take the cell's
     utilization (the busiest resource dimension) above ``target`` (0.6);
   * ``relative-size``: as max-parallel, but at most ``factor`` (4) times the workers
     the job asked for;

   and never beyond the job's elastic upper bound (``max_workers``). An extra worker
   takes an evicted extra worker's slot first, then a new task (a resize of the job);
3. the claims are committed as incremental transactions like any other scheduler's,
   so the store validates them against everyone's commits: a claim that lost a race
   is rejected and the next round decides again on fresh state.

Shrinking is the other half: extra workers run at ``OPPORTUNISTIC_PRECEDENCE``, below
any job's precedence, so the batch, service and this scheduler's own placements take
their room back first whenever the cell needs it (``schedulers.placement.Reclaimer``),
and a job never goes below what it asked for: its requested workers run at its own
precedence and are placed again if evicted. A job's work is done when one of its
workers finishes (all end together); extra slots left empty are then not filled.

Options (constructor keywords, ``--policy`` and ``--option``): ``policy``
(``max-parallel``, ``global-cap``, ``relative-size``), ``interval`` (5 s), ``target``
(0.6), ``factor`` (4). :meth:`MapReducePolicy.report` says what the rounds did (extra
workers added and running, jobs grown and sped up, the last round's time).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Mapping
from typing import Any

import attrs

from cellstate import mapreduce as model
from cellstate.cell import task_view
from cellstate.model import (
    PLACEABLE,
    Constraints,
    Job,
    MachineState,
    MapReduceSpec,
    Resources,
    TaskState,
    required_tasks,
    task_id,
)
from schedulers.api import CellView, Context, Plan, Policy
from schedulers.batch import first_fit
from schedulers.options import Options
from schedulers.placement import why_not
from schedulers.runtime import owner_of

POLICIES = ("max-parallel", "global-cap", "relative-size")
OPTIONS = ("policy", "interval", "target", "factor")


class MapReduceOptionError(ValueError):
    pass


@attrs.define
class JobState:
    """One running MapReduce job as a round sees it."""

    job: Job
    spec: MapReduceSpec
    running: int  # workers running (or claimed by this scheduler, not yet seen)
    waiting: bool  # a requested worker waits to be placed (the runtime places it)
    free_slots: list[int]  # extra workers' tasks that may be placed again
    next_index: int  # the first task index beyond the job's (and its own claims')
    limit: int  # the most workers the policy lets it have
    added: int = 0
    resized_to: int = 0


class MapReducePolicy(Policy):
    name = "mapreduce"
    propose_interval: float | None = 5.0

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = Options(options, "mapreduce scheduler", OPTIONS, MapReduceOptionError)
        policy = options.get("policy", "max-parallel")
        if policy not in POLICIES:
            raise MapReduceOptionError(f"mapreduce scheduler: option policy must be one of "
                                       f"{', '.join(POLICIES)}, got {policy!r}")
        self.mode: str = str(policy)
        self.propose_interval = o.number("interval", 5.0, 0.01, 3600.0)
        self.target = o.number("target", 0.6, 0.0, 1.0)
        self.factor = o.number("factor", 4.0, 1.0, 1e6)
        # Each job's progress as far as this scheduler can tell (for predictions only;
        # agents and the simulator run jobs by their own tracker).
        self.tracker = model.Tracker()
        self._grown: set[str] = set()  # running jobs that have had extra workers
        self._totals = {"proposals": 0, "workers_added": 0, "jobs_sped_up": 0}
        self._report: Mapping[str, float | int] = {}

    # -- placing new jobs ----------------------------------------------------------------

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        """A job's requested workers (a job without a mapreduce table: all its tasks),
        by the batch scheduler's randomized first fit."""
        required = required_tasks(job)
        pending = [i for i in ctx.view.pending_tasks(job) if i < required]
        return first_fit(ctx, job, pending)

    # -- growing running jobs --------------------------------------------------------------

    def propose(self, ctx: Context) -> Plan:
        started = time.perf_counter()
        view = ctx.view
        jobs = self._running_jobs(ctx)
        cell = _Cell.of(view)
        added = self._grow(ctx, jobs, cell) if jobs else 0
        resize = {s.job.id: s.resized_to for s in jobs.values() if s.resized_to}
        self._account(ctx, jobs, cell, added, time.perf_counter() - started)
        return Plan(view.claims, resize=resize)

    def _running_jobs(self, ctx: Context) -> dict[str, JobState]:
        """This instance's running MapReduce jobs that may grow, and the tracker brought
        up to date with every running job's workers."""
        view = ctx.view
        snap = view.snap
        members = snap.live_instances(ctx.scheduler) or [ctx.instance]
        out: dict[str, JobState] = {}
        seen: set[str] = set()
        for job in view.jobs.values():
            spec = job.mapreduce
            if (spec is None or job.scheduler != ctx.scheduler or job.id in snap.statuses
                    or owner_of(job.id, members) != ctx.instance):
                continue
            state = self._job_state(view, job, spec)
            if state is None:  # done: one of its workers finished
                continue
            seen.add(job.id)
            self.tracker.workers(job.id, spec, state.running, ctx.now)
            if state.running and not state.waiting and state.limit > state.running:
                out[job.id] = state
        for jid in self.tracker.jobs():
            if jid not in seen:
                self.tracker.forget(jid)
                if jid in self._grown:
                    self._grown.discard(jid)
                    self._totals["jobs_sped_up"] += 1
        return out

    def _job_state(self, view: CellView, job: Job, spec: MapReduceSpec) -> JobState | None:
        running = 0
        waiting = False
        free: list[int] = []
        tasks = view.snap.tasks
        for i in range(job.task_count):
            tid = task_id(job.id, i)
            if view.claimed(tid):
                running += 1
                continue
            rec = tasks.get(tid)
            # A MapReduce job is never a gang: its task records say it all.
            state = TaskState.PENDING if rec is None else (
                rec.state if not rec.gang else task_view(view.snap, tid).state)
            if state is TaskState.FINISHED:
                return None
            if state is TaskState.RUNNING:
                running += 1
            elif state in PLACEABLE:
                if i < spec.workers:
                    waiting = True
                else:
                    free.append(i)
        nxt = job.task_count
        while view.claimed(task_id(job.id, nxt)):  # grown earlier; not seen resized yet
            nxt += 1
            running += 1
        limit = spec.max_workers
        if self.mode == "relative-size":
            limit = min(limit, int(self.factor * spec.workers))
        return JobState(job, spec, running, waiting, free, nxt, limit)

    def _grow(self, ctx: Context, jobs: dict[str, JobState], cell: _Cell) -> int:
        """Add workers one at a time where the next one helps most; returns how many."""
        heap: list[tuple[float, str]] = []
        for jid, s in jobs.items():
            gain = self._gain(s, cell, ctx.now)
            if gain > 0:
                heap.append((-gain, jid))
        heapq.heapify(heap)
        finder = _Finder(ctx.view, ctx.rng)
        added = 0
        while heap:
            _, jid = heapq.heappop(heap)
            s = jobs[jid]
            need = s.job.task_resources
            if not cell.within(need, self.target if self.mode == "global-cap" else 1.0):
                # Past the target, or no room left in the whole cell: not for this job's
                # worker (a smaller one may still go).
                continue
            mid = finder.machine_for(s.job)
            if mid is None:
                continue  # nowhere to put one more of this job's workers this round
            if s.free_slots:
                index = s.free_slots.pop(0)
            else:
                index = s.next_index
                s.next_index += 1
                s.resized_to = s.next_index
            ctx.view.claim(s.job, index, mid)
            cell.take(s.job.task_resources)
            s.running += 1
            s.added += 1
            added += 1
            if s.running < s.limit:
                gain = self._gain(s, cell, ctx.now)
                if gain > 0:
                    heapq.heappush(heap, (-gain, jid))
        for jid, s in jobs.items():
            if s.added:  # predicted on from here with the workers claimed (the next
                # round counts again what actually runs)
                self.tracker.workers(jid, s.spec, s.running, ctx.now)
        return added

    def _gain(self, s: JobState, cell: _Cell, now: float) -> float:
        """Seconds the next worker brings the job's predicted finish forward, per unit
        of the cell a worker takes (its largest share of any resource)."""
        progress = self.tracker.progress(s.job.id, now)
        saved = (progress.seconds_left(s.spec, s.running)
                 - progress.seconds_left(s.spec, s.running + 1))
        return saved / cell.share(s.job.task_resources) if saved > 1e-9 else 0.0

    # -- reporting -------------------------------------------------------------------------

    def _account(self, ctx: Context, jobs: Mapping[str, JobState], cell: _Cell, added: int,
                 seconds: float) -> None:
        self._totals["proposals"] += 1
        self._totals["workers_added"] += added
        extra = 0
        grown = 0
        speedups: list[float] = []
        for jid in self.tracker.jobs():
            job = ctx.view.jobs.get(jid)
            spec = job.mapreduce if job is not None else None
            if spec is None:
                continue
            workers = self.tracker.running(jid)
            s = jobs.get(jid)
            if s is not None:
                workers = s.running
            if workers > spec.workers:
                extra += workers - spec.workers
                grown += 1
                self._grown.add(jid)
            speedups.append(self._predicted_speedup(jid, spec, workers, ctx.now))
        self._report = {
            **self._totals,
            "last_added": added,
            "last_round_ms": round(seconds * 1000, 3),
            "jobs_running": len(speedups),
            "jobs_grown": grown,
            "extra_workers": extra,
            "predicted_speedup_mean": round(sum(speedups) / len(speedups), 3) if speedups
            else 1.0,
            "predicted_speedup_max": round(max(speedups), 3) if speedups else 1.0,
            "utilization": round(cell.utilization(), 4),
        }

    def _predicted_speedup(self, jid: str, spec: MapReduceSpec, workers: int,
                           now: float) -> float:
        """The job's predicted run time with the workers it asked for, over its time so
        far plus what is left at ``workers``."""
        left = self.tracker.progress(jid, now).seconds_left(spec, workers)
        total = now - self.tracker.started(jid) + left
        return model.job_seconds(spec, spec.workers) / total if 0 < total < float("inf") \
            else 1.0

    def report(self) -> Mapping[str, float | int]:
        return self._report


class _Cell:
    """The cell's capacity and use of each resource, as a round takes room."""

    def __init__(self, capacity: dict[str, float], used: dict[str, float]) -> None:
        self.capacity = capacity
        self.used = used

    @classmethod
    def of(cls, view: CellView) -> _Cell:
        capacity: dict[str, list[float]] = {}
        used: dict[str, list[float]] = {}
        for m in view.machines():
            if m.state is not MachineState.UP:
                continue
            for name, amount in m.capacity.amounts:
                capacity.setdefault(name, []).append(amount)
            for name, amount in view.used(m.id).amounts:
                used.setdefault(name, []).append(amount)
        # fsum: the same total in whatever order the machines come (a map's order
        # follows the process's string hash), so the same decisions.
        return cls({n: math.fsum(v) for n, v in capacity.items()},
                   {n: math.fsum(v) for n, v in used.items()})

    def utilization(self) -> float:
        """The busiest dimension's share in use."""
        return max((self.used.get(n, 0.0) / c for n, c in self.capacity.items() if c),
                   default=0.0)

    def within(self, need: Resources, target: float) -> bool:
        """Whether taking ``need`` leaves every dimension at or below ``target``."""
        for name, amount in need.amounts:
            cap = self.capacity.get(name, 0.0)
            if cap <= 0 or (self.used.get(name, 0.0) + amount) / cap > target + 1e-12:
                return False
        return True

    def take(self, need: Resources) -> None:
        for name, amount in need.amounts:
            self.used[name] = self.used.get(name, 0.0) + amount

    def share(self, need: Resources) -> float:
        return max((a / self.capacity[n] for n, a in need.amounts
                    if self.capacity.get(n)), default=1.0) or 1.0


class _Finder:
    """Randomized first fit for one more worker, shared by the round's jobs. Jobs of
    one task shape and labels, without constraints of their own, fit on the same
    machines, so a machine ruled out for one is dropped for all of them for the rest of
    the round (room only shrinks within it); a job with constraints has its own list."""

    def __init__(self, view: CellView, rng: random.Random) -> None:
        self.view = view
        self.rng = rng
        self._lists: dict[object, list[str]] = {}

    def machine_for(self, job: Job) -> str | None:
        key: object = (job.id if job.constraints != Constraints()
                       else (job.task_resources, job.labels))
        candidates = self._lists.get(key)
        if candidates is None:
            candidates = self._lists[key] = self.view.machine_ids()
        while candidates:
            i = self.rng.randrange(len(candidates))
            m = self.view.machine(candidates[i])
            if m is not None and why_not(self.view, job, m) is None:
                return m.id
            candidates[i] = candidates[-1]
            candidates.pop()
        return None


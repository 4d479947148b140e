"""The metrics of a run, as Omega §4 defines them.

* job wait time: submission to the start of the job's first scheduling attempt, per
  job kind (mean and 90th percentile);
* scheduler busyness: the fraction of time a scheduler spends deciding, per day (one
  value per ``day`` of the run, averaged over the scheduler's instances), reported as
  the median over days with the median absolute deviation. Attempts that placed
  nothing count too;
* conflict fraction: conflicted transactions per successful transaction (may exceed
  1); wasted busyness is the part of busyness spent on attempts that conflicted;
* jobs abandoned, jobs left unscheduled at the end, utilization sampled over time.

And what Firmament §7 measures (``Placements``), over the jobs submitted after the
``warmup``:

* placement latency: a task's submission to the commit that first placed it (a task
  placed again after a preemption, or moved, is not counted again);
* job response time: submission to the end of the job's last task (placement latency
  plus run time), for jobs whose tasks all got placed;
* data locality: of the data the placed tasks read, the fraction held on the machine
  they run on (local) and in its rack (rack-local, local included). A task reads an
  even share of every block of its job's input (the flow network's view: a job's
  waiting tasks are one node); the *ceiling* is what the tasks would read locally on
  the machine (rack) holding most of their job's input, capacity aside;
* load spread: at each utilization sample after the warmup, the coefficient of
  variation (standard deviation / mean) and the max / mean of the machines' CPU use;
* each flow scheduler's rounds: the time of their parts and the network's size.

And what Cook measures (``Usage``, ``JobOutcome``), for the jobs submitted after the
warmup:

* job completion time: submission to the end of the job's last task, however often
  its tasks were preempted and run again (each run starts from scratch);
* effective utilization over time: the CPU of the runs that finished, each counted
  over the time from its start to its end, in the time buckets it covered; a run that
  was preempted counts nothing. Raw utilization counts every run, preempted or not;
* preempted runs and the CPU time they lost.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import attrs

from cellstate.model import CommitResult, Job
from schedulers.metrics import percentile, tally


@attrs.define
class SchedulerStats:
    instances: int
    busy: dict[int, float] = attrs.field(factory=dict)  # day -> seconds deciding
    wasted: dict[int, float] = attrs.field(factory=dict)
    attempts: int = 0
    transactions: int = 0
    successful: int = 0
    conflicted: int = 0
    tasks_placed: int = 0
    fell_back: int = 0  # claims committed on one of their fallback machines
    # Measured decision time (CPU seconds the policy ran), the model's time for the
    # same attempts, and the tasks they tried (with measure_decisions).
    measured_s: float = 0.0
    model_s: float = 0.0
    tried: int = 0
    timed: int = 0  # attempts timed


def _sqrt_of_fraction(x: Fraction) -> float:
    """The square root of ``x`` >= 0, correctly rounded to a float (as
    ``statistics.pstdev`` rounds it since Python 3.11)."""
    num, den = x.numerator, x.denominator
    # Scale so the integer root has at least 55 bits, then set its last bit if the root
    # is inexact: rounding that integer to a float's 53 bits rounds the true root.
    shift = max(0, 112 - num.bit_length() + den.bit_length())
    shift += shift & 1  # even: the root scales by 2 ** (shift / 2)
    scaled = num << shift
    root = math.isqrt(scaled // den)
    root |= root * root * den != scaled
    return root / (1 << (shift // 2))


def median_abs_deviation(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values)


def quantiles(values: Sequence[float], points: int = 101) -> list[float]:
    """``points`` evenly spaced quantiles from 0 to 1 (linear interpolation), for a
    CDF; an empty list when there are no values."""
    if not values:
        return []
    ordered = sorted(values)
    out = []
    for i in range(points):
        pos = i / (points - 1) * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out


@attrs.define
class Placements:
    latencies: list[float] = attrs.field(factory=list)
    responses: list[float] = attrs.field(factory=list)
    runtimes: list[float] = attrs.field(factory=list)  # of the jobs in ``responses``
    data: float = 0.0  # GB the placed tasks read
    local: float = 0.0  # of which on their machine
    rack_local: float = 0.0  # of which in their rack (local included)
    best_local: float = 0.0  # what they would read locally on the best machine
    best_rack_local: float = 0.0  # and in the best rack
    input_tasks: int = 0
    spread_cv: list[float] = attrs.field(factory=list)
    spread_max: list[float] = attrs.field(factory=list)


@attrs.define
class Rounds:
    """A flow scheduler's rounds, wall-clock seconds of each part."""

    update: list[float] = attrs.field(factory=list)
    solve: list[float] = attrs.field(factory=list)
    extract: list[float] = attrs.field(factory=list)
    arcs: list[int] = attrs.field(factory=list)
    nodes: list[int] = attrs.field(factory=list)
    placed: int = 0
    migrated: int = 0
    preempted: int = 0
    repaired: int = 0


@attrs.define
class JobOutcome:
    """One job's fate: ``completion`` is submission to the end of its last task (None
    if it did not finish); ``preempted`` counts its tasks' runs that were preempted."""

    job: str
    cls: str
    owner: str
    submitted: float
    completion: float | None = None
    preempted: int = 0


class Usage:
    """CPU-seconds of task runs per time bucket of ``width`` seconds up to ``until``:
    every run (raw), and the runs that finished (effective)."""

    def __init__(self, width: float, until: float) -> None:
        self.width = width
        self.until = until
        n = max(1, math.ceil(until / width - 1e-9))
        self.raw = [0.0] * n
        self.effective = [0.0] * n

    def add(self, cpu: float, start: float, end: float, effective: bool,
            runs: int = 1) -> None:
        """``runs`` runs alike (the tasks of one commit end together): each bucket
        takes each run's amount in turn, the same float additions as one call each."""
        end = min(end, self.until)
        last = len(self.raw) - 1
        t = start
        # Bucket by bucket, moving on one bucket each time: float rounding can make a
        # bucket's computed end equal the time already reached, which must not stall.
        width, raw, done = self.width, self.raw, self.effective
        i = max(0, min(int(t // width), last))
        # Called for every run that ends: locals and no min() calls (the same floats).
        while t < end and i <= last:
            if i == last:
                stop = end
            else:
                stop = (i + 1) * width
                if end <= stop:
                    stop = end
            if stop > t:
                amount = cpu * (stop - t)
                if runs == 1:
                    raw[i] += amount
                    if effective:
                        done[i] += amount
                else:
                    x = raw[i]
                    for _ in range(runs):
                        x += amount
                    raw[i] = x
                    if effective:
                        x = done[i]
                        for _ in range(runs):
                            x += amount
                        done[i] = x
                t = stop
            i += 1

    def series(self, capacity: float) -> dict[str, list[float]]:
        """Each bucket's utilization: CPU-seconds over the CPU-seconds it had."""
        out: dict[str, list[float]] = {"t": [], "effective": [], "raw": []}
        for i, (raw, eff) in enumerate(zip(self.raw, self.effective, strict=True)):
            length = min(self.width, self.until - i * self.width)
            denom = capacity * length if length > 0 and capacity > 0 else 1.0
            out["t"].append(i * self.width)
            out["raw"].append(raw / denom)
            out["effective"].append(eff / denom)
        return out

    def mean(self, capacity: float, since: float, effective: bool) -> float:
        """Utilization from ``since`` to the end, as a whole (buckets by their length)."""
        values = self.effective if effective else self.raw
        total = span = 0.0
        for i, v in enumerate(values):
            lo, hi = i * self.width, min((i + 1) * self.width, self.until)
            if hi <= since:
                continue
            # A bucket the warmup cuts counts in proportion (its CPU spread evenly).
            part = (hi - max(lo, since)) / (hi - lo)
            total += v * part
            span += hi - max(lo, since)
        return total / (capacity * span) if span > 0 and capacity > 0 else 0.0


class Recorder:
    def __init__(self, horizon: float, day: float, warmup: float = 0.0) -> None:
        self.horizon = horizon
        self.day = day
        self.days = max(1, math.ceil(horizon / day - 1e-9))
        self.schedulers: dict[str, SchedulerStats] = {}
        self.waits: dict[str, list[float]] = {}
        self.seen: set[str] = set()
        self.abandoned: dict[str, int] = {}
        self.submitted: dict[str, int] = {}
        self.utilization: list[tuple[float, float, float]] = []
        self.warmup = warmup
        self.placements = Placements()
        self.rounds: dict[str, Rounds] = {}
        # Per-job values of other parts of a run (a MapReduce job's speedup), by name.
        self.values: dict[str, list[float]] = {}
        self.outcomes: dict[str, JobOutcome] = {}  # Cook's measures, by job
        self.usage: Usage | None = None
        self.cpu_capacity = 0.0
        self.lost_cpu_s = 0.0  # CPU time of preempted runs (after the warmup)
        # Machine failures (SimConfig.failures), counted from the warmup on: failures,
        # the runs they cut short and the CPU time those runs had done.
        self.failures = 0  # failure events (a machine, rack or failure domain each)
        self.failed_machines = 0
        self.failed_runs = 0
        self.failed_cpu_s = 0.0
        self.preemptions: dict[str, int] = {}  # class -> runs its tasks preempted

    # -- Cook's measures --------------------------------------------------------------------

    def track_usage(self, width: float, cpu_capacity: float) -> None:
        """Integrate task runs' CPU over buckets of ``width`` up to the horizon."""
        self.usage = Usage(width, self.horizon)
        self.cpu_capacity = cpu_capacity

    def job_submitted(self, job: Job, cls: str) -> None:
        if self.measured(job):
            self.outcomes[job.id] = JobOutcome(job.id, cls, job.owner, job.submitted_at)

    def run_ended(self, job_id: str, cpu: float, start: float, end: float,
                  preempted_by: str = "") -> None:
        """A run of one task ended: finished, or preempted by a task of a job of class
        ``preempted_by`` (its work lost)."""
        if self.usage is not None:
            self.usage.add(cpu, start, end, effective=not preempted_by)
        if preempted_by:
            if end > self.warmup:
                self.lost_cpu_s += self._measured_cpu_s(cpu, start, end)
                self.preemptions[preempted_by] = self.preemptions.get(preempted_by, 0) + 1
            outcome = self.outcomes.get(job_id)
            if outcome is not None:
                outcome.preempted += 1

    def machine_failed(self, at: float, runs: Sequence[tuple[float, float]],
                       machines: int = 1) -> None:
        """``machines`` failed together at ``at``, ending ``runs`` (start, CPU): their
        work is lost (not effective utilization) and counted apart from preemptions."""
        for start, cpu in runs:
            if self.usage is not None:
                self.usage.add(cpu, start, at, effective=False)
            if at > self.warmup:
                self.failed_cpu_s += self._measured_cpu_s(cpu, start, at)
        if at > self.warmup:
            self.failures += 1
            self.failed_machines += machines
            self.failed_runs += len(runs)

    def _measured_cpu_s(self, cpu: float, start: float, end: float) -> float:
        """CPU-seconds of a run from ``start`` to ``end`` inside the measured window
        (after warm-up, before the horizon); none for a run wholly outside it (one that
        starts after the horizon, which only a drain runs)."""
        return cpu * max(min(end, self.horizon) - max(start, self.warmup), 0.0)

    def failure_summary(self, out: dict[str, Any]) -> None:
        out["failures"] = self.failures
        out["machine_failures"] = self.failed_machines
        out["runs_lost_to_failures"] = self.failed_runs
        out["cpu_hours_lost_to_failures"] = self.failed_cpu_s / 3600

    def add_runs(self, runs: Sequence[tuple[float, float]], end: float,
                 finished: bool = True) -> None:
        """Runs (start, CPU) that finished at ``end`` (not ``finished``: that were
        still going when the simulation stopped), in order: what ``run_ended`` adds
        to the usage buckets for each, runs alike (the tasks of one commit) at once."""
        if self.usage is None:
            return
        n = len(runs)
        i = 0
        while i < n:
            run = runs[i]
            j = i + 1
            while j < n and runs[j] == run:
                j += 1
            self.usage.add(run[1], run[0], end, finished, j - i)
            i = j

    def job_completed(self, job_id: str, at: float) -> None:
        outcome = self.outcomes.get(job_id)
        if outcome is not None and outcome.completion is None:
            outcome.completion = at - outcome.submitted

    def series(self) -> dict[str, list[float]]:
        """Effective and raw CPU utilization per bucket (``t``: each bucket's start)."""
        return self.usage.series(self.cpu_capacity) if self.usage is not None else {}

    def _cook_summary(self, out: dict[str, Any]) -> None:
        by_cls: dict[str, list[JobOutcome]] = {}
        for o in self.outcomes.values():
            by_cls.setdefault(o.cls, []).append(o)
        for cls, outcomes in sorted(by_cls.items()):
            done = [o.completion for o in outcomes if o.completion is not None]
            out[f"{cls}_completed"] = len(done)
            out[f"{cls}_completion_mean_s"] = statistics.fmean(done) if done else 0.0
            for q in (50, 90):
                out[f"{cls}_completion_p{q}_s"] = percentile(done, q / 100)
            out[f"{cls}_preempted_runs"] = sum(o.preempted for o in outcomes)
            out[f"{cls}_jobs_preempted"] = sum(1 for o in outcomes if o.preempted)
            out[f"{cls}_preemptions"] = self.preemptions.get(cls, 0)
        if self.usage is not None:
            cap = self.cpu_capacity
            out["effective_utilization_mean"] = self.usage.mean(cap, self.warmup, True)
            out["raw_utilization_mean"] = self.usage.mean(cap, self.warmup, False)
            out["lost_cpu_hours"] = self.lost_cpu_s / 3600

    def scheduler(self, name: str, instances: int) -> None:
        self.schedulers[name] = SchedulerStats(instances)

    def submitted_job(self, job: Job) -> None:
        k = job.kind.value
        self.submitted[k] = self.submitted.get(k, 0) + 1

    def started(self, jobs: Sequence[Job], at: float) -> None:
        """An attempt began at ``at``: the first one of a job ends its wait."""
        for j in jobs:
            if j.id not in self.seen:
                self.seen.add(j.id)
                self.waits.setdefault(j.kind.value, []).append(max(at - j.submitted_at, 0.0))

    def unmeasured(self, job_id: str) -> None:
        """A job of the prefill: it waits for no attempt (it was placed at time 0), so a
        later one (placing tasks a failure lost, or a flow scheduler moving its tasks)
        is not its first."""
        self.seen.add(job_id)

    def forget(self, job_id: str) -> None:
        self.seen.discard(job_id)

    def attempt(self, scheduler: str, start: float, cost: float,
                results: Mapping[str, CommitResult]) -> None:
        """An attempt that decided from ``start`` for ``cost`` seconds and committed."""
        s = self.schedulers[scheduler]
        s.attempts += 1
        t = tally(results.values())
        s.transactions += t.transactions
        s.tasks_placed += t.placed
        s.fell_back += t.fell_back
        s.conflicted += t.conflicted
        s.successful += t.successful
        self._busy(s.busy, start, cost)
        if t.conflicted:
            self._busy(s.wasted, start, cost)

    def decision(self, scheduler: str, measured: float, model: float, tried: int) -> None:
        """One decision's measured time and the model's for it (``tried`` tasks)."""
        s = self.schedulers[scheduler]
        s.measured_s += measured
        s.model_s += model
        s.tried += tried
        s.timed += 1

    def _busy(self, into: dict[int, float], start: float, cost: float) -> None:
        # Split over day boundaries; time past the horizon is not part of the run.
        t, end = start, min(start + cost, self.horizon)
        while t < end:
            d = int(t // self.day)
            stop = min(end, (d + 1) * self.day)
            into[d] = into.get(d, 0.0) + stop - t
            t = stop

    def abandoned_job(self, job: Job) -> None:
        k = job.kind.value
        self.abandoned[k] = self.abandoned.get(k, 0) + 1

    def sample(self, t: float, cpu: float, mem: float) -> None:
        self.utilization.append((t, cpu, mem))

    def value(self, name: str, value: float) -> None:
        """One more value of distribution ``name`` (kept for its CDF)."""
        self.values.setdefault(name, []).append(value)

    # -- Firmament's measures ---------------------------------------------------------------

    def measured(self, job: Job) -> bool:
        """Whether ``job`` counts for the placement measures (submitted after warmup)."""
        return job.submitted_at >= self.warmup

    def placed(self, job: Job, at: float) -> None:
        """A task of ``job`` was placed for the first time at ``at``."""
        self.placements.latencies.append(max(at - job.submitted_at, 0.0))

    def read(self, data: float, local: float, rack_local: float, best_local: float,
             best_rack_local: float) -> None:
        """A placed task reads ``data`` GB, ``local`` of it on its machine and
        ``rack_local`` in its rack; on the machine (rack) holding most of its job's
        input it would read ``best_local`` (``best_rack_local``)."""
        p = self.placements
        p.input_tasks += 1
        p.data += data
        p.local += local
        p.rack_local += rack_local
        p.best_local += best_local
        p.best_rack_local += best_rack_local

    def job_response(self, seconds: float, runtime: float) -> None:
        """A job's response time, and how long its tasks run (an ideal scheduler's
        response time)."""
        self.placements.responses.append(seconds)
        self.placements.runtimes.append(runtime)

    def spread(self, t: float, used: Sequence[float]) -> None:
        """Machines' utilization (0..1) at ``t``."""
        self.spread_counts(t, Counter(used))

    def spread_counts(self, t: float, counts: Mapping[float, int]) -> None:
        """Machines' utilization (0..1) at ``t``, as how many machines are at each
        value: a cell of thousands of machines has a few distinct values, so this costs
        O(values), not O(machines). The figures are exactly ``statistics.fmean`` and
        ``statistics.pstdev(used, mean)`` of the machines' values (both exact sums,
        rounded once: tests/simulator/test_recorder_spread.py)."""
        n = sum(counts.values())
        if t < self.warmup or not n:
            return
        mean = float(sum(Fraction(v) * c for v, c in counts.items() if c)) / n
        if mean <= 0:
            return
        squares = sum((Fraction((d := v - mean) * d) * c for v, c in counts.items() if c),
                      Fraction(0))
        self.placements.spread_cv.append(_sqrt_of_fraction(squares / n) / mean)
        self.placements.spread_max.append(max(v for v, c in counts.items() if c) / mean)

    def flow_round(self, scheduler: str, update: float, solve: float, extract: float,
                   nodes: int, arcs: int, placed: int, migrated: int, preempted: int,
                   repaired: int) -> None:
        r = self.rounds.setdefault(scheduler, Rounds())
        r.update.append(update)
        r.solve.append(solve)
        r.extract.append(extract)
        r.nodes.append(nodes)
        r.arcs.append(arcs)
        r.placed += placed
        r.migrated += migrated
        r.preempted += preempted
        r.repaired += repaired

    def distributions(self) -> dict[str, list[float]]:
        """CDFs (101 quantiles) of the distributions the placement measures keep."""
        out = {"placement_latency_s": quantiles(self.placements.latencies),
               "job_response_s": quantiles(self.placements.responses)}
        out.update((name, quantiles(v)) for name, v in sorted(self.values.items()))
        for name, r in sorted(self.rounds.items()):
            out[f"{name}_solve_s"] = quantiles(r.solve)
            out[f"{name}_round_s"] = quantiles(
                [a + b + c for a, b, c in zip(r.update, r.solve, r.extract, strict=True)])
        return out

    def _placement_summary(self, out: dict[str, Any]) -> None:
        p = self.placements
        lat = quantiles(p.latencies)
        out["tasks_measured"] = len(p.latencies)
        out["placement_latency_mean_s"] = statistics.fmean(p.latencies) if lat else 0.0
        for q in (50, 90, 99):
            out[f"placement_latency_p{q}_s"] = lat[q] if lat else 0.0
        out["placement_latency_max_s"] = lat[-1] if lat else 0.0
        resp = quantiles(p.responses)
        out["jobs_measured"] = len(p.responses)
        out["job_response_mean_s"] = statistics.fmean(p.responses) if resp else 0.0
        out["job_runtime_mean_s"] = statistics.fmean(p.runtimes) if p.runtimes else 0.0
        for q in (50, 99):
            out[f"job_response_p{q}_s"] = resp[q] if resp else 0.0
        out["input_tasks"] = p.input_tasks
        out["data_read_gb"] = p.data
        out["data_local_fraction"] = p.local / p.data if p.data else 0.0
        out["data_rack_local_fraction"] = p.rack_local / p.data if p.data else 0.0
        out["data_local_ceiling"] = p.best_local / p.data if p.data else 0.0
        out["data_rack_local_ceiling"] = p.best_rack_local / p.data if p.data else 0.0
        out["load_cv_mean"] = statistics.fmean(p.spread_cv) if p.spread_cv else 0.0
        out["load_max_over_mean"] = statistics.fmean(p.spread_max) if p.spread_max else 0.0
        for name, r in sorted(self.rounds.items()):
            total = [a + b + c for a, b, c in zip(r.update, r.solve, r.extract, strict=True)]
            solve = quantiles(r.solve)
            rnd = quantiles(total)
            out[f"{name}_rounds"] = len(r.solve)
            out[f"{name}_round_mean_s"] = statistics.fmean(total) if total else 0.0
            out[f"{name}_round_p50_s"] = rnd[50] if rnd else 0.0
            out[f"{name}_round_p99_s"] = rnd[99] if rnd else 0.0
            out[f"{name}_update_mean_s"] = statistics.fmean(r.update) if r.update else 0.0
            out[f"{name}_solve_mean_s"] = statistics.fmean(r.solve) if r.solve else 0.0
            out[f"{name}_solve_p50_s"] = solve[50] if solve else 0.0
            out[f"{name}_solve_p99_s"] = solve[99] if solve else 0.0
            out[f"{name}_solve_max_s"] = solve[-1] if solve else 0.0
            out[f"{name}_extract_mean_s"] = statistics.fmean(r.extract) if r.extract else 0.0
            out[f"{name}_arcs_mean"] = statistics.fmean(r.arcs) if r.arcs else 0.0
            out[f"{name}_arcs_max"] = max(r.arcs, default=0)
            out[f"{name}_nodes_mean"] = statistics.fmean(r.nodes) if r.nodes else 0.0
            out[f"{name}_round_placements"] = r.placed
            out[f"{name}_migrated"] = r.migrated
            out[f"{name}_preempted"] = r.preempted
            out[f"{name}_repaired"] = r.repaired

    def daily(self, name: str, wasted: bool = False, no_conflict: bool = False
              ) -> list[float]:
        """Busyness per day; ``wasted``: only attempts that conflicted;
        ``no_conflict``: only those that did not (Omega Fig. 12c's "no conflicts")."""
        s = self.schedulers[name]
        out = []
        for d in range(self.days):
            length = min(self.day, self.horizon - d * self.day)
            busy = s.busy.get(d, 0.0)
            if wasted:
                busy = s.wasted.get(d, 0.0)
            elif no_conflict:
                busy = max(0.0, busy - s.wasted.get(d, 0.0))
            out.append(busy / (length * s.instances) if length > 0 else 0.0)
        return out

    def summary(self, unscheduled: Mapping[str, int]) -> dict[str, Any]:
        kinds = sorted(set(self.submitted) | set(self.waits))
        out: dict[str, Any] = {}
        for k in kinds:
            w = self.waits.get(k, [])
            out[f"{k}_jobs"] = self.submitted.get(k, 0)
            out[f"{k}_wait_mean_s"] = statistics.fmean(w) if w else 0.0
            out[f"{k}_wait_p90_s"] = percentile(w, 0.9)
            out[f"{k}_abandoned"] = self.abandoned.get(k, 0)
            out[f"{k}_unscheduled"] = unscheduled.get(k, 0)
        for name, s in sorted(self.schedulers.items()):
            days = self.daily(name)
            wasted = self.daily(name, wasted=True)
            out[f"{name}_busyness"] = statistics.median(days)
            out[f"{name}_busyness_mad"] = median_abs_deviation(days)
            out[f"{name}_busyness_wasted"] = statistics.median(wasted)
            out[f"{name}_busyness_no_conflict"] = statistics.median(
                self.daily(name, no_conflict=True))
            if s.timed:
                out[f"{name}_decision_measured_mean_s"] = s.measured_s / s.timed
                out[f"{name}_decision_model_mean_s"] = s.model_s / s.timed
                out[f"{name}_decision_measured_per_task_s"] = (
                    s.measured_s / s.tried if s.tried else 0.0)
                out[f"{name}_decision_model_per_task_s"] = (
                    s.model_s / s.tried if s.tried else 0.0)
            out[f"{name}_conflict_fraction"] = (
                s.conflicted / s.successful if s.successful else float(s.conflicted))
            out[f"{name}_transactions"] = s.transactions
            out[f"{name}_conflicted"] = s.conflicted
            out[f"{name}_successful"] = s.successful
            out[f"{name}_attempts"] = s.attempts
            out[f"{name}_tasks_placed"] = s.tasks_placed
            out[f"{name}_fallbacks_taken"] = s.fell_back
        if self.utilization:
            out["cpu_utilization_mean"] = statistics.fmean(u[1] for u in self.utilization)
            late = [u[1] for u in self.utilization if u[0] >= self.warmup]
            out["cpu_utilization_measured"] = statistics.fmean(late) if late else 0.0
        self._placement_summary(out)
        self._cook_summary(out)
        return out

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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
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


class Recorder:
    def __init__(self, horizon: float, day: float) -> None:
        self.horizon = horizon
        self.day = day
        self.days = max(1, math.ceil(horizon / day - 1e-9))
        self.schedulers: dict[str, SchedulerStats] = {}
        self.waits: dict[str, list[float]] = {}
        self.seen: set[str] = set()
        self.abandoned: dict[str, int] = {}
        self.submitted: dict[str, int] = {}
        self.utilization: list[tuple[float, float, float]] = []
        # Per-job values of other parts of a run (a MapReduce job's speedup), by name.
        self.values: dict[str, list[float]] = {}

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

    def distributions(self) -> dict[str, list[float]]:
        """CDFs (101 quantiles) of every distribution recorded."""
        return {name: quantiles(v) for name, v in sorted(self.values.items())}

    def daily(self, name: str, wasted: bool = False) -> list[float]:
        s = self.schedulers[name]
        table = s.wasted if wasted else s.busy
        out = []
        for d in range(self.days):
            length = min(self.day, self.horizon - d * self.day)
            out.append(table.get(d, 0.0) / (length * s.instances) if length > 0 else 0.0)
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
        return out

"""Per-job speedups between two runs of the same workload (Cook's Figure 1).

Two runs with the same seed and workload submit the same jobs (same ids, times and
shapes: each class draws from its own random stream, whatever the schedulers do). A
job's speedup is its completion time in one run over that in the baseline run, as
Cook divides "the time with preemption by the time without": below 1 the job finished
sooner than in the baseline (Cook calls such jobs "sped up"), above 1 later. Jobs that
did not complete in both runs are not paired; they are counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from simulator.recorder import JobOutcome, quantiles


@attrs.frozen
class Speedup:
    job: str
    cls: str
    owner: str
    time: float  # completion time in the run
    baseline: float  # and in the baseline run

    @property
    def ratio(self) -> float:
        if self.baseline > 0:
            return self.time / self.baseline
        return 1.0 if self.time == 0 else math.inf


def pair_jobs(run: Sequence[JobOutcome], baseline: Sequence[JobOutcome]
              ) -> tuple[list[Speedup], int]:
    """The speedups of the jobs that completed in both runs, in job order, and how
    many jobs of either run could not be paired (not completed in one, or absent)."""
    base = {o.job: o for o in baseline}
    out: list[Speedup] = []
    seen: set[str] = set()
    for o in run:
        seen.add(o.job)
        b = base.get(o.job)
        if b is None or o.completion is None or b.completion is None:
            continue
        out.append(Speedup(o.job, o.cls, o.owner, o.completion, b.completion))
    unpaired = len(set(base) | seen) - len(out)
    return sorted(out, key=lambda s: s.job), unpaired


def summarize(speedups: Sequence[Speedup], unpaired: int, tolerance: float
              ) -> dict[str, Any]:
    """Fractions of paired jobs faster (ratio below 1 - tolerance), slower (above
    1 + tolerance) and unchanged, overall and per class; the ratios' quantiles."""
    out: dict[str, Any] = {"jobs_paired": len(speedups), "jobs_unpaired": unpaired}
    _fractions(out, "", speedups, tolerance)
    for cls in sorted({s.cls for s in speedups}):
        mine = [s for s in speedups if s.cls == cls]
        out[f"{cls}_paired"] = len(mine)
        _fractions(out, f"{cls}_", mine, tolerance)
    return out


def _fractions(out: dict[str, Any], prefix: str, speedups: Sequence[Speedup],
               tolerance: float) -> None:
    n = len(speedups)
    faster = sum(1 for s in speedups if s.ratio < 1 - tolerance)
    slower = sum(1 for s in speedups if s.ratio > 1 + tolerance)
    out[f"{prefix}faster_fraction"] = faster / n if n else 0.0
    out[f"{prefix}slower_fraction"] = slower / n if n else 0.0
    out[f"{prefix}unchanged_fraction"] = (n - faster - slower) / n if n else 0.0
    ratios = [s.ratio for s in speedups]
    qs = quantiles(ratios)
    for q in (10, 50, 90):
        out[f"{prefix}speedup_p{q}"] = qs[q] if qs else 1.0
    # The geometric mean: a job twice as fast and one twice as slow cancel out.
    finite = [r for r in ratios if 0 < r < math.inf]
    out[f"{prefix}speedup_geomean"] = (math.exp(sum(map(math.log, finite)) / len(finite))
                                       if finite else 1.0)


def pairs(points: Sequence[Mapping[str, Any]], axis: str, baseline: Any
          ) -> list[tuple[int, int]]:
    """(run, baseline run) indexes: every run off the baseline, with the baseline run
    that has the same values on every other axis (runs with none are left out)."""
    def rest(p: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in p.items() if k != axis))

    bases = {rest(p): i for i, p in enumerate(points) if p.get(axis) == baseline}
    return [(i, bases[rest(p)]) for i, p in enumerate(points)
            if p.get(axis) != baseline and rest(p) in bases]

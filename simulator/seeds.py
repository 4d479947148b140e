"""Runs of several seeds per sweep point, summarized: the mean of a metric over the
seeds and its 95% confidence interval (Student's t, the seeds taken as independent
samples), and sums of counts (the conflicts behind a point)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

# Student's t, two-sided 95%, by degrees of freedom (1..30); beyond, the normal's.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a confidence interval needs at least two samples")
    return _T975[df - 1] if df <= len(_T975) else 1.960


@attrs.frozen
class Estimate:
    """The mean of ``n`` samples and the half-width of its 95% interval (0 for one
    sample: no interval)."""

    mean: float
    half: float
    n: int

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.mean:.3g}"
        # Rounding leaves 1e-16 where every seed agrees: that is no spread at all.
        half = self.half if self.half > 1e-9 * max(1.0, abs(self.mean)) else 0.0
        return f"{self.mean:.3g} ± {half:.2g}"


def estimate(values: Sequence[float]) -> Estimate:
    if not values:
        raise ValueError("no samples")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Estimate(mean, 0.0, 1)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, half, len(values))


def by_point(rows: Sequence[Mapping[str, Any]], axes: Sequence[str], seed_axis: str = "seed"
             ) -> dict[tuple[Any, ...], list[Mapping[str, Any]]]:
    """Rows grouped by their values on ``axes`` other than ``seed_axis``, in the order
    the points first appear."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        key = tuple(row[a] for a in axes if a != seed_axis)
        groups.setdefault(key, []).append(row)
    return groups

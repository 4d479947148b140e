"""The metrics every scheduler instance keeps, named as in Omega §4.

* job wait time: submission to the start of the job's first scheduling attempt;
* scheduler busyness: the fraction of time spent deciding, split into useful time and
  time wasted on decisions whose transaction conflicted;
* conflict fraction: conflicted transactions per successful one (may exceed 1);
* attempts per job, decision time, tasks placed per second, jobs abandoned.

A transaction is *conflicted* when any of its claims was rejected for a reason that
another scheduler caused (sequence changed, insufficient resources, machine down,
task already placed, gang aborted); *successful* when it committed every claim.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

import attrs

from cellstate.model import CommitResult, Reason

CONFLICT_REASONS = frozenset({
    Reason.SEQUENCE_CHANGED,
    Reason.INSUFFICIENT_RESOURCES,
    Reason.MACHINE_DOWN,
    Reason.TASK_ALREADY_PLACED,
    Reason.GANG_ABORTED,
    Reason.CONSTRAINT_VIOLATED,
})


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@attrs.frozen
class TxnTally:
    """How one attempt's transactions went, counted as Omega counts them."""

    transactions: int = 0
    placed: int = 0
    conflicted: int = 0  # transactions with at least one claim lost to a conflict
    successful: int = 0  # transactions that committed every claim
    fell_back: int = 0  # claims committed on one of their fallback machines


def tally(results: Iterable[CommitResult]) -> TxnTally:
    transactions = placed = conflicted = successful = fell_back = 0
    for res in results:
        transactions += 1
        placed += len(res.committed)
        fell_back += len(res.fell_back)
        if any(r.reason in CONFLICT_REASONS for r in res.rejected):
            conflicted += 1
        elif not res.rejected:
            successful += 1
    return TxnTally(transactions, placed, conflicted, successful, fell_back)


@attrs.define
class SchedulerMetrics:
    scheduler: str
    instance: str
    started_at: float
    wait_times: list[float] = attrs.field(factory=list)
    decision_times: list[float] = attrs.field(factory=list)
    busy_useful: float = 0.0
    busy_wasted: float = 0.0
    transactions: int = 0
    successful: int = 0
    conflicted: int = 0
    tasks_placed: int = 0
    jobs_abandoned: int = 0
    jobs_held: int = 0  # jobs held back by the scheduler's limits (again after an attempt)
    attempts: dict[str, int] = attrs.field(factory=dict)
    rejected: dict[str, int] = attrs.field(factory=dict)  # claims turned down, by reason

    def record_wait(self, wait: float) -> None:
        self.wait_times.append(max(wait, 0.0))

    def record_decision(self, job_ids: list[str], seconds: float,
                        results: list[CommitResult]) -> None:
        """One scheduling attempt: its decision time and the transactions it sent."""
        self.decision_times.append(seconds)
        for j in job_ids:
            self.attempts[j] = self.attempts.get(j, 0) + 1
        t = tally(results)
        for res in results:
            for r in res.rejected:
                self.rejected[r.reason.value] = self.rejected.get(r.reason.value, 0) + 1
        self.transactions += t.transactions
        self.tasks_placed += t.placed
        self.conflicted += t.conflicted
        self.successful += t.successful
        if t.conflicted:
            self.busy_wasted += seconds
        else:
            self.busy_useful += seconds

    def jobs_attempted(self) -> int:
        return len(self.attempts)

    def conflict_fraction(self) -> float:
        return self.conflicted / self.successful if self.successful else float(self.conflicted)

    def busyness(self, now: float) -> float:
        elapsed = now - self.started_at
        return (self.busy_useful + self.busy_wasted) / elapsed if elapsed > 0 else 0.0

    def summary(self, now: float) -> dict[str, Any]:
        elapsed = max(now - self.started_at, 1e-9)
        attempts = list(self.attempts.values())
        return {
            "scheduler": self.scheduler,
            "instance": self.instance,
            "jobs_attempted": len(self.attempts),
            "wait_mean_s": statistics.fmean(self.wait_times) if self.wait_times else 0.0,
            "wait_p90_s": percentile(self.wait_times, 0.9),
            "busyness": self.busyness(now),
            "busy_useful_s": self.busy_useful,
            "busy_wasted_s": self.busy_wasted,
            "transactions": self.transactions,
            "successful": self.successful,
            "conflicted": self.conflicted,
            "conflict_fraction": self.conflict_fraction(),
            "attempts_per_job": statistics.fmean(attempts) if attempts else 0.0,
            "decision_mean_s": (statistics.fmean(self.decision_times)
                                if self.decision_times else 0.0),
            "tasks_placed": self.tasks_placed,
            "tasks_per_second": self.tasks_placed / elapsed,
            "jobs_abandoned": self.jobs_abandoned,
            "jobs_held": self.jobs_held,
        }

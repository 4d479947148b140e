"""A scheduler instance's metrics for Prometheus, read from the instance when scraped
(``omega scheduler ... --metrics HOST:PORT``): Omega's metrics (busyness useful and
wasted, conflict fraction, job wait time, attempts per job, decision time), claims
rejected at commit by reason, queue depth and the replica's lag. Names are listed in
docs/operations.md, "Metrics"."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from cellstate.model import Reason
from cellstate.replica import Replica
from schedulers.runtime import SchedulerInstance


class SchedulerCollector(Collector):
    def __init__(self, inst: SchedulerInstance, replica: Replica | None = None) -> None:
        self.inst = inst
        self.replica = replica

    def collect(self) -> Iterator[Metric]:
        inst, m = self.inst, self.inst.metrics
        who = [inst.scheduler, inst.instance]
        labels = ["scheduler", "instance"]
        busy = CounterMetricFamily("omega_scheduler_busy_seconds",
                                   "Time spent deciding: useful (the transaction committed "
                                   "without conflict) or wasted (it conflicted)",
                                   labels=[*labels, "kind"])
        busy.add_metric([*who, "useful"], m.busy_useful)
        busy.add_metric([*who, "wasted"], m.busy_wasted)
        yield busy
        yield _gauge("omega_scheduler_busyness", "Fraction of time spent deciding", labels,
                     who, m.busyness(time.time()))
        yield _gauge("omega_scheduler_conflict_fraction",
                     "Conflicted transactions per successful one", labels, who,
                     m.conflict_fraction())
        txns = CounterMetricFamily("omega_scheduler_transactions",
                                   "Transactions sent, by outcome", labels=[*labels, "outcome"])
        txns.add_metric([*who, "successful"], m.successful)
        txns.add_metric([*who, "conflicted"], m.conflicted)
        txns.add_metric([*who, "other"], m.transactions - m.successful - m.conflicted)
        yield txns
        rejected = CounterMetricFamily("omega_scheduler_claims_rejected",
                                       "Claims the store turned down, by reason",
                                       labels=[*labels, "reason"])
        # Every reason from the start, at 0: a rate over a series that appears only at
        # its first rejection misses that rejection.
        counts = {r.value: 0 for r in Reason} | dict(m.rejected)
        for reason, n in sorted(counts.items()):
            rejected.add_metric([*who, reason], n)
        yield rejected
        yield _counter("omega_scheduler_tasks_placed", "Tasks placed", labels, who,
                       m.tasks_placed)
        yield _counter("omega_scheduler_jobs_abandoned", "Jobs given up on", labels, who,
                       m.jobs_abandoned)
        yield _counter("omega_scheduler_jobs_held", "Jobs held back to wait for the "
                       "scheduler's resource limit (again after each attempt)", labels, who,
                       m.jobs_held)
        waits = list(m.wait_times)
        wait = SummaryMetricFamily("omega_scheduler_job_wait_seconds",
                                   "Submission to the first scheduling attempt", labels=labels)
        wait.add_metric(who, len(waits), sum(waits))
        yield wait
        decisions = list(m.decision_times)
        decide = SummaryMetricFamily("omega_scheduler_decision_seconds",
                                     "Time of one decision (one attempt)", labels=labels)
        decide.add_metric(who, len(decisions), sum(decisions))
        yield decide
        attempts = list(m.attempts.values())
        yield _gauge("omega_scheduler_attempts_per_job", "Mean attempts per job tried",
                     labels, who, sum(attempts) / len(attempts) if attempts else 0.0)
        yield _gauge("omega_scheduler_queue_depth", "Jobs this instance has to place",
                     labels, who, inst.queue_depth())
        if self.replica is not None:
            lag = self.replica.lag()
            yield _gauge("omega_replica_lag_revisions",
                         "Revisions the instance's copy of the cell is behind", labels, who,
                         lag.revisions_behind)
            yield _gauge("omega_replica_lag_seconds",
                         "Seconds since the instance's copy was last known current", labels,
                         who, lag.seconds_since_confirmed)


def _gauge(name: str, text: str, labels: list[str], values: list[str], v: float,
           ) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, text, labels=labels)
    g.add_metric(values, v)
    return g


def _counter(name: str, text: str, labels: list[str], values: list[str], v: float,
             ) -> CounterMetricFamily:
    c = CounterMetricFamily(name, text, labels=labels)
    c.add_metric(values, v)
    return c

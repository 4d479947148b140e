"""A scheduler instance's Prometheus metrics (schedulers/prometheus.py) after a conflict
it lost, with known values: Omega's busyness split into useful and wasted time, the
conflict fraction, transactions by outcome, claims rejected by reason, attempts per
job, wait and decision time, queue depth. tests/e2e/test_metrics.py scrapes the same
names from running processes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from schedulers.batch import BatchPolicy
from schedulers.prometheus import SchedulerCollector
from schedulers.runtime import RuntimeConfig
from schedulers.testing import Harness, job, machine


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"scheduler": "other", "instance": "0", **labels})
    assert value is not None, f"{name} {labels} is not exported"
    return value


def test_a_lost_conflict_shows_in_every_omega_metric() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=1)])
    slow = RuntimeConfig(retry_delay=60, max_retry_delay=60)
    first = h.add(BatchPolicy(), scheduler="batch", config=slow)
    second = h.add(BatchPolicy(), scheduler="other", config=slow)
    for inst in (first, second):  # each decision costs one (virtual) second
        inst.decision_cost = lambda jobs, plan, measured: 1.0
    h.submit([job("a", cpu=1, scheduler="batch"), job("b", cpu=1, scheduler="other")])
    h.pump()
    first.step()  # commits a/0 on m0
    second.step()  # decided from a copy without it: claims m0 too, and loses
    h.pump()
    h.clock.now += 61
    second.step()  # its retry: nothing fits now, nothing is sent
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(second))
    assert _sample(registry, "omega_scheduler_busy_seconds_total", kind="wasted") == 1.0
    assert _sample(registry, "omega_scheduler_busy_seconds_total", kind="useful") == 1.0
    assert _sample(registry, "omega_scheduler_transactions_total", outcome="conflicted") == 1
    assert _sample(registry, "omega_scheduler_transactions_total", outcome="successful") == 0
    # No successful transaction: the fraction is the count of conflicted ones.
    assert _sample(registry, "omega_scheduler_conflict_fraction") == 1.0
    rejected = {reason: _sample(registry, "omega_scheduler_claims_rejected_total",
                                reason=reason)
                for reason in ("sequence_changed", "insufficient_resources")
                if registry.get_sample_value("omega_scheduler_claims_rejected_total", {
                    "scheduler": "other", "instance": "0", "reason": reason}) is not None}
    assert sum(rejected.values()) == 1, rejected
    assert _sample(registry, "omega_scheduler_attempts_per_job") == 2.0
    assert _sample(registry, "omega_scheduler_decision_seconds_count") == 2
    assert _sample(registry, "omega_scheduler_decision_seconds_sum") == 2.0
    assert _sample(registry, "omega_scheduler_job_wait_seconds_count") == 1
    assert _sample(registry, "omega_scheduler_tasks_placed_total") == 0
    assert _sample(registry, "omega_scheduler_queue_depth") == 1  # b still waits
    assert _sample(registry, "omega_scheduler_jobs_abandoned_total") == 0
    assert 0 < _sample(registry, "omega_scheduler_busyness") <= 1
    with pytest.raises(AssertionError):  # the other scheduler's numbers are its own
        _sample(registry, "omega_scheduler_tasks_placed_total", scheduler="batch")

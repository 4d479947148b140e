"""The plugin interface serves the three styles of scheduler (schedulers/api.py)."""

from __future__ import annotations

from cellstate.cell import task_view
from cellstate.invariants import placed_tasks_of, violations
from cellstate.model import Claim, Transaction
from schedulers.api import Policy
from schedulers.batch import BatchPolicy
from schedulers.testing import Harness, job, machine, settled
from tests.policies import ElasticGrower, PrecedenceFirst


def test_style_one_job_at_a_time() -> None:
    assert not BatchPolicy.batches_jobs() and BatchPolicy.places_jobs()
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])
    inst = h.add(BatchPolicy())
    h.submit([job("a", tasks=2), job("b", tasks=2)])
    h.run(settled)
    assert len(inst.metrics.decision_times) == 2  # one decision per job


def test_style_all_pending_jobs_at_once_with_preemption() -> None:
    assert PrecedenceFirst.batches_jobs()
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=2), machine("m1", cpu=2)])
    h.admin.submit_job(job("old", tasks=2, cpu=2, precedence=1, scheduler="precedence-first"))
    assert h.admin.commit(Transaction("precedence-first", (Claim("old", 0, "m0"),
                                                           Claim("old", 1, "m1")))).ok
    inst = h.add(PrecedenceFirst())
    h.submit([job("low", cpu=1, precedence=0, scheduler="precedence-first"),
              job("high", cpu=2, precedence=9, scheduler="precedence-first")])
    h.run(lambda s: placed_tasks_of(s, "high") == 1)
    snap = h.admin.read_snapshot()
    assert inst.metrics.decision_times and len(inst.metrics.attempts) == 2
    states = sorted(task_view(snap, f"old/{i}").state.value for i in range(2))
    assert states == ["preempted", "running"]  # one victim was enough
    assert placed_tasks_of(snap, "low") == 0  # nothing left for the lowest precedence
    assert violations(snap) == []


def test_style_periodic_proposals_grow_a_running_job() -> None:
    assert ElasticGrower.propose_interval == 5.0
    assert Policy.propose is not ElasticGrower.propose
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4) for i in range(5)])  # 20 cpu
    h.add(ElasticGrower(cap=0.5))
    h.submit([job("mr", tasks=2, cpu=1, scheduler="elastic", labels=[("elastic_max", "8")])])
    h.run(lambda s: s.jobs["mr"].task_count > 2 and settled(s))
    snap = h.admin.read_snapshot()
    assert snap.jobs["mr"].task_count == 8  # under the 10-cpu cap, up to elastic_max
    assert placed_tasks_of(snap, "mr") == 8

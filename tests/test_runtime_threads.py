"""Instances as threads over one memory store, on real time: a slow scheduler does not
hold up a fast one (no head-of-line blocking between schedulers, Omega §3.4)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import attrs

from cellstate.invariants import placed_tasks_of
from cellstate.kv.memory import MemoryKV
from cellstate.model import Detection, Job, Transaction
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.api import Context, Plan
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig, SchedulerInstance
from schedulers.service import ServicePolicy
from schedulers.testing import Harness, job, machine, settled


class SlowService(ServicePolicy):
    """A careful placement that takes its time: each decision waits until the test
    opens ``gate``; ``entered`` says one has begun."""

    def __init__(self, gate: threading.Event, entered: threading.Event) -> None:
        super().__init__()
        self.gate, self.entered = gate, entered

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return super().schedule_job(ctx, job)


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60  # a bound for failure, not a measurement
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within 60 s"
        time.sleep(0.05)


def test_a_slow_service_scheduler_does_not_block_batch() -> None:
    """Every batch job is placed while the service scheduler is stuck in its first
    decision: batch never waits behind the service queue. Ordering, not timing: the
    service decision cannot end before the test opens its gate."""
    kv = MemoryKV()
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=8) for i in range(20)])
    stop, gate, entered = threading.Event(), threading.Event(), threading.Event()
    replicas, threads, insts = [], [], []
    try:
        for policy, sched in ((SlowService(gate, entered), "service"),
                              (BatchPolicy(), "batch")):
            replica = Replica(kv).start()
            replicas.append(replica)
            inst = SchedulerInstance(policy, CellStore(kv), replica, scheduler=sched,
                                     config=RuntimeConfig(retry_delay=0.05),
                                     rng=random.Random(1))
            inst.start()
            insts.append(inst)
        now = time.time()
        for i in range(3):
            admin.submit_job(attrs.evolve(job(f"s{i}", tasks=2, scheduler="service"),
                                          submitted_at=now))
        for inst in insts:
            threads.append(threading.Thread(target=inst.run, args=(stop,), daemon=True))
            threads[-1].start()
        assert entered.wait(60), "the service scheduler never started deciding"
        for i in range(20):
            admin.submit_job(attrs.evolve(job(f"b{i}", tasks=3), submitted_at=now))
        _wait("batch jobs placed", lambda: all(
            placed_tasks_of(admin.read_snapshot(), f"b{i}") == 3 for i in range(20)))
        assert not gate.is_set()
        assert len(insts[0].metrics.decision_times) == 0  # still in its first decision
        assert sum(placed_tasks_of(admin.read_snapshot(), f"s{i}") for i in range(3)) == 0
        gate.set()
        _wait("service jobs placed", lambda: sum(
            placed_tasks_of(admin.read_snapshot(), f"s{i}") for i in range(3)) == 6)
    finally:
        gate.set()
        stop.set()
        for t in threads:
            t.join(timeout=10)
        for r in replicas:
            r.stop()


def test_detection_is_chosen_per_scheduler_and_per_job() -> None:
    sent: list[Transaction] = []

    class Recording(CellStore):
        def commit_many(self, txns):  # type: ignore[no-untyped-def]
            sent.extend(txns)
            return super().commit_many(txns)

    h = Harness()
    h.admin.add_machines([machine("m0", cpu=8)])
    replica = Replica(h.kv, clock=h.clock)
    replica.load()
    inst = SchedulerInstance(BatchPolicy(), Recording(h.kv), replica, clock=h.clock,
                             config=RuntimeConfig(detection=Detection.COARSE))
    h.attach(inst, replica)
    h.submit([job("plain"), attrs.evolve(job("picky"), detection=Detection.FINE),
              job("together", tasks=2, gang=True)])
    h.run(settled)
    by_job = {t.job: t for t in sent}
    assert by_job["plain"].detection is Detection.COARSE  # the scheduler's default
    assert by_job["picky"].detection is Detection.FINE  # the job's own choice wins
    assert by_job["together"].mode.value == "gang"  # gang jobs commit as gangs
    assert by_job["plain"].mode.value == "incremental"

"""Instances as threads over one memory store, on real time: a slow scheduler does not
hold up a fast one (no head-of-line blocking between schedulers, Omega §3.4)."""

from __future__ import annotations

import random
import threading
import time

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
    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        time.sleep(2.0)  # a careful placement that takes its time
        return super().schedule_job(ctx, job)


def test_a_slow_service_scheduler_does_not_block_batch() -> None:
    kv = MemoryKV()
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=8) for i in range(20)])
    stop = threading.Event()
    replicas, threads, insts = [], [], []
    try:
        for policy, sched in ((SlowService(), "service"), (BatchPolicy(), "batch")):
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
        for i in range(20):
            admin.submit_job(attrs.evolve(job(f"b{i}", tasks=3), submitted_at=now))
        for inst in insts:
            threads.append(threading.Thread(target=inst.run, args=(stop,), daemon=True))
            threads[-1].start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            snap = admin.read_snapshot()
            if all(placed_tasks_of(snap, f"b{i}") == 3 for i in range(20)):
                break
            time.sleep(0.05)
        service_decisions = len(insts[0].metrics.decision_times)
        snap = admin.read_snapshot()
        assert all(placed_tasks_of(snap, f"b{i}") == 3 for i in range(20))
        # All batch work was done while the service scheduler was still in its first
        # two-second decision: batch never waited behind the service queue (which
        # alone holds 6 s of decisions).
        assert service_decisions <= 1, service_decisions
        assert sum(placed_tasks_of(snap, f"s{i}") for i in range(3)) < 6
    finally:
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

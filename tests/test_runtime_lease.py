"""A scheduler instance keeps its lease while every job it owns waits in a backoff longer
than the lease: renewal does not wait for the scheduling loop."""

from __future__ import annotations

import threading
import time

import pytest

from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig, SchedulerInstance
from schedulers.testing import Harness, job, machine, txn

TTL = 2


def _blocked_cell(store: CellStore) -> None:
    """One machine, full; a job that fits it only once the blocker ends (so the policy
    keeps retrying it, with backoff, rather than giving up at once)."""
    store.add_machines([machine("m0", cpu=4)])
    store.submit_job(job("blocker", cpu=4))
    assert store.commit(txn([Claim("blocker", 0, "m0")])).ok
    store.submit_job(job("waiting", cpu=2))


@pytest.mark.etcd
def test_lease_outlives_backoffs_longer_than_the_lease(etcd_kv: EtcdKV) -> None:
    _blocked_cell(CellStore(etcd_kv))
    # Backoff after the first fruitless attempt: 2 x 2 s, then 8 s; the lease lives 2 s.
    config = RuntimeConfig(lease_ttl=TTL, retry_delay=2.0)
    present: list[bool] = []  # is the instance's key there, after each revision
    with Replica(etcd_kv) as replica, Replica(etcd_kv) as watcher:
        watcher.on_changes(lambda snap, _: present.append("batch/i0" in snap.instances))
        inst = SchedulerInstance(BatchPolicy(), CellStore(etcd_kv), replica, instance="i0",
                                 config=config)
        inst.start()
        first = inst.lease
        assert first is not None
        stop = threading.Event()
        loop = threading.Thread(target=inst.run, args=(stop,))
        loop.start()
        try:
            time.sleep(3 * TTL + 1.5)  # more than three lease periods
        finally:
            stop.set()
            loop.join(timeout=15)
        assert not loop.is_alive()
        assert inst.metrics.attempts["waiting"] >= 2  # it was retried, in backoff
        assert inst.queued() == ["waiting"]
        assert inst.lease == first
        assert etcd_kv.lease_keepalive(first) > 0
        assert True in present
        assert False not in present[present.index(True):], "the instance's key lapsed"
        inst.stop()


def test_a_stepped_instance_never_sleeps_past_its_next_renewal() -> None:
    """On a virtual clock (the simulator's way): the step asks to be woken for the
    renewal, not when the job's backoff ends."""
    h = Harness()
    _blocked_cell(h.admin)
    inst = h.add(BatchPolicy(), "i0", config=RuntimeConfig(lease_ttl=TTL, retry_delay=10.0))
    first = inst.lease
    waits = []
    while h.clock.now < 1000.0 + 60:
        h.pump()
        wait = inst.step()
        waits.append(wait)
        h.clock.now += wait
        h.kv.expire_leases()
    assert inst.metrics.attempts["waiting"] >= 2
    assert inst.lease == first
    assert "batch/i0" in h.admin.read_snapshot().instances
    assert max(waits) <= TTL / 3 + 1e-9

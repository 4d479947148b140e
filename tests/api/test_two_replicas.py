"""Two cellstate replicas over one etcd, schedulers committing concurrently through
both: no machine is ever over-committed and no task is placed twice."""

from __future__ import annotations

import random
import threading

import pytest

from cellstate.api.client import RemoteStore, remote_replica
from cellstate.invariants import violations
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim, InstanceRecord, Transaction
from cellstate.store import CellStore
from schedulers.testing import job, machine
from tests.api.service_fixture import client_for, running_server

pytestmark = pytest.mark.etcd

MACHINES = 6
JOBS = 8
TASKS = 12  # 96 tasks of 1 cpu for 6 x 8 = 48 cpus: half of them cannot fit


def test_concurrent_schedulers_on_two_replicas_never_overcommit(etcd_kv: EtcdKV) -> None:
    admin = CellStore(etcd_kv)
    admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in range(MACHINES)])
    for j in range(JOBS):
        admin.submit_job(job(f"j{j}", tasks=TASKS, cpu=1))
    with running_server(etcd_kv, name="a") as a, running_server(etcd_kv, name="b") as b:
        errors: list[BaseException] = []
        placed: list[int] = []

        def scheduler(n: int) -> None:
            server = (a, b)[n % 2]
            rng = random.Random(n)
            try:
                with client_for(server) as client:
                    store = RemoteStore(client)
                    store.register_instance(InstanceRecord("batch", f"i{n}"), 30)
                    copy = remote_replica(client).start()
                    try:
                        count = 0
                        for _ in range(40):
                            snap = copy.snapshot()
                            # Every scheduler goes after every job: maximal contention.
                            jid = f"j{rng.randrange(JOBS)}"
                            claims = []
                            for i in rng.sample(range(TASKS), 4):
                                mid = f"m{rng.randrange(MACHINES)}"
                                claims.append(Claim(jid, i, mid, snap.machines[mid].seq))
                            res = store.commit(Transaction("batch", tuple(claims)))
                            count += len(res.committed)
                            copy.wait_for(res.revision, timeout=10)
                        placed.append(count)
                    finally:
                        copy.stop()
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=scheduler, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
    snap = admin.read_snapshot()
    assert violations(snap) == []
    running = sum(len(m.allocations) for m in snap.machines.values())
    assert running == sum(placed)  # every acknowledged placement is there, once
    assert 0 < running <= MACHINES * 8

"""A client with two cellstate servers, one of them paused (SIGSTOP: it accepts
connections and answers nothing, like a hung process or a network black hole): keep-
alives, commits and the sync stream go through the other one, and a lease of a few
seconds survives several of its periods."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cellstate.api.client import CellClient, RemoteStore, keep_alive_deadlines, remote_replica
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim, InstanceRecord, Transaction
from cellstate.store import CellStore
from omega.etcd_launcher import LocalEtcd
from omega.proc import Child
from schedulers.testing import job, machine
from tests.e2e.cluster import cluster

pytestmark = pytest.mark.etcd

TTL = 3  # seconds: as short as leases get, so a hung call would let it lapse


@contextmanager
def paused(child: Child) -> Iterator[None]:
    os.kill(child.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(child.pid, signal.SIGCONT)


def test_keep_alive_deadlines_are_a_fraction_of_the_lease() -> None:
    for ttl in (2, 3, 5, 10, 60):
        attempt, budget = keep_alive_deadlines(ttl)
        # Two endpoints fit in the budget, and the budget leaves time for a second
        # renewal round before the lease lapses.
        assert 2 * attempt <= budget <= ttl / 2


def test_a_paused_server_does_not_hold_up_keep_alives_commits_or_sync(
        fresh_etcd: LocalEtcd, tmp_path: Path) -> None:
    kv = EtcdKV([fresh_etcd.endpoint])
    admin = CellStore(kv)
    admin.add_machines([machine("m0", cpu=8)])
    admin.submit_job(job("j", tasks=2, cpu=1))
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        port_a = c.server("cellstate-a")
        port_b = c.server("cellstate-b")
        client = CellClient([f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"], retry_for=30.0,
                            tls=c.tls("scheduler:batch"))
        copy = remote_replica(client).start()
        try:
            store = RemoteStore(client)
            lease = store.register_instance(InstanceRecord("batch", "i0", "batch"), TTL)
            assert client.endpoint == f"127.0.0.1:{port_a}"  # everything went to a so far
            failures: list[BaseException] = []
            stop = threading.Event()

            def renew() -> None:
                # As a scheduler does, from a thread of its own, every ttl / 3: a
                # renewal that cannot get through raises.
                while not stop.wait(TTL / 3):
                    try:
                        store.keep_alive(lease)
                    except BaseException as e:
                        failures.append(e)

            renewer = threading.Thread(target=renew, daemon=True)
            renewer.start()
            with paused(c.children["cellstate-a"]):
                time.sleep(3 * TTL + 1)  # more than 3 lease periods on renewals alone
                assert not failures, failures
                seq = copy.snapshot().machines["m0"].seq
                res = store.commit(Transaction("batch", (Claim("j", 0, "m0", seq),)))
                assert [x.task for x in res.committed] == ["j/0"], res.rejected
                # The sync stream that was on a moved to b and shows the commit.
                assert copy.wait_for(res.revision, timeout=30)
                assert copy.snapshot().tasks["j/0"].machine == "m0"
            stop.set()
            renewer.join()
            assert not failures, failures
            assert kv.lease_keepalive(lease) > 0  # the same lease all along
            snap = admin.read_snapshot()
            assert "batch/i0" in snap.instances
        finally:
            copy.stop()
            client.close()
            kv.close()

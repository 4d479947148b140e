"""The commit leader (cellstate/api/leader.py): one server of a cell validates every
commit in memory and writes batches to etcd, fenced by its election key's revision;
the others forward commits to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cellstate.api.auth import Identity, Kind
from cellstate.api.client import CellClient, RemoteStore
from cellstate.api.leader import GroupCommitter, leader_key
from cellstate.api.server import CellStateServer
from cellstate.errors import FencedOut
from cellstate.invariants import violations
from cellstate.kv.base import KV, Compare, Delete, Op, Put, TxnOp, TxnResult
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    CellConfig,
    Claim,
    Detection,
    InstanceRecord,
    Reason,
    SchedulerLimits,
    Transaction,
)
from cellstate.store import CellStore
from omega.certs import DevCA
from schedulers.testing import job, machine
from tests.api.service_fixture import client_for, running_server


class CountingKV:
    """A KV that counts the write transactions sent through it (etcd Txns with puts or
    deletes); everything else goes straight to the KV it wraps."""

    def __init__(self, inner: KV) -> None:
        self._inner = inner
        self.writes = 0

    def txn(self, compares: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        if _writes(success):
            self.writes += 1
        return self._inner.txn(compares, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _writes(ops: Sequence[Op]) -> bool:
    """Whether ``ops`` put or delete (nested transactions, one per machine, included)."""
    return any(isinstance(op, Put | Delete)
               or (isinstance(op, TxnOp) and _writes(op.success)) for op in ops)


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.02)


def leader_of(*servers: CellStateServer) -> CellStateServer:
    leading = [s for s in servers if s.service.committer is not None]
    assert len(leading) == 1, f"{len(leading)} servers lead"
    return leading[0]


def token(kv: KV, cell: str = "default") -> int:
    kvs = kv.range(leader_key(cell)).kvs
    return kvs[0].mod_revision if kvs else 0


@contextmanager
def two_servers(kv: KV, **config: object) -> Iterator[tuple[CellStateServer, CellStateServer]]:
    config.setdefault("leader_ttl", 1)
    with running_server(kv, name="a", **config) as a, \
            running_server(kv, name="b", **config) as b:
        yield a, b


def seed_cell(kv: KV, machines: int = 2, cpu: float = 4, tasks: int = 8) -> None:
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=cpu, mem=64) for i in range(machines)])
    admin.submit_job(job("j", tasks=tasks, cpu=1))


def registered(client: Any, instance: str = "i0") -> RemoteStore:
    store = RemoteStore(client)
    store.register_instance(InstanceRecord("batch", instance), 30)
    return store


def test_one_server_leads_and_the_other_forwards_to_it(kv: KV) -> None:
    seed_cell(kv)
    with two_servers(kv) as (a, b):
        lead = leader_of(a, b)
        follower = b if lead is a else a
        assert token(kv) > 0
        with client_for(follower) as client:
            store = registered(client)
            res = store.commit(Transaction("batch", (Claim("j", 0, "m0"), Claim("j", 1, "m1"))))
            many = store.commit_many([Transaction("batch", (Claim("j", 2, "m0"),)),
                                      Transaction("batch", (Claim("j", 3, "m1"),))])
        committer = lead.service.committer
        assert follower.service.committer is None
    assert [c.task for c in res.committed] == ["j/0", "j/1"]
    assert [len(r.committed) for r in many] == [1, 1]
    assert committer is not None and committer.commits == 2 and committer.transactions == 3
    snap = CellStore(kv).read_snapshot()
    assert set(snap.machines["m0"].allocations) == {"j/0", "j/2"}
    assert set(snap.machines["m1"].allocations) == {"j/1", "j/3"}


def test_without_a_leader_each_server_commits_itself(kv: KV) -> None:
    seed_cell(kv)
    with two_servers(kv, commit_leader=False) as (a, b):
        assert a.service.committer is None and b.service.committer is None
        with client_for(b) as client:
            res = registered(client).commit(Transaction("batch", (Claim("j", 0, "m0"),)))
    assert len(res.committed) == 1
    assert token(kv) == 0  # nobody stood for election


def test_a_fenced_store_writes_nothing(kv: KV) -> None:
    seed_cell(kv)
    key = leader_key("default")
    first = kv.txn([], [Put(key, b"a:1")]).revision
    store = CellStore(kv)
    store.fence(key, first)
    assert len(store.commit(Transaction("batch", (Claim("j", 0, "m0"),))).committed) == 1
    kv.txn([], [Put(key, b"b:1")])  # another server leads now
    before = kv.range(b"/omega/default/", b"/omega/default0").revision
    with pytest.raises(FencedOut, match="not the commit leader"):
        store.commit(Transaction("batch", (Claim("j", 1, "m0"),)))
    assert kv.range(b"/omega/default/", b"/omega/default0").revision == before
    assert "j/1" not in CellStore(kv).read_snapshot().tasks


@contextmanager
def held(committer: GroupCommitter) -> Iterator[None]:
    """The leader's store busy (as with a batch in flight): commits queue meanwhile."""
    with committer.store._lock:
        yield


def queued(committer: GroupCommitter) -> int:
    with committer._cond:
        return len(committer._queue)


def commit_in_thread(store: RemoteStore, txn: Transaction, out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            out.append(store.commit(txn))
        except Exception as e:  # surfaced by the test
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_batch_decides_conflicts_in_memory_and_writes_once(kv: KV) -> None:
    """Commits that wait while a batch is in flight go out as the next batch: the one
    that loses a machine to an earlier one in the batch is rejected without an etcd
    round trip, the rest are written by one etcd Txn."""
    seed_cell(kv, machines=3, cpu=1)
    counting = CountingKV(kv)
    with running_server(counting, name="a", listen="127.0.0.1:0") as server:
        committer = server.service.committer
        assert committer is not None
        with client_for(server) as client:
            store = registered(client)
            results: list[Any] = []
            threads = []
            with held(committer):
                threads.append(commit_in_thread(
                    store, Transaction("batch", (Claim("j", 0, "m0"),)), results))
                wait_for("the first commit taken", lambda: committer.in_flight == 1)
                for i, mid in ((1, "m1"), (2, "m1"), (3, "m2")):
                    threads.append(commit_in_thread(
                        store, Transaction("batch", (Claim("j", i, mid),)), results))
                wait_for("three commits queued", lambda: queued(committer) == 3)
                writes = counting.writes
            for t in threads:
                t.join(timeout=30)
    assert all(not isinstance(r, Exception) for r in results), results
    by_task = {r.committed[0].task if r.committed else r.rejected[0].claim.task: r
               for r in results}
    assert by_task["j/0"].committed and by_task["j/3"].committed
    # j/1 and j/2 both claim m1 (room for one): the first to arrive wins.
    won, lost = sorted((by_task["j/1"], by_task["j/2"]), key=lambda r: not r.committed)
    assert won.committed and not won.rejected
    assert lost.rejected[0].reason is Reason.INSUFFICIENT_RESOURCES and not lost.committed
    assert committer.batches == 2 and committer.commits == 4
    # The first batch's write, then one for the three queued commits.
    assert counting.writes - writes == 2


class GatedKV:
    """Holds the leader's first write (a request of nested transactions, one per
    machine) on its way to etcd until ``release`` is set; ``entered`` says it is held."""

    def __init__(self, inner: KV) -> None:
        self._inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        self._armed = True

    def txn(self, compares: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        if self._armed and any(isinstance(op, TxnOp) for op in success):
            self._armed = False
            self.entered.set()
            self.release.wait(30)
        return self._inner.txn(compares, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_batch_waits_for_the_commits_of_its_last_cycle(kv: KV) -> None:
    """Sibling hold: three schedulers' commits came in the last cycle (one in the
    batch, two queued behind it); the next batch, taken with two waiting, waits for the
    third (the first scheduler's next commit) and writes all three together, instead
    of leaving it to a batch of its own."""
    seed_cell(kv, machines=4)
    committer = GroupCommitter(CellStore(kv)).start()
    results: list[Any] = []

    def scheduler(indexes: Sequence[int]) -> None:
        for i in indexes:
            results.extend(committer.commit([Transaction("batch", (Claim("j", i, f"m{i}"),))]))

    try:
        threads = [threading.Thread(target=scheduler, args=([0, 3],))]
        with held(committer):
            threads[0].start()
            wait_for("the first commit taken", lambda: committer.in_flight == 1)
            threads += [threading.Thread(target=scheduler, args=([i],)) for i in (1, 2)]
            for t in threads[1:]:
                t.start()
            wait_for("two commits queued", lambda: queued(committer) == 2)
            # The first batch's time bounds the hold (half of it): make it long, so
            # that the first scheduler's next commit comes well within it.
            time.sleep(2.0)
        for t in threads:
            t.join(timeout=30)
        assert len(results) == 4 and all(r.ok for r in results)
        assert committer.batches == 2 and committer.commits == 4  # [j/0], [j/1 j/2 j/3]
        assert committer.held_s > 0
    finally:
        committer.close()
    assert violations(CellStore(kv).read_snapshot()) == []


def test_a_batch_decided_over_a_write_that_fails_is_decided_again(kv: KV) -> None:
    """The next batch is decided over the state the write in flight will make; when
    that write fails (an outside writer changed its machine meanwhile), the batch is
    decided again from what etcd holds, never answered from what did not happen."""
    seed_cell(kv, machines=1, cpu=3)
    gated = GatedKV(kv)
    first: list[Any] = []
    second: list[Any] = []
    with running_server(gated, name="a", listen="127.0.0.1:0",
                        commit_pipeline=True) as server:
        committer = server.service.committer
        assert committer is not None
        with client_for(server) as client:
            store = registered(client)
            t1 = commit_in_thread(store, Transaction("batch", (Claim("j", 0, "m0"),)), first)
            assert gated.entered.wait(30), "j/0's write never sent"
            t2 = commit_in_thread(store, Transaction("batch", (Claim("j", 1, "m0"),)), second)
            # Over j/0's write (one of m0's three cpus), j/1 fits.
            wait_for("j/1 decided over j/0's write", lambda: committer.overlapped == 1)
            # Meanwhile a library committer, outside the leader, takes two of them.
            outside = CellStore(kv).commit(
                Transaction("batch", (Claim("j", 2, "m0"), Claim("j", 3, "m0"))))
            assert len(outside.committed) == 2
            gated.release.set()
            t1.join(timeout=30)
            t2.join(timeout=30)
    (res0,), (res1,) = first, second
    assert [c.task for c in res0.committed] == ["j/0"]  # its guard failed; decided again
    assert not res1.committed
    assert res1.rejected[0].reason is Reason.INSUFFICIENT_RESOURCES
    assert committer.redone == 1
    snap = CellStore(kv).read_snapshot()
    assert set(snap.machines["m0"].allocations) == {"j/0", "j/2", "j/3"}
    assert "j/1" not in snap.tasks or snap.tasks["j/1"].machine == ""
    assert violations(snap) == []


def test_a_coarse_claim_decided_over_a_write_in_flight_sees_it(kv: KV) -> None:
    """Coarse detection over a write in flight: the machine changed since the claim's
    scheduler saw it (that write's revision is not known yet, but it is not the one
    seen), so the claim is rejected, naming the revision the write got."""
    seed_cell(kv, machines=1, cpu=3)
    seen = CellStore(kv).read_snapshot().machines["m0"].seq
    gated = GatedKV(kv)
    first: list[Any] = []
    second: list[Any] = []
    with running_server(gated, name="a", listen="127.0.0.1:0",
                        commit_pipeline=True) as server:
        committer = server.service.committer
        assert committer is not None
        with client_for(server) as client:
            store = registered(client)
            t1 = commit_in_thread(store, Transaction("batch", (Claim("j", 0, "m0", seen),)),
                                  first)
            assert gated.entered.wait(30), "j/0's write never sent"
            t2 = commit_in_thread(store, Transaction(
                "batch", (Claim("j", 1, "m0", seen),), detection=Detection.COARSE), second)
            wait_for("j/1 decided over j/0's write", lambda: committer.overlapped == 1)
            gated.release.set()
            t1.join(timeout=30)
            t2.join(timeout=30)
    (res0,), (res1,) = first, second
    assert res0.committed and not res1.committed
    (rejection,) = res1.rejected
    assert rejection.reason is Reason.SEQUENCE_CHANGED
    assert f"at sequence {res0.revision}," in rejection.detail, rejection.detail
    # Decided once, over the write in flight, which happened as decided over.
    assert res1.attempts == 1 and committer.redone == 0


def test_a_batch_larger_than_one_request_is_cut_at_a_commit() -> None:
    """Commits that queued beyond what one etcd request holds (here 8 machines: etcd's
    limit of 16 ops, half of it for the request's own list) are staged up to the last
    commit that fits whole; the rest go first into the next batch."""
    kv = MemoryKV(max_txn_ops=16)
    seed_cell(kv, machines=10, cpu=4, tasks=16)
    counting = CountingKV(kv)
    with running_server(counting, name="a", listen="127.0.0.1:0",
                        commit_pipeline=True) as server:
        committer = server.service.committer
        assert committer is not None
        with client_for(server) as client:
            store = registered(client)
            results: list[Any] = []
            threads = []
            with held(committer):
                threads.append(commit_in_thread(
                    store, Transaction("batch", (Claim("j", 0, "m0"),)), results))
                wait_for("the first commit taken", lambda: committer.in_flight == 1)
                for n in range(3):  # three machines each: nine in all
                    claims = tuple(Claim("j", 1 + 3 * n + i, f"m{1 + 3 * n + i}")
                                   for i in range(3))
                    threads.append(commit_in_thread(store, Transaction("batch", claims),
                                                    results))
                wait_for("three commits queued", lambda: queued(committer) == 3)
                writes = counting.writes
            for t in threads:
                t.join(timeout=30)
    assert all(not isinstance(r, Exception) and not r.rejected for r in results), results
    assert sum(len(r.committed) for r in results) == 10
    # The first commit; the next two (six machines); the third, cut off from them.
    assert committer.batches == 3 and counting.writes - writes == 3


def test_leadership_moves_when_the_leader_stops(kv: KV) -> None:
    seed_cell(kv)
    with running_server(kv, name="a", leader_ttl=1) as a:
        first = token(kv)
        assert a.service.committer is not None
        with running_server(kv, name="b", leader_ttl=1) as b:
            assert b.service.committer is None
            a.stop(grace=0)  # resigns: b takes over at its next round
            wait_for("b to lead", lambda: b.service.committer is not None)
            assert token(kv) > first
            with client_for(b) as client:
                res = registered(client).commit(Transaction("batch", (Claim("j", 0, "m0"),)))
            assert len(res.committed) == 1


def test_a_deposed_leader_mid_batch_is_fenced_and_the_commit_lands_once(kv: KV) -> None:
    """A leader paused with a batch in flight while another server took over: its write
    fails on the fence, it steps down, and the client's retry commits through the new
    leader, once."""
    seed_cell(kv)
    with two_servers(kv) as (a, b):
        old = leader_of(a, b)
        other = b if old is a else a
        committer = old.service.committer
        assert committer is not None
        results: list[Any] = []
        with client_for(old, other) as client:
            store = registered(client)
            with held(committer):
                t = commit_in_thread(store, Transaction("batch", (Claim("j", 0, "m0"),)), results)
                wait_for("the batch taken", lambda: committer.in_flight == 1)
                kv.txn([], [Delete(leader_key("default"))])  # as if its lease lapsed
                wait_for("the other server to lead", lambda: other.service.committer is not None)
                new_token = token(kv)
            t.join(timeout=60)
        assert old.service.committer is None  # stepped down on the failed fence
    assert len(results) == 1 and not isinstance(results[0], Exception), results
    (res,) = results
    assert [c.task for c in res.committed] == ["j/0"]
    assert res.revision > new_token
    snap = CellStore(kv).read_snapshot()
    assert set(snap.machines["m0"].allocations) == {"j/0"}


@pytest.mark.etcd
def test_a_follower_forwards_over_mutual_tls_as_its_server_identity(
        etcd_kv: KV, tmp_path: Path) -> None:
    """With TLS a follower forwards with its own certificate (server:NAME) and the
    leader accepts it for a scheduler the cell lists; the scheduler's own identity
    never reaches the leader."""
    ca = DevCA(tmp_path / "certs")
    tls = ca.issue(Identity(Kind.SERVER, "cellstate"))
    limits = CellConfig({"batch": SchedulerLimits()})
    seed_cell(etcd_kv)
    with two_servers(etcd_kv, tls=tls, limits=limits) as (a, b):
        lead = leader_of(a, b)
        follower = b if lead is a else a
        client = CellClient([f"127.0.0.1:{follower.port}"], retry_for=5.0,
                            tls=ca.issue(Identity(Kind.SCHEDULER, "batch")))
        try:
            res = registered(client).commit(Transaction("batch", (Claim("j", 0, "m0"),)))
        finally:
            client.close()
        committer = lead.service.committer
        assert committer is not None and committer.commits == 1
    assert [c.task for c in res.committed] == ["j/0"]

"""The cellstate service over real gRPC: commits, sync, jobs, machines, and every kind
of bad input refused with a clear status and no change to the cell."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import grpc
import orjson
import pytest

from cellstate.api.client import ClientError, RemoteStore, remote_replica
from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import Claim, Fallback, InstanceRecord, Reason, Transaction, TxnMode
from cellstate.store import CellStore, NotFoundError, StoreError
from cellstate.validation import TransactionError
from schedulers.testing import job, machine
from tests.api.service_fixture import client_for, running_server


@pytest.fixture
def server(kv: KV) -> Iterator[CellStateServer]:
    admin = CellStore(kv)
    admin.add_machines([machine("m1", cpu=4), machine("m2", cpu=4)])
    admin.submit_job(job("j1", tasks=3, cpu=2))
    with running_server(kv) as s:
        yield s


def _stub(server: CellStateServer) -> tuple[grpc.Channel, pb_grpc.CellStateStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    return channel, pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]


def test_commit_through_the_service_reaches_another_processes_copy(
        server: CellStateServer) -> None:
    with client_for(server) as client:
        store = RemoteStore(client)
        lease = store.register_instance(InstanceRecord("batch", "0", "batch"), 10)
        assert lease > 0
        copy = remote_replica(client).start()
        try:
            snap = copy.snapshot()
            assert set(snap.machines) == {"m1", "m2"} and set(snap.jobs) == {"j1"}
            seq = snap.machines["m1"].seq
            res = store.commit(Transaction("batch", (
                Claim("j1", 0, "m1", seq), Claim("j1", 1, "m1", seq), Claim("j1", 2, "m1", seq),
            )))
            # m1 has 4 cpus: two tasks of 2 fit, the third is refused with its reason.
            assert [c.index for c in res.committed] == [0, 1]
            assert [(r.claim.index, r.reason) for r in res.rejected] == [
                (2, Reason.INSUFFICIENT_RESOURCES)]
            assert copy.wait_for(res.revision, timeout=5)
            placed = copy.snapshot().machines["m1"].allocations
            assert sorted(placed) == ["j1/0", "j1/1"]
            info = client.get_job("j1")
            assert info["state"] == "running"
            assert info["task_states"] == {"pending": 1, "running": 2}
        finally:
            copy.stop()


def test_gang_through_the_service_is_all_or_nothing(kv: KV, server: CellStateServer,
                                                    ) -> None:
    with client_for(server) as client:
        store = RemoteStore(client)
        store.register_instance(InstanceRecord("batch", "0"), 10)
        seqs = {m["id"]: m["seq"] for m in client.list_machines()}
        # The revision is read from etcd itself: the server's status reports its replica's,
        # which may not have seen the instance's registration yet.
        before = kv.range(b"\x00", b"\x00").revision
        res = store.commit(Transaction("batch", tuple(
            Claim("j1", i, "m1", seqs["m1"]) for i in range(3)), TxnMode.GANG))
        assert res.committed == () and len(res.rejected) == 3
        assert client.list_jobs()[0]["task_states"] == {"pending": 3}
        assert kv.range(b"\x00", b"\x00").revision == before


def _unchanged(kv: KV, action: object) -> None:
    """Run ``action``; the cell's revision must not move."""
    before = kv.range(b"\x00", b"\x00").revision
    assert callable(action)
    action()
    assert kv.range(b"\x00", b"\x00").revision == before


def test_commit_from_an_unregistered_scheduler_is_refused(kv: KV, server: CellStateServer,
                                                          ) -> None:
    with client_for(server) as client:
        txn = Transaction("rogue", (Claim("j1", 0, "m1", 0),))

        def attempt() -> None:
            with pytest.raises(StoreError, match="scheduler 'rogue' is not registered"):
                client.commit(txn)
            with pytest.raises(StoreError, match="instance rogue/7 is not registered"):
                client.commit(txn, "7")

        _unchanged(kv, attempt)


def test_malformed_messages_get_invalid_argument_and_change_nothing(
        kv: KV, server: CellStateServer) -> None:
    channel, stub = _stub(server)
    cases = [
        (stub.Commit, pb.CommitRequest(), "transaction is missing"),
        (stub.Commit, pb.CommitRequest(transaction=pb.Transaction(scheduler="batch")),
         "transaction has no claims"),
        (stub.Commit, pb.CommitRequest(transaction=pb.Transaction(
            scheduler="batch", claims=[pb.Claim(job="j1", machine="m1",
                                                resources={"cpu": float("nan")})])),
         r"transaction.claims\[0\].resources.cpu"),
        (stub.Commit, pb.CommitRequest(transaction=pb.Transaction(
            scheduler="batch", mode=7,  # type: ignore[arg-type]  # a number no enum has
            claims=[pb.Claim(job="j1", machine="m1")])),
         "transaction.mode: 7"),
        (stub.SubmitJob, pb.SubmitJobRequest(spec_json=b"{not json"), "spec_json is not valid"),
        (stub.SubmitJob, pb.SubmitJobRequest(spec_json=orjson.dumps(
            {"id": "j9", "scheduler": "batch", "task_resources": {"cpu": -1}})),
         r"job.task_resources"),
        (stub.SubmitJob, pb.SubmitJobRequest(spec_json=orjson.dumps(
            {"id": "j9", "scheduler": "batch", "task_resources": {"cpu": 1}, "tasks": 3})),
         r"job: unknown field\(s\) 'tasks'"),
        (stub.RegisterAgent, pb.RegisterAgentRequest(agent="a1", ttl=10,
                                                     machines_json=[b'{"id": "m9"}']),
         r"machines_json\[0\].capacity"),
        (stub.ReportTask, pb.ReportTaskRequest(task="j1/0", outcome="exploded"),
         "outcome: 'exploded'"),
        (stub.ListMachines, pb.ListMachinesRequest(state="sideways"), "state: 'sideways'"),
        (stub.RegisterInstance, pb.RegisterInstanceRequest(scheduler="batch", instance="0",
                                                           ttl=0), "ttl: 0"),
    ]
    try:
        for method, request, message in cases:
            def attempt(method: object = method, request: object = request,
                        message: str = message) -> None:
                with pytest.raises(grpc.RpcError) as err:
                    method(request, timeout=5)  # type: ignore[operator]
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
                assert re.search(message, err.value.details()), err.value.details()

            _unchanged(kv, attempt)
    finally:
        channel.close()


def test_unknown_ids_get_not_found_or_failed_precondition(kv: KV, server: CellStateServer,
                                                          ) -> None:
    with client_for(server) as client:
        def attempt() -> None:
            with pytest.raises(NotFoundError, match="unknown job 'nope'"):
                client.get_job("nope")
            with pytest.raises(NotFoundError, match="unknown job 'nope'"):
                client.kill_job("nope")
            with pytest.raises(StoreError, match="task j1/0 is pending, not running"):
                client.call("ReportTask", pb.ReportTaskRequest(task="j1/0", outcome="finished"))
            with pytest.raises(ClientError, match="is not a task id"):
                client.call("ReportTask", pb.ReportTaskRequest(task="j1", outcome="finished"))
            assert client.keep_alive(123456789) == 0

        _unchanged(kv, attempt)


def test_oversized_requests_are_refused(kv: KV) -> None:
    with running_server(kv, max_message_bytes=64 * 1024) as server, client_for(server) as client:
        store = RemoteStore(client)
        store.register_instance(InstanceRecord("batch", "0"), 10)
        claims = tuple(Claim("j" * 200, i, "m" * 200, 0) for i in range(400))

        def attempt() -> None:
            with pytest.raises(StoreError, match=r"(?i)received message larger than max"):
                client.commit(Transaction("batch", claims))

        _unchanged(kv, attempt)


def test_invalid_transaction_is_a_transaction_error(kv: KV, server: CellStateServer) -> None:
    with client_for(server) as client:
        store = RemoteStore(client)
        store.register_instance(InstanceRecord("batch", "0"), 10)
        dup = Transaction("batch", (Claim("j1", 0, "m1", 0), Claim("j1", 0, "m2", 0)))

        def attempt() -> None:
            with pytest.raises(TransactionError, match="already claimed by claim 0"):
                store.commit(dup)

        _unchanged(kv, attempt)


def test_sync_resumes_after_the_server_restarts(kv: KV) -> None:
    admin = CellStore(kv)
    admin.add_machine(machine("m1"))
    with running_server(kv) as first:
        port = first.port
        with client_for(first, retry_for=10) as client:
            copy = remote_replica(client).start()
            try:
                first.stop(grace=0)
                # While no server runs, the cell changes; a new server on the same port
                # serves the copy the change it missed.
                revision = admin.add_machine(machine("m2"))
                with running_server(kv, listen=f"127.0.0.1:{port}"):
                    assert copy.wait_for(revision, timeout=10)
                    assert set(copy.snapshot().machines) == {"m1", "m2"}
            finally:
                copy.stop()


def test_two_servers_share_one_cell(kv: KV) -> None:
    admin = CellStore(kv)
    admin.add_machine(machine("m1", cpu=2))
    admin.submit_job(job("j1", tasks=1, cpu=2))
    admin.submit_job(job("j2", tasks=1, cpu=2))
    with running_server(kv) as a, running_server(kv) as b, \
            client_for(a) as ca, client_for(b) as cb:
        sa, sb = RemoteStore(ca), RemoteStore(cb)
        sa.register_instance(InstanceRecord("batch", "a"), 10)
        sb.register_instance(InstanceRecord("batch", "b"), 10)
        seq = ca.list_machines()[0]["seq"]
        # Both saw the machine empty; only one of the two claims can win it.
        ra = sa.commit(Transaction("batch", (Claim("j1", 0, "m1", seq),)))
        rb = sb.commit(Transaction("batch", (Claim("j2", 0, "m1", seq),)))
        assert len(ra.committed) + len(rb.committed) == 1
        assert rb.rejected[0].reason is Reason.INSUFFICIENT_RESOURCES
        deadline = time.monotonic() + 5
        while cb.list_machines()[0]["tasks"] != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cb.list_machines()[0]["used"] == {"cpu": 2.0, "mem": 1.0}


def test_a_plan_of_several_jobs_is_one_commit_call_answered_per_job(
        kv: KV, server: CellStateServer) -> None:
    """Over real gRPC: one Commit carries a transaction per job (one with fallbacks, one
    that moves a running task); each is answered on its own, the fallback's machine is
    named, and all of it is one etcd write."""
    with client_for(server) as client:
        store = RemoteStore(client)
        store.register_instance(InstanceRecord("batch", "0"), 10)
        client.submit_job(job("j2", tasks=2, cpu=2))
        client.submit_job(job("j3", tasks=1, cpu=2))
        seqs = {m["id"]: m["seq"] for m in client.list_machines()}
        assert store.commit(Transaction("batch", (Claim("j1", 0, "m1", seqs["m1"]),))).ok
        # The server lists machines from its replica, which may not have seen the commit
        # yet: stale sequence numbers would make the plan below conflict.
        deadline = time.monotonic() + 5
        while True:
            listed = {m["id"]: m["seq"] for m in client.list_machines()}
            if listed["m1"] != seqs["m1"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        seqs = listed

        def revision() -> int:  # etcd's, not the server copy's (which may lag)
            return kv.range(b"\x00", b"\x00").revision

        before = revision()
        txns = [
            # j1/0 moves to m2; j1/1 takes its place on m1.
            Transaction("batch", (Claim("j1", 0, "m2", seqs["m2"], moves_from="m1"),
                                  Claim("j1", 1, "m1", seqs["m1"])), job="j1"),
            # After j1's: j2/0 fits m1, j2/1 falls back to m2, j3 finds room on neither.
            Transaction("batch", tuple(
                Claim("j2", i, "m1", seqs["m1"], fallbacks=(Fallback("m2", seqs["m2"]),))
                for i in range(2)), job="j2"),
            Transaction("rogue", (Claim("j3", 0, "m1", seqs["m1"],
                                        fallbacks=(Fallback("m2", seqs["m2"]),)),), job="j3"),
        ]
        with pytest.raises(StoreError, match="instance rogue/0 is not registered"):
            store.commit_many(txns)
        assert revision() == before  # nothing of the batch was applied
        txns[2] = Transaction("batch", txns[2].claims, job="j3")
        r1, r2, r3 = store.commit_many(txns)
        assert r1.ok and r1.placed_on() == {"j1/0": "m2", "j1/1": "m1"}
        assert r2.ok and r2.placed_on() == {"j2/0": "m1", "j2/1": "m2"}
        assert r2.fell_back == ("j2/1",)
        assert [(r.claim.task, r.reason) for r in r3.rejected] == [
            ("j3/0", Reason.INSUFFICIENT_RESOURCES)]
        assert "fallbacks: machine 'm2' has 0 cpu free" in r3.rejected[0].detail
        # One etcd write for the three jobs (their claims share machines, so even
        # per-machine writes keep them in one nested transaction).
        assert r1.revision == r2.revision == revision() == before + 1
        tasks = {t["index"]: t for t in client.get_job("j1")["tasks"]}
        assert (tasks[0]["state"], tasks[0]["machine"]) == ("running", "m2")


def test_malformed_batches_get_invalid_argument_and_change_nothing(
        kv: KV, server: CellStateServer) -> None:
    channel, stub = _stub(server)
    ok = pb.Transaction(scheduler="batch", claims=[pb.Claim(job="j1", machine="m1")])
    cases = [
        (pb.CommitRequest(transaction=ok, transactions=[ok]), "either transaction or"),
        (pb.CommitRequest(transactions=[ok, pb.Transaction(scheduler="batch")]),
         r"transactions\[1\]: transaction has no claims"),
        (pb.CommitRequest(transactions=[ok, pb.Transaction(scheduler="batch", claims=[
            pb.Claim(job="j1", index=1, machine="m1",
                     fallbacks=[pb.Fallback(machine=f"m{i}") for i in range(3, 8)])])]),
         r"transactions\[1\].claims\[0\].fallbacks: 5 given, more than the limit of 4"),
        (pb.CommitRequest(transactions=[pb.Transaction(scheduler="batch", claims=[
            pb.Claim(job="j1", machine="m1", moves_from="m1")])]),
         r"transactions\[0\]: .*claim 0: moves task j1/0 from 'm1' to the same machine"),
    ]
    try:
        for request, message in cases:
            def attempt(request: pb.CommitRequest = request, message: str = message) -> None:
                with pytest.raises(grpc.RpcError) as err:
                    stub.Commit(request, timeout=5)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
                assert re.search(message, err.value.details()), err.value.details()

            _unchanged(kv, attempt)
    finally:
        channel.close()

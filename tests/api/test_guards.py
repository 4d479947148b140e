"""Guards on what any caller of the service can do to others: only the holder of an
instance's lease can withdraw it or report its metrics, an agent cannot take over a
live agent's machines, refused requests leave nothing behind, requests too large or
from the future are refused as what they are, names are checked whole, and status
calls do not read every task of the cell."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import orjson
import pytest

import cellstate.api.server
import cellstate.jobinfo
from cellstate.api.client import ClientError
from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.server import CellStateServer, metrics_prefix
from cellstate.keys import KeyKind, Keyspace
from cellstate.kv.base import KV, prefix_end
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, MachineState, Transaction
from cellstate.store import CellStore, StoreError
from schedulers.testing import claims, job, machine, make_cell, txn
from tests.api.service_fixture import client_for, running_server

KEYS = Keyspace("default")
METRICS_LIMIT = 16 * 1024  # the server's MAX_METRICS_BYTES


@pytest.fixture
def server(kv: KV) -> Iterator[CellStateServer]:
    admin = CellStore(kv)
    admin.add_machines([machine("m1", cpu=4)])
    admin.submit_job(job("j1", tasks=3, cpu=2))
    with running_server(kv) as s:
        yield s


@pytest.fixture
def stub(server: CellStateServer) -> Iterator[pb_grpc.CellStateStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
    finally:
        channel.close()


def revision(kv: KV) -> int:
    return kv.range(b"\x00", b"\x00").revision


def refused(call: Callable[..., Any], request: Any, code: grpc.StatusCode, message: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=10)
    assert err.value.code() is code, err.value.details()
    assert re.search(message, err.value.details()), err.value.details()
    return str(err.value.details())


def register(stub: pb_grpc.CellStateStub, scheduler: str, instance: str) -> int:
    return int(stub.RegisterInstance(pb.RegisterInstanceRequest(
        scheduler=scheduler, instance=instance, ttl=30), timeout=10).lease)


def register_agent(stub: pb_grpc.CellStateStub, agent: str, *docs: dict[str, Any],
                   ) -> pb.RegisterAgentResponse:
    request = pb.RegisterAgentRequest(agent=agent, ttl=30,
                                      machines_json=[orjson.dumps(d) for d in docs])
    reply: pb.RegisterAgentResponse = stub.RegisterAgent(request, timeout=10)
    return reply


def mdoc(mid: str, cpu: float = 4, **extra: Any) -> dict[str, Any]:
    return {"id": mid, "capacity": {"cpu": cpu, "mem": 16}, **extra}


def stored_machine(kv: KV, mid: str) -> Any:
    """The machine as etcd holds it, its allocations included."""
    return CellStore(kv, KEYS.cell).read_snapshot().machines[mid]


# -- 7: deregistration ---------------------------------------------------------------------


def test_only_the_lease_holder_can_deregister_an_instance(
        kv: KV, server: CellStateServer, stub: pb_grpc.CellStateStub) -> None:
    mine, other = register(stub, "batch", "0"), register(stub, "batch", "1")
    before = revision(kv)
    refused(stub.DeregisterInstance, pb.DeregisterInstanceRequest(
        scheduler="batch", instance="0", lease=0),
        grpc.StatusCode.INVALID_ARGUMENT, r"lease: 0 is no lease")
    refused(stub.DeregisterInstance, pb.DeregisterInstanceRequest(
        scheduler="batch", instance="0", lease=other),
        grpc.StatusCode.FAILED_PRECONDITION,
        r"instance batch/0 is registered under another lease .* only its holder")
    assert revision(kv) == before
    assert kv.range(KEYS.instance("batch", "0")).kvs and kv.lease_keepalive(other) > 0
    # So the instance is still registered and places work.
    with client_for(server) as client:
        seq = client.list_machines()[0]["seq"]
        res = client.commit(Transaction("batch", (Claim("j1", 0, "m1", seq),)), "0")
        assert [c.index for c in res.committed] == [0]
    # Its holder withdraws it (and the lease); doing so again is harmless.
    request = pb.DeregisterInstanceRequest(scheduler="batch", instance="0", lease=mine)
    stub.DeregisterInstance(request, timeout=10)
    assert not kv.range(KEYS.instance("batch", "0")).kvs
    assert stub.KeepAlive(pb.KeepAliveRequest(lease=mine), timeout=10).ttl == 0
    stub.DeregisterInstance(request, timeout=10)


def test_deregistering_with_an_agents_lease_does_not_end_the_agent(
        kv: KV, stub: pb_grpc.CellStateStub) -> None:
    lease = register_agent(stub, "a1", mdoc("m9")).lease
    stub.DeregisterInstance(pb.DeregisterInstanceRequest(
        scheduler="nobody", instance="x", lease=lease), timeout=10)
    assert kv.lease_keepalive(lease) > 0
    assert kv.range(KEYS.agent("a1")).kvs
    assert stored_machine(kv, "m9").state is MachineState.UP


# -- 7: agents -----------------------------------------------------------------------------


def test_an_agent_cannot_take_over_a_live_agents_machines(
        kv: KV, stub: pb_grpc.CellStateStub) -> None:
    a1 = register_agent(stub, "a1", mdoc("m2"), mdoc("m3")).lease
    admin = CellStore(kv)
    seq = stored_machine(kv, "m2").seq
    assert admin.commit(Transaction("batch", (Claim("j1", 0, "m2", seq),))).committed
    before = revision(kv)
    refused(stub.RegisterAgent, pb.RegisterAgentRequest(
        agent="a2", ttl=30, machines_json=[orjson.dumps(mdoc("m3")), orjson.dumps(mdoc("m4"))]),
        grpc.StatusCode.FAILED_PRECONDITION,
        r"agent a2: machines belong to another live agent \(m3 to agent 'a1'\)")
    # Nothing written: no key for a2, no m4, m3 still a1's with its task.
    assert revision(kv) == before
    assert not kv.range(KEYS.agent("a2")).kvs and not kv.range(KEYS.machine("m4")).kvs
    assert stored_machine(kv, "m3").agent == "a1"
    assert "j1/0" in stored_machine(kv, "m2").allocations
    # Once a1 is gone, its machines are free for another agent.
    kv.lease_revoke(a1)
    register_agent(stub, "a2", mdoc("m3"), mdoc("m4"))
    m3 = stored_machine(kv, "m3")
    assert (m3.agent, m3.state) == ("a2", MachineState.UP)


def test_the_same_agent_registering_again_keeps_its_machines(
        kv: KV, stub: pb_grpc.CellStateStub) -> None:
    register_agent(stub, "a1", mdoc("m2"))
    register_agent(stub, "a1", mdoc("m2", cpu=8))  # a restart before the old lease lapsed
    m2 = stored_machine(kv, "m2")
    assert (m2.agent, m2.capacity.get("cpu")) == ("a1", 8)


def test_a_refused_registration_writes_nothing(kv: KV, stub: pb_grpc.CellStateStub) -> None:
    # m1 runs a task holding 2 cpus; a registration that shrinks it to 1 cpu is refused
    # before the agent's key or its other machine is written.
    admin = CellStore(kv)
    seq = stored_machine(kv, "m1").seq
    assert admin.commit(Transaction("batch", (Claim("j1", 0, "m1", seq),))).committed
    before = revision(kv)
    refused(stub.RegisterAgent, pb.RegisterAgentRequest(
        agent="a3", ttl=30, machines_json=[orjson.dumps(mdoc("m5")),
                                           orjson.dumps(mdoc("m1", cpu=1))]),
        grpc.StatusCode.FAILED_PRECONDITION, r"machine m1: new capacity 1 cpu is below the 2")
    assert revision(kv) == before
    assert not kv.range(KEYS.agent("a3")).kvs and not kv.range(KEYS.machine("m5")).kvs


def test_a_registration_etcd_refuses_as_too_large_leaves_no_agent_behind() -> None:
    """etcd's "request is too large" is the caller's to fix, not a reason to retry: it
    is INVALID_ARGUMENT (was UNAVAILABLE, retried for 30 s), and the registration it
    cut short leaves no agent key and no lease."""
    kv = MemoryKV(max_request_bytes=16 * 1024)
    labels = {f"l{i}": "x" * 200 for i in range(4)}
    docs = [mdoc(f"m{i:03}", labels=labels) for i in range(40)]
    with running_server(kv) as server:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            stub = pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
            refused(stub.RegisterAgent, pb.RegisterAgentRequest(
                agent="a1", ttl=30, machines_json=[orjson.dumps(d) for d in docs]),
                grpc.StatusCode.INVALID_ARGUMENT, r"too large for etcd")
            assert not kv.range(KEYS.agent("a1")).kvs
            machines = KEYS.prefix(KeyKind.MACHINE)
            assert not kv.range(machines, prefix_end(machines)).kvs
            # The server's status as of every write so far: its replica may not have
            # caught up yet (a run at load 9 read it between the agent key written and
            # taken back: 1 agent).
            status = stub.GetStatus(pb.GetStatusRequest(min_revision=revision(kv)))
            assert status.agents == 0
        finally:
            channel.close()


# -- 7: metrics ----------------------------------------------------------------------------


def test_metrics_need_the_instances_live_lease_and_are_bounded(
        kv: KV, stub: pb_grpc.CellStateStub) -> None:
    mine, other = register(stub, "batch", "0"), register(stub, "batch", "1")
    prefix = metrics_prefix("default")

    def reports() -> list[bytes]:
        return [k.key for k in kv.range(prefix, prefix_end(prefix)).kvs]

    def report(instance: str, lease: int, body: bytes = b'{"tasks_placed": 1}') -> Any:
        return pb.ReportMetricsRequest(scheduler="batch", instance=instance, lease=lease,
                                       metrics_json=body)

    refused(stub.ReportMetrics, report("0", 0), grpc.StatusCode.INVALID_ARGUMENT,
            r"lease: 0 is no lease")
    refused(stub.ReportMetrics, report("0", other), grpc.StatusCode.FAILED_PRECONDITION,
            r"instance batch/0 is not registered under lease")
    refused(stub.ReportMetrics, report("9", mine), grpc.StatusCode.FAILED_PRECONDITION,
            r"instance batch/9 is not registered under lease")
    big = orjson.dumps({"pad": "x" * METRICS_LIMIT})
    refused(stub.ReportMetrics, report("0", mine, big), grpc.StatusCode.INVALID_ARGUMENT,
            rf"metrics_json: {len(big)} bytes, above the limit of {METRICS_LIMIT} bytes")
    refused(stub.ReportMetrics, pb.ReportMetricsRequest(
        scheduler="batch", instance="0/x", lease=mine, metrics_json=b"{}"),
        grpc.StatusCode.INVALID_ARGUMENT, r"instance '0/x' is not a valid name")
    assert reports() == []
    for _ in range(3):
        stub.ReportMetrics(report("0", mine), timeout=10)
    assert reports() == [prefix + b"batch/0"]
    (found,) = kv.range(prefix + b"batch/0").kvs
    assert found.lease == mine
    stub.DeregisterInstance(pb.DeregisterInstanceRequest(
        scheduler="batch", instance="0", lease=mine), timeout=10)
    assert reports() == []


# -- 8b: an oversized job ------------------------------------------------------------------


def test_an_oversized_job_spec_is_refused_as_too_large(
        kv: KV, server: CellStateServer, stub: pb_grpc.CellStateStub) -> None:
    spec = {"id": "big", "scheduler": "batch", "task_resources": {"cpu": 1},
            "labels": {f"k{i}": "v" * 100 for i in range(20_000)}}
    before = revision(kv)
    refused(stub.SubmitJob, pb.SubmitJobRequest(spec_json=orjson.dumps(spec)),
            grpc.StatusCode.INVALID_ARGUMENT,
            r"job big: its spec is \d+ bytes encoded, above the limit of 1048576 bytes")
    with client_for(server, retry_for=30) as client, \
            pytest.raises(ClientError, match="above the limit"):
        client.submit_job(spec)  # at once: not retried as if no server answered
    assert revision(kv) == before


# -- 8c: a sync from the future ------------------------------------------------------------


def test_a_sync_from_a_future_revision_is_refused(
        kv: KV, stub: pb_grpc.CellStateStub) -> None:
    now = revision(kv)
    stream = stub.Sync(pb.SyncRequest(start_revision=now + 1000), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() is grpc.StatusCode.OUT_OF_RANGE
    assert f"start_revision {now + 1000} is in the future: the cell is at revision {now}" in \
        str(err.value.details())
    # The revision after the newest is where an up-to-date copy resumes: it waits.
    stream = stub.Sync(pb.SyncRequest(start_revision=now + 1), timeout=10)
    added = CellStore(kv).add_machine(machine("m7"))
    msg = next(stream)
    assert msg.revision == added and [r.key for r in msg.records] == ["machines/m7"]
    stream.cancel()


# -- 9: names ------------------------------------------------------------------------------


@pytest.mark.parametrize(("scheduler", "instance", "field"), [
    ("zeta/y", "0", "scheduler"), ("a\x00b", "0", "scheduler"), ("ok\n", "0", "scheduler"),
    ("batch", "0/1", "instance"), ("batch", "", "instance"),
])
def test_register_instance_checks_names(kv: KV, server: CellStateServer,
                                        stub: pb_grpc.CellStateStub, scheduler: str,
                                        instance: str, field: str) -> None:
    before = revision(kv)
    refused(stub.RegisterInstance, pb.RegisterInstanceRequest(
        scheduler=scheduler, instance=instance, ttl=30),
        grpc.StatusCode.INVALID_ARGUMENT, rf"{field} .* is not a valid name")
    assert revision(kv) == before
    # "zeta/y" must not make "zeta" look registered.
    with client_for(server) as client, pytest.raises(StoreError, match="not registered"):
        client.commit(Transaction("zeta", (Claim("j1", 0, "m1", 0),)))


# -- 8d: status calls ---------------------------------------------------------------------


class TaskReads:
    """Counts task_view calls made by the server's request threads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for module in (cellstate.jobinfo, cellstate.api.server):
            original = module.task_view
            monkeypatch.setattr(module, "task_view", self._counting(original))

    def _counting(self, original: Any) -> Any:
        def task_view(*args: Any) -> Any:
            if threading.current_thread().name.startswith("cellstate"):
                self.count += 1
            return original(*args)
        return task_view

    def during(self, call: Any) -> int:
        before = self.count
        call()
        return self.count - before


def test_status_calls_do_not_read_every_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a million-task job, GetStatus and ListJobs read no task, and GetJob reads
    only the tasks that have a record (before: every task of every job, 2.5-3.7 s a
    call; benchmarks/status_calls.py has the times)."""
    kv = MemoryKV()
    store = make_cell(kv, [machine("m1", cpu=64)],
                      [job("huge", tasks=1_000_000, cpu=0.01, mem=0.01),
                       job("small", tasks=1000, cpu=0.01, mem=0.01)])
    snap = store.read_snapshot()
    assert store.commit(txn(claims(snap, "huge", [(0, "m1"), (1, "m1")]))).ok
    assert store.commit(txn(claims(store.read_snapshot(), "small",
                                   [(0, "m1"), (1, "m1"), (2, "m1")]))).ok
    with running_server(kv) as server, client_for(server) as client:
        reads = TaskReads(monkeypatch)
        status: dict[str, Any] = {}
        assert reads.during(lambda: status.update(client.status())) == 0
        assert status["tasks"] == {"pending": 1_000_995, "running": 5}
        listed: list[dict[str, Any]] = []
        assert reads.during(lambda: listed.extend(client.list_jobs())) == 0
        assert [j["task_states"] for j in listed] == [
            {"pending": 999_998, "running": 2}, {"pending": 997, "running": 3}]
        info: dict[str, Any] = {}
        assert reads.during(lambda: info.update(client.get_job("small"))) == 3
        assert len(info["tasks"]) == 1000 and info["tasks"][2]["machine"] == "m1"

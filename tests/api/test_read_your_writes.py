"""Status reads see the writes that came before them: a server answers from its copy
of the cell (a watch a moment behind etcd), so a read waits for that copy to reach
the server's own last write and the revision the caller names (``min_revision``, which
the client fills in from every reply it has had), and finds a job etcd holds that the
copy does not have yet. A copy that cannot catch up in time answers UNAVAILABLE and the
client asks the next server."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import orjson
import pytest

from cellstate import codec
from cellstate.api import server as server_module
from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.server import CellStateServer
from cellstate.kv.memory import MemoryKV
from cellstate.store import CellStore
from schedulers.testing import job, machine
from tests.api.service_fixture import client_for, running_server


class Gate:
    """Holds a server's copy of the cell back: while closed, the copy's sync thread
    waits before applying what etcd sent (its records listeners run first)."""

    def __init__(self, server: CellStateServer) -> None:
        self._open = threading.Event()
        self._open.set()
        server.replica.on_records(self._wait)

    def _wait(self, *_: Any) -> None:
        self._open.wait(30)

    def close(self) -> None:
        self._open.clear()

    def open(self, after: float = 0.0) -> None:
        threading.Timer(after, self._open.set).start()


@pytest.fixture
def kv() -> Iterator[MemoryKV]:
    store = MemoryKV()
    admin = CellStore(store)
    admin.add_machines([machine("m1", cpu=4)])
    yield store
    store.close()


def _stub(server: CellStateServer) -> tuple[grpc.Channel, pb_grpc.CellStateStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    return channel, pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]


def test_a_job_is_known_to_the_server_that_took_it_even_while_its_copy_lags(
        kv: MemoryKV) -> None:
    with running_server(kv) as s, client_for(s) as client:
        gate = Gate(s)
        gate.close()
        revision = client.submit_job(job("j1", tasks=2, cpu=1))
        assert s.replica.revision < revision  # the copy is behind the write
        gate.open(after=0.3)
        info = client.get_job("j1")
        assert info["spec"]["id"] == "j1" and info["task_states"] == {"pending": 2}
        assert s.replica.revision >= revision


def test_other_status_reads_show_the_servers_own_writes(kv: MemoryKV) -> None:
    with running_server(kv) as s:
        channel, stub = _stub(s)
        gate = Gate(s)
        try:
            gate.close()
            stub.SubmitJob(pb.SubmitJobRequest(
                spec_json=orjson.dumps(codec.job_to_doc(job("j1", tasks=1, cpu=1)))))
            gate.open(after=0.3)
            # A client that sent no min_revision still sees the job in every read.
            assert [j.revision > 0 for j in stub.ListJobs(pb.ListJobsRequest()).jobs] == [True]
            assert dict(stub.GetStatus(pb.GetStatusRequest()).jobs) == {"pending": 1}
            gate.close()
            reply = stub.SetMachineState(pb.SetMachineStateRequest(machine="m1",
                                                                   action="cordon"))
            gate.open(after=0.3)
            machines = stub.ListMachines(pb.ListMachinesRequest()).machines
            assert reply.state != "up"
            assert orjson.loads(machines[0].machine_json)["state"] == reply.state
        finally:
            channel.close()


def test_a_job_written_through_another_server_is_found(kv: MemoryKV) -> None:
    with running_server(kv, name="a") as a, running_server(kv, name="b") as b:
        gate = Gate(a)
        gate.close()
        with client_for(b) as through_b:
            revision = through_b.submit_job(job("j1", tasks=1, cpu=1))
        channel, stub = _stub(a)
        try:
            gate.open(after=0.3)
            # No min_revision: a finds the job in etcd and waits for its copy to hold it.
            info = stub.GetJob(pb.GetJobRequest(job="j1"))
            assert info.revision == revision
            # An unknown job is still unknown, at once.
            with pytest.raises(grpc.RpcError) as e:
                stub.GetJob(pb.GetJobRequest(job="j2"))
            assert e.value.code() is grpc.StatusCode.NOT_FOUND
            assert "unknown job 'j2'" in str(e.value.details())
        finally:
            channel.close()


def test_min_revision_waits_for_the_callers_write(kv: MemoryKV) -> None:
    with running_server(kv, name="a") as a, running_server(kv, name="b") as b, \
            client_for(b) as through_b:
        submitted = through_b.submit_job(job("j1", tasks=1, cpu=1))
        assert a.replica.wait_for(submitted, timeout=5)
        gate = Gate(a)
        gate.close()
        killed = through_b.kill_job("j1", reason="changed my mind")
        channel, stub = _stub(a)
        try:
            # Without it, a answers from its copy: the job before the kill.
            assert stub.GetJob(pb.GetJobRequest(job="j1")).state != "killed"
            gate.open(after=0.3)
            info = stub.GetJob(pb.GetJobRequest(job="j1", min_revision=killed))
            assert info.state == "killed"
        finally:
            channel.close()


def test_a_copy_that_cannot_catch_up_sends_the_client_to_the_next_server(
        kv: MemoryKV, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "READ_WAIT", 0.3)
    with running_server(kv, name="a") as a, running_server(kv, name="b") as b:
        gate = Gate(a)
        gate.close()
        try:
            channel, stub = _stub(a)
            try:
                stub.SubmitJob(pb.SubmitJobRequest(
                    spec_json=orjson.dumps(codec.job_to_doc(job("j1", tasks=1, cpu=1)))))
                with pytest.raises(grpc.RpcError) as e:
                    stub.GetJob(pb.GetJobRequest(job="j1"))
                assert e.value.code() is grpc.StatusCode.UNAVAILABLE
                assert re.fullmatch(r"server a: its copy of the cell is at revision \d+, not "
                                    r"yet at \d+ after 0.3 s; ask another server or again",
                                    str(e.value.details()))
            finally:
                channel.close()
            with client_for(a, b) as both:
                both.submit_job(job("j2", tasks=1, cpu=1))
                assert both.get_job("j2")["spec"]["id"] == "j2"  # answered by b
                assert both.endpoint == f"127.0.0.1:{b.port}"
        finally:
            gate.open()


@pytest.mark.parametrize(("min_revision", "message"), [
    (-1, "min_revision: -1 is not a revision (>= 0)"),
    (10**9, "min_revision 1000000000 is in the future: the cell is at revision "),
])
def test_a_bad_min_revision_is_refused(kv: MemoryKV, min_revision: int, message: str) -> None:
    with running_server(kv) as s:
        channel, stub = _stub(s)
        try:
            before = kv.range(b"", b"\0").revision
            calls: list[Callable[[], object]] = [
                lambda: stub.GetJob(pb.GetJobRequest(job="j1", min_revision=min_revision)),
                lambda: stub.ListJobs(pb.ListJobsRequest(min_revision=min_revision)),
                lambda: stub.ListMachines(pb.ListMachinesRequest(min_revision=min_revision)),
                lambda: stub.GetStatus(pb.GetStatusRequest(min_revision=min_revision)),
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert message in str(e.value.details())
            assert kv.range(b"", b"\0").revision == before
        finally:
            channel.close()


def test_the_client_asks_for_the_newest_revision_it_has_seen(kv: MemoryKV) -> None:
    with running_server(kv) as s, client_for(s) as client:
        assert client.seen_revision == 0
        revision = client.submit_job(job("j1", tasks=1, cpu=1))
        assert client.seen_revision == revision
        listed = client.list_machines()
        assert listed and client.seen_revision >= revision
        client.saw(revision - 1)  # never goes back
        assert client.seen_revision >= revision

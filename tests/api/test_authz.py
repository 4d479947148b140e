"""The authorization matrix (docs/security.md), walked over real mutual TLS against a
cellstate server on a real etcd: every identity tries every kind of call. A refused
call gets PERMISSION_DENIED or UNAUTHENTICATED with a message saying who and why, and
leaves etcd's revision exactly as it was; an allowed one does what it says."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import grpc
import orjson
import pytest

from cellstate import codec
from cellstate.api import convert
from cellstate.api.auth import Identity, Kind, parse_identity
from cellstate.api.config import ServerConfig
from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.server import CellStateServer
from cellstate.api.tls import TlsFiles, channel_credentials
from cellstate.keys import Keyspace
from cellstate.kv.etcd import EtcdKV
from cellstate.model import CellConfig, Claim, SchedulerLimits, Transaction
from cellstate.store import CellStore
from omega.certs import DevCA
from schedulers.testing import machine
from tests.etcd_fixture import make_local_etcd

pytestmark = pytest.mark.etcd

OK = "ok"
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
FINAL = grpc.StatusCode.FAILED_PRECONDITION

IDENTITIES = ["operator:root", "user:alice", "user:bob", "scheduler:batch",
              "scheduler:service", "scheduler:evil", "agent:agent-0", "agent:agent-1",
              "server:cellstate", "submitter:workload"]
LIMITS = CellConfig({"batch": SchedulerLimits(max_precedence=50), "service": SchedulerLimits()})


@attrs.define
class Cell:
    server: CellStateServer
    kv: EtcdKV
    ca: DevCA
    stubs: dict[str, Any] = attrs.field(factory=dict)
    leases: dict[str, int] = attrs.field(factory=dict)  # scheduler -> its i0's lease
    called: set[str] = attrs.field(factory=set)  # every RPC method called
    channels: list[grpc.Channel] = attrs.field(factory=list)

    def files(self, who: str) -> TlsFiles:
        identity = parse_identity(who)
        files = self.ca.files(identity)
        return files if files.cert.exists() else self.ca.issue(identity)

    def stub(self, who: str) -> Any:
        if who not in self.stubs:
            channel = grpc.secure_channel(f"127.0.0.1:{self.server.port}",
                                          channel_credentials(self.files(who)))
            self.channels.append(channel)
            self.stubs[who] = pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
        return self.stubs[who]

    def call(self, who: str, method: str, request: Any) -> Any:
        self.called.add(method)
        return getattr(self.stub(who), method)(request, timeout=10)

    def revision(self) -> int:
        return self.kv.range(b"\x00").revision

    def settle(self) -> None:
        """Wait until the server's copy has every write (its checks read it)."""
        assert self.server.replica.wait_for(self.revision(), timeout=10)

    def close(self) -> None:
        for c in self.channels:
            c.close()


def _job(id_: str, owner: str, scheduler: str = "batch", precedence: int = 1,
         tasks: int = 3) -> pb.SubmitJobRequest:
    return pb.SubmitJobRequest(spec_json=orjson.dumps({
        "id": id_, "owner": owner, "scheduler": scheduler, "task_count": tasks,
        "task_resources": {"cpu": 1, "mem": 1}, "precedence": precedence, "duration": 60}))


def _register(agent: str, *machines: str, cpu: float = 8, rack: str = "",
              ) -> pb.RegisterAgentRequest:
    return pb.RegisterAgentRequest(agent=agent, ttl=3600, machines_json=[
        orjson.dumps(codec.machine_to_doc(attrs.evolve(machine(m, cpu=cpu), agent=agent,
                                                       rack=rack)))
        for m in machines])


def _commit(scheduler: str, job: str, index: int, mid: str) -> pb.CommitRequest:
    txn = Transaction(scheduler, (Claim(job, index, mid),))
    return pb.CommitRequest(transaction=convert.transaction_to(txn, "i0"))


@contextlib.contextmanager
def _cell(etcd_kv: EtcdKV, tmp_path: Path) -> Iterator[Cell]:
    """Machines m0 (an operator's: no agent), m1 (agent-0's) and m2 (agent-1's); jobs
    ja (alice's, one task running on m1), jb (bob's), jdone (alice's, finished), jsvc
    (alice's, for the service scheduler), jk (alice's, killed), jab (alice's, abandoned
    by batch with a task running on m1); the instances batch/i0 and service/i0. All
    made through the API by the identities allowed to (m0 by an operator in etcd)."""
    ca = DevCA(tmp_path / "certs")
    tls = ca.issue(Identity(Kind.SERVER, "cellstate"))
    # submitter:workload may submit for bob only (a submitter not listed: itself only).
    config = ServerConfig(listen="127.0.0.1:0", limits=LIMITS, tls=tls,
                          submitter_owners=(("workload", ("bob",)),))
    server = CellStateServer(etcd_kv, config)
    server.start()
    c = Cell(server, etcd_kv, ca)
    try:
        # An operator with etcd access adds a machine no agent runs (the API has no call
        # for it: it is not leased, so it never goes down).
        CellStore(etcd_kv, config.cell).add_machine(machine("m0", cpu=8))
        c.call("agent:agent-0", "RegisterAgent", _register("agent-0", "m1"))
        c.call("agent:agent-1", "RegisterAgent", _register("agent-1", "m2"))
        for req, who in ((_job("ja", "alice"), "user:alice"), (_job("jb", "bob"), "user:bob"),
                         (_job("jdone", "alice", tasks=1), "user:alice"),
                         (_job("jsvc", "alice", "service"), "user:alice"),
                         (_job("jk", "alice"), "user:alice"),
                         (_job("jab", "alice"), "user:alice")):
            c.call(who, "SubmitJob", req)
        for s in ("batch", "service"):
            c.leases[s] = c.call(f"scheduler:{s}", "RegisterInstance",
                                 pb.RegisterInstanceRequest(scheduler=s, instance="i0",
                                                            ttl=3600)).lease
        c.settle()
        c.call("scheduler:batch", "Commit", _commit("batch", "ja", 0, "m1"))
        c.call("scheduler:batch", "Commit", _commit("batch", "jdone", 0, "m1"))
        c.call("scheduler:batch", "Commit", _commit("batch", "jab", 0, "m1"))
        c.settle()
        c.call("scheduler:batch", "SetJobStatus", pb.SetJobStatusRequest(
            job="jab", state="abandoned", reason="gave up"))
        c.call("agent:agent-0", "ReportTask", pb.ReportTaskRequest(
            task="jdone/0", outcome="finished", agent="agent-0", machine="m1"))
        c.call("user:alice", "KillJob", pb.KillJobRequest(job="jk", reason="test"))
        c.settle()
        assert orjson.loads(c.call("operator:root", "GetJob",
                                   pb.GetJobRequest(job="jdone")).spec_json)["id"] == "jdone"
        yield c
    finally:
        c.close()
        server.stop(grace=0)


@pytest.fixture
def cell(etcd_kv: EtcdKV, tmp_path: Path) -> Iterator[Cell]:
    """The cell of :func:`_cell`, made for this test."""
    with _cell(etcd_kv, tmp_path) as c:
        yield c


@pytest.fixture(scope="module")
def refusing_cell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cell]:
    """The cell of :func:`_cell`, one for every case of the matrix that expects a
    refusal: a refused call changes nothing (each such case asserts that etcd's
    revision did not move), so they need no cell of their own (348 of its 450 cases,
    each a server and a dozen calls to set it up: 70 s of the run). On an etcd of its
    own: the shared one is emptied before every test that takes ``etcd_kv``."""
    server = make_local_etcd()
    server.start()
    try:
        kv = EtcdKV([server.endpoint])
        try:
            with _cell(kv, tmp_path_factory.mktemp("authz")) as c:
                yield c
        finally:
            kv.close()
    finally:
        server.stop()


Call = Callable[[Cell, str], Any]


def _lease(c: Cell) -> int:
    return int(c.call("scheduler:batch", "RegisterInstance", pb.RegisterInstanceRequest(
        scheduler="batch", instance="i9", ttl=60)).lease)


# Each operation: what the caller sends (given its name, for "its own" cases).
OPERATIONS: dict[str, Call] = {
    "read status": lambda c, w: c.call(w, "GetStatus", pb.GetStatusRequest()),
    "list jobs": lambda c, w: c.call(w, "ListJobs", pb.ListJobsRequest()),
    "get a job": lambda c, w: c.call(w, "GetJob", pb.GetJobRequest(job="ja")),
    "list machines": lambda c, w: c.call(w, "ListMachines", pb.ListMachinesRequest()),
    "sync": lambda c, w: next(iter(c.call(w, "Sync", pb.SyncRequest(start_revision=0)))),
    "submit as alice": lambda c, w: c.call(w, "SubmitJob", _job("jn", "alice")),
    "submit as bob": lambda c, w: c.call(w, "SubmitJob", _job("jn", "bob")),
    "submit, no owner": lambda c, w: c.call(w, "SubmitJob", pb.SubmitJobRequest(
        spec_json=orjson.dumps({"id": "jn", "scheduler": "batch", "task_count": 1,
                                "task_resources": {"cpu": 1}}))),
    "submit precedence 500 (service)": lambda c, w: c.call(
        w, "SubmitJob", _job("jn", w.partition(":")[2], "service", precedence=500)),
    "submit precedence 60 (batch caps 50)": lambda c, w: c.call(
        w, "SubmitJob", _job("jn", w.partition(":")[2], "batch", precedence=60)),
    "submit backdated to 1970": lambda c, w: c.call(w, "SubmitJob", pb.SubmitJobRequest(
        spec_json=orjson.dumps({"id": "jn", "scheduler": "batch", "task_count": 1,
                                "task_resources": {"cpu": 1}, "submitted_at": 1.0}))),
    "submit to unknown scheduler": lambda c, w: c.call(
        w, "SubmitJob", _job("jn", w.partition(":")[2], "evil")),
    "kill alice's job": lambda c, w: c.call(w, "KillJob", pb.KillJobRequest(
        job="ja", reason="test", by=w)),
    "kill finished job": lambda c, w: c.call(w, "KillJob", pb.KillJobRequest(
        job="jdone", reason="test", by=w)),
    "kill alice's job by SetJobStatus": lambda c, w: c.call(w, "SetJobStatus",
                                                            pb.SetJobStatusRequest(
        job="ja", state="killed", reason="test", by=w)),
    "kill killed job again": lambda c, w: c.call(w, "KillJob", pb.KillJobRequest(
        job="jk", reason="test")),
    "kill abandoned job, a task running": lambda c, w: c.call(w, "KillJob", pb.KillJobRequest(
        job="jab", reason="test")),
    "resize killed job": lambda c, w: c.call(w, "ResizeJob", pb.ResizeJobRequest(
        job="jk", task_count=5)),
    "abandon killed job": lambda c, w: c.call(w, "SetJobStatus", pb.SetJobStatusRequest(
        job="jk", state="abandoned", reason="test")),
    "resize alice's job": lambda c, w: c.call(w, "ResizeJob", pb.ResizeJobRequest(
        job="ja", task_count=5)),
    "abandon alice's job": lambda c, w: c.call(w, "SetJobStatus", pb.SetJobStatusRequest(
        job="ja", state="abandoned", reason="test", by=w)),
    "register batch instance": lambda c, w: c.call(w, "RegisterInstance",
                                                   pb.RegisterInstanceRequest(
        scheduler="batch", instance="i1", ttl=60)),
    "register evil instance": lambda c, w: c.call(w, "RegisterInstance",
                                                  pb.RegisterInstanceRequest(
        scheduler="evil", instance="i1", ttl=60)),
    "commit for batch": lambda c, w: c.call(w, "Commit", _commit("batch", "ja", 1, "m2")),
    "commit for evil": lambda c, w: c.call(w, "Commit", _commit("evil", "ja", 1, "m2")),
    "commit for batch, service's job": lambda c, w: c.call(w, "Commit",
                                                          _commit("batch", "jsvc", 1, "m2")),
    "deregister service/i0": lambda c, w: c.call(w, "DeregisterInstance",
                                                 pb.DeregisterInstanceRequest(
        scheduler="service", instance="i0", lease=c.leases["service"])),
    "report service/i0 pending for batch's ja": lambda c, w: c.call(
        w, "ReportPending", pb.ReportPendingRequest(
            scheduler="service", instance="i0", lease=c.leases["service"],
            reports=[pb.PendingReport(job="ja", report_json=b"{}")])),
    "report service/i0 pending": lambda c, w: c.call(w, "ReportPending",
                                                     pb.ReportPendingRequest(
        scheduler="service", instance="i0", lease=c.leases["service"],
        reports=[pb.PendingReport(job="jsvc", report_json=b"{}")])),
    "report batch metrics": lambda c, w: c.call(w, "ReportMetrics", pb.ReportMetricsRequest(
        scheduler="batch", instance="i0", lease=c.leases["batch"], metrics_json=b"{}")),
    "keep a lease alive": lambda c, w: c.call(w, "KeepAlive", pb.KeepAliveRequest(lease=1)),
    "register as agent-0 with m1": lambda c, w: c.call(w, "RegisterAgent",
                                                       _register("agent-0", "m1")),
    "register as agent-1 with m1": lambda c, w: c.call(w, "RegisterAgent",
                                                       _register("agent-1", "m1")),
    "register as agent-0 with m1 at 1e6 cpus": lambda c, w: c.call(
        w, "RegisterAgent", _register("agent-0", "m1", cpu=1e6)),
    "register as agent-0 with m1 in another rack": lambda c, w: c.call(
        w, "RegisterAgent", _register("agent-0", "m1", rack="r-evil")),
    "register as agent-0 with m0 (an operator's)": lambda c, w: c.call(
        w, "RegisterAgent", _register("agent-0", "m0")),
    "register as agent-0 with m1 and m0": lambda c, w: c.call(
        w, "RegisterAgent", _register("agent-0", "m1", "m0")),
    "register as agent-0 with a new machine": lambda c, w: c.call(
        w, "RegisterAgent", _register("agent-0", "m1", "m9")),
    "register a piece as agent-0 under another lease": lambda c, w: c.call(
        w, "RegisterAgent", pb.RegisterAgentRequest(
            agent="agent-0", lease=c.leases["batch"],
            machines_json=_register("agent-0", "m9").machines_json)),
    "report ja/0 (on m1) finished": lambda c, w: c.call(w, "ReportTask", pb.ReportTaskRequest(
        task="ja/0", outcome="finished", agent=w.partition(":")[2], machine="m1")),
    "report ja/0 (on m1) naming m2": lambda c, w: c.call(w, "ReportTask", pb.ReportTaskRequest(
        task="ja/0", outcome="finished", agent=w.partition(":")[2], machine="m2")),
    "cordon m2": lambda c, w: c.call(w, "SetMachineState", pb.SetMachineStateRequest(
        machine="m2", action="cordon")),
    "drain m1": lambda c, w: c.call(w, "SetMachineState", pb.SetMachineStateRequest(
        machine="m1", action="drain")),
    "uncordon m1": lambda c, w: c.call(w, "SetMachineState", pb.SetMachineStateRequest(
        machine="m1", action="uncordon")),
    "set batch's cpu limit": lambda c, w: c.call(w, "SetLimits", pb.SetLimitsRequest(
        scheduler="batch", changes_json=b'{"max_resources": {"cpu": 1000}}')),
}

# Who may do what; every other (identity, operation) pair must be refused with
# PERMISSION_DENIED. Reads are open to every identity but the server's own.
ALLOWED: dict[str, set[str]] = {
    "read status": set(IDENTITIES),
    "list jobs": set(IDENTITIES),
    "get a job": set(IDENTITIES),
    "list machines": set(IDENTITIES),
    "sync": set(IDENTITIES),
    # A submitter names only the owners the server's [auth.submitters] lists for it:
    # agents run a job's command for its owner, so naming one is acting as it.
    "submit as alice": {"operator:root", "user:alice"},
    "submit as bob": {"operator:root", "user:bob", "submitter:workload"},
    "submit, no owner": {"operator:root", "user:alice", "user:bob", "submitter:workload"},
    "submit precedence 500 (service)": {"operator:root"},
    "submit precedence 60 (batch caps 50)": set(),
    # Queues are in submission order: only operators and submitters (replaying a
    # workload) date jobs.
    "submit backdated to 1970": {"operator:root", "submitter:workload"},
    "submit to unknown scheduler": set(),
    "kill alice's job": {"operator:root", "user:alice"},
    "kill finished job": set(),
    # A kill whatever the call: not the scheduler's (it abandons).
    "kill alice's job by SetJobStatus": {"operator:root", "user:alice"},
    "kill killed job again": {"operator:root", "user:alice"},  # changes nothing
    # Its scheduler gave up placing the rest; what runs, its owner can still stop.
    "kill abandoned job, a task running": {"operator:root", "user:alice"},
    "resize killed job": set(),
    "abandon killed job": set(),
    "resize alice's job": {"operator:root", "user:alice", "scheduler:batch"},
    "abandon alice's job": {"operator:root", "user:alice", "scheduler:batch"},
    "register batch instance": {"scheduler:batch"},
    "register evil instance": set(),
    # A server forwards commits to the commit leader (cellstate/api/leader.py).
    "commit for batch": {"scheduler:batch", "server:cellstate"},
    "commit for evil": set(),
    "commit for batch, service's job": set(),
    "deregister service/i0": {"scheduler:service"},
    "report service/i0 pending": {"scheduler:service"},
    "report service/i0 pending for batch's ja": set(),
    "report batch metrics": {"scheduler:batch"},
    "keep a lease alive": {"operator:root", "scheduler:batch", "scheduler:service",
                           "scheduler:evil", "agent:agent-0", "agent:agent-1"},
    "register as agent-0 with m1": {"operator:root", "agent:agent-0"},
    "register as agent-1 with m1": set(),
    # A machine's capacity and topology, and machines an operator added, are an
    # operator's: an agent registers new machines and its own as recorded.
    "register as agent-0 with m1 at 1e6 cpus": {"operator:root"},
    "register as agent-0 with m1 in another rack": {"operator:root"},
    "register as agent-0 with m0 (an operator's)": {"operator:root"},
    "register as agent-0 with m1 and m0": {"operator:root"},
    "register as agent-0 with a new machine": {"operator:root", "agent:agent-0"},
    "register a piece as agent-0 under another lease": set(),
    "report ja/0 (on m1) finished": {"operator:root", "agent:agent-0"},
    # agent-1's own machine named, but the task is on agent-0's: refused.
    "report ja/0 (on m1) naming m2": set(),
    # A machine's state decides what every scheduler may place there: operators only
    # (not even the machine's own agent).
    "cordon m2": {"operator:root"},
    "drain m1": {"operator:root"},
    "uncordon m1": {"operator:root"},
    # Limits bound what a scheduler may take, and which schedulers may act at all.
    "set batch's cpu limit": {"operator:root"},
}
# Refused for a reason that is not the caller's identity: the job is in a final state.
OTHER_REFUSAL = {("kill finished job", "operator:root"): (FINAL, "final state"),
                 ("kill finished job", "user:alice"): (FINAL, "final state"),
                 ("resize killed job", "operator:root"): (FINAL, "final state"),
                 ("resize killed job", "user:alice"): (FINAL, "final state"),
                 ("abandon killed job", "operator:root"): (FINAL, "final state"),
                 ("abandon killed job", "user:alice"): (FINAL, "final state"),
                 ("resize killed job", "scheduler:batch"): (FINAL, "final state"),
                 ("abandon killed job", "scheduler:batch"): (FINAL, "final state"),
                 # The store: the task is not on the machine the report names.
                 ("report ja/0 (on m1) naming m2", "operator:root"): (FINAL, "not m2"),
                 # An operator may move machines, but not from a live agent (the store).
                 ("register as agent-1 with m1", "operator:root"): (FINAL, "live agent"),
                 # A piece joins only a live registration of the same agent's lease.
                 **{("register a piece as agent-0 under another lease", who): (
                     grpc.StatusCode.NOT_FOUND, "not registered under lease")
                    for who in ("operator:root", "agent:agent-0")}}


def _expected(op: str, who: str) -> tuple[object, str]:
    if (op, who) in OTHER_REFUSAL:
        return OTHER_REFUSAL[op, who]
    return (OK, "") if who in ALLOWED[op] else (DENIED, "")


CASES = [pytest.param(op, who, id=f"{who}-{op}") for op in OPERATIONS for who in IDENTITIES]


@pytest.mark.parametrize(("op", "who"), CASES)
def test_the_matrix(request: pytest.FixtureRequest, op: str, who: str) -> None:
    expected, why = _expected(op, who)
    cell: Cell = request.getfixturevalue("cell" if expected == OK else "refusing_cell")
    before = cell.revision()
    if expected == OK:
        OPERATIONS[op](cell, who)
        return
    with pytest.raises(grpc.RpcError) as info:
        OPERATIONS[op](cell, who)
    assert info.value.code() == expected, info.value.details()
    details = str(info.value.details())
    if expected == DENIED:
        assert who in details, details  # says who was refused ...
        assert " may " in details, details  # ... and what the rule is
    else:
        assert why in details, details
    assert cell.revision() == before


def test_the_matrix_has_every_operation_and_identity() -> None:
    assert set(ALLOWED) == set(OPERATIONS)
    # The "allowed" sets name only known identities (a typo would silently deny).
    assert set().union(*ALLOWED.values()) <= set(IDENTITIES)


def test_the_matrix_calls_every_rpc_of_the_api(cell: Cell) -> None:
    """An RPC added to the API without a row here would go unchecked."""
    cell.called.clear()
    for op in OPERATIONS.values():
        with contextlib.suppress(grpc.RpcError):
            op(cell, "operator:root")
    service = pb.DESCRIPTOR.services_by_name["CellState"]
    assert cell.called == {m.name for m in service.methods}


@pytest.mark.parametrize("op", ["read status", "submit, no owner", "kill alice's job",
                                "commit for batch"])
def test_a_certificate_naming_no_identity_is_unauthenticated(cell: Cell, op: str) -> None:
    files = cell.ca.files(Identity(Kind.USER, "nobody"))
    cell.ca.issue_raw("nobody", files, None)  # signed by the CA, but no kind:name
    cell.stubs["user:nobody"] = pb_grpc.CellStateStub(  # type: ignore[no-untyped-call]
        grpc.secure_channel(f"127.0.0.1:{cell.server.port}", channel_credentials(files)))
    before = cell.revision()
    with pytest.raises(grpc.RpcError) as info:
        OPERATIONS[op](cell, "user:nobody")
    assert info.value.code() == UNAUTH
    assert "'nobody' is not kind:name" in str(info.value.details())
    assert cell.revision() == before


def test_a_sync_needs_an_identity_too(cell: Cell) -> None:
    files = cell.ca.files(Identity(Kind.USER, "nobody"))
    cell.ca.issue_raw("nobody", files, None)
    with grpc.secure_channel(f"127.0.0.1:{cell.server.port}",
                             channel_credentials(files)) as channel:
        stream = pb_grpc.CellStateStub(channel).Sync(  # type: ignore[no-untyped-call]
            pb.SyncRequest(start_revision=0), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stream))
    assert info.value.code() == UNAUTH


def test_a_plaintext_client_is_refused(cell: Cell) -> None:
    before = cell.revision()
    with grpc.insecure_channel(f"127.0.0.1:{cell.server.port}") as channel:
        stub = pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as info:
            stub.SubmitJob(_job("jp", "alice"), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # no TLS handshake, no call
    assert cell.revision() == before
    assert "jp" not in cell.server.replica.snapshot().jobs


def test_a_certificate_of_another_ca_is_refused(cell: Cell, tmp_path: Path) -> None:
    # The same identity, signed by a CA the server does not trust.
    other = DevCA(tmp_path / "other").issue(Identity(Kind.OPERATOR, "root"))
    mixed = TlsFiles(cell.ca.ca_path, other.cert, other.key)
    before = cell.revision()
    with grpc.secure_channel(f"127.0.0.1:{cell.server.port}",
                             channel_credentials(mixed)) as channel:
        stub = pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as info:
            stub.SubmitJob(_job("jp", "alice"), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert cell.revision() == before


def test_a_new_scheduler_name_gains_nothing(cell: Cell) -> None:
    """Naming a scheduler the cell does not list gets neither a job past the limits
    nor a commit: only an operator adds scheduler names."""
    for who in ("user:alice", "operator:root"):
        with pytest.raises(grpc.RpcError) as info:
            cell.call(who, "SubmitJob", _job("jx", "alice", "evil2", precedence=1000))
        assert info.value.code() == DENIED
        assert "not one of this cell's schedulers (batch, service)" in str(
            info.value.details())
    with pytest.raises(grpc.RpcError) as info:
        cell.call("scheduler:evil", "RegisterInstance", pb.RegisterInstanceRequest(
            scheduler="evil", instance="e0", ttl=60))
    assert info.value.code() == DENIED


def test_a_user_job_without_owner_is_the_users(cell: Cell) -> None:
    OPERATIONS["submit, no owner"](cell, "user:bob")
    cell.settle()
    assert cell.server.replica.snapshot().jobs["jn"].owner == "bob"


def test_a_killed_finished_job_stays_finished(cell: Cell) -> None:
    with pytest.raises(grpc.RpcError):
        cell.call("operator:root", "KillJob", pb.KillJobRequest(job="jdone", reason="x"))
    info = cell.call("operator:root", "GetJob", pb.GetJobRequest(job="jdone"))
    assert info.state == "finished"


def test_a_killed_job_stays_as_it_was(cell: Cell) -> None:
    """A killed job is final: a resize (which would have grown it) and an abandonment
    are refused and the job keeps its task count and its kill."""
    for method, request in (("ResizeJob", pb.ResizeJobRequest(job="jk", task_count=9)),
                            ("SetJobStatus", pb.SetJobStatusRequest(
                                job="jk", state="abandoned", reason="x"))):
        with pytest.raises(grpc.RpcError) as info:
            cell.call("operator:root", method, request)
        assert info.value.code() == FINAL
        assert "it is killed" in str(info.value.details())
    info = cell.call("operator:root", "GetJob", pb.GetJobRequest(job="jk"))
    assert info.state == "killed"
    assert orjson.loads(info.spec_json)["task_count"] == 3


def test_an_abandoned_job_is_killed_only_while_something_runs(cell: Cell) -> None:
    """A kill stops what an abandoned job still runs, and makes it killed; an
    abandoned job with nothing running stays abandoned."""
    cell.call("user:alice", "KillJob", pb.KillJobRequest(job="jab", reason="stop it"))
    cell.settle()
    info = cell.call("user:alice", "GetJob", pb.GetJobRequest(job="jab"))
    assert info.state == "killed" and info.tasks[0].state == "killed"
    cell.call("user:bob", "SubmitJob", _job("idle", "bob"))
    cell.settle()
    cell.call("scheduler:batch", "SetJobStatus", pb.SetJobStatusRequest(
        job="idle", state="abandoned", reason="gave up"))
    cell.settle()
    before = cell.revision()
    with pytest.raises(grpc.RpcError) as err:
        cell.call("user:bob", "KillJob", pb.KillJobRequest(job="idle", reason="x"))
    assert err.value.code() == FINAL and "it is abandoned" in str(err.value.details())
    assert cell.revision() == before


def test_a_status_records_who_set_it_by_certificate(cell: Cell) -> None:
    """A kill's ``by`` is the caller's identity, not what the request claims."""
    cell.call("user:alice", "KillJob", pb.KillJobRequest(job="ja", reason="x",
                                                         by="operator:root"))
    cell.call("scheduler:batch", "SetJobStatus", pb.SetJobStatusRequest(
        job="jb", state="abandoned", reason="x", by="batch/i0"))
    cell.settle()
    statuses = cell.server.replica.snapshot().statuses
    assert statuses["ja"].by == "user:alice (operator:root)"
    assert statuses["jb"].by == "scheduler:batch (batch/i0)"


def test_a_status_time_is_the_servers_unless_an_operator_says_it(cell: Cell) -> None:
    """A scheduler cannot date its abandonment (or a user its kill) in the past; an
    operator replaying a workload can."""
    before = time.time()
    cell.call("scheduler:batch", "SetJobStatus", pb.SetJobStatusRequest(
        job="jb", state="abandoned", reason="x", at=1.0))
    cell.call("operator:root", "SetJobStatus", pb.SetJobStatusRequest(
        job="ja", state="abandoned", reason="x", at=2.0))
    cell.settle()
    statuses = cell.server.replica.snapshot().statuses
    assert before <= statuses["jb"].at <= time.time()
    assert statuses["ja"].at == 2.0


def test_a_kill_reason_with_an_escape_sequence_is_refused(cell: Cell) -> None:
    before = cell.revision()
    with pytest.raises(grpc.RpcError) as info:
        cell.call("user:alice", "KillJob", pb.KillJobRequest(job="ja", reason="\x1b[2Jbye"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "status reason holds control character '\\x1b' at position 0" in str(
        info.value.details())
    assert cell.revision() == before


@pytest.mark.parametrize("report", [
    {"reason": "no fit\x1b]0;pwned\x07"},
    {"fits": [{"machine": "m1", "why": "\x9b2J"}]},
    {"\x1b[31mkey": 1},
])
def test_a_pending_report_with_a_control_character_is_refused(cell: Cell,
                                                              report: dict[str, Any]) -> None:
    """`omega why` prints schedulers' reports in terminals: no escape sequences."""
    before = cell.revision()
    with pytest.raises(grpc.RpcError) as info:
        cell.call("scheduler:service", "ReportPending", pb.ReportPendingRequest(
            scheduler="service", instance="i0", lease=cell.leases["service"],
            reports=[pb.PendingReport(job="jsvc", report_json=orjson.dumps(report))]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "control character" in str(info.value.details())
    assert cell.revision() == before


@pytest.mark.parametrize(("who", "spec"), [
    # A job's text fields are names: no control characters, no path separators.
    ("user:alice", {"id": "j\x1b[2J", "owner": "alice"}),
    ("user:alice", {"id": "jx", "owner": "alice", "labels": {"k": "v\x1b"}}),
    ("submitter:workload", {"id": "jx", "owner": "../bob"}),
    ("user:alice", {"id": "jx", "owner": "alice", "task_count": 10**9}),
    ("user:alice", {"id": "jx", "owner": "alice", "task_resources": {"cpu": -1}}),
    ("user:alice", {"id": "jx", "owner": "alice", "task_resources": {"cpu": float("nan")}}),
])
def test_hostile_job_specs_are_refused_and_change_nothing(cell: Cell, who: str,
                                                          spec: dict[str, Any]) -> None:
    before = cell.revision()
    doc = {"scheduler": "batch", "task_count": 1, "task_resources": {"cpu": 1}, **spec}
    with pytest.raises(grpc.RpcError) as info:
        cell.call(who, "SubmitJob", pb.SubmitJobRequest(spec_json=_json(doc)))
    assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, DENIED), info.value
    assert cell.revision() == before


def test_a_machine_label_with_an_escape_sequence_is_refused(cell: Cell) -> None:
    before = cell.revision()
    doc = {**codec.machine_to_doc(machine("m7", cpu=8)), "labels": {"zone": "a\x1b[2J"}}
    with pytest.raises(grpc.RpcError) as info:
        cell.call("agent:agent-0", "RegisterAgent", pb.RegisterAgentRequest(
            agent="agent-0", ttl=60, machines_json=[orjson.dumps(doc)]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "control character" in str(info.value.details())
    assert cell.revision() == before


def _json(doc: dict[str, Any]) -> bytes:
    import json

    return json.dumps(doc).encode()  # allows NaN, as a hostile client would send it


def test_a_lease_is_renewed_only_by_the_identity_holding_it(cell: Cell) -> None:
    """A scheduler's instance lease (with its metrics and pending reports on it) and an
    agent's lease: renewed by their holder and operators, refused to everyone else."""
    batch = _lease(cell)
    cell.call("scheduler:batch", "ReportMetrics", pb.ReportMetricsRequest(
        scheduler="batch", instance="i9", lease=batch, metrics_json=b"{}"))
    cell.call("scheduler:batch", "ReportPending", pb.ReportPendingRequest(
        scheduler="batch", instance="i9", lease=batch,
        reports=[pb.PendingReport(job="ja", report_json=b"{}")]))
    assert len(cell.kv.lease_keys(batch)) == 3  # registration, metrics, pending report
    agent = int(cell.call("agent:agent-0", "RegisterAgent", _register("agent-0", "m1")).lease)
    for lease, holders in ((batch, {"scheduler:batch"}), (agent, {"agent:agent-0"})):
        before = cell.revision()
        for who in ("scheduler:batch", "scheduler:service", "agent:agent-0",
                    "agent:agent-1", "operator:root"):
            request = pb.KeepAliveRequest(lease=lease)
            if who in holders or who == "operator:root":
                assert cell.call(who, "KeepAlive", request).ttl > 0
                continue
            with pytest.raises(grpc.RpcError) as info:
                cell.call(who, "KeepAlive", request)
            assert info.value.code() == DENIED
            assert f"{who} may not renew lease {lease:x}" in str(info.value.details())
        assert cell.revision() == before


def test_a_registration_too_large_for_one_call_is_refused(cell: Cell) -> None:
    """An agent registers many machines in pieces of at most 1,000 a call."""
    before = cell.revision()
    request = _register("agent-0", *(f"n{i}" for i in range(1001)))
    with pytest.raises(grpc.RpcError) as info:
        cell.call("agent:agent-0", "RegisterAgent", request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "above the limit of 1000 a call" in str(info.value.details())
    assert cell.revision() == before


def test_pieces_join_the_registration_of_their_lease(cell: Cell) -> None:
    first = cell.call("agent:agent-0", "RegisterAgent", _register("agent-0", "m1"))
    cell.call("agent:agent-0", "RegisterAgent", pb.RegisterAgentRequest(
        agent="agent-0", lease=first.lease, machines_json=_register("agent-0", "p1").machines_json))
    cell.settle()
    snap = cell.server.replica.snapshot()
    assert snap.machines["p1"].agent == "agent-0"
    assert snap.agents["agent-0"].machines == ("m1", "p1")
    assert cell.kv.range(Keyspace("default").agent("agent-0")).kvs[0].lease == first.lease

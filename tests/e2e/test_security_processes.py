"""The third security round (issue 36) through real processes over mutual TLS: a
cellstate server process on a real etcd, called with certificates its CA signed. A
submitter names only the owners it is allowed, an agent cannot take over or inflate
a machine, a revoked certificate has no rights, and the cell's limits change only by
an operator's write, whatever the servers' start-up files say. Every refusal leaves
etcd's revision as it was."""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from cellstate.api.auth import Identity, Kind
from cellstate.api.client import CellClient, RemoteAgentBackend
from cellstate.errors import AccessDenied
from cellstate.keys import Keyspace
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Machine, Resources
from cellstate.store import CellStore
from omega.etcd_launcher import LocalEtcd, free_ports
from omega.proc import omega
from omega.security import tls_argv
from tests.e2e.cluster import Cluster, cluster

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def _client(c: Cluster, who: str) -> CellClient:
    return CellClient([c.cellstate], retry_for=5.0, tls=c.tls(who))


def _revision(endpoint: str) -> int:
    kv = EtcdKV([endpoint])
    try:
        return kv.range(b"\x00").revision
    finally:
        kv.close()


def _job(id_: str, owner: str) -> dict[str, object]:
    return {"id": id_, "owner": owner, "scheduler": "batch", "task_count": 1,
            "task_resources": {"cpu": 1}, "duration": 1}


def test_a_submitter_names_only_the_owners_it_is_allowed(fresh_etcd: LocalEtcd,
                                                         tmp_path: Path) -> None:
    """submitter:workload may name the owners the servers' [auth.submitters] lists for
    it (its generator's); any other submitter only itself. An agent that runs alice's
    commands must not run them for whoever holds a submitter key."""
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        c.server("cellstate-0")
        for who, job, owner in (("submitter:replay", "r1", "alice"),
                                ("submitter:workload", "w1", "mallory")):
            before = _revision(fresh_etcd.endpoint)
            with _client(c, who) as client, pytest.raises(AccessDenied) as info:
                client.submit_job(_job(job, owner), allow_unknown_scheduler=True)
            assert f"{who} may not submit job {job} for owner {owner!r}" in str(info.value)
            assert _revision(fresh_etcd.endpoint) == before
        with _client(c, "submitter:replay") as client:
            client.submit_job(_job("r2", "replay"), allow_unknown_scheduler=True)
        with _client(c, "submitter:workload") as client:
            client.submit_job(_job("w2", "alice"), allow_unknown_scheduler=True)


def _machine(mid: str, cpu: float) -> Machine:
    return Machine(mid, Resources.of(cpu=cpu, mem=16), rack="r1", failure_domain="fd1")


def test_an_agent_cannot_take_over_or_inflate_a_machine(fresh_etcd: LocalEtcd,
                                                         tmp_path: Path) -> None:
    """A machine an operator added (no agent) is nobody's to register; an agent's own
    machine keeps its capacity and topology unless an operator changes them."""
    kv = EtcdKV([fresh_etcd.endpoint])
    try:
        CellStore(kv, "default").add_machine(_machine("ops-1", 8))
        with cluster(fresh_etcd.endpoint, tmp_path) as c:
            c.server("cellstate-0")
            with _client(c, "agent:evil") as client:
                agent = RemoteAgentBackend(client)
                agent.register_agent("evil", [_machine("evil-1", 8)], 30)
                for machines, why in (
                        ([_machine("ops-1", 1e6)], "an operator added it"),
                        ([_machine("evil-1", 8), _machine("ops-1", 8)], "an operator added it"),
                        ([_machine("evil-1", 1e6)], "another capacity")):
                    before = _revision(fresh_etcd.endpoint)
                    with pytest.raises(AccessDenied) as info:
                        agent.register_agent("evil", machines, 30)
                    assert why in str(info.value) and "agent:evil may not" in str(info.value)
                    assert _revision(fresh_etcd.endpoint) == before
            with _client(c, "operator:admin") as client:
                # An operator changes a machine (its capacity, its agent).
                RemoteAgentBackend(client).register_agent("evil", [_machine("evil-1", 16)], 30)
                recorded = {m["id"]: m for m in client.list_machines()}
        assert recorded["ops-1"]["capacity"]["cpu"] == 8 and not recorded["ops-1"].get("agent")
        assert recorded["evil-1"]["capacity"]["cpu"] == 16
    finally:
        kv.close()


def test_a_revoked_certificate_is_refused(fresh_etcd: LocalEtcd, tmp_path: Path) -> None:
    """`omega certs DIR --revoke` puts the certificate's serial on the cell's revocation
    list, which a running server reads again: the next call on the same connection is
    refused, and a new certificate for the same identity works."""
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        c.server("cellstate-0")
        assert c.certs is not None
        with _client(c, "user:alice") as client:
            client.submit_job(_job("a1", "alice"), allow_unknown_scheduler=True)
            done = subprocess.run(omega("certs", str(c.certs.ca.folder), "user:alice",
                                        "--revoke"), capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            assert "user:alice: certificate" in done.stdout
            before = _revision(fresh_etcd.endpoint)
            deadline = time.monotonic() + 10
            # The server looks at the file at most once a second: a call before it has
            # looked again is still served, so each attempt submits a job of its own (the
            # same job again would be refused as already there, hiding the revocation).
            for attempt in itertools.count(2):
                try:
                    client.submit_job(_job(f"a{attempt}", "alice"),
                                      allow_unknown_scheduler=True)
                except AccessDenied as e:
                    assert "user:alice" in str(e) and "is revoked" in str(e)
                    break
                assert time.monotonic() < deadline, "the revoked certificate still works"
                before = _revision(fresh_etcd.endpoint)
                time.sleep(0.2)
            with pytest.raises(AccessDenied):
                client.status()  # reads too
            assert _revision(fresh_etcd.endpoint) == before
        c.certs.ca.issue(Identity(Kind.USER, "alice"))  # a new certificate, a new serial
        with _client(c, "user:alice") as client:
            client.submit_job(_job("new", "alice"), allow_unknown_scheduler=True)


def _limits(endpoint: str) -> tuple[int, dict[str, object]]:
    """The cell's config record in etcd: (its version, its limits)."""
    kv = EtcdKV([endpoint])
    try:
        found = kv.range(Keyspace("default").config).kvs[0]
        return found.version, orjson.loads(found.value)["limits"]
    finally:
        kv.close()


def _refused(c: Cluster, name: str, *args: str) -> str:
    """Start a server that must refuse to start; its log."""
    c.server(name, wait=False, extra=args)
    deadline = time.monotonic() + 60
    while c.children[name].running():
        assert time.monotonic() < deadline, f"{name} started\n{c.logs()}"
        time.sleep(0.2)
    assert c.children[name].popen.returncode not in (0, None)
    return (c.workdir / f"{name}.log").read_text()


def test_the_cells_limits_change_only_by_an_operators_write(fresh_etcd: LocalEtcd,
                                                            tmp_path: Path) -> None:
    """The first server's file seeds a new cell's limits; a server whose file says
    otherwise refuses to start and writes nothing, one without limits serves the
    cell's, and only `omega limits` (an operator) changes them; after that, the first
    server's old file is refused too."""
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        assert c.certs is not None
        c.certs.limit({"batch": {"cpu": 10}})
        c.server("cellstate-0")
        version, limits = _limits(fresh_etcd.endpoint)
        assert limits["batch"] == {"max_resources": {"cpu": 10.0}}
        other = tmp_path / "other.toml"
        other.write_text("[limits.batch]\nmax_resources = { cpu = 1000 }\n")
        log = _refused(c, "cellstate-1", "--config", str(other))
        assert "disagrees with the cell's limits" in log and "batch: the cell's" in log
        assert _limits(fresh_etcd.endpoint) == (version, limits)
        # No limits in its file at all: it serves what the cell says.
        port = free_ports(1)[0]
        files = c.certs.files(Identity(Kind.SERVER, "cellstate-2"))
        c.spawn("cellstate-2", omega("server", "--etcd", fresh_etcd.endpoint, "--listen",
                                     f"127.0.0.1:{port}", "--name", "cellstate-2",
                                     *tls_argv(files)))
        c.server_ports["cellstate-2"] = port
        c.wait_serving("cellstate-2")
        assert _limits(fresh_etcd.endpoint) == (version, limits)
        c.run("limits", "batch", "--max-resources", "cpu=20", "--cellstate", c.cellstate)
        now_version, now = _limits(fresh_etcd.endpoint)
        assert now_version == version + 1 and now["batch"] == {"max_resources": {"cpu": 20.0}}
        c.signal("cellstate-0", 9)
        log = _refused(c, "cellstate-3")  # cellstate-0's file, which says cpu=10
        assert "the cell's limits are unchanged" in log
        assert _limits(fresh_etcd.endpoint) == (now_version, now)


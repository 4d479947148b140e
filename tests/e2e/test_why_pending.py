"""Why a job is pending, answered after one scheduling attempt, and what can never run
refused at submission: real etcd, a cellstate server with scheduler limits, an agent
and the batch and service schedulers as processes.

The schedulers retry after 60 s at the earliest (their config), so every report read
here comes from a job's first attempt: that is the "within one attempt" the tests
check, by the report's attempt count, not by a clock."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cellstate import codec
from cellstate.api.server import pending_prefix
from cellstate.errors import AccessDenied, NotFoundError, StoreError
from cellstate.kv.base import prefix_end
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Job
from cellstate.store import CellStore
from tests.e2e.cluster import Cluster, cluster, wait_for
from tests.etcd_fixture import make_local_etcd

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

SLOW_RETRY = "[scheduler]\nretry_delay = 60\nmax_retry_delay = 120\n"


def _job(jid: str, scheduler: str, tasks: int, cpu: float = 1, **extra: Any) -> dict[str, Any]:
    return {"id": jid, "scheduler": scheduler, "task_count": tasks,
            "task_resources": {"cpu": cpu, "mem": 1}, "duration": 600,
            "kind": "service" if scheduler == "service" else "batch", **extra}


@pytest.fixture(scope="module")
def cell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    """4 machines of 4 cpu; batch may use precedence 4 and 6 cpu at most."""
    tmp = tmp_path_factory.mktemp("why")
    etcd = make_local_etcd()
    etcd.start()
    try:
        with cluster(etcd.endpoint, tmp) as c:
            server_toml = tmp / "server.toml"
            server_toml.write_text("[limits.batch]\nmax_precedence = 4\n"
                                   "max_resources = { cpu = 6 }\n")
            c.server("cellstate-0", extra=("--config", str(server_toml)))
            c.start("agent", "agent", "--cellstate", c.cellstate, "--spec",
                    str(c.spec("cell", 4)), "--id", "agent-0")
            for name in ("batch", "service"):
                conf = tmp / f"{name}.toml"
                conf.write_text(SLOW_RETRY)
                c.start(name, "scheduler", name, "--cellstate", c.cellstate, "--config",
                        str(conf), "--instance", f"{name[0]}0")
            with c.client() as client:
                wait_for("4 machines", lambda: client.status()["machines_up"] == 4, c)

                def registered() -> bool:
                    return {s["scheduler"] for s in client.status()["schedulers"]} == {
                        "batch", "service"}

                wait_for("both schedulers", registered, c)
            yield c, etcd.endpoint
    finally:
        etcd.stop()


def _report(c: Cluster, job: str, scheduler: str) -> dict[str, Any]:
    """The scheduler's first report on ``job``, waited for."""
    found: dict[str, Any] = {}
    with c.client() as client:
        def reported() -> bool:
            try:
                info = client.get_job(job)
            except NotFoundError:
                # A job written straight to etcd reaches the server's replica a moment
                # later; until then the server does not know it.
                return False
            for r in info.get("why", {}).get("schedulers", []):
                if r["scheduler"] == scheduler:
                    found.update(r)
                    return True
            return False

        wait_for(f"{scheduler}'s report on {job}", reported, c, timeout=30)
    return found


def _stamped(doc: dict[str, Any]) -> Job:
    """A job as the server would store it (with its submission time: the runtime gives
    up on a job for an unknown scheduler 30 s after its submission)."""
    return codec.parse_job({**doc, "submitted_at": time.time()}, "job")


def _kill(c: Cluster, job: str) -> None:
    with c.client() as client:
        client.kill_job(job)


def _codes(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["code"]: r for r in report["reasons"]}


# A precedence above the limit and a scheduler the cell does not list are refused by
# the authorization (PERMISSION_DENIED) before the check of what can never run; over
# plaintext, without identities, that check refuses them (tests/test_why_pending.py).
@pytest.mark.parametrize(("doc", "refused", "says"), [
    (_job("prec", "batch", 1, precedence=6), AccessDenied,
     "scheduler 'batch''s jobs go up to 4"),
    (_job("huge-gang", "service", 17, gang=True), StoreError, "holds at most 16 of them"),
    (_job("quota-gang", "batch", 8, gang=True), StoreError,
     "above scheduler 'batch''s limit of 6"),
    (_job("nosuch", "nosuch", 1), AccessDenied,
     "scheduler 'nosuch' is not one of this cell's schedulers"),
])
def test_submit_refuses_what_can_never_run(cell: tuple[Cluster, str], doc: dict[str, Any],
                                           refused: type[Exception], says: str) -> None:
    c, _ = cell
    with c.client() as client:
        with pytest.raises(refused) as e:
            client.submit_job(doc)
        assert says in str(e.value)
        with pytest.raises(NotFoundError):  # nothing was written
            client.get_job(doc["id"])


def test_cli_submit_refusal_exits_2_with_the_reason(cell: tuple[Cluster, str]) -> None:
    c, _ = cell
    run = subprocess.run(c.argv("submit", "--cellstate", c.cellstate, "--id", "cli-prec",
                                "--scheduler", "batch", "--precedence", "6"),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run
    assert "go up to 4" in run.stderr and "Traceback" not in run.stderr


def test_quota_shows_at_once(cell: tuple[Cluster, str]) -> None:
    c, _ = cell
    with c.client() as client:
        client.submit_job(_job("quota", "batch", 8))
    report = _report(c, "quota", "batch")
    assert report["attempts"] == 1 and report["placed"] == 6
    # The two tasks past the limit were held back, not sent to be refused at commit.
    held = _codes(report)["limit"]
    assert held["tasks"] == 2 and "limit_exceeded" not in _codes(report)
    with c.client() as client:
        cell_says = client.get_job("quota")["why"]["cell"]
    assert [b["code"] for b in cell_says] == ["quota"]
    assert "holds 6 of its limit of 6 cpu" in cell_says[0]["text"]
    # What docs/operations.md shows for this job, line by line.
    text = subprocess.run(c.argv("why", "quota", "--cellstate", c.cellstate),
                          capture_output=True, text=True, timeout=60, check=True).stdout
    head, cell_line, instance, held_line = text.splitlines()
    assert head == "job quota (batch, batch): running: 2 task(s) pending"
    assert cell_line == ("  cell: scheduler 'batch' holds 6 of its limit of 6 cpu; one task "
                         "needs 1 more")
    assert re.fullmatch(r"  batch/b0: attempt 1, \d+ s ago, placed 6", instance), instance
    assert held_line == ("    limit: scheduler 'batch' is at its resource limit of cpu=6: 2 "
                         "task(s) wait for its own tasks to end")
    _kill(c, "quota")  # the other tests start from an empty cell


def test_fit_counts_over_the_machines_considered(cell: tuple[Cluster, str]) -> None:
    c, _ = cell
    with c.client() as client:
        client.submit_job(_job("wide", "service", 6, cpu=4))
    report = _report(c, "wide", "service")
    assert report["attempts"] == 1
    fit = _codes(report)["fit"]
    assert fit["machines"] == 4 and fit["fit"] == 0
    assert fit["excluded"]["insufficient cpu"] == 4
    assert fit["tasks"] == 6 - report["placed"] > 0
    _kill(c, "wide")


def test_precedence_limit_of_a_job_already_in_the_cell(cell: tuple[Cluster, str]) -> None:
    """A job written before the limit (straight to the store) can never run: its
    scheduler gives up on it at once, with the reason, and sends no claim of it."""
    c, endpoint = cell
    kv = EtcdKV([endpoint])
    try:
        CellStore(kv, "default").submit_job(
            _stamped(_job("old-prec", "batch", 1, precedence=6)))
    finally:
        kv.close()
    with c.client() as client:
        def abandoned() -> bool:
            try:
                return bool(client.get_job("old-prec")["state"] == "abandoned")
            except NotFoundError:
                return False  # written straight to etcd: the server learns it a moment later

        wait_for("old-prec abandoned", abandoned, c, timeout=30)
        assert client.get_job("old-prec")["reason"] == (
            "precedence 6 is above scheduler 'batch''s limit of 4: the store refuses every "
            "claim of this job")


def test_missing_scheduler_and_the_why_command(cell: tuple[Cluster, str]) -> None:
    c, endpoint = cell
    kv = EtcdKV([endpoint])
    try:
        CellStore(kv, "default").submit_job(_stamped(_job("orphan", "gone", 1)))
    finally:
        kv.close()
    text = subprocess.run(c.argv("why", "orphan", "--cellstate", c.cellstate),
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert "1 task(s) pending" in text
    assert "no scheduler named 'gone' has run in this cell" in text
    as_json = json.loads(subprocess.run(
        c.argv("why", "orphan", "--json", "--cellstate", c.cellstate),
        capture_output=True, text=True, timeout=60, check=True).stdout)
    assert as_json["pending"] == 1
    assert [b["code"] for b in as_json["cell"]] == ["no_scheduler"]


def test_a_report_goes_once_its_job_no_longer_waits(cell: tuple[Cluster, str]) -> None:
    c, endpoint = cell
    with c.client() as client:
        client.submit_job(_job("killed", "batch", 7))
        _report(c, "killed", "batch")
        client.kill_job("killed")
    kv = EtcdKV([endpoint])
    try:
        prefix = pending_prefix("default", "killed")
        wait_for("the report's deletion",
                 lambda: not kv.range(prefix, prefix_end(prefix)).kvs, c, timeout=30)
    finally:
        kv.close()


def test_a_limit_raised_live_lets_the_held_tasks_run_at_once(
        cell: tuple[Cluster, str]) -> None:
    """`omega limits` raises batch's cpu limit while two tasks of a job wait for it: the
    scheduler (whose retry delay is a minute) places them at once, as it sees the config
    change, and the store takes them."""
    c, _ = cell
    with c.client() as client:
        client.submit_job(_job("raised", "batch", 8))
    assert _codes(_report(c, "raised", "batch"))["limit"]["tasks"] == 2
    started = time.monotonic()
    out = c.run("limits", "batch", "--max-resources", "cpu=8", "--cellstate", c.cellstate)
    try:
        assert out.startswith("limits of batch set (revision "), out
        assert out.rstrip().endswith("precedence up to 4; holds cpu 6 of 8"), out

        def all_running() -> bool:
            with c.client() as client:
                tasks = client.get_job("raised")["tasks"]
                return [t["state"] for t in tasks] == ["running"] * 8

        wait_for("the held tasks to run", all_running, c, timeout=30)
        assert time.monotonic() - started < 30  # not after the retry delay (60 s)
    finally:
        _kill(c, "raised")
        c.run("limits", "batch", "--max-resources", "cpu=6", "--cellstate", c.cellstate)

"""`omega job` and `omega why` show why a job waits, as text and as JSON, through a live
cellstate service: the cell's own reasons (computed when asked) and an instance's
report of its last attempt (sent with ReportPending). tests/test_why_pending.py checks
the reasons themselves; tests/e2e/test_why_pending.py the same with real schedulers."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import attrs
import orjson
import pytest

from cellstate.api.client import CellClient, RemoteStore
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import CellConfig, InstanceRecord, Resources, SchedulerLimits
from cellstate.store import CellStore
from schedulers.testing import job, machine
from tests.api.service_fixture import run_omega, running_server

LIMITS = CellConfig({"batch": SchedulerLimits(max_precedence=4,
                                              max_resources=Resources.of(cpu=8))})


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, int]]:
    """Two machines of 4 cpu, a live batch instance (its lease) limited to precedence
    4; a job of precedence 6 written before the limit (straight to the store:
    submission would refuse it)."""
    store = CellStore(kv)
    store.add_machines([machine("m0", cpu=4), machine("m1", cpu=4)])
    lease = store.register_instance(InstanceRecord("batch", "b0"), 60)
    store.submit_job(attrs.evolve(job("old", precedence=6), submitted_at=time.time()))
    with running_server(kv, limits=LIMITS) as server:
        yield server, lease


def test_omega_job_shows_the_cells_reason_under_its_tasks(
        live: tuple[CellStateServer, int], capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live
    code, text, _ = run_omega(server, capsys, "job", "old")
    assert code == 0
    head, *rest = text.splitlines()
    assert head == "job old (batch, batch): pending"
    assert rest[rest.index("why pending:") + 1].startswith(
        "  cell: precedence 6 is above scheduler 'batch''s limit of 4")
    code, out, _ = run_omega(server, capsys, "job", "old", "-o", "json")
    assert code == 0
    assert [b["code"] for b in json.loads(out)["why"]["cell"]] == ["precedence_limit"]


def test_why_shows_an_instances_report_beside_the_cell(
        live: tuple[CellStateServer, int], capsys: pytest.CaptureFixture[str]) -> None:
    server, lease = live
    report = {"job": "old", "at": time.time(), "attempts": 1, "placed": 0, "reasons": [
        {"code": "limit_exceeded", "count": 1, "machines": ["m1"],
         "text": "1 claim(s) lost at commit (limit_exceeded), e.g. precedence 6 is above "
                 "scheduler 'batch''s limit of 4"}]}
    with CellClient([f"127.0.0.1:{server.port}"]) as client:
        RemoteStore(client).report_pending("batch", "b0", lease, {"old": orjson.dumps(report)}, [])
    code, text, _ = run_omega(server, capsys, "why", "old")
    assert code == 0
    head, cell, instance, lost = text.splitlines()
    assert head == "job old (batch, batch): pending: 1 task(s) pending"
    assert cell == ("  cell: precedence 6 is above scheduler 'batch''s limit of 4: the store "
                    "refuses every claim of this job (can never run)")
    assert re.fullmatch(r"  batch/b0: attempt 1, \d+ s ago, placed 0", instance), instance
    assert lost == ("    limit_exceeded: 1 claim(s) lost at commit (limit_exceeded), e.g. "
                    "precedence 6 is above scheduler 'batch''s limit of 4")
    code, out, _ = run_omega(server, capsys, "--json", "why", "old")
    doc = json.loads(out)
    assert code == 0 and doc["pending"] == 1
    (sched,) = doc["schedulers"]
    assert (sched["scheduler"], sched["instance"], sched["attempts"]) == ("batch", "b0", 1)
    assert sched["reasons"][0]["machines"] == ["m1"]


def test_why_counts_lost_and_preempted_tasks_as_waiting(
        kv: KV, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 34: `omega why` said "100 task(s) pending" where the scheduler's line said
    "250 task(s) fit nowhere": 150 lost tasks wait to be placed too."""
    from cellstate.model import Claim, MachineState
    from schedulers.testing import txn

    store = CellStore(kv)
    store.add_machines([machine("m0", cpu=4), machine("m1", cpu=4)])
    store.register_instance(InstanceRecord("batch", "b0"), 60)
    store.submit_job(job("j", tasks=5, cpu=1))
    assert store.commit(txn([Claim("j", i, "m0") for i in range(3)])).ok
    store.update_machine("m0", state=MachineState.DOWN)  # its 3 tasks are lost
    with running_server(kv) as server:
        code, text, _ = run_omega(server, capsys, "why", "j")
        assert code == 0
        assert text.splitlines()[0] == ("job j (batch, batch): pending: 5 task(s) pending "
                                        "(2 never placed, 3 lost)"), text
        code, out, _ = run_omega(server, capsys, "why", "j", "--json")
        assert json.loads(out)["pending"] == 5

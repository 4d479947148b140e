"""`omega status` shows each scheduler's limits and what it holds of them (issue 15: "no
way to see a scheduler's limits and usage"), from the cell at one revision."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from cellstate.admission import limits_report
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import CellConfig, Claim, InstanceRecord, Resources, SchedulerLimits
from cellstate.store import CellStore
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import run_omega, running_server

LIMITS = CellConfig({
    "batch": SchedulerLimits(max_precedence=4, max_resources=Resources.of(cpu=6, mem=100)),
    "service": SchedulerLimits(max_precedence=9),
})


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, int]]:
    """Batch holds 2 cpu and 2 GiB of its 6 and 100; service has only a precedence
    limit. Yields the server and the revision of the last write."""
    store = CellStore(kv)
    store.add_machines([machine("m0", cpu=4)])
    store.set_config(LIMITS)
    store.register_instance(InstanceRecord("batch", "0"), 60)
    store.submit_job(job("j", tasks=2, cpu=1))
    revision = store.commit(txn([Claim("j", 0, "m0"), Claim("j", 1, "m0")])).revision
    with running_server(kv) as server:
        yield server, revision


def test_the_report_from_a_snapshot(live: tuple[CellStateServer, int]) -> None:
    server, revision = live
    _wait(server, revision)
    assert limits_report(server.service.status.view().snap) == {
        "batch": {"max_precedence": 4, "max_resources": {"cpu": 6.0, "mem": 100.0},
                  "shares": {}, "quotas": {}, "used": {"cpu": 2.0, "mem": 2.0}},
        "service": {"max_precedence": 9, "max_resources": None, "shares": {}, "quotas": {},
                    "used": None},
    }


def test_omega_status_shows_limits_and_usage(live: tuple[CellStateServer, int],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    server, revision = live
    _wait(server, revision)
    code, text, _ = run_omega(server, capsys, "status")
    assert code == 0
    lines = text.splitlines()
    assert "limits of batch: precedence up to 4; holds cpu 2 of 6, mem 2 of 100" in lines
    assert "limits of service: precedence up to 9" in lines
    code, out, _ = run_omega(server, capsys, "status", "--json")
    assert json.loads(out)["limits"]["batch"]["used"] == {"cpu": 2.0, "mem": 2.0}


def _wait(server: CellStateServer, revision: int) -> None:
    deadline = time.monotonic() + 30  # the server's copy follows the store's writes
    while server.service.status.view().snap.revision < revision:
        assert time.monotonic() < deadline, "the server's copy never caught up"
        time.sleep(0.05)

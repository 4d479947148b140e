"""The README's main command: the demo starts etcd, places work, and stops everything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cellstate.cli import main

pytestmark = pytest.mark.etcd


def _etcd_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-x", "etcd"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_demo_places_work_and_stops_its_etcd() -> None:
    before = _etcd_pids()
    proc = subprocess.run(
        [sys.executable, "-m", "cellstate.cli", "demo", "--duration", "4", "--machines", "60",
         "--no-fsync", "--jobs-per-second", "8"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    last = next(line for line in proc.stdout.splitlines() if line.startswith("done:"))
    assert "invariants hold" in last, proc.stdout
    assert "batch/b0:" in proc.stdout and "service/s0:" in proc.stdout
    placed = int(last.split("tasks placed")[0].split(",")[-1])
    assert placed > 0
    assert _etcd_pids() <= before, "the demo left an etcd running"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--duration", "-1"], "must be positive"),
        (["demo", "--machines", "lots"], "is not a number"),
        (["status"], "--etcd"),
    ],
)
def test_bad_flags_say_what_is_wrong(argv: list[str], message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_status_and_check_on_a_live_cell(etcd_server, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from cellstate.kv.etcd import EtcdKV
    from cellstate.model import Claim
    from tests.builders import job, machine, make_cell, txn

    kv = EtcdKV([etcd_server.endpoint])
    try:
        store = make_cell(kv, [machine("m1", cpu=4)], [job("j", cpu=1)], cell="clitest")
        store.commit(txn([Claim("j", 0, "m1")]))
    finally:
        kv.close()
    assert main(["status", "--etcd", etcd_server.endpoint, "--cell", "clitest", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"running": 1' in out and '"cpu_utilization": 0.25' in out
    assert main(["check", "--etcd", etcd_server.endpoint, "--cell", "clitest"]) == 0
    assert "ok" in capsys.readouterr().out

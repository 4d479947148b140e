"""The views issue 34 asked for, against a live cellstate service: `omega events` (the
task records' histories), `omega machine ID`, `omega top`, `omega jobs` filtered by
owner and label and watching (-w), and `omega logs -f`."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import (
    Claim,
    InstanceRecord,
    JobState,
    JobStatus,
    MachineState,
    TaskState,
)
from cellstate.store import CellStore
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import run_omega, running_server


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, CellStore]]:
    """m1 runs web/0 (alice's, label app=web), which was preempted once by svc/0
    (bob's); m2 ran batch/0 until m2 went down."""
    # A clock a second apart per reading: the events' order is the order of the writes
    # (store times are kept to the millisecond; a fast machine writes several in one).
    ticks = itertools.count(1_700_000_000)
    admin = CellStore(kv, clock=lambda: float(next(ticks)))
    admin.add_machines([machine("m1", cpu=4), machine("m2", cpu=4)])
    admin.register_instance(InstanceRecord("batch", "0"), 60)
    admin.submit_job(attrs.evolve(job("web", cpu=4), owner="alice",
                                  labels=(("app", "web"),)))
    admin.submit_job(attrs.evolve(job("svc", cpu=4, scheduler="service"), owner="bob",
                                  precedence=5))
    admin.submit_job(attrs.evolve(job("batch", cpu=1), owner="alice"))
    assert admin.commit(txn([Claim("web", 0, "m1")])).ok
    assert admin.commit(txn([Claim("svc", 0, "m1", evict=("web/0",))],
                            scheduler="service")).ok
    admin.kill_job(JobStatus("svc", JobState.KILLED, "done with it", by="user:bob"))
    assert admin.commit(txn([Claim("web", 0, "m1"), Claim("batch", 0, "m2")])).ok
    admin.update_machine("m2", state=MachineState.DOWN)
    with running_server(kv) as server:
        yield server, admin


def test_events_tell_what_happened_to_each_task_with_who_and_why(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live
    code, out, err = run_omega(server, capsys, "events", "--json")
    assert code == 0, err
    got = [(e["task"], e["event"], e["machine"], e["by"], e["why"]) for e in json.loads(out)]
    assert got == [
        ("web/0", "placed", "m1", "batch", "placed"),
        ("svc/0", "placed", "m1", "service", "placed"),
        ("web/0", "preempted", "m1", "service", "preempted for svc/0"),
        ("svc/0", "killed", "m1", "user:bob", "job killed: done with it"),
        ("batch/0", "placed", "m2", "batch", "placed"),
        ("web/0", "placed", "m1", "batch", "placed"),
        ("batch/0", "lost", "m2", "", "machine m2 down"),
    ]
    _, out, _ = run_omega(server, capsys, "events", "--job", "web")
    lines = out.splitlines()
    assert lines[0].split() == ["TIME", "TASK", "EVENT", "MACHINE", "BY", "WHY"]
    assert [x.split()[3] for x in lines[1:]] == ["placed", "preempted", "placed"]


def test_machine_describes_its_tasks_and_events(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live
    code, out, err = run_omega(server, capsys, "machine", "m1")
    assert code == 0, err
    assert out.startswith("machine m1: up (agent -")
    assert "capacity: cpu 4/4 (100%), mem 1/16 (6%)" in out
    assert "web/0" in out and "preempted for svc/0" in out
    _, out, _ = run_omega(server, capsys, "machine", "m1", "--json")
    doc = json.loads(out)
    assert [t["task"] for t in doc["tasks"]] == ["web/0"] and doc["tasks"][0]["placed_at"] > 0
    code, _, err = run_omega(server, capsys, "machine", "m9")
    assert code == 2 and "unknown machine 'm9'" in err


def test_top_ranks_machines_jobs_and_schedulers(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live
    code, out, _ = run_omega(server, capsys, "top", "--json")
    assert code == 0
    assert [(r["machine"], r["fullest"]) for r in json.loads(out)] == [("m1", 1.0), ("m2", 0.0)]
    code, out, _ = run_omega(server, capsys, "top", "--by", "job")
    assert code == 0
    assert out.splitlines()[1:] == ["JOB  TASKS  CPU  MEM", "web      1    4    1"]


def test_jobs_filter_by_owner_and_label(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live

    def ids(*flags: str) -> list[str]:
        code, out, err = run_omega(server, capsys, "jobs", "--json", *flags)
        assert code == 0, err
        return sorted(j["spec"]["id"] for j in json.loads(out))

    assert ids("--owner", "alice") == ["batch", "web"]
    assert ids("--label", "app=web") == ["web"]
    assert ids("-l", "app") == ["web"]
    assert ids("--owner", "bob", "-l", "app=web") == []
    with pytest.raises(SystemExit) as usage:  # argparse's usage error
        run_omega(server, capsys, "jobs", "--label", "=x")
    assert usage.value.code == 2
    assert "is not KEY=VALUE or KEY" in capsys.readouterr().err


def test_jobs_watch_shows_the_list_again_when_it_changes(
        live: tuple[CellStateServer, CellStore]) -> None:
    server, admin = live
    proc = subprocess.Popen(
        [sys.executable, "-m", "omega.cli", "jobs", "-w", "--interval", "0.2", "--insecure",
         "--cellstate", f"127.0.0.1:{server.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("JOB")
        admin.submit_job(job("later"))
        deadline = time.monotonic() + 30
        seen = ""
        while "later" not in seen:
            assert time.monotonic() < deadline, seen
            seen += proc.stdout.readline()
        assert "-- " in seen  # the time of the new list
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_logs_follow_prints_until_the_task_ends(
        live: tuple[CellStateServer, CellStore], tmp_path: Path) -> None:
    server, admin = live
    log = tmp_path / "web" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("first\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "omega.cli", "logs", "web", "0", "-f", "--log-dir",
         str(tmp_path), "--insecure", "--cellstate", f"127.0.0.1:{server.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "first\n"
        with log.open("a") as f:
            f.write("second\n")
        assert proc.stdout.readline() == "second\n"
        admin.release_task("web/0", TaskState.FINISHED)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

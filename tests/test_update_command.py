"""`omega update`: a rolling update through a live service with a real service
scheduler placing the new version's tasks, in a cell the job fills, so that every new
task can only go where an old one made room (issue 34)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import attrs
import pytest

from cellstate.api.server import CellStateServer
from cellstate.invariants import constraint_violations, violations
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Constraints, JobKind, TaskState
from cellstate.store import CellStore
from omega.cli import build_parser
from omega.commands.scheduler import scheduler_process_config
from omega.commands.update import next_version
from schedulers.process import run_scheduler
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import run_omega, running_server


@pytest.fixture
def live() -> Iterator[tuple[CellStateServer, CellStore]]:
    """Three machines of 2 cpu, each running one task of web (2 cpu, one per machine),
    and a service scheduler process's instance running in a thread."""
    kv = MemoryKV()
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=2) for i in range(3)])
    web = attrs.evolve(job("web", tasks=3, cpu=2, scheduler="service"), kind=JobKind.SERVICE,
                       owner="alice", constraints=Constraints(max_per_machine=1))
    admin.submit_job(web)
    assert admin.commit(txn([Claim("web", i, f"m{i}") for i in range(3)],
                            scheduler="service")).ok
    stop = threading.Event()
    with running_server(kv) as server:
        config = scheduler_process_config(build_parser().parse_args(
            ["scheduler", "service", "--instance", "s0", "--insecure",
             "--cellstate", f"127.0.0.1:{server.port}"]))
        thread = threading.Thread(target=run_scheduler, args=(config, stop), daemon=True)
        thread.start()
        try:
            yield server, admin
        finally:
            stop.set()
            thread.join(timeout=30)


def test_update_rolls_a_full_cell_over_a_batch_at_a_time(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    server, admin = live
    code, out, err = run_omega(server, capsys, "update", "web", "--duration", "600",
                               "--batch", "1", "--timeout", "60")
    assert code == 0, err
    assert out.splitlines() == ["web.v2: 1/3 task(s) running; web: 2",
                                "web.v2: 2/3 task(s) running; web: 1",
                                "web.v2: 3/3 task(s) running; web: none left (killed)",
                                "updated web -> web.v2"]
    snap = admin.read_snapshot()
    new = snap.jobs["web.v2"]
    assert new.duration == 600 and dict(new.labels)["omega.replaces"] == "web"
    assert new.owner == "alice" and new.constraints.max_per_machine == 1
    assert snap.statuses["web"].reason == "replaced by web.v2"
    running = [t for t in snap.tasks.values() if t.state is TaskState.RUNNING]
    assert sorted(t.job for t in running) == ["web.v2"] * 3
    assert violations(snap) == [] and constraint_violations(snap) == []


def test_nothing_to_update_changes_nothing(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    server, admin = live
    before = admin.read_snapshot()
    code, _, err = run_omega(server, capsys, "update", "web")
    assert code == 2 and "nothing to update: give --command" in err
    # (The scheduler thread writes its own records meanwhile: compare the jobs' side.)
    after = admin.read_snapshot()
    assert (after.jobs, after.tasks, after.statuses) == (before.jobs, before.tasks,
                                                         before.statuses)


def test_versions_count_up() -> None:
    assert [next_version(j) for j in ("web", "web.v2", "a.v9", "v2")] == [
        "web.v2", "web.v3", "a.v10", "v2.v2"]

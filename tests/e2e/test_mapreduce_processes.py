"""The mapreduce scheduler as a process among the others, end to end: a real etcd, a
cellstate server, an agent running the workers, the batch scheduler and `omega
scheduler mapreduce`, each its own process over gRPC on loopback. Killed with SIGKILL
while a growth round commits (extra workers for many jobs: several etcd
transactions) and started again with the same command, it loses and doubles nothing:
etcd's history, walked revision by revision (tests/faults/checker.py), holds every
invariant at every revision and places each task once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from cellstate.keys import Keyspace
from omega.etcd_launcher import LocalEtcd
from tests.e2e.cluster import Cluster, cluster, etcd_history, kill_at_first_put, wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

CELL = "default"
KEYS = Keyspace(CELL)
TASKS = KEYS.root + b"tasks/"


def _mapreduce(jid: str, workers: int, most: int) -> dict[str, Any]:
    # A million seconds of maps: no job finishes while the test runs.
    return {"id": jid, "scheduler": "mapreduce", "task_resources": {"cpu": 1, "mem": 1},
            "mapreduce": {"maps": 100, "map_seconds": 10_000.0, "workers": workers,
                          "max_workers": most}}


def _batch(jid: str, tasks: int) -> dict[str, Any]:
    return {"id": jid, "scheduler": "batch", "task_count": tasks,
            "task_resources": {"cpu": 1, "mem": 1}}


def _states(c: Cluster) -> dict[str, dict[str, int]]:
    with c.client() as client:
        return {j["spec"]["id"]: j["task_states"] for j in client.list_jobs()}


def _mapreduce_report(c: Cluster) -> dict[str, Any]:
    with c.client() as client:
        mine = [s for s in client.status()["schedulers"] if s["scheduler"] == "mapreduce"]
    return mine[0].get("policy", {}) if mine else {}


def test_mapreduce_scheduler_killed_mid_growth_and_restarted(history_etcd: LocalEtcd,
                                                             tmp_path: Path) -> None:
    """60 machines of 8 cpus (480). Batch takes 50; 20 MapReduce jobs ask for 5
    workers each and may grow to 19: a growth round of 280 extra workers, more than
    one etcd transaction holds. The scheduler is killed while that round commits;
    meanwhile 5 more MapReduce jobs (2 workers, up to 4) and 5 batch jobs (4 tasks)
    arrive. Restarted, it places the new jobs' workers and grows every job to its
    bound (470 of 480 cpus: nothing needs evicting), and each task was placed exactly
    once in all of etcd's history."""
    with cluster(history_etcd.endpoint, tmp_path) as c:
        c.server("cellstate-0")
        spec = c.spec("cell", 60, cpu=8)
        c.start("agent-0", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
                "--id", "agent-0")
        with c.client() as client:
            wait_for("60 machines", lambda: client.status()["machines_up"] == 60, c)
        c.start("batch-0", "scheduler", "batch", "--cellstate", c.cellstate,
                "--instance", "b0")
        expected: dict[str, dict[str, int]] = {}
        with c.client() as client:
            for i in range(5):
                client.submit_job(_batch(f"b-{i:02}", 10))
                expected[f"b-{i:02}"] = {"running": 10}
            wait_for("the batch jobs", lambda: all(
                _states(c).get(j) == s for j, s in expected.items()), c)
            for i in range(20):  # before the scheduler has run here: say it is coming
                client.submit_job(_mapreduce(f"mr-{i:02}", 5, 19), allow_unknown_scheduler=True)
                expected[f"mr-{i:02}"] = {"running": 19}
            # A short lease, so the restart waits little for the killed run's
            # registration; a round a second.
            config = tmp_path / "mapreduce.toml"
            config.write_text("[scheduler]\nlease_ttl = 3\n[options]\ninterval = 1.0\n")
            c.start("mapreduce-0", "scheduler", "mapreduce", "--policy", "max-parallel",
                    "--config", str(config), "--cellstate", c.cellstate, "--instance", "mr0")
            first, written = kill_at_first_put(
                c, history_etcd.endpoint, TASKS + b"mr-", "mapreduce-0",
                # an extra worker: task index past the 5 each job asked for
                lambda kv: int(kv.key.rsplit(b"/", 1)[1]) >= 5, timeout=60)
            assert c.children["mapreduce-0"].wait(10) == -signal.SIGKILL
            for i in range(5):
                client.submit_job(_mapreduce(f"mr-new-{i}", 2, 4))
                client.submit_job(_batch(f"b-new-{i}", 4))
                expected |= {f"mr-new-{i}": {"running": 4}, f"b-new-{i}": {"running": 4}}
        c.restart("mapreduce-0")
        wait_for("every job at its bound", lambda: _states(c) == expected, c, timeout=90)
        wait_for("the restarted scheduler's report",
                 lambda: _mapreduce_report(c).get("extra_workers", 0) > 0, c, timeout=15)
        log = c.children["mapreduce-0"].log_path.read_text()
        print(f"killed at revision {first} ({written} extra workers written there); "
              f"restart waited for the old lease: {'waiting up to' in log}")
    history = etcd_history(history_etcd.endpoint, CELL)
    assert history.problems() == []
    tasks = {f"{j}/{i}" for j, s in expected.items() for i in range(s["running"])}
    assert set(history.placements) == tasks
    twice = {t: p for t, p in history.placements.items() if len(p) != 1}
    assert twice == {}, f"placed more than once: {twice}"

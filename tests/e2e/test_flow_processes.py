"""The flow scheduler as a process among the others, end to end: a real etcd, a
cellstate server, an agent, the batch scheduler and `omega scheduler flow`, each its
own process over gRPC on loopback. What etcd went through is walked revision by
revision afterwards (tests/faults/checker.py): every invariant held at every revision,
and each task was placed exactly once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from cellstate.keys import Keyspace
from omega.etcd_launcher import LocalEtcd
from tests.e2e.cluster import (
    Cluster,
    cluster,
    etcd_history,
    kill_at_first_put,
    wait_for,
    wait_for_schedulers,
)
from tests.faults.checker import History

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

CELL = "default"
KEYS = Keyspace(CELL)


def _job(jid: str, scheduler: str, tasks: int, cpu: float = 0.5, **extra: Any,
         ) -> dict[str, Any]:
    # No duration: the agent runs the tasks until the test ends, so each stays placed.
    return {"id": jid, "scheduler": scheduler, "task_count": tasks,
            "task_resources": {"cpu": cpu, "mem": cpu}, **extra}


def _start_cell(c: Cluster, machines: int) -> None:
    c.server("cellstate-0")
    spec = c.spec("cell", machines, cpu=8)
    c.start("agent-0", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
            "--id", "agent-0")
    with c.client() as client:
        wait_for(f"{machines} machines", lambda: client.status()["machines_up"] == machines, c)


def _flow(c: Cluster, tmp_path: Path, *extra: str) -> None:
    # A short lease, from the config file, so a restart after a kill waits little
    # for the killed run's registration to lapse.
    config = tmp_path / "flow.toml"
    config.write_text("[scheduler]\nlease_ttl = 3\n[options]\ninterval = 0.5\n"
                      'solver = "firmament"\n')
    c.start("flow-0", "scheduler", "flow", "--policy", "quincy", "--config", str(config),
            "--cellstate", c.cellstate, "--instance", "f0", *extra)


def _all_running(c: Cluster, jobs: dict[str, int]) -> bool:
    with c.client() as client:
        listed = {j["spec"]["id"]: j["task_states"] for j in client.list_jobs()}
    return all(listed.get(j) == {"running": n} for j, n in jobs.items())


def _placed_once(history: History, jobs: dict[str, int]) -> None:
    assert history.problems() == []
    tasks = {f"{j}/{i}" for j, n in jobs.items() for i in range(n)}
    assert set(history.placements) == tasks
    twice = {t: p for t, p in history.placements.items() if len(p) != 1}
    assert twice == {}, f"placed more than once: {twice}"


def _flow_report(c: Cluster) -> dict[str, Any]:
    with c.client() as client:
        mine = [s for s in client.status()["schedulers"] if s["scheduler"] == "flow"]
    return mine[0] if mine else {}


def test_batch_and_flow_place_their_jobs_side_by_side(history_etcd: LocalEtcd, tmp_path: Path,
                                                      ) -> None:
    with cluster(history_etcd.endpoint, tmp_path) as c:
        _start_cell(c, 24)
        c.start("batch-0", "scheduler", "batch", "--cellstate", c.cellstate,
                "--instance", "b0")
        _flow(c, tmp_path)
        jobs: dict[str, int] = {}
        with c.client() as client:
            wait_for_schedulers(client, c, "batch", "flow")
            machines = sorted(m["id"] for m in client.list_machines())
            for i in range(12):
                client.submit_job(_job(f"b-{i:02}", "batch", 8))
                # Every other flow job reads data stored on two machines (Quincy); every
                # fourth, each task its own block (a node of its own per task).
                data: dict[str, Any] = (
                    {"input": {machines[i]: 10.0, machines[-1 - i]: 4.0}} if i % 2 else {})
                if i % 4 == 1:
                    data["task_input"] = [[{"size": 1.0, "on": [machines[(i + k) % 24]]}]
                                          for k in range(8)]
                client.submit_job(_job(f"f-{i:02}", "flow", 8, **data))
                jobs |= {f"b-{i:02}": 8, f"f-{i:02}": 8}
        wait_for("every task running", lambda: _all_running(c, jobs), c)

        def reported() -> bool:  # instances report their metrics every 2 s
            # The absorb of the last changes (its own commits coming back, the agent
            # starting the tasks) may come a report after the last placement's.
            r = _flow_report(c)
            return (r.get("tasks_placed") == 96
                    and r.get("policy", {}).get("absorbs", 0) >= 1)

        wait_for("the flow scheduler's metrics", reported, c, timeout=15)
        flow = _flow_report(c)
        assert flow["policy"]["rounds"] >= 1
        assert flow["policy"]["placed"] >= 96  # claims made; 96 of them committed
        assert flow["policy"]["median_solve_ms"] > 0
        # Solved by our own solver, each round from the last one's state.
        assert sum(v for k, v in flow["policy"].items() if k.startswith("solved_by_")) >= 1
        # The process hands the policy the cell's changes between rounds (its own
        # commits coming back, the agent starting the tasks): the network takes them
        # in then, not in the next round.
        assert flow["policy"]["absorbs"] >= 1
    _placed_once(etcd_history(history_etcd.endpoint, CELL), jobs)


def test_flow_scheduler_killed_mid_commit_and_restarted(history_etcd: LocalEtcd, tmp_path: Path,
                                                        ) -> None:
    """Killed while a large plan commits (300 tasks: more than one etcd transaction),
    then started again with the same command: the new run waits for the old
    registration to lapse, places what is left and what came meanwhile, and nothing
    is placed twice or lost."""
    with cluster(history_etcd.endpoint, tmp_path) as c:
        _start_cell(c, 40)
        c.start("batch-0", "scheduler", "batch", "--cellstate", c.cellstate,
                "--instance", "b0")
        jobs: dict[str, int] = {}
        with c.client() as client:
            # Once the flow scheduler has run, jobs for a scheduler that has not are
            # refused: the batch scheduler must have registered before then.
            wait_for_schedulers(client, c, "batch")
            # Queued before the flow scheduler starts: its first round plans them all.
            machines = sorted(m["id"] for m in client.list_machines())
            for i in range(30):
                # (not refused: the flow scheduler is about to start); every third job's
                # tasks read blocks of their own (a node per task in the network)
                own = ({"task_input": [[{"size": 1.0, "on": [machines[(i + k) % 40]]}]
                                       for k in range(10)]} if i % 3 == 0 else {})
                client.submit_job(_job(f"f-{i:02}", "flow", 10, cpu=0.25, **own),
                                  allow_unknown_scheduler=True)
                jobs[f"f-{i:02}"] = 10
            for i in range(5):
                client.submit_job(_job(f"b-{i:02}", "batch", 10, cpu=0.25))
                jobs[f"b-{i:02}"] = 10
            _flow(c, tmp_path)
            first, written = kill_at_first_put(
                c, history_etcd.endpoint, KEYS.root + b"tasks/f-", "flow-0")
            assert c.children["flow-0"].wait(10) == -signal.SIGKILL
            # Work that arrives while it is down, for both schedulers.
            for i in range(30, 40):
                client.submit_job(_job(f"f-{i:02}", "flow", 10, cpu=0.25))
                client.submit_job(_job(f"b-{i:02}", "batch", 4, cpu=0.25))
                jobs |= {f"f-{i:02}": 10, f"b-{i:02}": 4}
        c.restart("flow-0")
        wait_for("every task running", lambda: _all_running(c, jobs), c)
        wait_for("the restarted flow scheduler's report",
                 lambda: _flow_report(c).get("policy", {}).get("rounds", 0) >= 1, c,
                 timeout=15)
        log = c.children["flow-0"].log_path.read_text()
        print(f"killed at revision {first} ({written} flow tasks written there); "
              f"restart waited for the old lease: {'waiting up to' in log}")
    _placed_once(etcd_history(history_etcd.endpoint, CELL), jobs)

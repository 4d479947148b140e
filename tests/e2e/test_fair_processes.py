"""The fair scheduler as a process among the others, end to end: a real etcd, a
cellstate server, an agent running the tasks and `omega scheduler fair`, each its own
process over gRPC on loopback.

alice fills the cell; four more users then arrive and take back their fair share by
preemption in one round, more than one etcd transaction holds. The scheduler is killed
with SIGKILL as the first of those writes lands and started again with the same command: it finishes
the work with nothing lost or doubled (etcd's history, walked revision by revision,
holds every invariant at every revision and places each task at most once), and
`omega shares` then explains the cell from outside."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from cellstate.keys import Keyspace
from omega.etcd_launcher import LocalEtcd
from tests.e2e.cluster import Cluster, cluster, etcd_history, kill_at_first_put, wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

CELL = "default"
TASKS = Keyspace(CELL).root + b"tasks/"


USERS = ("bob", "carol", "dave", "erin")


def _job(jid: str, owner: str, tasks: int) -> dict[str, Any]:
    # No duration: the tasks run until preempted or the test ends.
    return {"id": jid, "owner": owner, "scheduler": "fair", "task_count": tasks,
            "task_resources": {"cpu": 1, "mem": 1}}


def _states(c: Cluster) -> dict[str, dict[str, int]]:
    with c.client() as client:
        return {j["spec"]["id"]: j["task_states"] for j in client.list_jobs()}


def test_fair_scheduler_killed_mid_preemption_and_restarted(history_etcd: LocalEtcd,
                                                            tmp_path: Path) -> None:
    """40 machines of 4 cpus (160). alice's 160 tasks fill them. Four users submit 20
    tasks each: their k-th tasks have CRS k/160 and alice's victims (160 - j)/160
    after j preemptions, so with delta 0.05 (8/160) all 80 preempt alice's 80 least
    important tasks (alice/80 to alice/159), and alice's next task (CRS 81/160) then
    waits: no task is above 81/160 + 0.05."""
    with cluster(history_etcd.endpoint, tmp_path) as c:
        c.server("cellstate-0")
        spec = c.spec("cell", 40, cpu=4)
        c.start("agent-0", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
                "--id", "agent-0")
        with c.client() as client:
            wait_for("40 machines", lambda: client.status()["machines_up"] == 40, c)
        config = tmp_path / "fair.toml"
        config.write_text("[scheduler]\nlease_ttl = 3\n[options]\ninterval = 0.5\n"
                          "delta = 0.05\nmin_runtime = 0.0\nmax_preemptions_per_round = 100\n"
                          "max_preemptions_per_minute = 1000\n")
        c.start("fair-0", "scheduler", "fair", "--config", str(config),
                "--cellstate", c.cellstate, "--instance", "f0")
        with c.client() as client:
            client.submit_job(_job("alice", "alice", 160))
            wait_for("alice's tasks", lambda: _states(c).get("alice") == {"running": 160}, c)
            for user in USERS:
                client.submit_job(_job(user, user, 20))
            first, written = kill_at_first_put(
                c, history_etcd.endpoint, TASKS, "fair-0",
                lambda kv: not kv.key.startswith(TASKS + b"alice/"), timeout=60)
            assert c.children["fair-0"].wait(10) == -signal.SIGKILL
        c.restart("fair-0")
        expected = {"alice": {"running": 80, "preempted": 80},
                    **{u: {"running": 20} for u in USERS}}
        wait_for("the fair shares", lambda: _states(c) == expected, c, timeout=90)
        shares = json.loads(c.run("shares", "--cellstate", c.cellstate, "--json"))
        print(f"killed at revision {first} ({written} task records written there)")
    users = {u["user"]: u for u in shares["users"]}
    assert shares["delta"] == 0.05 and shares["live_instances"]
    assert (users["alice"]["tasks"], users["alice"]["waiting"]) == (80, 80)
    assert users["alice"]["share"] == 0.5 and users["bob"]["share"] == 0.125
    assert users["alice"]["next_task"] == "alice/80"
    assert users["alice"]["next_crs"] == pytest.approx(81 / 160)
    assert users["alice"]["verdict"] == "waits"
    assert users["bob"]["waiting"] == 0 and users["bob"]["verdict"] == ""
    history = etcd_history(history_etcd.endpoint, CELL)
    assert history.problems() == []
    twice = {t: p for t, p in history.placements.items() if len(p) != 1}
    assert twice == {}, f"placed more than once: {twice}"
    assert set(history.placements) == ({f"alice/{i}" for i in range(160)}
                                       | {f"{u}/{i}" for u in USERS for i in range(20)})
    # The round did not fit one etcd transaction: the kill fell inside it.
    assert written < 80

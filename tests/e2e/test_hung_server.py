"""Issue 14, finding 4, as processes: two cellstate servers, an agent and a scheduler
with leases of 3 s; one server is paused (SIGSTOP) for several lease periods. No
machine goes down, the scheduler keeps its registration, and a job submitted meanwhile
is placed, run and reported through the other server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cellstate.cell import CellSnapshot
from cellstate.kv.etcd import EtcdKV
from cellstate.model import MachineState
from cellstate.replica import Replica
from omega.etcd_launcher import LocalEtcd
from tests.e2e.cluster import cluster, wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

TTL = 3


def test_a_paused_server_takes_no_machine_and_no_scheduler_down(fresh_etcd: LocalEtcd,
                                                                 tmp_path: Path) -> None:
    kv = EtcdKV([fresh_etcd.endpoint])
    lapses: list[str] = []  # what went missing, seen from etcd itself

    def watch(snap: CellSnapshot, changed: object) -> None:
        if watching:
            lapses.extend(m.id for m in snap.machines.values() if m.state is MachineState.DOWN)
            if "batch/b0" not in snap.instances:
                lapses.append("batch/b0")

    watching = False
    with Replica(kv) as replica, cluster(fresh_etcd.endpoint, tmp_path) as c:
        replica.on_changes(watch)
        c.server("cellstate-a")
        c.server("cellstate-b")  # c.cellstate lists a first: everyone starts on a
        spec = c.spec("cell", 4)
        c.start("agent-0", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
                "--id", "agent-0", "--ttl", str(TTL))
        conf = tmp_path / "batch.toml"
        conf.write_text(f"[scheduler]\nlease_ttl = {TTL}\n")
        c.start("batch", "scheduler", "--cellstate", c.cellstate, "--config", str(conf),
                "--name", "batch", "--instance", "b0")
        with c.client() as client:
            wait_for("4 machines and the scheduler", lambda: (
                client.status()["machines_up"] == 4
                and "batch/b0" in replica.snapshot().instances), c)
        paused = c.children["cellstate-a"]
        watching = True
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            time.sleep(3 * TTL + 1)  # several lease periods
            with c.client() as client:  # a's turn to time out, then b answers
                client.submit_job({"id": "j", "scheduler": "batch", "task_count": 2,
                                   "task_resources": {"cpu": 1, "mem": 1}, "duration": 0.5})
                wait_for("job j to finish",
                         lambda: client.get_job("j")["state"] == "finished", c)
            watching = False
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        assert lapses == []
    kv.close()

"""End to end, with every part its own process over gRPC on loopback: a real etcd, two
cellstate replicas, agents, the batch and service schedulers."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from omega.etcd_launcher import LocalEtcd
from tests.e2e.cluster import Cluster, cluster, wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def _job(jid: str, scheduler: str, tasks: int, duration: float | None, **extra: Any,
         ) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": jid, "scheduler": scheduler, "task_count": tasks,
                           "task_resources": {"cpu": 1, "mem": 1},
                           "kind": "service" if scheduler == "service" else "batch", **extra}
    if duration is not None:
        doc["duration"] = duration
    return doc


def _state(c: Cluster, job: str) -> str:
    with c.client() as client:
        return str(client.get_job(job)["state"])


def test_jobs_of_both_kinds_finish(fresh_etcd: LocalEtcd, tmp_path: Path) -> None:
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        port_a = c.server("cellstate-a")
        port_b = c.server("cellstate-b")
        spec = c.spec("cell", 6)
        c.start("agent-0", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
                "--id", "agent-0", "--log-dir", str(tmp_path / "tasks"),
                # The command job runs python3: this agent allows any command.
                "--allow-command-from", "*", "--allow-command", "/")
        # Each scheduler talks to a different replica.
        c.start("batch", "scheduler", "--cellstate", f"127.0.0.1:{port_a}", "--name", "batch",
                "--instance", "b0")
        c.start("service", "scheduler", "--cellstate", f"127.0.0.1:{port_b}", "--name",
                "service", "--instance", "s0")
        with c.client(port_b) as client:
            wait_for("6 machines", lambda: client.status()["machines_up"] == 6, c)
            # Submission refuses a job whose scheduler has not run yet, once any has.
            wait_for("both schedulers", lambda: len(client.status()["schedulers"]) == 2, c)
            client.submit_job(_job("b1", "batch", 8, 1.0))
            client.submit_job(_job("s1", "service", 3, 2.0,
                                   constraints={"max_per_machine": 1}))
            out = tmp_path / "ran.txt"
            client.submit_job(_job("cmd", "batch", 1, None, command=[
                "python3", "-c", f"open({str(out)!r}, 'w').write('ok')"]))
        for job in ("b1", "s1", "cmd"):
            def finished(job: str = job) -> bool:
                return _state(c, job) == "finished"

            wait_for(f"job {job} to finish", finished, c)
        assert out.read_text() == "ok"
        with c.client(port_a) as client:
            info = client.get_job("s1")
            # The service scheduler spread its tasks: one per machine.
            machines = [t["machine"] for t in info["tasks"]]
            assert len(set(machines)) == 3, info
            assert client.status()["used"].get("cpu", 0) == 0  # every task freed its share

            def reported() -> bool:  # instances report their metrics every 2 s
                placed = {(s["scheduler"], s["instance"]): s["tasks_placed"]
                          for s in client.status()["schedulers"]}
                return placed == {("batch", "b0"): 9, ("service", "s0"): 3}

            wait_for("both schedulers' metrics", reported, c, timeout=10)


def test_a_dead_agents_tasks_are_rescheduled_elsewhere(fresh_etcd: LocalEtcd,
                                                       tmp_path: Path) -> None:
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        c.server("cellstate-a")
        c.server("cellstate-b")
        spec = c.spec("cell", 4)
        for i in range(2):
            c.start(f"agent-{i}", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
                    "--index", str(i), "--of", "2", "--id", f"agent-{i}", "--ttl", "2")
        c.start("service", "scheduler", "--cellstate", c.cellstate, "--name", "service",
                "--instance", "s0")
        with c.client() as client:
            wait_for("4 machines", lambda: client.status()["machines_up"] == 4, c)
            owner = {m["id"]: m["agent"] for m in client.list_machines()}
            # Long-running service tasks, one per machine, two of them.
            client.submit_job(_job("svc", "service", 2, None, constraints={"max_per_machine": 1}))
            wait_for("svc running", lambda: client.get_job("svc")["task_states"] == {
                "running": 2}, c)
            placed = {t["machine"] for t in client.get_job("svc")["tasks"]}
            victim = owner[sorted(placed)[0]]
            c.children[victim].popen.send_signal(signal.SIGKILL)
            survivor = next(a for a in ("agent-0", "agent-1") if a != victim)

            def moved() -> bool:
                tasks = client.get_job("svc")["tasks"]
                return all(t["state"] == "running" and owner[t["machine"]] == survivor
                           for t in tasks)

            wait_for("the tasks to move to the surviving agent", moved, c, timeout=60)
            down = {m["id"] for m in client.list_machines(state="down")}
            assert down == {m for m, a in owner.items() if a == victim}
            assert client.status()["agents"] == 1

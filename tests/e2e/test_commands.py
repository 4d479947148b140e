"""No remote code execution by default: a real agent process, over mutual TLS, runs a
job's command only when its operator allowed the job's owner and the executable.
Refused commands never start (their files never appear) and their tasks fail."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from omega.command_policy import CommandPolicy
from omega.etcd_launcher import LocalEtcd
from tests.e2e.cluster import cluster, wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def _job(id_: str, owner: str, command: list[str]) -> dict[str, object]:
    return {"id": id_, "owner": owner, "scheduler": "batch", "task_count": 1,
            "task_resources": {"cpu": 1, "mem": 1}, "command": command}


def test_only_allowed_owners_and_paths_run_commands(fresh_etcd: LocalEtcd,
                                                    tmp_path: Path) -> None:
    touch = os.path.realpath(shutil.which("touch") or "/usr/bin/touch")
    out = tmp_path / "out"
    out.mkdir()
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        c.server("cellstate-0")
        spec = c.spec("cmd", 2)
        c.start("agent-0", "agent", "--cellstate", c.cellstate, "--spec", str(spec),
                "--id", "agent-0", "--allow-command-from", "alice", "--allow-command", touch,
                # It touches files in this test's folder: as this user, not nobody.
                "--run-as", pwd.getpwuid(os.geteuid()).pw_name)
        c.start("batch", "scheduler", "batch", "--cellstate", c.cellstate, "--instance", "b0")
        with c.client() as client:  # operator:admin, who may submit for any owner
            wait_for("2 machines", lambda: client.status()["machines_up"] == 2, c)
            client.submit_job(_job("anonymous", "nobody", [touch, str(out / "anonymous")]))
            client.submit_job(_job("outside", "alice",
                                   ["/bin/sh", "-c", f"touch {out / 'outside'}"]))
            client.submit_job(_job("allowed", "alice", [touch, str(out / "allowed")]))
            # A job with a duration only runs no code: it needs no permission.
            timed = {**_job("timed", "mallory", []), "duration": 0.5}
            del timed["command"]
            client.submit_job(timed)
            states = {}

            def ended() -> bool:
                states.update({j: client.get_job(j)["state"]
                               for j in ("anonymous", "outside", "allowed", "timed")})
                return all(s in ("finished", "failed") for s in states.values())

            wait_for("the four jobs to end", ended, c)
        assert states == {"anonymous": "failed", "outside": "failed", "allowed": "finished",
                          "timed": "finished"}
        assert sorted(p.name for p in out.iterdir()) == ["allowed"]
        log = (tmp_path / "agent-0.log").read_text()
        assert "owner 'nobody' may not run commands on this agent" in log
        assert "is outside the paths this agent runs commands from" in log
        # --run-as its own user: its operator is told what that exposes.
        assert "commands run as this agent's own user: they can read its files" in log


def test_the_default_policy_runs_nothing_and_allow_all_runs_anything() -> None:
    path = os.defpath
    assert CommandPolicy().refusal("alice", ["true"], path)
    assert CommandPolicy(frozenset({"alice"})).refusal("alice", ["true"], path)
    assert CommandPolicy.allow_all().refusal("anyone", ["true"], path) == ""
    folder = os.path.dirname(os.path.realpath(shutil.which("true") or "/bin/true")) + "/"
    assert CommandPolicy(frozenset({"*"}), (folder,)).refusal("bob", ["true"], path) == ""
    assert "not an executable" in CommandPolicy.allow_all().refusal(
        "bob", ["no-such-program-here"], path)

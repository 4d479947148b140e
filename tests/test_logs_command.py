"""``omega logs``: what an agent's runner wrote for a job's command tasks, found through
the cell; and the client config file and environment variables the commands read."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import Claim
from cellstate.store import CellStore
from omega.agent import SubprocessRunner, TaskLaunch
from omega.cli import main
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import run_omega, running_server


@pytest.fixture
def live(kv: KV, tmp_path: Path) -> Iterator[tuple[CellStateServer, Path]]:
    """Job j of 3 tasks: 0 and 1 ran their command through the agent's runner (which
    wrote their logs), 2 never ran."""
    store = CellStore(kv)
    store.add_machines([machine("m1", cpu=4)])
    store.submit_job(job("j", tasks=3, cpu=1))
    store.commit(txn([Claim("j", 0, "m1"), Claim("j", 1, "m1")]))
    logs = tmp_path / "task-logs"
    runner = SubprocessRunner(log_dir=logs)
    for i in range(2):
        code = (f"import sys; print('task {i} says hello'); "
                f"print('task {i} line 2'); print('to stderr', file=sys.stderr)")
        p = runner.start(TaskLaunch(f"j/{i}", "m1", "agent-0", (sys.executable, "-c", code)))
        assert p.wait(30) == 0
    with running_server(kv) as server:
        yield server, logs



def test_one_tasks_log(live: tuple[CellStateServer, Path],
                       capsys: pytest.CaptureFixture[str]) -> None:
    server, logs = live
    code, out, _ = run_omega(server, capsys, "logs", "j", "1", "--log-dir", str(logs))
    assert code == 0
    assert out.splitlines() == ["task 1 says hello", "task 1 line 2", "to stderr"]
    code, out, _ = run_omega(server, capsys, "logs", "j", "1", "--log-dir", str(logs),
                          "--tail", "1")
    assert out.splitlines() == ["to stderr"]


def test_every_task_that_ran_with_headers(live: tuple[CellStateServer, Path],
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    server, logs = live
    monkeypatch.setenv("OMEGA_LOG_DIR", str(logs))  # the folder from the environment
    code, out, _ = run_omega(server, capsys, "logs", "j")
    assert code == 0
    assert "==> j/0 (running on m1) <==\ntask 0 says hello" in out
    assert "==> j/1 (running on m1) <==\ntask 1 says hello" in out
    assert "j/2" not in out  # never ran
    code, out, _ = run_omega(server, capsys, "logs", "j", "--json")
    assert [d["task"] for d in json.loads(out)] == ["j/0", "j/1"]


@pytest.mark.parametrize(("argv", "message"), [
    (["logs", "j", "2"], "no log of task j/2 under"),
    (["logs", "j", "7"], "job j has 3 task(s): there is no task 7"),
    (["logs", "nope"], "unknown job 'nope'"),
])
def test_what_has_no_log_says_why(live: tuple[CellStateServer, Path],
                                  capsys: pytest.CaptureFixture[str], argv: list[str],
                                  message: str) -> None:
    server, logs = live
    code, _, err = run_omega(server, capsys, *argv, "--log-dir", str(logs))
    assert code == 2 and message in err, err


def test_no_log_dir_says_where_to_give_it(live: tuple[CellStateServer, Path],
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.delenv("OMEGA_LOG_DIR", raising=False)
    monkeypatch.setenv("OMEGA_CONFIG", str(tmp_path / "empty.toml"))
    (tmp_path / "empty.toml").write_text("")
    server, _ = live
    code, _, err = run_omega(server, capsys, "logs", "j")
    assert code == 2 and "--log-dir DIR (or $OMEGA_LOG_DIR" in err


def test_the_config_file_gives_defaults_and_flags_and_env_win(
        live: tuple[CellStateServer, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server, logs = live
    config = tmp_path / "omega.toml"
    config.write_text(f'cellstate = "127.0.0.1:{server.port}"\ninsecure = true\n'
                      f'output = "json"\nlog_dir = "{logs}"\n')
    for var in ("OMEGA_CELLSTATE", "OMEGA_INSECURE", "OMEGA_OUTPUT", "OMEGA_LOG_DIR",
                "OMEGA_CERT", "OMEGA_CA", "OMEGA_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMEGA_CONFIG", str(config))
    assert main(["logs", "j", "0"]) == 0  # address, plaintext, output and folder: the file's
    assert json.loads(capsys.readouterr().out)[0]["text"].startswith("task 0 says hello")
    monkeypatch.setenv("OMEGA_OUTPUT", "table")  # the environment over the file
    assert main(["logs", "j", "0"]) == 0
    assert capsys.readouterr().out.startswith("task 0 says hello")
    assert main(["logs", "j", "0", "-o", "json"]) == 0  # a flag over both
    assert json.loads(capsys.readouterr().out)[0]["task"] == "j/0"


@pytest.mark.parametrize(("content", "message"), [
    ("cellstate = ", "not valid TOML"),
    ("colour = 'blue'", "colour: unknown setting"),
    ("insecure = 'yes'", "insecure: expected a bool"),
    ("output = 'xml'", "output: 'xml' is not one of table, wide, json"),
])
def test_a_bad_config_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str], content: str,
                                    message: str) -> None:
    config = tmp_path / "omega.toml"
    config.write_text(content)
    monkeypatch.setenv("OMEGA_CONFIG", str(config))
    assert main(["jobs"]) == 2
    err = capsys.readouterr().err
    assert str(config) in err and message in err, err


def test_a_config_file_named_but_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OMEGA_CONFIG", str(tmp_path / "nope.toml"))
    assert main(["jobs"]) == 2
    assert "$OMEGA_CONFIG: " in capsys.readouterr().err

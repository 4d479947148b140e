"""Command tasks run confined (omega/task_sandbox.py, omega/supervisor.py): as the
configured user, in a fresh directory of their own, under the configured limits, in
a cgroup of their own where one can be made. Real processes, started the way the
agent starts them (SubprocessRunner under the supervisor)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from omega.agent import SubprocessRunner, TaskLaunch
from omega.proc import supervised
from omega.task_sandbox import RunAs, TaskSandbox, parse_limits, run_as

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching users needs an agent run as root")
NOBODY = pwd.getpwnam("nobody")

# Prints what the task sees: its uid, working directory, HOME and its limits. (A bare
# "sh": found on PATH by the task's user, who may not read the agent's Python.)
REPORT = ["sh", "-c",
          'echo "uid=$(id -u) cwd=$(pwd) home=$HOME"; touch mine; '
          "grep -E '^Max (open files|cpu time|core file size)' /proc/self/limits"]


def _run(runner: SubprocessRunner, task: str, command: list[str]) -> str:
    process = runner.start(TaskLaunch(task, "m0", "agent-0", tuple(command)))
    assert process.wait(timeout=20) is not None, "the task did not end"
    assert runner.log_dir is not None
    job, _, index = task.partition("/")
    return (runner.log_dir / job / f"{index}.log").read_text()


def _limit(report: str, name: str) -> str:
    (line,) = [line for line in report.splitlines() if line.startswith(f"Max {name}")]
    return line.split()[len(name.split()) + 1]  # the soft limit


@needs_root
def test_a_root_agents_command_runs_as_nobody_in_its_own_directory_with_limits(
        tmp_path: Path) -> None:
    sandbox = TaskSandbox(tmp_path / "tasks", run_as(None),
                          parse_limits(["nofile=64", "cpu=30"]))
    (tmp_path / "tasks").mkdir(mode=0o711)
    runner = SubprocessRunner(log_dir=tmp_path / "logs", sandbox=sandbox)
    report = _run(runner, "job-a/3", REPORT)
    task_dir = tmp_path / "tasks" / "job-a" / "3"
    assert f"uid={NOBODY.pw_uid} cwd={task_dir} home={task_dir}" in report
    assert (task_dir / "mine").stat().st_uid == NOBODY.pw_uid  # it could write there
    assert task_dir.stat().st_uid == NOBODY.pw_uid and task_dir.stat().st_mode & 0o777 == 0o700
    assert _limit(report, "open files") == "64"
    assert _limit(report, "cpu time") == "30"
    assert _limit(report, "core file size") == "0"  # the default: no core dumps
    # Another task gets another, fresh directory; the same task placed again starts empty.
    assert "cwd=" + str(tmp_path / "tasks" / "job-a" / "4") in _run(runner, "job-a/4", REPORT)
    (task_dir / "left-over").write_text("x")
    _run(runner, "job-a/3", ["/bin/true"])
    assert sorted(p.name for p in task_dir.iterdir()) == []


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder everyone may enter (pytest's own tmp_path is not: there ``nobody``
    could read nothing at all, whatever the files' modes)."""
    path = Path(tempfile.mkdtemp(prefix="omega-sandbox-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_nobody_cannot_read_what_the_agent_keeps(open_dir: Path) -> None:
    secret = open_dir / "agent.key"
    secret.write_text("the agent's key")
    secret.chmod(0o600)
    public = open_dir / "public"
    public.write_text("anyone's")  # the control: what nobody may read, it reads
    (open_dir / "tasks").mkdir(mode=0o711)
    runner = SubprocessRunner(log_dir=open_dir / "logs",
                              sandbox=TaskSandbox(open_dir / "tasks", run_as(None)))
    report = _run(runner, "j/0", ["/bin/sh", "-c",
                                  f"cat {public}; cat {secret} || echo refused"])
    assert "anyone's" in report
    assert "refused" in report and "the agent's key" not in report


@needs_root
def test_a_task_cannot_read_another_tasks_log(open_dir: Path) -> None:
    """Task logs hold their submitters' output: the agent's alone, not readable by
    the user every task runs as."""
    (open_dir / "tasks").mkdir(mode=0o711)
    (open_dir / "logs").mkdir(mode=0o755)
    runner = SubprocessRunner(log_dir=open_dir / "logs",
                              sandbox=TaskSandbox(open_dir / "tasks", run_as(None)))
    _run(runner, "alices/0", ["/bin/sh", "-c", "echo alice-secret"])
    log = open_dir / "logs" / "alices" / "0.log"
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.parent.stat().st_mode & 0o777 == 0o700
    report = _run(runner, "mallory/0", ["/bin/sh", "-c",
                                        f"ls {open_dir / 'logs'}; cat {log} || echo refused"])
    assert "alices" in report  # it could look (the folder is open) ...
    assert "refused" in report and "alice-secret" not in report  # ... but not read


def test_the_agents_own_user_needs_no_switch(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert run_as(me) is None
    runner = SubprocessRunner(log_dir=tmp_path / "logs",
                              sandbox=TaskSandbox(tmp_path / "tasks", run_as(me),
                                                  parse_limits(["nofile=100"])))
    report = _run(runner, "j/0", REPORT)
    assert f"uid={os.geteuid()} cwd={tmp_path / 'tasks' / 'j' / '0'}" in report
    assert _limit(report, "open files") == "100"


def test_who_commands_run_as() -> None:
    assert run_as(None, euid=0) == RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert run_as(None, euid=1234) is None  # not root: its own user, nothing to switch
    assert run_as("nobody", euid=0) == RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(ValueError, match="cannot run commands as another user"):
        run_as("nobody", euid=NOBODY.pw_uid + 1)
    with pytest.raises(ValueError, match="'no-such-user-here': no such user"):
        run_as("no-such-user-here", euid=0)


def test_bad_limits_say_what_is_wrong() -> None:
    assert parse_limits([]) == (("core", 0),)
    assert parse_limits(["core=1024", "as=1000000"]) == (("as", 1000000), ("core", 1024))
    for bad in ("memory=1", "cpu", "cpu=-1", "cpu=lots"):
        with pytest.raises(ValueError, match=f"--task-limit '{bad}': expected NAME=VALUE"):
            parse_limits([bad])


def test_a_confinement_that_cannot_be_applied_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = ["/bin/sh", "-c", f"touch {marker}"]
    # A cgroup folder that is not one: joining it fails, so the command must not run.
    confine = ["--cgroup", str(tmp_path / "no-cgroup")]
    done = subprocess.run(supervised(command, confine=confine), capture_output=True,
                          timeout=20, start_new_session=True)
    assert done.returncode == 126
    assert b"cannot confine it" in done.stderr
    assert not marker.exists()
    bad = subprocess.run(supervised(command, confine=["--rlimit", "memory=1"]),
                         capture_output=True, timeout=20)
    assert bad.returncode == 2 and b"--rlimit must be NAME=VALUE" in bad.stderr
    assert not marker.exists()


def _cgroup2_parent() -> Path | None:
    """A writable cgroup v2 folder on this host, or None."""
    for mount in Path("/proc/self/mounts").read_text().splitlines():
        fields = mount.split()
        if fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


@pytest.fixture
def cgroup() -> Iterator[Path]:
    parent = _cgroup2_parent()
    if parent is None:
        pytest.skip("no writable cgroup v2 hierarchy on this host")
    folder = parent / f"omega-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        for child in folder.iterdir():
            if child.is_dir():
                child.rmdir()
        folder.rmdir()


def test_each_task_runs_in_a_cgroup_of_its_own(cgroup: Path, tmp_path: Path) -> None:
    root = Path(next(line.split()[1] for line in Path("/proc/self/mounts").read_text()
                     .splitlines() if line.split()[2] == "cgroup2"))
    runner = SubprocessRunner(log_dir=tmp_path / "logs",
                              sandbox=TaskSandbox(tmp_path / "tasks", cgroup=cgroup))
    report = _run(runner, "job-c/1", ["/bin/cat", "/proc/self/cgroup"])
    mine = "/" + str((cgroup / "omega-job-c-1").relative_to(root))
    assert f"0::{mine}" in report.splitlines()
    # Gone once the task ended (the runner removes it when it sees the exit).
    process = runner.start(TaskLaunch("job-c/2", "m0", "agent-0", ("/bin/true",)))
    assert process.wait(timeout=20) == 0
    assert process.poll() == 0
    assert not (cgroup / "omega-job-c-2").exists()

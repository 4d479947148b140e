"""What a node agent's command task runs as and within (docs/security.md): a user of
its own, a working directory of its own, resource limits.

A job's command is code from whoever submitted it. Even once the agent's operator has
allowed it (:mod:`omega.command_policy`), it runs confined:

* **as an unprivileged user**: an agent running as root runs commands as ``nobody``
  unless told otherwise (``--run-as USER``); an agent running as anyone else runs
  them as itself (it cannot switch users) and refuses a ``--run-as`` of another user;
* **in a fresh directory of its own**, ``TASK_DIR/<job>/<index>`` (``--task-dir``;
  by default ``STATE_DIR/task-dirs``, else a temporary folder the agent makes and
  removes), owned by that user and its ``HOME``, so tasks neither share files nor
  write where the agent keeps its own;
* **under resource limits**: rlimits (``--task-limit cpu=SECONDS``, ``as=BYTES``,
  ``nofile=N``, ``nproc=N``, ``fsize=BYTES``, ``core=BYTES``; core dumps are off
  unless given) and, given a writable cgroup v2 folder (``--cgroup DIR``, delegated
  to the agent), a cgroup per task with ``memory.max`` (from ``as``) and ``pids.max``
  (from ``nproc``) where those controllers are enabled.

:mod:`omega.supervisor` applies all of it in the child it forks, just before the
command executes (the agent itself is multi-threaded and may not fork and change
itself, see :mod:`omega.proc`); :class:`TaskSandbox` says what to apply and makes
the folders.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
from collections.abc import Iterable
from pathlib import Path

import attrs

from omega.supervisor import RLIMITS

log = logging.getLogger(__name__)

DEFAULT_ROOT_USER = "nobody"
# Always applied unless given: a crashing task's core dump is the agent's disk.
DEFAULT_RLIMITS = (("core", 0),)


@attrs.frozen
class RunAs:
    name: str
    uid: int
    gid: int


def run_as(name: str | None, euid: int | None = None) -> RunAs | None:
    """Whom commands run as: None is the agent's own user (nothing to switch).
    ``name`` None: ``nobody`` when the agent runs as root. Raises ValueError for an
    unknown user, or another user when the agent cannot switch."""
    euid = os.geteuid() if euid is None else euid
    if name is None:
        if euid != 0:
            return None
        name = DEFAULT_ROOT_USER
    try:
        entry = pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
    except KeyError:
        raise ValueError(f"--run-as {name!r}: no such user on this host") from None
    if entry.pw_uid == euid:
        return None
    if euid != 0:
        raise ValueError(f"--run-as {name!r}: this agent runs as uid {euid}, not root, and "
                         "cannot run commands as another user")
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def parse_limits(items: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """``NAME=VALUE`` flags as (name, value), with the defaults for names not given."""
    given: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in RLIMITS or not value.isdigit():
            raise ValueError(f"--task-limit {item!r}: expected NAME=VALUE, NAME one of "
                             f"{', '.join(RLIMITS)}, VALUE a whole number")
        given[name] = int(value)
    return tuple(sorted({**dict(DEFAULT_RLIMITS), **given}.items()))


@attrs.frozen
class TaskSandbox:
    """``root``: where task directories go (None: commands share the runner's working
    directory, as they did before sandboxes). ``user``: None runs commands as the
    agent's user. ``rlimits``: (name, value) for :mod:`omega.supervisor`. ``cgroup``:
    a writable cgroup v2 folder to make a cgroup per task in."""

    root: Path | None = None
    user: RunAs | None = None
    rlimits: tuple[tuple[str, int], ...] = DEFAULT_RLIMITS
    cgroup: Path | None = None

    def task_dir(self, job: str, index: int) -> Path | None:
        """A fresh, empty directory for the task, owned by its user (None without a
        root). A task placed here again (after a failure) starts from empty too."""
        if self.root is None:
            return None
        path = self.root / job / str(index)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True, mode=0o700)
        if self.user is not None:
            os.chown(path, self.user.uid, self.user.gid)
        return path

    def task_cgroup(self, job: str, index: int) -> Path | None:
        """The task's cgroup, made with its limits (None without ``cgroup``)."""
        if self.cgroup is None:
            return None
        path = self.cgroup / f"omega-{job}-{index}"
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        limits = dict(self.rlimits)
        for name, file in (("as", "memory.max"), ("nproc", "pids.max")):
            if name in limits and (path / file).exists():
                (path / file).write_text(str(limits[name]))
        return path

    def supervisor_flags(self, cgroup: Path | None) -> list[str]:
        flags = []
        if self.user is not None:
            flags += ["--user", f"{self.user.uid}:{self.user.gid}"]
        for name, value in self.rlimits:
            flags += ["--rlimit", f"{name}={value}"]
        if cgroup is not None:
            flags += ["--cgroup", str(cgroup)]
        return flags

    def env(self, task_dir: Path | None) -> dict[str, str]:
        env = {}
        if task_dir is not None:
            env["HOME"] = str(task_dir)
        if self.user is not None:
            env["USER"] = env["LOGNAME"] = self.user.name
        return env


def remove_cgroup(path: Path | None) -> None:
    """Remove a task's cgroup once its processes are gone (rmdir fails while any is
    left; then it stays, for the operator to look at)."""
    if path is not None:
        try:
            path.rmdir()
        except OSError as e:
            log.info("task cgroup %s stays: %s", path, e)


def describe(sandbox: TaskSandbox) -> str:
    who = sandbox.user.name if sandbox.user else "the agent's user"
    where = (f"{sandbox.root}/<job>/<index>" if sandbox.root
             else "the agent's working directory")
    limits = ", ".join(f"{n}={v}" for n, v in sandbox.rlimits) or "none"
    cgroup = f", a cgroup each under {sandbox.cgroup}" if sandbox.cgroup else ""
    return f"commands run as {who} in {where}, limits {limits}{cgroup}"

"""A node agent's state directory: which task processes it started, so that the next run
of the agent kills whatever this one leaves behind before it registers.

::

    <dir>/lock          flock-ed while an agent uses the directory (one agent per directory)
    <dir>/tasks/<pid>   one per running command task: {"task": ..., "pid": ..., "start": ...}

A command task runs under :mod:`omega.supervisor`, which ends it when the agent dies.
What can still be left over: the task's own children once its supervisor was killed
outright, or a task that ignores SIGTERM while a new agent is already starting. So every
task process carries ``OMEGA_AGENT_STATE=<dir>`` in its environment, and
:meth:`AgentState.kill_leftovers` kills every process that has it, plus the process
group of every recorded supervisor that still runs (identified by its pid *and* start
time, so a reused pid is never mistaken for it). The agent does this before it
registers, so no task of a previous run is still running when the cell hears from it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
from pathlib import Path

import orjson

from omega.proc import alive, environment, process_group, process_ids, start_time

log = logging.getLogger(__name__)

STATE_ENV = "OMEGA_AGENT_STATE"


class StateDirInUse(ValueError):
    """Another agent holds the state directory (a configuration error: exit code 2)."""


class AgentState:
    """An agent's state directory, held (locked) until :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        self._tasks = self.path / "tasks"
        self._tasks.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path / "lock", "a+")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "?"
            self._lock.close()
            raise StateDirInUse(f"agent state directory {self.path} is in use by another "
                                f"agent (pid {holder}); give each agent its own") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()

    @property
    def marker(self) -> tuple[str, str]:
        """The environment variable every task process gets."""
        return STATE_ENV, str(self.path)

    def record(self, task: str, pid: int) -> None:
        """Note a started task process (its supervisor, the leader of its group)."""
        doc = {"task": task, "pid": pid, "start": start_time(pid)}
        tmp = self._tasks / f".{pid}.tmp"
        tmp.write_bytes(orjson.dumps(doc))
        tmp.replace(self._tasks / str(pid))

    def forget(self, pid: int) -> None:
        """The task process has ended (and been reaped)."""
        (self._tasks / str(pid)).unlink(missing_ok=True)

    def kill_leftovers(self, timeout: float = 5.0) -> list[int]:
        """SIGKILL every process a previous run left behind; returns their pids once
        they are gone (or after ``timeout`` seconds, logging the survivors)."""
        groups: dict[int, str] = {}
        for path in self._tasks.iterdir():
            try:
                doc = orjson.loads(path.read_bytes())
                if doc["start"] is not None and start_time(doc["pid"]) == doc["start"]:
                    groups[int(doc["pid"])] = str(doc["task"])
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("agent state %s: ignoring unreadable record %s", self.path, path)
        marker = f"{STATE_ENV}={self.path}".encode()
        me = os.getpid()
        victims = [pid for pid in process_ids() if pid != me and (
            process_group(pid) in groups or marker in environment(pid))]
        for pgid, task in groups.items():
            log.warning("killing task %s (process group %d) left by a previous run", task, pgid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if victims:
            log.warning("killed %d task process(es) left by a previous run: %s", len(victims),
                        ", ".join(map(str, victims)))
        deadline = time.monotonic() + timeout
        while (left := [p for p in victims if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        if left:
            log.error("task processes survived SIGKILL: %s", ", ".join(map(str, left)))
        for path in self._tasks.iterdir():
            path.unlink(missing_ok=True)
        return victims

    def close(self) -> None:
        """Let go of the directory (another agent may use it now)."""
        if not self._lock.closed:
            self._lock.close()

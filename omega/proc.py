"""Child processes that cannot outlive their parent.

The demo and the end-to-end tests start etcd, servers, agents and schedulers as
children. Each is started in its own session (a Ctrl-C in the terminal reaches only
the parent, which stops the children in order) and asks, on Linux, for a parent-death
signal as soon as it starts (``OMEGA_PARENT_PID``, see :func:`die_with_parent`), so
that even a parent killed with SIGKILL leaves nothing running.

The request is made by the child itself, not by a ``preexec_fn``: a ``preexec_fn``
makes Python fork instead of vfork, and gRPC >= 1.80 aborts a forked child of a
process with live channels before it can exec (grpc/grpc#43055). Programs that cannot
ask themselves (etcd, task commands) run under :mod:`omega.supervisor`
(:func:`supervised`).

Also here: reading processes from ``/proc`` (Linux), which an agent uses to find and
kill what a previous run of it left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1
PARENT_ENV = "OMEGA_PARENT_PID"
SUPERVISOR = Path(__file__).with_name("supervisor.py")


def die_with_parent() -> None:
    """If started by :class:`Child`, get SIGTERM when the parent dies; exit at once if it
    is gone already. Does nothing elsewhere."""
    parent = os.environ.pop(PARENT_ENV, None)  # not for our own children's children
    if not parent or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:
        sys.exit(f"parent process {parent} is gone")


class Child:
    """A started child process with its log file."""

    def __init__(self, name: str, args: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = log_path.open("ab")
        self.popen = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {}), PARENT_ENV: str(os.getpid())},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it has not ended within ``timeout``."""
        self.terminate()
        code = self.wait(timeout)
        if code is None:
            self.kill()
            code = self.popen.wait()
        self._log.close()
        return code

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def seconds_since_exec() -> float | None:
    """How long ago this process started (Linux: its start time in /proc, in clock
    ticks since boot, against CLOCK_BOOTTIME); None where that cannot be read. A
    server announces it with its start-up phases, so a slow restart says where it went
    (docs/reliability.md)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def omega(*args: str) -> list[str]:
    """The command line that runs ``omega ARGS`` with this interpreter."""
    return [sys.executable, "-m", "omega.cli", *args]


def supervised(command: Sequence[str], *, grace: float = 5.0,
               cleanup: str | os.PathLike[str] | None = None,
               confine: Sequence[str] = ()) -> list[str]:
    """The command line that runs ``command`` under :mod:`omega.supervisor`, bound to
    this process: it ends when this process dies, even by SIGKILL (SIGTERM, then SIGKILL
    after ``grace`` seconds), and ``cleanup`` is removed then. Start it in a session of
    its own so that signals reach whatever the command starts. ``confine``: the
    supervisor's ``--user``/``--rlimit``/``--cgroup`` flags (omega/task_sandbox.py)."""
    head = [sys.executable, "-I", "-S", str(SUPERVISOR), "--parent", str(os.getpid()),
            "--grace", f"{grace:g}", *confine]
    if cleanup is not None:
        head += ["--cleanup", os.fspath(cleanup)]
    return [*head, "--", *command]


# -- processes, as /proc shows them (Linux) ----------------------------------------------


def process_ids() -> list[int]:
    """Every process id this system shows (empty where there is no /proc)."""
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def _stat_fields(pid: int, stat: Path | None = None) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` (or of ``stat``, a thread's) after the command
    name; None if the process is gone."""
    try:
        text = (stat or Path(f"/proc/{pid}/stat")).read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    return text[text.rfind(")") + 2:].split()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, an identity a
    reused pid does not share. None if there is no such process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def all_threads_stopped(pid: int) -> bool:
    """Every thread of the process is stopped (SIGSTOP lands thread by thread); also
    True once it is gone."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = _stat_fields(pid, stat)
        if fields is not None and fields[0] != "T":
            return False
    return True


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (empty where there is no /proc)."""
    found = []
    for child in process_ids():
        fields = _stat_fields(child)
        if fields is not None and fields[1] == str(pid) and fields[0] not in ("Z", "X"):
            found.append(child)
    return found


def process_group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields is not None else None


def environment(pid: int) -> list[bytes]:
    """The process's environment entries (``NAME=value``); empty if unreadable."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []

"""Run a command so that it cannot outlive the process that started it.

    python -I -S supervisor.py --parent PID [--grace S] [--cleanup DIR]
        [--user UID:GID] [--rlimit NAME=VALUE]... [--cgroup DIR] -- COMMAND [ARG...]

A node agent runs each command task under this supervisor, and the demo runs its etcd
under it. The supervisor (S) starts COMMAND (C) as its child and waits for it:

* **C ends**: S ends the same way (the same exit code, or killed by the same signal),
  so its parent sees what it would have seen from C itself.
* **SIGTERM or SIGINT from anyone else**: forwarded to S's process group when S leads
  one (its parent started it in a session of its own, so this reaches whatever C
  started too), else to C.
* **The parent dies** (even by SIGKILL): S asks the kernel for SIGHUP on its parent's
  death (``PR_SET_PDEATHSIG``) and also checks ``getppid()`` every second, which also
  covers a parent that died before S could ask. It then sends SIGTERM as above, waits
  up to ``--grace`` seconds for C, SIGKILLs it if needed, removes ``--cleanup`` (the
  demo's data folder), and SIGKILLs its whole process group, itself last.
* **S itself is SIGKILLed**: C gets SIGKILL from the kernel (C asks for it before it
  executes COMMAND), though not what C started; an agent that restarts with the same
  state directory kills those (:func:`omega.proc.kill_leftovers`).

**Confinement** (a node agent's command tasks, docs/security.md): before C executes
COMMAND it applies each ``--rlimit`` (soft and hard: ``cpu`` seconds, ``as`` bytes of
address space, ``nofile``, ``nproc``, ``fsize`` bytes, ``core`` bytes), joins the
cgroup v2 directory ``--cgroup`` (written to its ``cgroup.procs``; the agent made it
and wrote its limits), and with ``--user`` drops every group and becomes that user
and group, so COMMAND cannot raise the limits again or act as the agent's user. If
any of that fails, COMMAND does not run (exit code 126, the reason on stderr). S
itself keeps the agent's user, so it can still signal and stop C.

Why a process of its own: a program cannot ask for a parent-death signal on behalf of
another (etcd is a Go binary, task commands are anyone's), ``preexec_fn`` is out of the
question in processes with gRPC channels (see :mod:`omega.proc`), and the signal is
tied to the *thread* that started the child, which S's ``getppid()`` check makes
harmless: a signal that arrives while the parent process still lives is ignored.

This file imports nothing but the standard library and is run as a file with ``-I -S``
(no PYTHONPATH, no site-packages: a task's environment cannot break it, and it starts
in a few tens of milliseconds). The fork below happens in this small single-threaded
process, never in the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
_PARENT_DIED = signal.SIGHUP
_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, _PARENT_DIED}
_CHECK_EVERY = 1.0  # seconds between getppid() checks


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel (Linux) to send ``sig`` when the parent thread exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig)) == 0)
    except (OSError, AttributeError):
        return False


# --rlimit names -> resource.RLIMIT_* names (looked up only when one is given).
RLIMITS = {"cpu": "RLIMIT_CPU", "as": "RLIMIT_AS", "nofile": "RLIMIT_NOFILE",
           "nproc": "RLIMIT_NPROC", "fsize": "RLIMIT_FSIZE", "core": "RLIMIT_CORE"}


class Confinement:
    """What the command runs under: ``user`` (uid, gid) or None (this process's),
    ``rlimits`` (name, value), ``cgroup`` (a cgroup v2 directory) or None."""

    def __init__(self, user: tuple[int, int] | None = None,
                 rlimits: list[tuple[str, int]] | None = None,
                 cgroup: str | None = None) -> None:
        self.user = user
        self.rlimits = rlimits or []
        self.cgroup = cgroup

    def apply(self) -> None:
        """In the child, before exec: raises OSError when it cannot be applied."""
        # execvp imports `warnings` to search PATH: import it while we may still read
        # the standard library (the task's user may not, e.g. under /root).
        os.get_exec_path()
        if self.rlimits:
            import resource

            for name, value in self.rlimits:
                limit = getattr(resource, RLIMITS[name])
                resource.setrlimit(limit, (value, value))
        if self.cgroup:
            with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if self.user is not None:
            uid, gid = self.user
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)


class _Refused(Exception):
    """The confinement could not be applied: the command must not run."""


def _spawn(command: list[str], confinement: Confinement | None = None) -> int:
    supervisor = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 127
    try:  # the child: never returns
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != supervisor:
            os._exit(1)  # the supervisor died in between
        # A Python process ignores SIGPIPE and SIGXFSZ, and exec keeps ignored signals
        # ignored; the command gets the defaults, and nothing blocked.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if confinement is not None:
            try:
                confinement.apply()
            except (OSError, ValueError) as e:
                raise _Refused(e) from None
        os.execvp(command[0], command)
    except _Refused as e:
        code = 126
        with contextlib.suppress(OSError):
            os.write(2, f"omega supervisor: not running {command[0]!r}: cannot confine it: "
                        f"{e}\n".encode())
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(2, f"omega supervisor: cannot run {command[0]!r}: {e}\n".encode())
    os._exit(code)


class Supervisor:
    def __init__(self, parent: int, grace: float, cleanup: str | None,
                 confinement: Confinement | None = None) -> None:
        self.parent = parent
        self.grace = grace
        self.cleanup = cleanup
        self.confinement = confinement
        self.me = os.getpid()
        self.leader = os.getpgid(0) == self.me
        self.child: int | None = None

    def run(self, command: list[str]) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
        set_parent_death_signal(_PARENT_DIED)
        if os.getppid() != self.parent:
            return self.orphaned()
        self.child = _spawn(command, self.confinement)
        while True:
            info = signal.sigtimedwait(_WATCHED, _CHECK_EVERY)
            status = self._reap()
            if status is not None:
                return self._mirror(status)
            if os.getppid() != self.parent:
                return self.orphaned()
            if info is None or info.si_signo in (signal.SIGCHLD, _PARENT_DIED):
                continue  # (a SIGHUP with the parent alive: the spawning thread ended)
            if info.si_pid != self.me:  # not our own forwarded signal coming back
                self._forward(info.si_signo)

    def _reap(self) -> int | None:
        assert self.child is not None
        try:
            pid, status = os.waitpid(self.child, os.WNOHANG)
        except ChildProcessError:
            return 0
        return status if pid else None

    def _forward(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.leader:
                os.killpg(self.me, sig)
            elif self.child is not None:
                os.kill(self.child, sig)

    def _mirror(self, status: int) -> int:
        """End the way the child ended."""
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those take no handler
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(self.me, sig)
            return 128 + sig  # a signal whose default is not to end the process
        return os.waitstatus_to_exitcode(status)

    def orphaned(self) -> int:
        """The parent is gone: stop the child, clean up, leave nothing behind."""
        if self.child is not None:
            self._forward(signal.SIGTERM)
            deadline = time.monotonic() + self.grace
            while self._reap() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.child, signal.SIGKILL)
                    os.waitpid(self.child, 0)
                    break
                signal.sigtimedwait({signal.SIGCHLD}, min(left, 0.1))
        if self.cleanup:
            import shutil  # only now: every task start pays for what is imported up top

            shutil.rmtree(self.cleanup, ignore_errors=True)
        if self.leader:  # whatever the command started and left behind, then ourselves
            os.killpg(self.me, signal.SIGKILL)
        return 1


USAGE = ("usage: supervisor.py --parent PID [--grace SECONDS] [--cleanup DIR] "
         "[--user UID:GID] [--rlimit NAME=VALUE]... [--cgroup DIR] -- COMMAND [ARG...]")
_OPTIONS = ("--parent", "--grace", "--cleanup", "--user", "--cgroup")


def parse(argv: list[str]) -> tuple[int, float, str | None, list[str]]:
    """(parent, grace, cleanup, command); raises ValueError saying what is wrong. (No
    argparse: importing it would double the start-up time of every task.)"""
    parent, grace, cleanup, _, command = parse_all(argv)
    return parent, grace, cleanup, command


def parse_all(argv: list[str]) -> tuple[int, float, str | None, Confinement, list[str]]:
    """:func:`parse` and the confinement flags."""
    options: dict[str, str] = {}
    rlimits: list[tuple[str, int]] = []
    rest = list(argv)
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if flag not in (*_OPTIONS, "--rlimit") or not rest:
            raise ValueError(f"unknown option or missing value: {flag!r}")
        value = rest.pop(0)
        if flag == "--rlimit":
            rlimits.append(_rlimit(value))
        else:
            options[flag] = value
    command = rest[1:]
    if "--parent" not in options:
        raise ValueError("--parent PID is required")
    if not command:
        raise ValueError("no command given (after --)")
    try:
        parent, grace = int(options["--parent"]), float(options.get("--grace", "5"))
    except ValueError:
        raise ValueError(f"--parent must be a pid and --grace seconds: {options}") from None
    user = None
    if "--user" in options:
        uid, sep, gid = options["--user"].partition(":")
        if not (sep and uid.isdigit() and gid.isdigit()):
            raise ValueError(f"--user must be UID:GID, not {options['--user']!r}")
        user = (int(uid), int(gid))
    confinement = Confinement(user, rlimits, options.get("--cgroup"))
    return parent, grace, options.get("--cleanup"), confinement, command


def _rlimit(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or name not in RLIMITS or not value.isdigit():
        raise ValueError(f"--rlimit must be NAME=VALUE with NAME one of "
                         f"{', '.join(RLIMITS)} and VALUE a whole number, not {text!r}")
    return name, int(value)


def main(argv: list[str] | None = None) -> int:
    try:
        parent, grace, cleanup, confinement, command = parse_all(
            sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"omega supervisor: {e}\n{USAGE}", file=sys.stderr)
        return 2
    return Supervisor(parent, grace, cleanup, confinement).run(command)


if __name__ == "__main__":
    sys.exit(main())

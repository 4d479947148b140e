"""The node agent: registers machines, runs the tasks placed on them, reports how they end.

One agent process stands for any number of machines (a block of a cell spec, see
:mod:`omega.cellspec`). It talks to the cell through two narrow doors:

* an :class:`AgentBackend` for its writes: register its machines under a lease, keep
  the lease alive, report a task's outcome (:class:`DirectBackend` goes straight to a
  :class:`~cellstate.store.CellStore`; the gRPC client offers the same protocol);
* a :class:`SnapshotSource` for its reads: a synced copy of the cell (a
  :class:`~cellstate.replica.Replica`, local or over the sync stream).

What it does, each :meth:`Agent.step`::

    leftovers  (first step only) kill every task process a previous run of the agent
               left behind (:mod:`omega.agent_state`), before the cell hears from it
    lease      register (again, if the lease was lost); keep the lease alive (ttl / 3;
               :meth:`Agent.run` does this from a thread of its own instead, so that
               nothing the loop waits for can let the lease lapse)
    follow     for each of its machines that changed: start every task whose effective
               state is RUNNING there and that it does not run yet; stop every run whose
               task is not RUNNING there any more (preempted, lost, moved) - not reported.
               Tasks are started only from a copy of the cell at least as new as the
               agent's registration: an older copy may show tasks that were lost and
               placed elsewhere while the agent was away
    watch      a timer task ends at start + the job's duration; a command task ends when
               its process exits (0: FINISHED, else FAILED); a task with neither runs
               until it is stopped (a service); a MapReduce job's worker ends when the
               job's work is done (below)
    report     send each outcome; one that fails is retried with backoff until it is
               sent, or until the task is no longer RUNNING here (then it is moot)
    reap       processes being stopped get SIGTERM, then SIGKILL after the grace period

A MapReduce job runs by the linear speedup model (``cellstate/mapreduce.py``): the
agent follows how many workers each MapReduce job of the cell runs (all of the cell's,
from its copy, not only those on its machines) and integrates the work they do, so
workers added or evicted anywhere move the finish of its own workers. When the work
is done (or any agent reports one of the job's workers finished: all end together)
each of its workers here ends FINISHED. An agent that starts while a job runs counts
that job's work from its own start (it cannot know what was done before).

A task of a job that a user killed is stopped and reported FAILED, which frees its
resources (the store has no other path that releases a killed job's running tasks;
if one releases it first, the report is moot and dropped).

The clock is injected and :meth:`Agent.step` never sleeps, so tests and the simulator
drive an agent on virtual time; :meth:`Agent.run` is the loop for a real process.
Commands run under :mod:`omega.supervisor` in their own session (process group), so
stopping a task also stops whatever it spawned, and they die with the agent even when
it is killed with SIGKILL; :meth:`Agent.stop` always ends every process it started.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

import attrs

from cellstate.cell import CellSnapshot, alloc_placed, task_view
from cellstate.keys import KeyKind
from cellstate.kv.base import LeaseNotFoundError
from cellstate.mapreduce import Tracker
from cellstate.model import (
    MAX_DETAIL,
    JobState,
    Machine,
    TaskResult,
    TaskState,
    check_name,
    printable,
    split_task_id,
    task_id,
)
from cellstate.replica import ChangeListener
from cellstate.store import CellStore, ContentionError, StoreError
from omega.agent_state import AgentState
from omega.command_policy import CommandPolicy
from omega.proc import supervised
from omega.task_sandbox import TaskSandbox, remove_cgroup

log = logging.getLogger(__name__)

# Retry delays (seconds, doubling per failure up to the cap) for reports and
# registrations that failed because the cell state could not be reached.
_RETRY_BASE = 0.5
_RETRY_CAP = 30.0
# How long run() waits at most between steps, so a set stop event is seen promptly.
_MAX_IDLE = 0.25


# -- the doors -------------------------------------------------------------------------


class AgentBackend(Protocol):
    """Where an agent's writes go. Implementations: :class:`DirectBackend` (a store in
    this process) and the gRPC client (``cellstate.api.client``)."""

    def register_agent(self, agent: str, machines: Sequence[Machine], ttl: int,
                       ) -> tuple[int, int]:
        """Announce ``agent`` under a new lease of ``ttl`` seconds and register its
        machines: new ones are added, known ones are brought back up and adopted (see
        :meth:`CellStore.register_agent`). Returns (lease id, the revision of the
        registration). Raises on failure (nothing, or only the agent's key, was
        written); the agent retries later."""

    def keep_alive(self, lease: int) -> bool:
        """Refresh the lease once. True: it is alive for another ttl. False: it is gone
        (lapsed or revoked), so the agent must register again. Raises when the backend
        cannot tell (unavailable); the agent tries again soon."""

    def report_task(self, task: str, outcome: TaskState, agent: str, machine: str,
                    result: TaskResult | None = None) -> None:
        """Record that ``task``, running on ``machine`` of ``agent``, ended with
        ``outcome`` (FINISHED or FAILED; ``result``: its exit code and times), freeing
        its resources. Returns when the
        outcome is recorded, and also when the report is moot (the task is not running
        on that machine any more: preempted, lost, released by someone else), which the
        backend logs. Raises when it could not tell (e.g. the cell state is
        unavailable); the agent retries the same report later, so it must be safe to
        repeat."""


@runtime_checkable
class DeregisteringBackend(Protocol):
    """Optional: a backend that can let an agent go at once (``Agent.stop(deregister=True)``)."""

    def deregister_agent(self, agent: str, lease: int) -> None:
        """Revoke the agent's lease and take its machines down now (their tasks are
        lost and go back to their schedulers), instead of after the lease lapses."""


class SnapshotSource(Protocol):
    """A synced copy of the cell, as :class:`~cellstate.replica.Replica` offers."""

    def snapshot(self) -> CellSnapshot: ...

    def on_changes(self, listener: ChangeListener) -> None:
        """Call ``listener(snapshot, changed)`` after each applied batch; ``changed``
        lists (kind, id) of changed records, or is None after a reload."""


# -- running commands ------------------------------------------------------------------


@attrs.frozen
class TaskLaunch:
    """What a runner needs to start one task's command."""

    task: str
    machine: str
    agent: str
    command: tuple[str, ...]


class TaskProcess(Protocol):
    """A started command (:class:`subprocess.Popen`-like)."""

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM); harmless if it has exited."""

    def kill(self) -> None:
        """Stop it now (SIGKILL); harmless if it has exited."""

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds (real time) for it to exit; its exit code,
        or None if it still runs."""


class Runner(Protocol):
    def start(self, launch: TaskLaunch) -> TaskProcess:
        """Start the command; raises OSError if it cannot be started."""


@attrs.frozen
class SubprocessRunner:
    """Runs commands as subprocesses: no shell, stdin closed, each under
    :mod:`omega.supervisor` in its own session (process group), so that stopping it
    stops its children too and the agent's death (even by SIGKILL) ends it.

    ``workdir``: where relative command paths are found, and the working directory of
    every command without a ``sandbox`` root (None: the agent's).
    ``sandbox``: the user, directory and limits each command runs with
    (:mod:`omega.task_sandbox`; the default confines nothing but core dumps).
    ``log_dir``: stdout and stderr of task ``JOB/INDEX`` are appended to
    ``log_dir/JOB/INDEX.log``; None sends them to /dev/null.
    ``env``: variables added to the agent's environment. Every command also gets
    ``OMEGA_TASK``, ``OMEGA_MACHINE`` and ``OMEGA_AGENT``.
    ``state``: the agent's state directory, which records every process started (and
    marks it, see :mod:`omega.agent_state`), so the next run of the agent can kill
    what this one leaves. ``grace``: seconds a task gets between SIGTERM and SIGKILL
    when the agent dies."""

    workdir: Path | None = None
    log_dir: Path | None = None
    env: Mapping[str, str] = attrs.field(factory=dict)
    state: AgentState | None = None
    grace: float = 5.0
    sandbox: TaskSandbox = attrs.field(factory=TaskSandbox)

    def start(self, launch: TaskLaunch) -> TaskProcess:
        env = {**os.environ, **self.env, "OMEGA_TASK": launch.task,
               "OMEGA_MACHINE": launch.machine, "OMEGA_AGENT": launch.agent}
        if self.state is not None:
            name, value = self.state.marker
            env[name] = value
        # The supervisor starts either way; a command it cannot run should fail here,
        # at once, as it did when it was started directly.
        _check_executable(launch.command[0], env.get("PATH", os.defpath), self.workdir)
        command = list(launch.command)
        if os.sep in command[0] and not os.path.isabs(command[0]) and self.workdir:
            command[0] = str(self.workdir / command[0])  # found where it was, run elsewhere
        job, index = split_task_id(launch.task)
        task_dir = self.sandbox.task_dir(job, index)
        env.update(self.sandbox.env(task_dir))
        cgroup = self.sandbox.task_cgroup(job, index)
        out = self._open_log(launch.task)
        try:
            popen = subprocess.Popen(
                supervised(command, grace=self.grace,
                           confine=self.sandbox.supervisor_flags(cgroup)),
                cwd=task_dir or self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=out if out is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except BaseException:
            if out is not None:
                out.close()
            remove_cgroup(cgroup)
            raise
        state = self.state

        def ended() -> None:
            if state is not None:
                state.forget(popen.pid)
            remove_cgroup(cgroup)

        if state is not None:
            state.record(launch.task, popen.pid)
        return ChildProcess(popen, out, supervised=True, on_exit=ended)

    def _open_log(self, task: str) -> IO[bytes] | None:
        if self.log_dir is None:
            return None
        job, index = split_task_id(task)
        path = self.log_dir / job / f"{index}.log"
        # The agent's alone: a task's output is its submitter's, and other tasks run
        # as a user who could otherwise read it (docs/security.md).
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)  # a folder left by an older agent, or made by umask
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab")


def _check_executable(name: str, path: str, cwd: Path | None) -> None:
    """Raise FileNotFoundError unless ``name`` is an executable file (found on ``path``
    when it has no slash, else relative to ``cwd``)."""
    if os.sep in name:
        full = name if os.path.isabs(name) or cwd is None else os.path.join(cwd, name)
        found = os.path.isfile(full) and os.access(full, os.X_OK)
    else:
        found = shutil.which(name, path=path) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, "no such executable", name)


class ChildProcess:
    """A subprocess in its own process group, with the log file it writes to.

    ``supervised``: the process is :mod:`omega.supervisor`, which forwards SIGTERM to
    the group itself (signalling the group too would deliver it twice). ``on_exit`` is
    called once the process has ended and been reaped."""

    def __init__(self, popen: subprocess.Popen[bytes], log_file: IO[bytes] | None, *,
                 supervised: bool = False, on_exit: Callable[[], None] | None = None,
                 ) -> None:
        self.popen = popen
        self._log = log_file
        self._supervised = supervised
        self._on_exit = on_exit

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        code = self.popen.poll()
        if code is not None:
            self._close_log()
        return code

    def terminate(self) -> None:
        self._signal(signal.SIGTERM, group=not self._supervised)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._close_log()
        return code

    def _signal(self, sig: signal.Signals, group: bool = True) -> None:
        if self.popen.returncode is not None:
            return  # reaped: its pid (and group id) may belong to someone else now
        with contextlib.suppress(ProcessLookupError):  # the whole group has exited
            if group:
                os.killpg(self.popen.pid, sig)
            else:
                os.kill(self.popen.pid, sig)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._on_exit is not None:
            on_exit, self._on_exit = self._on_exit, None
            on_exit()


# -- the direct backend ----------------------------------------------------------------


class DirectBackend:
    """:class:`AgentBackend` over a :class:`CellStore` in this process (tests, the
    simulator, an agent with etcd access). ``clock`` stamps registrations (wall time)."""

    def __init__(self, store: CellStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock
        self._machines: dict[str, tuple[str, ...]] = {}  # agent -> machine ids registered

    def register_agent(self, agent: str, machines: Sequence[Machine], ttl: int,
                       ) -> tuple[int, int]:
        lease, revision = self.store.register_agent(agent, machines, ttl, self._clock())
        self._machines[agent] = tuple(m.id for m in machines)
        return lease, revision

    def keep_alive(self, lease: int) -> bool:
        try:
            self.store.kv.lease_keepalive(lease)
        except LeaseNotFoundError:
            return False
        return True  # any other KVError propagates: we cannot tell

    def report_task(self, task: str, outcome: TaskState, agent: str, machine: str,
                    result: TaskResult | None = None) -> None:
        try:
            # With the machine named, a late report cannot end the task's next run
            # elsewhere: the store refuses it in the same guarded write.
            self.store.release_task(task, outcome, machine, result)
        except ContentionError:
            raise  # busy, not moot: the agent retries
        except StoreError as e:
            log.info("agent %s: report of %s as %s is moot: %s", agent, task, outcome.value, e)

    def deregister_agent(self, agent: str, lease: int) -> None:
        with contextlib.suppress(LeaseNotFoundError):  # lapsed already
            self.store.kv.lease_revoke(lease)
        for mid in self._machines.pop(agent, ()):
            self.store.machine_lost(mid)


# -- the agent -------------------------------------------------------------------------


@attrs.define(eq=False)
class _Run:
    """One start of one task on one of our machines."""

    task: str
    job: str
    machine: str
    started_at: float
    kind: str  # "timer", "command", "service" or "mapreduce"
    deadline: float | None = None  # timers
    process: TaskProcess | None = None  # commands
    outcome: TaskState | None = None  # set when it ended on its own (or its job was killed)
    ended_at: float | None = None
    exit_code: int | None = None  # commands
    detail: str = ""  # why a command did not start
    reported: bool = False
    report_failures: int = 0
    next_report: float = 0.0


@attrs.frozen
class TaskRun:
    """A read-only view of a task the agent runs or ran (and still remembers)."""

    task: str
    machine: str
    kind: str  # "timer", "command", "service" or "mapreduce"
    started_at: float
    outcome: TaskState | None  # None while it runs
    ended_at: float | None
    reported: bool


@attrs.define
class AgentStats:
    started: int = 0  # task runs started
    finished: int = 0  # ended on their own with success
    failed: int = 0  # ended with a non-zero exit, could not start, or their job was killed
    stopped: int = 0  # stopped because the task stopped running here
    reports: int = 0  # outcomes sent (including moot ones the backend dropped)
    report_errors: int = 0  # report attempts that failed and were retried
    registrations: int = 0
    lease_losses: int = 0  # keep-alives that found the lease gone
    refused: int = 0  # commands the agent's command policy did not allow (also failed)


@attrs.define(eq=False)
class _Dying:
    process: TaskProcess
    kill_at: float
    killed: bool = False


class Agent:
    """A node agent for ``machines`` (see the module docstring for what a step does).

    ``clock`` is the time source for timers, keep-alives and retries (virtual in
    tests). ``ttl`` is the lease's time to live in seconds. ``runner`` starts command
    tasks (default: :class:`SubprocessRunner` with logs to /dev/null). ``grace`` is the
    time a stopped task's process gets between SIGTERM and SIGKILL; ``poll_interval``
    how often running processes are checked for exit. ``state``: the agent's state
    directory (:mod:`omega.agent_state`); the first step kills what a previous run
    left behind, and :meth:`stop` lets go of it. Give the same one to the runner.

    Drive it with :meth:`step` from one thread (or :meth:`run`); the source's listener
    may be called from another thread. Call :meth:`stop` when done: it ends every
    process the agent started."""

    def __init__(
        self,
        backend: AgentBackend,
        source: SnapshotSource,
        agent_id: str,
        machines: Sequence[Machine],
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl: int = 10,
        runner: Runner | None = None,
        grace: float = 5.0,
        poll_interval: float = 0.1,
        state: AgentState | None = None,
        commands: CommandPolicy | None = None,
        wall_clock: Callable[[], float] = time.time,
        flush_budget: float = 3.0,
    ) -> None:
        check_name(agent_id, "agent id")
        if ttl < 1:
            raise ValueError(f"agent {agent_id}: lease ttl must be at least 1 second, got {ttl}")
        self.agent_id = agent_id
        self._machines = [attrs.evolve(m, agent=agent_id) for m in machines]
        self._ids = frozenset(m.id for m in self._machines)
        self._backend = backend
        self._source = source
        self._clock = clock
        self._wall = wall_clock  # reported times are wall-clock (``clock`` may not be)
        self._ttl = ttl
        self._runner: Runner = runner or SubprocessRunner(state=state, grace=grace)
        # The library runs what its caller trusts; `omega agent` passes a policy that
        # allows nothing unless its operator says so (omega/command_policy.py).
        self._commands = commands if commands is not None else CommandPolicy.allow_all()
        self._state = state
        self._leftovers_killed = state is None
        self._grace = grace
        # How long (real time) stop() goes on sending unsent outcomes: whoever stops the
        # agent (the demo, systemd) kills it after a grace of its own, and a report
        # left unsent costs little (the lease lapses; the task is lost and placed again).
        self._flush_budget = flush_budget
        self._poll = poll_interval
        self.stats = AgentStats()
        self._lock = threading.RLock()  # step() and stop() from different threads
        self._stopped = False
        # Lease state. The renewal thread of run() changes it too, under _lease_lock.
        self._lease_lock = threading.Lock()
        self._lease: int | None = None
        self._registered_at = 0  # the revision of the current registration
        self._renewing = False  # a renewal thread keeps the lease alive
        self._next_lease_work = 0.0  # next keep-alive, or next registration attempt
        self._register_failures = 0
        self._starts_held = False  # tasks were not started: the copy was older than us
        # Task state.
        self._runs: dict[str, _Run] = {}
        self._timers: list[tuple[float, int, _Run]] = []  # heap of (deadline, seq, run)
        # MapReduce jobs: the work of every one running in the cell, and our runs of each.
        self._mapreduce = Tracker()
        self._workers: dict[str, set[_Run]] = {}
        self._seq = 0
        self._unreported: dict[str, _Run] = {}  # runs with an outcome still to send
        self._procs: dict[str, _Run] = {}  # runs whose process may still run
        self._dying: list[_Dying] = []
        # Changes noted by the source's listener (any thread), taken by step().
        self._changes_lock = threading.Lock()
        self._full = True  # reconcile every machine at the first step
        self._changed: list[tuple[KeyKind, str]] = []
        self._wake = threading.Event()
        source.on_changes(self._on_changes)

    # -- reading state -----------------------------------------------------------------

    @property
    def machine_ids(self) -> frozenset[str]:
        return self._ids

    @property
    def lease(self) -> int | None:
        """The lease the agent holds now (None before registering or after losing it)."""
        return self._lease

    def tasks(self) -> dict[str, TaskRun]:
        """The tasks the agent runs, or ran and the cell still shows running here."""
        with self._lock:
            return {tid: TaskRun(r.task, r.machine, r.kind, r.started_at, r.outcome,
                                 r.ended_at, r.reported) for tid, r in self._runs.items()}

    # -- driving -----------------------------------------------------------------------

    def step(self) -> float:
        """Do the work that is due now; returns the seconds until more may be due (new
        snapshots also make work: :meth:`run` wakes up for them)."""
        with self._lock:
            if self._stopped:
                return _MAX_IDLE
            now = self._clock()
            if not self._leftovers_killed:
                self._kill_leftovers()
            self._tend_lease(now)
            self._follow(now)
            self._watch(now)
            self._report(now)
            self._reap(now)
            return max(0.0, self._next_due(now) - now)

    def run(self, stop: threading.Event, *, deregister: bool = False) -> None:
        """Step until ``stop`` is set, then :meth:`stop` (for an agent process). The
        lease is renewed from a thread of its own meanwhile: a step may wait (on a
        report to a hung server, on starting processes) longer than a lease lives."""
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(done,), daemon=True,
                                   name=f"agent-{self.agent_id}-lease")
        self._renewing = True
        renewer.start()
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    delay = self.step()
                except Exception:  # a bug must not leave the machines' tasks unmanaged
                    log.exception("agent %s: step failed", self.agent_id)
                    delay = 1.0
                self._wake.wait(min(delay, _MAX_IDLE))
        finally:
            done.set()
            renewer.join(timeout=10)
            self._renewing = False
            self.stop(deregister=deregister)

    def stop(self, *, deregister: bool = False) -> None:
        """End every process the agent started (SIGTERM, SIGKILL after the grace
        period, in real time), send outcomes still unsent (once), and stop. The lease is
        left to lapse, which takes the machines down, unless ``deregister`` and the
        backend can let go at once (:class:`DeregisteringBackend`)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._end_processes()
            self._flush_reports()
            if deregister:
                self._deregister()
            self._runs.clear()
            self._timers.clear()
            self._workers.clear()
            self._procs.clear()
            if self._state is not None:
                self._state.close()

    def _kill_leftovers(self) -> None:
        assert self._state is not None
        killed = self._state.kill_leftovers()
        if killed:
            log.warning("agent %s: killed %d task process(es) a previous run left behind",
                        self.agent_id, len(killed))
        self._leftovers_killed = True

    # -- the lease ---------------------------------------------------------------------

    def _tend_lease(self, now: float) -> None:
        if now < self._next_lease_work:
            return
        if self._renewing:
            with self._lease_lock:
                if self._lease is not None:
                    # The renewal thread keeps this lease alive, and if it is lost sets
                    # this back to 0 and wakes the loop. Left in the past, the lease work
                    # was due at every step, so run() never slept: each agent process
                    # spun, a third of a core or more.
                    self._next_lease_work = now + self._ttl / 3
                    return
        elif self._lease is not None and self._keep_alive(now):
            return
        self._register(now)

    def _keep_alive(self, now: float) -> bool:
        """Refresh the lease; False if it is gone (register again)."""
        lease = self._lease
        assert lease is not None
        alive = self._renew_once(lease)
        if alive is None:
            self._next_lease_work = now + min(1.0, self._ttl / 6)
            return True
        if alive:
            self._next_lease_work = now + self._ttl / 3
            return True
        return False

    def _renew_once(self, lease: int) -> bool | None:
        """One keep-alive: True if renewed, False if the lease is gone (then it is
        dropped, so the loop registers again), None if the backend could not tell."""
        try:
            alive = self._backend.keep_alive(lease)
        except Exception as e:
            log.warning("agent %s: keep-alive failed (%s); retrying", self.agent_id, e)
            return None
        if alive:
            return True
        with self._lease_lock:
            if self._lease != lease:
                return False  # replaced meanwhile
            log.warning("agent %s: lease %x is gone; registering again", self.agent_id, lease)
            self.stats.lease_losses += 1
            self._lease = None
            self._next_lease_work = 0.0
        return False

    def _renew(self, done: threading.Event) -> None:
        """The renewal thread of :meth:`run`: every ttl / 3, sooner after a failure.
        Each keep-alive is bounded by the backend's short deadlines (the gRPC client
        tries every server in turn), so one hung server never stops renewal."""
        delay = self._ttl / 3
        while not done.wait(delay):
            lease = self._lease
            if lease is None:
                delay = min(_MAX_IDLE, self._ttl / 6)
                continue
            alive = self._renew_once(lease)
            if alive is None:
                delay = min(1.0, self._ttl / 6)
            elif alive:
                delay = self._ttl / 3
            else:
                self._wake.set()  # the loop registers again
                delay = min(_MAX_IDLE, self._ttl / 6)

    def _register(self, now: float) -> None:
        try:
            lease, revision = self._backend.register_agent(self.agent_id, self._machines,
                                                           self._ttl)
            with self._lease_lock:
                self._lease, self._registered_at = lease, revision
        except Exception as e:
            self._register_failures += 1
            delay = _backoff(self._register_failures)
            log.warning("agent %s: registering %d machines failed (%s); retrying in %.1f s",
                        self.agent_id, len(self._machines), e, delay)
            self._next_lease_work = now + delay
            return
        self._register_failures = 0
        self.stats.registrations += 1
        self._next_lease_work = now + self._ttl / 3
        log.info("agent %s: registered %d machines (lease %x, revision %d)", self.agent_id,
                 len(self._machines), lease, revision)

    def _deregister(self) -> None:
        if self._lease is None:
            return
        if not isinstance(self._backend, DeregisteringBackend):
            log.info("agent %s: the backend cannot deregister; the lease will lapse",
                     self.agent_id)
            return
        try:
            self._backend.deregister_agent(self.agent_id, self._lease)
        except Exception as e:
            log.warning("agent %s: deregistering failed (%s); the lease will lapse",
                        self.agent_id, e)
        self._lease = None

    # -- following the cell -------------------------------------------------------------

    def _on_changes(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        with self._changes_lock:
            if changed is None:
                self._full = True
            else:
                self._changed.extend(changed)
        self._wake.set()

    def _follow(self, now: float) -> None:
        with self._changes_lock:
            full, self._full = self._full, False
            changed, self._changed = self._changed, []
        snap = self._source.snapshot()
        may_start = self._lease is not None and snap.revision >= self._registered_at
        if may_start and self._starts_held:
            full, self._starts_held = True, False  # start what was held back
        if not full and not changed:
            return
        if not may_start:
            # Stop what is not running here any more, but start nothing: this copy of the
            # cell predates our registration (or we hold no lease), so a task it shows
            # running here may have been lost and placed elsewhere meanwhile.
            self._starts_held = True
        machines = self._ids if full else self._touched(snap, changed)
        by_machine: dict[str, list[_Run]] = {}
        for r in self._runs.values():
            by_machine.setdefault(r.machine, []).append(r)
        for mid in sorted(machines):
            self._reconcile(snap, mid, by_machine.get(mid, []), now, may_start)
        self._follow_mapreduce(snap, None if full else changed, now)

    def _touched(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]]) -> set[str]:
        """Our machines whose tasks may have changed state."""
        out: set[str] = set()
        for kind, ident in changed:
            if kind is KeyKind.MACHINE:
                out.add(ident)
            elif kind is KeyKind.TASK:
                rec = snap.tasks.get(ident)
                run = self._runs.get(ident)
                out.update(m for m in (rec.machine if rec else "", run.machine if run else "")
                           if m)
            elif kind is KeyKind.GANG:
                # A gang's commit point flips its tasks to running without touching
                # their machines' keys; rare enough to look at every machine.
                return set(self._ids)
            elif kind is KeyKind.STATUS:
                out.update(r.machine for r in self._runs.values() if r.job == ident)
        return out & self._ids

    def _reconcile(self, snap: CellSnapshot, mid: str, runs: list[_Run], now: float,
                   may_start: bool = True) -> None:
        running, killed = self._running_here(snap, mid)
        for r in runs:
            if self._runs.get(r.task) is not r:
                continue  # replaced while reconciling another machine
            if r.task in killed:
                self._kill_for_job(r, now)
            elif r.task not in running:
                self._drop(r, now)
        if not may_start:
            return
        for tid in running:
            current = self._runs.get(tid)
            if current is not None and current.machine == mid:
                continue
            if current is not None:
                self._drop(current, now)  # it moved here from another of our machines
            self._start(snap, tid, mid, now)
        for tid in killed:
            if tid not in self._runs:
                # Never started here, but it holds the machine: release it.
                self._start_ended(tid, mid, TaskState.FAILED, now)

    def _running_here(self, snap: CellSnapshot, mid: str) -> tuple[list[str], list[str]]:
        """The tasks the cell shows running on our machine ``mid``, split into those to
        run and those whose job was killed."""
        m = snap.machines.get(mid)
        if m is None or m.agent != self.agent_id:
            return [], []  # not (yet, or any more) ours to run
        running: list[str] = []
        killed: list[str] = []
        for tid, a in m.allocations.items():
            if not alloc_placed(a, snap.gangs):
                continue
            view = task_view(snap, tid)
            if view.state is not TaskState.RUNNING or view.machine != mid:
                continue
            status = snap.statuses.get(a.job)
            if status is not None and status.state is JobState.KILLED:
                killed.append(tid)
            else:
                running.append(tid)
        return sorted(running), sorted(killed)

    # -- MapReduce jobs ---------------------------------------------------------------------

    def _follow_mapreduce(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None,
                          now: float) -> None:
        """Count the workers of every MapReduce job whose tasks changed (of every one,
        after a reload)."""
        if changed is None:
            jobs = {j.id for j in snap.jobs.values() if j.mapreduce is not None}
            jobs.update(self._mapreduce.jobs())
        else:
            jobs = set()
            for kind, ident in changed:
                if kind is KeyKind.TASK:
                    jobs.add(ident.rpartition("/")[0])
                elif kind in (KeyKind.JOB, KeyKind.STATUS):
                    jobs.add(ident)
        for job_id in sorted(jobs):
            self._count_workers(snap, job_id, now)

    def _count_workers(self, snap: CellSnapshot, job_id: str, now: float) -> None:
        """Tell the tracker how many workers the job runs now; end our workers if its
        work is done (by our count, or by another agent's: one of them finished)."""
        job = snap.jobs.get(job_id)
        if job is None or job.mapreduce is None:
            self._mapreduce.forget(job_id)
            return
        running = 0
        finished = False
        for i in range(job.task_count):
            state = task_view(snap, task_id(job_id, i)).state
            running += state is TaskState.RUNNING
            finished = finished or state is TaskState.FINISHED
        self._mapreduce.workers(job_id, job.mapreduce, running, now)
        if not self._mapreduce.tracks(job_id):
            return
        if finished or running == 0:
            # Done, or none left (killed, every worker evicted): nothing to follow.
            done_at = now if finished else None
            self._mapreduce.forget(job_id)
        else:
            done_at = self._mapreduce.done_at(job_id)
        for run in self._workers.get(job_id, ()):
            if done_at is None or run.outcome is not None or run.deadline == done_at:
                continue
            run.deadline = done_at
            self._seq += 1
            heapq.heappush(self._timers, (done_at, self._seq, run))

    # -- starting and stopping runs -------------------------------------------------------

    def _start(self, snap: CellSnapshot, tid: str, mid: str, now: float) -> None:
        job_id = split_task_id(tid)[0]
        job = snap.jobs.get(job_id)
        if job is None:
            log.warning("agent %s: task %s runs on %s but its job is unknown; not started",
                        self.agent_id, tid, mid)
            return
        self.stats.started += 1
        if job.mapreduce is not None:
            run = _Run(tid, job_id, mid, now, "mapreduce")
            self._runs[tid] = run
            self._workers.setdefault(job_id, set()).add(run)
            self._count_workers(snap, job_id, now)
        elif job.command:
            self._start_command(tid, job_id, mid, job.command, now, job.owner)
        elif job.duration is not None:
            run = _Run(tid, job_id, mid, now, "timer", deadline=now + job.duration)
            self._runs[tid] = run
            self._seq += 1
            heapq.heappush(self._timers, (run.deadline or now, self._seq, run))
        else:
            self._runs[tid] = _Run(tid, job_id, mid, now, "service")
        log.debug("agent %s: started %s on %s", self.agent_id, tid, mid)

    def _start_command(
        self, tid: str, job_id: str, mid: str, command: tuple[str, ...], now: float,
        owner: str = "",
    ) -> None:
        run = _Run(tid, job_id, mid, now, "command")
        self._runs[tid] = run
        workdir = getattr(self._runner, "workdir", None)
        refused = self._commands.refusal(owner, command, os.environ.get("PATH", os.defpath),
                                         str(workdir) if workdir is not None else None)
        if refused:
            log.warning("agent %s: task %s: not running %r: %s", self.agent_id, tid,
                        command[0], refused)
            run.detail = f"agent {self.agent_id} did not run {command[0]!r}: {refused}"
            self.stats.refused += 1
            self._ended(run, TaskState.FAILED, now)
            return
        try:
            run.process = self._runner.start(TaskLaunch(tid, mid, self.agent_id, command))
        except OSError as e:
            log.warning("agent %s: task %s: cannot start %r: %s", self.agent_id, tid,
                        command[0], e)
            run.detail = f"cannot start {command[0]!r}: {e}"
            self._ended(run, TaskState.FAILED, now)
            return
        self._procs[tid] = run

    def _forget_worker(self, run: _Run) -> None:
        workers = self._workers.get(run.job)
        if workers is not None:
            workers.discard(run)
            if not workers:
                del self._workers[run.job]

    def _start_ended(self, tid: str, mid: str, outcome: TaskState, now: float) -> None:
        run = _Run(tid, split_task_id(tid)[0], mid, now, "service")
        self._runs[tid] = run
        self._ended(run, outcome, now)

    def _drop(self, run: _Run, now: float) -> None:
        """Forget a run whose task is not running here any more; stop its process."""
        del self._runs[run.task]
        self._forget_worker(run)
        self._unreported.pop(run.task, None)
        if run.outcome is None:
            self.stats.stopped += 1
            log.info("agent %s: stopping %s on %s: it is not running there any more",
                     self.agent_id, run.task, run.machine)
            self._terminate(run, now)

    def _kill_for_job(self, run: _Run, now: float) -> None:
        if run.outcome is not None:
            return
        log.info("agent %s: stopping %s: its job was killed", self.agent_id, run.task)
        self._terminate(run, now)
        self._ended(run, TaskState.FAILED, now)

    def _terminate(self, run: _Run, now: float) -> None:
        if run.process is not None:
            run.process.terminate()
            self._dying.append(_Dying(run.process, now + self._grace))
            run.process = None
            self._procs.pop(run.task, None)

    def _ended(self, run: _Run, outcome: TaskState, now: float) -> None:
        run.outcome = outcome
        run.ended_at = now
        run.next_report = now
        if outcome is TaskState.FINISHED:
            self.stats.finished += 1
        else:
            self.stats.failed += 1
        self._unreported[run.task] = run

    # -- watching runs, reporting, reaping ----------------------------------------------

    def _watch(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            at, _, run = heapq.heappop(self._timers)
            # A MapReduce worker's deadline moves as workers come and go: a superseded
            # entry is skipped.
            if self._runs.get(run.task) is run and run.outcome is None and run.deadline == at:
                self._ended(run, TaskState.FINISHED, now)
        for run in list(self._procs.values()):
            assert run.process is not None
            code = run.process.poll()
            if code is not None:
                run.process = None
                run.exit_code = code
                del self._procs[run.task]
                self._ended(run, TaskState.FINISHED if code == 0 else TaskState.FAILED, now)

    def _report(self, now: float) -> None:
        for run in list(self._unreported.values()):
            if run.next_report <= now:
                self._send(run, now)

    def _send(self, run: _Run, now: float) -> bool:
        assert run.outcome is not None
        # The agent's clock may be monotonic (or virtual): the run's times in wall time.
        offset = self._wall() - now
        result = TaskResult(run.exit_code, max(run.started_at + offset, 0.0),
                            max((run.ended_at or now) + offset, 0.0),
                            printable(run.detail, MAX_DETAIL))
        try:
            self._backend.report_task(run.task, run.outcome, self.agent_id, run.machine,
                                      result)
        except Exception as e:
            run.report_failures += 1
            self.stats.report_errors += 1
            delay = _backoff(run.report_failures)
            run.next_report = now + delay
            log.warning("agent %s: reporting %s as %s failed (%s); retrying in %.1f s",
                        self.agent_id, run.task, run.outcome.value, e, delay)
            return False
        run.reported = True
        self.stats.reports += 1
        del self._unreported[run.task]
        return True

    def _reap(self, now: float) -> None:
        alive = []
        for d in self._dying:
            if d.process.poll() is not None:
                continue
            if not d.killed and now >= d.kill_at:
                d.process.kill()
                d.killed = True
            alive.append(d)
        self._dying = alive

    def _next_due(self, now: float) -> float:
        due = [self._next_lease_work]
        if self._timers:
            due.append(self._timers[0][0])
        due.extend(r.next_report for r in self._unreported.values())
        if self._dying or self._procs:
            due.append(now + self._poll)
        due.extend(d.kill_at for d in self._dying if not d.killed)
        return min(due)

    # -- stopping --------------------------------------------------------------------------

    def _end_processes(self) -> None:
        """Terminate every process, wait up to the grace period (real time), kill the
        rest and wait for them; none is left behind."""
        now = self._clock()
        self._watch(now)  # record what has exited already, so it is reported
        for run in list(self._procs.values()):
            self._terminate(run, now)
        deadline = time.monotonic() + self._grace
        for d in self._dying:
            d.process.terminate()
            d.process.wait(max(0.0, deadline - time.monotonic()))
        for d in self._dying:
            if d.process.poll() is None:
                d.process.kill()
                if d.process.wait(5.0) is None:
                    log.error("agent %s: a task process survived SIGKILL", self.agent_id)
        self._dying = []

    def _flush_reports(self) -> None:
        """Send each unsent outcome once, within the flush budget; the rest are left
        to the lease's lapse (their tasks become lost and are placed again)."""
        now = self._clock()
        deadline = time.monotonic() + self._flush_budget
        left = list(self._unreported.values())
        while left and time.monotonic() < deadline:
            run = left.pop(0)
            if not self._send(run, now):
                log.error("agent %s: outcome of %s (%s) not reported before stopping",
                          self.agent_id, run.task, run.outcome.value if run.outcome else "?")
        if left:
            log.warning("agent %s: stopping after %.0f s of reports; %d outcome(s) not "
                        "reported (their tasks are lost when the lease lapses)",
                        self.agent_id, self._flush_budget, len(left))


def _backoff(failures: int) -> float:
    return float(min(_RETRY_CAP, _RETRY_BASE * 2 ** min(failures - 1, 16)))

"""The node agent over the direct backend, on the memory store and a real etcd: it
registers its machines, runs placed tasks (timers on a virtual clock, real commands),
reports how they end, stops what stops running here, and its machines go down when
its lease lapses."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from cellstate.cell import task_view
from cellstate.kv.base import KV, UnavailableError
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Claim,
    Job,
    JobState,
    JobStatus,
    Machine,
    MachineState,
    Resources,
    TaskResult,
    TaskState,
    control_at,
)
from cellstate.replica import Replica
from cellstate.store import CellStore
from omega.agent import (
    Agent,
    ChildProcess,
    DirectBackend,
    SubprocessRunner,
    TaskLaunch,
    TaskProcess,
)
from omega.cellspec import parse_cell_spec
from schedulers.testing import Clock, job, txn

SPEC = parse_cell_spec("""
[layout]
machines_per_rack = 2
[[types]]
name = "small"
count = 2
capacity = { cpu = 4, mem = 16 }
""")
M1, M2 = "m00001", "m00002"
T0 = 1000.0
PY = sys.executable


class RecordingRunner:
    """Starts real subprocesses and keeps them, so tests can look at them and clean up."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.inner = SubprocessRunner(log_dir=log_dir)
        self.started: dict[str, ChildProcess] = {}

    def start(self, launch: TaskLaunch) -> TaskProcess:
        process = self.inner.start(launch)
        assert isinstance(process, ChildProcess)
        self.started[launch.task] = process
        return process

    def cleanup(self) -> None:
        for p in self.started.values():
            if p.poll() is None:
                p.kill()
                p.wait(5)


class FlakyBackend(DirectBackend):
    """Reports fail (unavailable) while ``failures`` is above zero."""

    failures = 0

    def report_task(self, task: str, outcome: TaskState, agent: str, machine: str,
                    result: TaskResult | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise UnavailableError("cellstate unavailable")
        super().report_task(task, outcome, agent, machine, result)


@attrs.define
class Rig:
    kv: KV
    clock: Callable[[], float]
    store: CellStore
    replica: Replica
    backend: DirectBackend
    agent: Agent
    runner: RecordingRunner

    def sync(self) -> None:
        """Bring the agent's replica up to the store's current revision."""
        target = self.kv.range(b"\x00").revision
        deadline = time.monotonic() + 10
        while self.replica.revision < target:
            assert time.monotonic() < deadline, "replica did not catch up"
            self.replica.request_progress()
            self.replica.pump(timeout=0.05)

    def step(self) -> float:
        self.sync()
        return self.agent.step()

    def until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        """Step in real time until ``done()`` (for real processes)."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(min(self.step(), 0.02))

    def place(self, j: Job, machine: str, index: int = 0, evict: tuple[str, ...] = ()) -> None:
        if j.id not in self.store.read_snapshot().jobs:
            self.store.submit_job(j)
        res = self.store.commit(txn([Claim(j.id, index, machine, evict=evict)]))
        assert res.ok, res.rejected

    def state(self, tid: str) -> TaskState:
        return task_view(self.store.read_snapshot(), tid).state

    def machine(self, mid: str) -> Machine:
        return self.store.read_snapshot().machines[mid]


RigFactory = Callable[..., Rig]


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[RigFactory]:
    """Builds rigs; stops every agent, replica and process afterwards, pass or fail."""
    rigs: list[Rig] = []

    def make(kv: KV, clock: Callable[[], float] | None = None, *,
             backend: type[DirectBackend] = DirectBackend, machines: Sequence[Machine] = (),
             **agent_kw: object) -> Rig:
        clock = clock or Clock(T0)
        store = CellStore(kv)
        replica = Replica(kv, clock=clock)
        replica.load()
        direct = backend(store, clock=clock)
        runner = RecordingRunner(tmp_path / "logs")
        agent = Agent(direct, replica, "a1", machines or SPEC.machines(), clock=clock, ttl=10,
                      runner=runner, **agent_kw)  # type: ignore[arg-type]
        rig = Rig(kv, clock, store, replica, direct, agent, runner)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        try:
            rig.agent.stop()
        finally:
            rig.runner.cleanup()
            rig.replica.stop()


def timed(jid: str, duration: float, **kw: object) -> Job:
    return attrs.evolve(job(jid, **kw), duration=duration)  # type: ignore[arg-type]


def command(jid: str, code: str, **kw: object) -> Job:
    return attrs.evolve(job(jid, **kw), command=(PY, "-c", code))  # type: ignore[arg-type]


# -- registration and timers ---------------------------------------------------------------


def test_registers_its_machines(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    assert rig.agent.step() == pytest.approx(10 / 3)  # the next keep-alive
    snap = rig.store.read_snapshot()
    assert sorted(snap.machines) == [M1, M2]
    m = snap.machines[M1]
    assert (m.state, m.agent, m.rack, m.failure_domain) == (MachineState.UP, "a1", "r001", "fd01")
    assert m.capacity == Resources.of(cpu=4, mem=16) and m.label("type") == "small"
    assert snap.agents["a1"].machines == (M1, M2) and snap.agents["a1"].started_at == T0
    assert rig.agent.lease is not None and rig.agent.stats.registrations == 1


def test_timer_task_runs_for_its_duration_and_frees_the_machine(
        kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    clock = rig.clock
    assert isinstance(clock, Clock)
    rig.step()
    rig.place(timed("j", 30, cpu=3, mem=8), M1)
    assert rig.step() == pytest.approx(10 / 3)  # keep-alive comes before the deadline
    run = rig.agent.tasks()["j/0"]
    assert (run.machine, run.kind, run.started_at, run.outcome) == (M1, "timer", T0, None)

    clock.now = T0 + 29.5
    assert rig.step() == pytest.approx(0.5)
    assert rig.state("j/0") is TaskState.RUNNING
    clock.now = T0 + 30
    rig.step()
    assert rig.state("j/0") is TaskState.FINISHED
    assert rig.machine(M1).allocations == {}
    run = rig.agent.tasks()["j/0"]
    assert (run.outcome, run.ended_at, run.reported) == (TaskState.FINISHED, T0 + 30, True)
    rig.step()  # the snapshot shows it finished: forgotten, not started again
    assert rig.agent.tasks() == {}
    assert attrs.asdict(rig.agent.stats) == {
        "started": 1, "finished": 1, "failed": 0, "stopped": 0, "reports": 1,
        "report_errors": 0, "registrations": 1, "lease_losses": 0, "refused": 0}


def test_report_is_retried_while_the_cell_state_is_unavailable(make_rig: RigFactory) -> None:
    clock = Clock(T0)
    rig = make_rig(MemoryKV(clock=clock), clock, backend=FlakyBackend)
    assert isinstance(rig.backend, FlakyBackend)
    rig.step()
    rig.place(timed("j", 30), M1)
    rig.step()
    rig.backend.failures = 2
    clock.now = T0 + 30
    assert rig.step() == pytest.approx(0.5)  # first retry after 0.5 s
    assert rig.state("j/0") is TaskState.RUNNING
    clock.now = T0 + 30.4
    rig.step()
    assert rig.agent.stats.report_errors == 1
    clock.now = T0 + 30.5
    assert rig.step() == pytest.approx(1.0)  # failed again: backoff doubles
    assert rig.agent.stats.report_errors == 2 and rig.state("j/0") is TaskState.RUNNING
    clock.now = T0 + 31.5
    rig.step()
    assert rig.state("j/0") is TaskState.FINISHED
    assert rig.agent.tasks()["j/0"].ended_at == T0 + 30  # the time it ended, not reported
    assert rig.agent.stats.reports == 1


class SlowBackend(FlakyBackend):
    """Once ``delay`` is set, each report takes that long in real time (a server
    swamped while a demo stops)."""

    delay = 0.0

    def report_task(self, task: str, outcome: TaskState, agent: str, machine: str,
                    result: TaskResult | None = None) -> None:
        time.sleep(self.delay)
        super().report_task(task, outcome, agent, machine, result)


def test_stop_sends_unsent_outcomes_only_within_its_budget(make_rig: RigFactory) -> None:
    """Issue 34: an agent stopping with many outcomes to send went on for longer than
    the demo's 15 s grace and was killed. Now stop() gives up after its budget; what is
    left is lost when the lease lapses, as for an agent that dies."""
    clock = Clock(T0)
    rig = make_rig(MemoryKV(clock=clock), clock, backend=SlowBackend, flush_budget=1.5)
    rig.step()
    for i in range(10):
        rig.place(timed(f"j{i}", 30, cpu=0.1, mem=0.1), M1)
    rig.step()
    assert isinstance(rig.backend, SlowBackend)
    rig.backend.failures = 10
    clock.now = T0 + 30
    rig.step()  # every report fails; every outcome waits for the next try
    assert rig.agent.stats.reports == 0
    rig.backend.delay = 1.0
    started = time.monotonic()
    rig.agent.stop()
    assert time.monotonic() - started < 4.0
    assert 0 < rig.agent.stats.reports < 10


def test_service_task_runs_until_its_job_is_killed(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.place(job("svc", cpu=2), M2)
    rig.step()
    assert rig.agent.tasks()["svc/0"].kind == "service"
    rig.clock.now = T0 + 10_000  # type: ignore[attr-defined]
    rig.step()
    assert rig.state("svc/0") is TaskState.RUNNING
    rig.store.set_job_status(JobStatus("svc", JobState.KILLED, "user asked", by="tester"))
    rig.step()
    # Stopped and reported failed, so the machine's resources are free again.
    assert rig.state("svc/0") is TaskState.FAILED
    assert rig.machine(M2).allocations == {}
    assert (rig.agent.stats.failed, rig.agent.stats.stopped) == (1, 0)


# -- real commands ----------------------------------------------------------------------


def test_commands_report_finished_or_failed(kv: KV, make_rig: RigFactory,
                                            tmp_path: Path) -> None:
    rig = make_rig(kv, time.monotonic)
    rig.step()
    rig.place(command("ok", "import os; print('task', os.environ['OMEGA_TASK'])"), M1)
    rig.place(command("bad", "import sys; sys.exit(3)"), M2)
    rig.until(lambda: rig.agent.stats.reports == 2)
    assert rig.state("ok/0") is TaskState.FINISHED
    assert rig.state("bad/0") is TaskState.FAILED
    assert rig.machine(M1).allocations == {} and rig.machine(M2).allocations == {}
    assert rig.runner.started["bad/0"].poll() == 3
    # The records say how each run ended: the exit code, and when (wall-clock seconds).
    tasks = rig.store.read_snapshot().tasks
    assert (tasks["ok/0"].exit_code, tasks["bad/0"].exit_code) == (0, 3)
    for t in (tasks["ok/0"], tasks["bad/0"]):
        assert time.time() - 60 < t.started_at <= t.ended_at <= time.time()
    assert (tmp_path / "logs" / "ok" / "0.log").read_text() == "task ok/0\n"
    assert (rig.agent.stats.finished, rig.agent.stats.failed) == (1, 1)


def test_command_that_cannot_start_fails(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.place(attrs.evolve(job("nope"), command=("/nonexistent/omega-test-binary",)), M1)
    rig.step()
    assert rig.state("nope/0") is TaskState.FAILED
    assert rig.agent.stats.failed == 1
    # The record says why, for `omega job` (not only the agent's log).
    record = rig.store.read_snapshot().tasks["nope/0"]
    assert record.exit_code is None
    assert record.detail.startswith("cannot start '/nonexistent/omega-test-binary': ")


def test_a_detail_quoting_an_escape_sequence_is_reported_clean(kv: KV, make_rig: RigFactory
                                                               ) -> None:
    """The submitter wrote the command: its path, quoted in the detail, must not put an
    escape sequence on an operator's terminal (the server would refuse the report)."""
    rig = make_rig(kv)
    rig.step()
    rig.place(attrs.evolve(job("esc"), command=("/nonexistent/\x1b[2Jx",)), M1)
    rig.step()
    assert rig.state("esc/0") is TaskState.FAILED
    detail = rig.store.read_snapshot().tasks["esc/0"].detail
    assert detail.startswith("cannot start '/nonexistent/\\x1b[2Jx': ")
    assert control_at(detail) == -1


SLEEP = "import time; time.sleep(60)"
# Ignores SIGTERM, and says so once it does (so the test knows the handler is in place).
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")


def test_preempted_task_is_terminated_and_not_reported(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.place(command("low", SLEEP, cpu=4), M1)
    rig.step()
    process = rig.runner.started["low/0"]
    assert process.poll() is None
    rig.place(timed("high", 5, cpu=4, precedence=10), M1, evict=("low/0",))
    rig.step()
    assert process.wait(5) == -15  # SIGTERM
    assert rig.state("low/0") is TaskState.PREEMPTED  # as the scheduler left it
    assert set(rig.agent.tasks()) == {"high/0"}
    assert (rig.agent.stats.stopped, rig.agent.stats.reports) == (1, 0)
    # Reaped: nothing to poll, so only the keep-alive (before high/0's timer) is due.
    assert rig.step() == pytest.approx(10 / 3)


def _wait_ready(log_file: Path) -> None:
    deadline = time.monotonic() + 10
    while not (log_file.exists() and log_file.read_text() == "ready\n"):
        assert time.monotonic() < deadline, "the stubborn process never got ready"
        time.sleep(0.01)


def test_stubborn_process_is_killed_after_the_grace_period(make_rig: RigFactory,
                                                           tmp_path: Path) -> None:
    clock = Clock(T0)
    rig = make_rig(MemoryKV(clock=clock), clock, grace=3.0)
    rig.step()
    rig.place(command("low", STUBBORN, cpu=4), M1)
    rig.step()
    _wait_ready(tmp_path / "logs" / "low" / "0.log")
    process = rig.runner.started["low/0"]
    rig.place(timed("high", 100, cpu=4, precedence=10), M1, evict=("low/0",))
    rig.step()
    assert process.wait(0.3) is None  # ignored SIGTERM
    clock.now = T0 + 2.9
    rig.step()
    assert process.poll() is None
    clock.now = T0 + 3.0
    rig.step()
    assert process.wait(5) == -9  # SIGKILL once the grace period is over


def test_stop_ends_every_process(kv: KV, make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(kv, grace=0.5)
    rig.step()
    rig.place(command("svc", SLEEP, tasks=2), M1)
    rig.place(command("stub", STUBBORN), M2)
    rig.place(command("svc", SLEEP, tasks=2), M2, index=1)
    rig.step()
    assert sorted(rig.runner.started) == ["stub/0", "svc/0", "svc/1"]
    assert all(p.poll() is None for p in rig.runner.started.values())
    _wait_ready(tmp_path / "logs" / "stub" / "0.log")
    rig.agent.stop()
    codes = {t: p.poll() for t, p in rig.runner.started.items()}
    assert codes == {"svc/0": -15, "svc/1": -15, "stub/0": -9}
    # Nothing reported: the tasks still run as far as the cell knows; the lease lapses.
    assert rig.state("svc/0") is TaskState.RUNNING and rig.agent.stats.reports == 0


# -- losing the lease ----------------------------------------------------------------------


def test_lapsed_lease_takes_machines_down_and_loses_tasks(
        make_rig: RigFactory, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(T0)
    kv = MemoryKV(clock=clock)
    rig = make_rig(kv, clock)
    rig.step()
    rig.place(job("svc", cpu=2), M1)
    rig.place(timed("t", 60), M2)
    rig.step()
    assert set(rig.agent.tasks()) == {"svc/0", "t/0"}

    clock.now = T0 + 9.9  # the agent hangs: no keep-alive since T0
    assert rig.store.machine_lost(M1) is False  # the agent's key is still there
    clock.now = T0 + 10
    kv.expire_leases()
    assert "a1" not in rig.store.read_snapshot().agents
    assert rig.store.machine_lost(M1) and rig.store.machine_lost(M2)
    snap = rig.store.read_snapshot()
    assert [snap.machines[m].state for m in (M1, M2)] == [MachineState.DOWN] * 2
    assert task_view(snap, "svc/0").state is TaskState.LOST  # pending again for its scheduler
    assert task_view(snap, "t/0").state is TaskState.LOST
    assert snap.machines[M1].allocations == {}

    with caplog.at_level(logging.WARNING, logger="omega.agent"):
        rig.step()  # the agent wakes up: its lease is gone, so it registers again
    assert (rig.agent.stats.lease_losses, rig.agent.stats.registrations) == (1, 2)
    # What the operator finds in the agent's log (docs/operations.md, "Logs").
    assert any(re.fullmatch(r"agent a1: lease [0-9a-f]+ is gone; registering again",
                            r.getMessage()) for r in caplog.records), caplog.text
    assert rig.agent.tasks() == {} and rig.agent.stats.stopped == 2
    snap = rig.store.read_snapshot()
    assert snap.machines[M1].state is MachineState.UP and "a1" in snap.agents


def test_keep_alive_holds_the_lease(make_rig: RigFactory) -> None:
    clock = Clock(T0)
    kv = MemoryKV(clock=clock)
    rig = make_rig(kv, clock)
    for _ in range(30):  # 100 virtual seconds in steps of what the agent asks for
        clock.now += rig.step()
    assert clock.now >= T0 + 99
    kv.expire_leases()
    assert rig.store.machine_lost(M1) is False
    assert (rig.agent.stats.registrations, rig.agent.stats.lease_losses) == (1, 0)


def test_deregister_takes_machines_down_at_once(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.place(job("svc"), M1)
    rig.step()
    rig.agent.stop(deregister=True)
    snap = rig.store.read_snapshot()
    assert "a1" not in snap.agents
    assert snap.machines[M1].state is MachineState.DOWN
    assert task_view(snap, "svc/0").state is TaskState.LOST


def test_direct_backend_drops_moot_reports(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.place(timed("j", 10), M2)
    before = rig.store.read_snapshot().revision
    # Wrong machine: never releases the task where it runs now.
    rig.backend.report_task("j/0", TaskState.FINISHED, "a1", M1)
    # Not running at all.
    rig.store.submit_job(timed("k", 10))
    rig.backend.report_task("k/0", TaskState.FINISHED, "a1", M1)
    snap = rig.store.read_snapshot()
    assert snap.revision == before + 1  # only the submit wrote
    assert task_view(snap, "j/0").state is TaskState.RUNNING


# -- the loop of an agent process ---------------------------------------------------------


def test_run_loop_follows_a_syncing_replica(kv: KV) -> None:
    """Real time, real threads: the replica syncs in its thread and wakes the loop."""
    store = CellStore(kv)
    with Replica(kv) as replica:
        agent = Agent(DirectBackend(store), replica, "a1", SPEC.machines(), ttl=10)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), kwargs={"deregister": True})
        thread.start()
        try:
            deadline = time.monotonic() + 10
            # The agent's key is written first, its machines after it.
            while (m := store.read_snapshot().machines.get(M2)) is None or m.agent != "a1":
                assert time.monotonic() < deadline, "the agent did not register"
                time.sleep(0.01)
            store.submit_job(timed("j", 0.05))
            assert store.commit(txn([Claim("j", 0, M1)])).ok
            while task_view(store.read_snapshot(), "j/0").state is not TaskState.FINISHED:
                assert time.monotonic() < deadline, "the task did not finish"
                time.sleep(0.01)
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
        snap = store.read_snapshot()
        assert "a1" not in snap.agents and snap.machines[M1].state is MachineState.DOWN


class CountingAgent(Agent):
    """Counts its steps."""

    steps = 0

    def step(self) -> float:
        self.steps += 1
        return super().step()


class CountingBackend(DirectBackend):
    """Counts the lease's keep-alives."""

    keep_alives = 0

    def keep_alive(self, lease: int) -> bool:
        self.keep_alives += 1
        return super().keep_alive(lease)


def test_run_loop_sleeps_while_its_renewal_thread_keeps_the_lease() -> None:
    """With nothing to do, the loop of an agent process sleeps between steps (at most
    0.25 s apart). It used to find the lease's work due at every step once the first
    keep-alive's time had passed (the renewal thread does that work), and spun: a third
    of a core or more for every agent process."""
    kv = MemoryKV()
    backend = CountingBackend(CellStore(kv))
    with Replica(kv) as replica:
        agent = CountingAgent(backend, replica, "a1", SPEC.machines(), ttl=1)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,))
        thread.start()
        try:
            deadline = time.monotonic() + 30
            # Three keep-alives, every ttl / 3: a second past the first one's due time.
            while backend.keep_alives < 4:
                assert time.monotonic() < deadline, "the lease was not kept alive"
                time.sleep(0.01)
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
    # About a step every 0.25 s (a busy loop: thousands); a slow machine steps less.
    assert agent.steps < 40, f"{agent.steps} steps in {backend.keep_alives} keep-alives"

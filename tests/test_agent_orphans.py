"""No task runs twice because its agent died: an agent's command tasks die with it (even
when it is killed with SIGKILL), a restarted agent kills what a previous run left
behind before it registers, and no task is started from a copy of the cell older than
the agent's registration (it may show a task that was lost and placed elsewhere)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim, Machine, TaskState
from cellstate.replica import Replica
from cellstate.store import CellStore
from omega.agent import Agent, DirectBackend
from omega.agent_state import AgentState, StateDirInUse
from omega.cellspec import parse_cell_spec
from omega.proc import Child, alive, omega, process_ids
from schedulers.testing import Clock, job, machine, txn
from tests.api.service_fixture import running_server

SPEC_TEXT = """
name = "orphans"
[layout]
machines_per_rack = 2
[[types]]
name = "small"
count = 2
capacity = { cpu = 4, mem = 16 }
"""
AGENT = "orphan-agent"


def _processes(arg: str) -> list[int]:
    """Live processes whose command line is exactly ``sleep ARG``."""
    found = []
    for pid in process_ids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv == [b"sleep", arg.encode()] and alive(pid):
            found.append(pid)
    return found


def _wait(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.fixture
def live(etcd_kv: EtcdKV) -> Iterator[tuple[CellStateServer, CellStore]]:
    with running_server(etcd_kv) as server:
        yield server, CellStore(etcd_kv)


def _start_agent(server: CellStateServer, tmp_path: Path, state_dir: Path) -> Child:
    spec = tmp_path / "cell.toml"
    spec.write_text(SPEC_TEXT)
    return Child("agent", omega("agent", "--cellstate", f"127.0.0.1:{server.port}",
                                "--spec", str(spec), "--id", AGENT, "--ttl", "2",
                                "--state-dir", str(state_dir), "--insecure",
                                "--allow-command-from", "*", "--allow-command", "/"),
                 tmp_path / "agent.log")


def _run_command(store: CellStore, command: tuple[str, ...]) -> None:
    def machines() -> list[str]:
        return sorted(m.id for m in store.read_snapshot().machines.values()
                      if m.agent == AGENT)

    # The agent's record and its machines' are separate writes: wait for the machines.
    _wait("the agent's machines", lambda: bool(machines()))
    mid = machines()[0]
    store.submit_job(attrs.evolve(job("cmd"), command=command))
    assert store.commit(txn([Claim("cmd", 0, mid)])).ok


@pytest.mark.etcd
def test_command_tasks_die_with_an_agent_killed_by_sigkill(
        live: tuple[CellStateServer, CellStore], tmp_path: Path) -> None:
    server, store = live
    arg = f"{1000 + os.getpid() % 1000}.11"  # unique to this test run
    agent = _start_agent(server, tmp_path, tmp_path / "state")
    try:
        # The task's own child too: the shell forks the sleep and waits for it.
        _run_command(store, ("sh", "-c", f"sleep {arg} & wait"))
        _wait("the task's process", lambda: bool(_processes(arg)))
        agent.kill()
        agent.wait(10)
        _wait("the task's processes to end with the agent", lambda: not _processes(arg),
              timeout=20)
    finally:
        agent.stop()
        _kill_all(_processes(arg))


class _Witness(DirectBackend):
    """Notes whether the watched processes were still alive when the agent registered."""

    watched: Sequence[int] = ()
    alive_at_registration: list[int] | None = None

    def register_agent(self, agent: str, machines: Sequence[Machine], ttl: int,
                       ) -> tuple[int, int]:
        self.alive_at_registration = [p for p in self.watched if alive(p)]
        return super().register_agent(agent, machines, ttl)


@pytest.mark.etcd
def test_a_restarted_agent_kills_leftovers_before_it_registers(
        live: tuple[CellStateServer, CellStore], etcd_kv: EtcdKV, tmp_path: Path) -> None:
    server, store = live
    arg = f"{1000 + os.getpid() % 1000}.22"
    state_dir = tmp_path / "state"
    agent = _start_agent(server, tmp_path, state_dir)
    try:
        _run_command(store, ("sh", "-c", f"sleep {arg} & wait"))
        _wait("the task's process", lambda: bool(_processes(arg)))
        leftover = _processes(arg)
        # The task's supervisor dies outright (the OOM killer, a careless kill -9), then
        # the agent: the shell goes with the supervisor, the sleep it started stays.
        for supervisor in _children_of(agent.pid):
            os.kill(supervisor, signal.SIGKILL)
        _wait("the shell to go", lambda: len(_processes(arg)) == 1 and not any(
            alive(p) for p in _children_of(agent.pid)))
        agent.kill()
        agent.wait(10)
        time.sleep(0.5)
        assert _processes(arg) == leftover, "the leftover should still run here"

        # The agent comes back (in this process) with the same state directory.
        spec = parse_cell_spec(SPEC_TEXT)
        backend = _Witness(CellStore(etcd_kv))
        backend.watched = leftover
        with Replica(etcd_kv) as replica:
            again = Agent(backend, replica, AGENT, spec.machines(), ttl=2,
                          state=AgentState(state_dir))
            try:
                again.step()
            finally:
                again.stop()
        assert backend.alive_at_registration == []
        assert _processes(arg) == []
    finally:
        agent.stop()
        _kill_all(_processes(arg))


def test_an_agent_state_directory_serves_one_agent(tmp_path: Path) -> None:
    first = AgentState(tmp_path / "state")
    try:
        with pytest.raises(StateDirInUse, match=f"in use by another agent \\(pid {os.getpid()}"):
            AgentState(tmp_path / "state")
    finally:
        first.close()
    AgentState(tmp_path / "state").close()  # free again


def test_no_task_is_started_from_a_copy_older_than_the_registration(kv: KV) -> None:
    clock = Clock(1000.0)
    store = CellStore(kv)
    m1, m2 = machine("m1"), machine("m2")
    # The agent's previous run: its machine runs a service task.
    lease, _ = store.register_agent("a1", [m1], 10, clock())
    store.add_machines([m2])
    store.submit_job(job("svc"))
    assert store.commit(txn([Claim("svc", 0, "m1")])).ok
    replica = Replica(kv, clock=clock)
    replica.load()  # a copy of the cell from before the agent died
    try:
        # The agent dies: its machine goes down, the task is lost and placed elsewhere.
        kv.lease_revoke(lease)
        assert store.machine_lost("m1")
        assert store.commit(txn([Claim("svc", 0, "m2")])).ok

        agent = Agent(DirectBackend(store, clock=clock), replica, "a1", [m1], clock=clock)
        try:
            agent.step()  # registers; its copy still shows svc/0 running on m1
            assert agent.lease is not None
            assert agent.tasks() == {}
            while replica.pump(timeout=0):
                pass
            agent.step()  # up to date: svc/0 runs on m2
            assert agent.tasks() == {}
            # Tasks placed here from now on are started.
            store.submit_job(job("next"))
            assert store.commit(txn([Claim("next", 0, "m1")])).ok
            while replica.pump(timeout=0.05):
                pass
            agent.step()
            assert set(agent.tasks()) == {"next/0"}
            assert agent.tasks()["next/0"].outcome is None
        finally:
            agent.stop()
        assert store.read_snapshot().tasks["svc/0"].state is TaskState.RUNNING
    finally:
        replica.stop()

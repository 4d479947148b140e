"""A node agent as its own process: the machines of a cell spec (or its share of them),
against the cellstate service."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs

from cellstate.api.client import CellClient, RemoteAgentBackend, remote_replica
from cellstate.api.metrics import serving
from cellstate.api.tls import TlsFiles
from cellstate.gc_tuning import tune_for_large_heap
from cellstate.model import Machine
from omega.agent import Agent, SubprocessRunner
from omega.agent_metrics import AgentCollector
from omega.agent_state import AgentState
from omega.cellspec import load_cell_spec, resolve_spec
from omega.command_policy import CommandPolicy
from omega.task_sandbox import TaskSandbox, describe, parse_limits, run_as

log = logging.getLogger(__name__)


@attrs.frozen
class AgentProcessConfig:
    cellstate: tuple[str, ...]
    spec: Path
    index: int = 0  # this agent's share of the spec: block ``index`` of ``count``
    count: int = 1
    agent_id: str = ""
    cell: str = "default"
    ttl: int = 10
    workdir: Path | None = None
    log_dir: Path | None = None
    state_dir: Path | None = None  # records task processes; a restart kills leftovers
    tls: TlsFiles | None = None  # mutual TLS (cellstate/api/tls.py); None: plaintext
    # Which jobs' commands run here (omega/command_policy.py); the default: none.
    commands: CommandPolicy = attrs.field(factory=CommandPolicy)
    # What they run as and within (omega/task_sandbox.py): None run_as is nobody for
    # an agent running as root, else the agent's user; None task_dir is STATE_DIR/task-dirs
    # with a state_dir, else a temporary folder.
    run_as: str | None = None
    task_dir: Path | None = None
    task_limits: tuple[str, ...] = ()
    cgroup: Path | None = None
    metrics: str = ""  # host:port to serve Prometheus metrics on; "" for none


def run_agent(config: AgentProcessConfig, stop: threading.Event) -> Agent:
    spec = load_cell_spec(resolve_spec(config.spec))  # a bad spec fails before connecting
    if not 0 <= config.index < config.count:
        raise ValueError(f"--index {config.index} is not below --of {config.count}")
    agent_id = config.agent_id or f"{socket.gethostname()}-{os.getpid()}"
    machines = spec.machines_for(config.index, config.count, agent_id)
    if not machines:
        raise ValueError(f"{config.spec}: share {config.index} of {config.count} has no machines")
    # Checked before connecting: a user that cannot be switched to stops the agent.
    sandbox = TaskSandbox(None, run_as(config.run_as), parse_limits(config.task_limits),
                          config.cgroup)
    for warning in config.commands.warnings(verified_owners=config.tls is not None,
                                            own_user=sandbox.user is None):
        log.warning("agent %s: %s", agent_id, warning)
    # Taken before connecting: a second agent on the same folder fails at once, and the
    # first step kills what a previous run left before anything is registered.
    state = AgentState(config.state_dir) if config.state_dir is not None else None
    task_dir = config.task_dir or (config.state_dir / "task-dirs" if config.state_dir else None)
    with _task_root(task_dir) as root:
        return _run(config, attrs.evolve(sandbox, root=root), state, agent_id, machines,
                    stop)


@contextlib.contextmanager
def _task_root(given: Path | None) -> Iterator[Path]:
    """The folder of the tasks' directories: ``given``, or a temporary one removed at
    the end. Others may pass through it (to their own task's directory), not list it."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        given.chmod(0o711)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="omega-tasks-") as tmp:
        os.chmod(tmp, 0o711)
        yield Path(tmp)


def _run(config: AgentProcessConfig, sandbox: TaskSandbox, state: AgentState | None,
         agent_id: str, machines: list[Machine], stop: threading.Event) -> Agent:
    client = CellClient(config.cellstate, tls=config.tls)
    replica = remote_replica(client, config.cell)
    try:
        replica.start()
        tune_for_large_heap()  # the agent holds a copy of the whole cell
        runner = SubprocessRunner(workdir=config.workdir, log_dir=config.log_dir, state=state,
                                  sandbox=sandbox)
        agent = Agent(RemoteAgentBackend(client), replica, agent_id, machines, ttl=config.ttl,
                      runner=runner, state=state, commands=config.commands)
        log.info("agent %s: %d machines (%s..%s) of %s; %s", agent_id, len(machines),
                 machines[0].id, machines[-1].id, config.spec, describe(sandbox))
        with serving(config.metrics, AgentCollector(agent)):
            agent.run(stop)
        return agent
    finally:
        replica.stop()
        client.close()
        if state is not None:
            state.close()

"""A node agent as its own process: the machines of a cell spec (or its share of them),
against the cellstate service."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

import attrs

from cellstate.api.client import CellClient, RemoteAgentBackend, remote_replica
from cellstate.api.metrics import serving
from cellstate.api.tls import TlsFiles
from cellstate.gc_tuning import tune_for_large_heap
from omega.agent import Agent, SubprocessRunner
from omega.agent_metrics import AgentCollector
from omega.agent_state import AgentState
from omega.cellspec import load_cell_spec, resolve_spec
from omega.command_policy import CommandPolicy

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
    metrics: str = ""  # host:port to serve Prometheus metrics on; "" for none


def run_agent(config: AgentProcessConfig, stop: threading.Event) -> Agent:
    spec = load_cell_spec(resolve_spec(config.spec))  # a bad spec fails before connecting
    if not 0 <= config.index < config.count:
        raise ValueError(f"--index {config.index} is not below --of {config.count}")
    agent_id = config.agent_id or f"{socket.gethostname()}-{os.getpid()}"
    machines = spec.machines_for(config.index, config.count, agent_id)
    if not machines:
        raise ValueError(f"{config.spec}: share {config.index} of {config.count} has no machines")
    # Taken before connecting: a second agent on the same folder fails at once, and the
    # first step kills what a previous run left before anything is registered.
    state = AgentState(config.state_dir) if config.state_dir is not None else None
    client = CellClient(config.cellstate, tls=config.tls)
    replica = remote_replica(client, config.cell)
    try:
        replica.start()
        tune_for_large_heap()  # the agent holds a copy of the whole cell
        runner = SubprocessRunner(workdir=config.workdir, log_dir=config.log_dir, state=state)
        agent = Agent(RemoteAgentBackend(client), replica, agent_id, machines, ttl=config.ttl,
                      runner=runner, state=state, commands=config.commands)
        log.info("agent %s: %d machines (%s..%s) of %s", agent_id, len(machines),
                 machines[0].id, machines[-1].id, config.spec)
        with serving(config.metrics, AgentCollector(agent)):
            agent.run(stop)
        return agent
    finally:
        replica.stop()
        client.close()
        if state is not None:
            state.close()

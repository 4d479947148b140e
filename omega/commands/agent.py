"""``omega agent``: a node agent for the machines of a cell spec."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omega.commands.common import cellstate_flag, cert_name, endpoints, non_negative_int, positive
from omega.security import tls_from_args

ORDER = 14


def register(sub: Any) -> None:
    a = sub.add_parser("agent", help="run a node agent for the machines of a cell spec")
    cellstate_flag(a)
    a.add_argument("--spec", required=True,
                   help="cell spec: a TOML file, or a shipped one by name (demo, alibaba)")
    a.add_argument("--index", type=non_negative_int, default=0,
                   help="this agent's share of the spec's machines (0-based)")
    a.add_argument("--of", type=positive(int), default=1, dest="count",
                   help="how many agents share the spec (default 1)")
    a.add_argument("--id", default="", help="agent id (default host-pid)")
    a.add_argument("--cell", default="default",
                   help="cell name (default 'default')")
    a.add_argument("--ttl", type=positive(int), default=10,
                   help="lease seconds: machines go down this long after the agent dies")
    a.add_argument("--workdir", help="where relative command paths are found (default: "
                                     "the agent's working directory)")
    a.add_argument("--run-as", metavar="USER",
                   help="the user commands run as (default: nobody for an agent running "
                        "as root, else the agent's own user; docs/security.md)")
    a.add_argument("--task-dir", metavar="DIR",
                   help="each command runs in a fresh DIR/JOB/INDEX of its own (default: "
                        "STATE_DIR/task-dirs with --state-dir, else a temporary folder removed "
                        "when the agent stops)")
    a.add_argument("--task-limit", action="append", default=[], metavar="NAME=VALUE",
                   help="a resource limit of every command: cpu (seconds), as (bytes of "
                        "memory), nofile, nproc, fsize (bytes), core (bytes; default 0); "
                        "repeatable")
    a.add_argument("--cgroup", metavar="DIR",
                   help="a writable cgroup v2 folder: each command gets a cgroup in it "
                        "(memory.max from as=, pids.max from nproc=, where enabled)")
    a.add_argument("--log-dir", help="write each command task's output under this folder")
    a.add_argument("--state-dir",
                   help="the agent's own folder (one per agent): records its task processes, "
                        "so that a restart kills what a crashed run left behind")
    a.add_argument("--allow-command-from", action="append", default=[], metavar="OWNER",
                   help="run the commands of jobs this owner submitted (repeatable; '*' "
                        "any owner). Default: no job's command runs (jobs with a duration "
                        "need nothing)")
    a.add_argument("--allow-command", action="append", default=[], metavar="PATH",
                   help="an executable, or a folder ending in '/', that allowed owners' "
                        "commands may run (repeatable; resolved to a real path)")
    a.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)")
    a.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.agent_process import AgentProcessConfig, run_agent
    from omega.command_policy import CommandPolicy
    from omega.signals import stop_event_on_signals

    tls = tls_from_args(args)
    config = AgentProcessConfig(
        endpoints(args.cellstate), Path(args.spec), args.index, args.count,
        args.id or cert_name(tls, "agent"),
        args.cell, args.ttl, Path(args.workdir) if args.workdir else None,
        Path(args.log_dir) if args.log_dir else None,
        Path(args.state_dir) if args.state_dir else None, tls=tls,
        commands=CommandPolicy(frozenset(args.allow_command_from),
                               tuple(args.allow_command)), metrics=args.metrics,
        run_as=args.run_as, task_dir=Path(args.task_dir) if args.task_dir else None,
        task_limits=tuple(args.task_limit),
        cgroup=Path(args.cgroup) if args.cgroup else None)
    run_agent(config, stop_event_on_signals())
    return 0

"""The `omega` command line: start each process, submit and inspect jobs, run the demo.

Processes::

    omega etcd                          a local single-member etcd (prints its endpoint)
    omega server                        a cellstate server replica (gRPC)
    omega agent --spec demo             a node agent for a cell spec's machines
    omega scheduler flow --policy quincy
                                        one scheduler instance (also: --name batch)
    omega workload                      a stream of demo jobs
    omega demo                          all of the above, locally, with a live summary
    omega certs DIR                     a development CA and certificates for a cell

Using a cell (through any cellstate server; ``--cellstate`` or $OMEGA_CELLSTATE)::

    omega submit --file job.json | --id J --scheduler batch --tasks 10 --cpu 1 ...
    omega jobs | job ID | kill ID | machines | status      (--json for scripts)

Administration straight on etcd: ``omega check`` and ``omega recover``.

Every command that talks to a cellstate server uses mutual TLS: ``--ca``, ``--cert``,
``--key`` (or $OMEGA_CA...), or plaintext with an explicit ``--insecure``
(docs/security.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellstate.model import ModelError, check_name
from omega.jobfile import load_job_file
from omega.security import add_etcd_flags, add_tls_flags, etcd_access_from_args, tls_from_args

if TYPE_CHECKING:
    from schedulers.process import SchedulerProcessConfig

DEFAULT_CELLSTATE = "127.0.0.1:7070"


def _positive(kind: type[float] | type[int]) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        # NaN compares false with everything, so "value <= 0" alone lets it through.
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 0.8:  # the service scheduler's 0.2 comes first
        raise argparse.ArgumentTypeError(f"must be from 0 to 0.8, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of at least 0")
    return v


def _user_weight(text: str) -> tuple[str, float]:
    user, sep, raw = text.partition("=")
    if not sep or not user:
        raise argparse.ArgumentTypeError(f"{text!r} is not USER=WEIGHT")
    try:
        w = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the weight {raw!r} is not a number"
                                         ) from None
    if not math.isfinite(w) or w <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the weight must be above 0")
    return user, w


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


_OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}(\.[A-Za-z_][A-Za-z0-9_-]{0,63})*")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?")


def option_value(text: str) -> int | float | bool | str:
    """An option's value as typed on the command line: a number where it looks like
    one (not ``inf`` or ``nan``: the policy's checks name those), ``true``/``false``,
    else the text itself."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    return text


def _option(text: str) -> tuple[str, int | float | bool | str]:
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    if not _OPTION_KEY.fullmatch(key):
        raise argparse.ArgumentTypeError(
            f"{key!r} is not an option name (letters, digits, '_' and '-'; a dot names an "
            "entry of a table, as in costs.migrate_cost)")
    return key, option_value(raw)


def options_from_flags(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``--option`` pairs as a table (dotted keys as nested tables); a key given twice,
    or both as a value and as a table, is an error."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        *tables, leaf = key.split(".")
        at = out
        for i, table in enumerate(tables):
            inner = at.setdefault(table, {})
            if not isinstance(inner, dict):
                raise ValueError(f"--option {key}: {'.'.join(tables[:i + 1])} was given a "
                                 "value, so it cannot be a table too")
            at = inner
        if leaf in at:
            what = "a table" if isinstance(at[leaf], dict) else "given twice"
            raise ValueError(f"--option {key}: {what}")
        at[leaf] = value
    return out


def _cellstate_flag(p: argparse.ArgumentParser) -> None:
    from omega.clientconfig import default

    p.add_argument("--cellstate", default=default("cellstate", DEFAULT_CELLSTATE),
                   help="cellstate server address(es), comma-separated (default "
                        f"$OMEGA_CELLSTATE, the config file's, or {DEFAULT_CELLSTATE})")


def _json_flag(p: argparse.ArgumentParser) -> None:
    """Nothing: ``--json`` (and ``-o``, ``-v``) are global flags that every command
    takes, before or after its name (omega/cliglobal.py). Kept for callers."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omega", description="Omega-style shared-state cell.",
        epilog="Global flags (-v, --json, -o) go before or after the command. Exit codes: "
               "0 ok, 1 invariant broken (check, demo), 2 bad input or refused, 3 no "
               "server answered, 4 cannot listen, 130 interrupted, 141 output closed.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="run the local demo cluster (etcd, server, agents, "
                                    "schedulers, workload) as processes")
    d.add_argument("--duration", type=_positive(float), default=30.0,
                   help="seconds (default 30)")
    d.add_argument("--spec", default=None,
                   help="cell spec of the machines: a file, or a shipped one by name "
                        "(default: demo)")
    d.add_argument("--agents", type=_positive(int), default=2,
                   help="agent processes sharing the spec's machines (default 2)")
    d.add_argument("--servers", type=_positive(int), default=1,
                   help="cellstate server replicas (default 1)")
    d.add_argument("--batch-instances", type=_positive(int), default=2,
                   help="instances of the batch scheduler sharing its queue (default 2)")
    d.add_argument("--jobs-per-second", type=_positive(float), default=4.0,
                   help="jobs the workload submits per second, on average (default 4)")
    d.add_argument("--flow-policy", default="quincy",
                   help="the flow scheduler's cost model: quincy (default), load-spread, "
                        "network, trivial or aladdin (Aladdin+H, e.g. with --spec alibaba)")
    d.add_argument("--mapreduce-policy", default="max-parallel",
                   help="the mapreduce scheduler's policy: max-parallel (default), "
                        "global-cap or relative-size")
    d.add_argument("--jobs", help="a job file (JSON or TOML, as omega submit --file) to "
                                  "submit once the schedulers run; the demo checks at the "
                                  "end that their placement rules hold")
    d.add_argument("--settle", type=_non_negative_float, default=60.0,
                   help="with --jobs: after --duration, seconds to wait at most for the "
                        "job file's tasks to be placed before the final check (default 60)")
    d.add_argument("--seed", type=int, default=1,
                   help="random seed of the workload and schedulers (default 1; the same "
                        "seed submits the same jobs)")
    d.add_argument("--no-fsync", action="store_true", help="etcd --unsafe-no-fsync (faster)")
    d.add_argument("--data-dir", help="keep etcd's data and the processes' logs here "
                                      "(default: a temp dir)")
    d.add_argument("--insecure", action="store_true",
                   help="run every process over plaintext gRPC, without identities "
                        "(default: mutual TLS with certificates made in the data dir)")
    d.add_argument("--contention", choices=["low", "high"], default="low",
                   help="low (default), or high: at least 4 batch instances with "
                        "coarse-grained conflict detection and 3x the jobs, so schedulers "
                        "visibly conflict and retry")
    d.add_argument("--keep-going", action="store_true",
                   help="when a process dies (kill a scheduler, agent or server to see "
                        "failover), report it and go on (default: stop the demo)")
    d.add_argument("--no-dashboard", action="store_true",
                   help="do not start the web dashboard (default: `omega dashboard` on a "
                        "free port; the demo prints its address)")
    d.add_argument("--allow-commands", action="store_true",
                   help="agents run the commands of the demo's users and of your shell's "
                        "omega submit (sleep, echo, sh, cat, date, true, false, python3), "
                        "logging their output for omega logs")
    d.add_argument("--no-metrics", action="store_true",
                   help="do not serve Prometheus metrics (default: every server, scheduler "
                        "and agent serves them; the demo prints where)")

    cs = sub.add_parser("certs", help="make a development CA and certificates for a cell")
    cs.add_argument("dir", metavar="DIR", help="folder of the CA and the certificates "
                                               "(the CA is made once and reused)")
    cs.add_argument("identities", nargs="*", metavar="KIND:NAME",
                    help="identities to issue (operator, user, scheduler, agent or server "
                         ":NAME); default: every process of the demo or compose cell")
    cs.add_argument("--host", action="append", default=[],
                    help="a name or address clients dial servers by (repeatable; default "
                         "localhost, 127.0.0.1 and cellstate-0..2)")
    cs.add_argument("--agents", type=_positive(int), default=2,
                    help="agents of the default set (agent-0...; default 2)")
    cs.add_argument("--days", type=_positive(int), default=365,
                    help="days the certificates are valid (default 365)")
    cs.add_argument("--etcd-member", action="append", default=[], metavar="NAME",
                    help="also an etcd member's certificate (client and peer TLS, for the "
                         "host NAME; etcd-member-NAME.pem) and, with it, one for etcd's "
                         "root user (etcd-root.pem); repeatable")
    cs.add_argument("--keep", action="store_true",
                    help="issue only certificates that do not exist yet (a restart of "
                         "compose's certs service rotates nothing)")
    cs.add_argument("--ca-key", metavar="FILE",
                    help="the CA's private key (default DIR/ca.key): elsewhere, DIR can be "
                         "given to every process without the key that signs for all")

    e = sub.add_parser("etcd", help="run a local single-member etcd in the foreground")
    e.add_argument("--data-dir", help="keep its data here (default: a temporary folder)")
    e.add_argument("--no-fsync", action="store_true",
                   help="etcd --unsafe-no-fsync (faster; for tests and demos)")
    e.add_argument("--listen", metavar="127.0.0.1:PORT",
                   help="the client address (loopback only: a local etcd; default: a free "
                        "port, printed)")

    s = sub.add_parser("server", help="run a cellstate server replica")
    s.add_argument("--config", help="TOML file (see docs/operations.md); flags override it")
    s.add_argument("--listen", help="host:port to serve gRPC on (default 127.0.0.1:7070)")
    s.add_argument("--etcd", help="etcd endpoint(s), comma-separated")
    s.add_argument("--cell", help="cell name (default 'default'; one etcd holds several)")
    s.add_argument("--name", help="this replica's name in status output")
    add_etcd_flags(s)
    s.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)")

    a = sub.add_parser("agent", help="run a node agent for the machines of a cell spec")
    _cellstate_flag(a)
    a.add_argument("--spec", required=True,
                   help="cell spec: a TOML file, or a shipped one by name (demo, alibaba)")
    a.add_argument("--index", type=_non_negative_int, default=0,
                   help="this agent's share of the spec's machines (0-based)")
    a.add_argument("--of", type=_positive(int), default=1, dest="count",
                   help="how many agents share the spec (default 1)")
    a.add_argument("--id", default="", help="agent id (default host-pid)")
    a.add_argument("--cell", default="default",
                   help="cell name (default 'default')")
    a.add_argument("--ttl", type=_positive(int), default=10,
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

    c = sub.add_parser(
        "scheduler", help="run one scheduler instance",
        description="Run one scheduler instance: `omega scheduler flow --policy quincy`, "
                    "or (the older form) `omega scheduler --name batch`.")
    c.add_argument("scheduler", nargs="?", metavar="SCHEDULER",
                   help="the registered policy to run (batch, service, flow or a plugin's); "
                        "also the scheduler's name unless --name or the file gives one")
    c.add_argument("--cellstate", help="cellstate server address(es), comma-separated "
                                       "(default: the config file's, $OMEGA_CELLSTATE or "
                                       f"{DEFAULT_CELLSTATE})")
    c.add_argument("--config", help="TOML file (see schedulers/process.py); flags override it")
    c.add_argument("--name", help="scheduler name (jobs name it)")
    c.add_argument("--policy",
                   help="with SCHEDULER: the policy's own `policy` option (flow: its cost "
                        "model, quincy, load-spread, network or trivial); without: the "
                        "registered policy (default: the name)")
    c.add_argument("--option", action="append", type=_option, default=[], metavar="KEY=VALUE",
                   help="an option of the policy, over the file's [options] (repeatable; "
                        "numbers, true and false are typed, anything else is a string; "
                        "costs.migrate_cost=100 sets one entry of the costs table)")
    c.add_argument("--instance", help="instance id (default host-pid)")
    c.add_argument("--cell", help="cell name (default 'default')")
    c.add_argument("--mode", choices=["incremental", "gang"],
                   help="how transactions commit: incremental (default: what fits) or gang "
                        "(all claims or none)")
    c.add_argument("--detection", choices=["fine", "coarse"],
                   help="conflict detection: fine (default: only claims that no longer "
                        "fit) or coarse (any change to the machine)")
    c.add_argument("--seed", type=int, help="random seed of the policy (default: random)")
    c.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)")

    w = sub.add_parser("workload", help="submit a stream of demo jobs")
    _cellstate_flag(w)
    w.add_argument("--jobs-per-second", type=_positive(float), default=4.0,
                   help="jobs submitted per second, on average (default 4)")
    w.add_argument("--duration", type=_positive(float), help="seconds (default: until stopped)")
    w.add_argument("--seed", type=int, default=1,
                   help="random seed (default 1; the same seed submits the same jobs)")
    w.add_argument("--prefix", default="", help="prefix of the job ids")
    w.add_argument("--flow-fraction", type=_fraction, default=0.2,
                   help="the share of jobs for the flow scheduler (default 0.2; 0 where "
                        "none runs)")
    w.add_argument("--mapreduce-fraction", type=_fraction, default=0.1,
                   help="the share of MapReduce jobs, for the mapreduce scheduler (default "
                        "0.1; 0 where none runs)")
    w.add_argument("--fair-fraction", type=_fraction, default=0.15,
                   help="the share of jobs for the fair scheduler, from its batch and "
                        "interactive users (default 0.15; 0 where none runs)")

    sm = sub.add_parser("submit", help="submit a job from a spec file or flags")
    _cellstate_flag(sm)
    _json_flag(sm)
    sm.add_argument("--file", help="job spec (JSON or TOML): one job, or {\"jobs\": [...]}")
    sm.add_argument("--id", help="the job's id (letters, digits, '_', '.', '-'); new")
    sm.add_argument("--scheduler", default="batch",
                    help="the scheduler that places it (default batch)")
    sm.add_argument("--tasks", type=_positive(int), default=1,
                    help="number of tasks (default 1)")
    sm.add_argument("--cpu", type=_positive(float), default=1.0,
                    help="CPU cores per task (default 1; fractions allowed)")
    sm.add_argument("--mem", type=_positive(float), default=1.0,
                    help="memory per task, GiB (default 1)")
    sm.add_argument("--gpu", type=_positive(float), default=None,
                    help="GPUs per task (default none)")
    sm.add_argument("--kind", choices=["batch", "service"], default="batch",
                    help="batch (runs to completion, default) or service (long-running)")
    sm.add_argument("--precedence", type=_non_negative_int, default=0,
                    help="higher evicts lower (default 0; at most the scheduler's limit)")
    sm.add_argument("--priority", type=int, default=0,
                    help="the job's rank among its owner's own jobs, higher first (a fair "
                         "scheduler orders each owner's jobs by it; default 0)")
    sm.add_argument("--gang", action="store_true", help="all tasks or none")
    sm.add_argument("--allow-unknown-scheduler", action="store_true",
                    help="accept it even if its scheduler has not run in the cell yet "
                         "(about to be started); otherwise refused once any has")
    sm.add_argument("--owner", help="the job's owner (default: the name of a user:NAME "
                                    "certificate, else $USER)")
    sm.add_argument("--duration", type=_positive(float), help="seconds each task runs")
    sm.add_argument("--command", dest="task_command", default="",
                    help="a command each task runs, e.g. --command 'sleep 30' (split like a "
                         "shell would, but run without one)")

    sh = sub.add_parser("shares", help="each user's share of a fair scheduler and what "
                                       "their next waiting task would do now")
    _cellstate_flag(sh)
    _json_flag(sh)
    sh.add_argument("--scheduler", default="fair", help="the fair scheduler's name (default "
                                                         "fair)")
    sh.add_argument("--cell", default="default", help="cell name (default 'default')")
    sh.add_argument("--delta", type=_non_negative_float, default=None,
                    help="the tolerance in CRS (default: what a live instance reports, "
                         "else 0.05)")
    sh.add_argument("--weight", type=_user_weight, action="append", default=[],
                    metavar="USER=W", help="a user's weight (default: what a live instance "
                                           "reports, else 1); repeatable")

    j = sub.add_parser("jobs", help="list jobs, newest first")
    _cellstate_flag(j)
    _json_flag(j)
    j.add_argument("--scheduler", default="", help="only this scheduler's jobs")
    j.add_argument("--status", "--state", dest="state", default="",
                   choices=["", "pending", "running", "finished", "failed", "abandoned",
                            "killed"], help="only jobs in this state")
    j.add_argument("--limit", type=_non_negative_int, default=0,
                   help="at most this many jobs (default 0: all)")
    j.add_argument("--oldest-first", action="store_true",
                   help="oldest submission first (default: newest first)")

    for name, text in (("job", "show one job, its tasks and why any wait"),
                       ("why", "why a job's tasks are pending: the cell's reasons and each "
                               "scheduler's last attempt"),
                       ("kill", "kill a job")):
        x = sub.add_parser(name, help=text)
        _cellstate_flag(x)
        _json_flag(x)
        x.add_argument("job_id", metavar="JOB", help="the job's id")
        if name == "kill":
            x.add_argument("--reason", default="killed by a user",
                           help="why, kept with the job (default 'killed by a user')")

    m = sub.add_parser("machines", help="list machines")
    _cellstate_flag(m)
    _json_flag(m)
    m.add_argument("--status", "--state", dest="state", default="",
                   choices=["", "up", "cordoned", "draining", "down"],
                   help="only machines in this state")
    m.add_argument("--limit", type=_non_negative_int, default=0,
                   help="at most this many machines (default 0: all)")

    st = sub.add_parser("status", help="cell status: utilization, jobs, per-scheduler metrics")
    _cellstate_flag(st)
    _json_flag(st)

    for name, text in (("check", "check a cell's invariants on etcd (exit 1 if broken)"),
                       ("recover", "finish what crashed committers left behind, on etcd")):
        x = sub.add_parser(name, help=text)
        x.add_argument("--etcd", required=True, help="etcd endpoint(s), comma-separated")
        x.add_argument("--cell", default="default", help="cell name (default 'default')")
        _json_flag(x)
        add_etcd_flags(x)

    ea = sub.add_parser("etcd-auth", help="lock etcd down for a cell: a root user, a role "
                                          "per kind of process, users, auth on")
    ea.add_argument("--etcd", required=True, help="etcd endpoint(s), comma-separated")
    ea.add_argument("--cell", default="default", help="cell name (default 'default')")
    ea.add_argument("--server", action="append", default=[], metavar="USER[=PASSWORD_FILE]",
                    help="an etcd user with the cell's server role (read-write on the "
                         "cell's keys): a certificate's common name, or a user with the "
                         "password in PASSWORD_FILE (repeatable)")
    ea.add_argument("--reader", action="append", default=[], metavar="USER[=PASSWORD_FILE]",
                    help="an etcd user with the cell's reader role (omega check; "
                         "repeatable)")
    ea.add_argument("--root-password-file",
                    help="the root user's password (default: none, root authenticates by "
                         "a certificate whose common name is root only)")
    add_etcd_flags(ea)

    _add_simulator(sub)
    _add_own_modules(sub)
    # Every command that talks to (or is) a cellstate server takes the TLS flags,
    # commands added later included.
    for name, parser in sub.choices.items():
        if name not in NO_TLS_COMMANDS:
            add_tls_flags(parser)
    from omega.cliglobal import install

    install(p, sub)
    return p


# Commands that talk to no cellstate server (etcd, files, the simulator), or take
# their own TLS choice (the demo makes its certificates).
NO_TLS_COMMANDS = frozenset({"demo", "etcd", "certs", "check", "recover", "simulate",
                             "completion", "etcd-auth", "env"})


def _add_own_modules(sub: Any) -> None:
    """Commands that live in modules of their own (each has ``register(sub)``)."""
    from omega import completion, dashboard, envcmd, limitscmd, logscmd, machinecmds, plan

    completion.register(sub, build_parser)
    envcmd.register(sub)
    dashboard.register(sub, _cellstate_flag)
    logscmd.register(sub, _cellstate_flag, _non_negative_int)
    plan.register(sub, _cellstate_flag, _option, options_from_flags)
    machinecmds.register(sub, _cellstate_flag, _positive(int))
    limitscmd.register(sub, _cellstate_flag)


def _add_simulator(sub: Any) -> None:
    from simulator.cli import register

    register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    from omega import cliglobal
    from omega.proc import die_with_parent

    die_with_parent()
    from cellstate.errors import ConfigError
    from omega import clientconfig

    try:
        clientconfig.load()  # a bad config file is named before anything else
    except ConfigError as e:
        print(f"omega: {e}", file=sys.stderr)
        return cliglobal.BAD_INPUT
    parser = build_parser()
    try:
        args = cliglobal.parse(parser, _subcommands(parser), argv)
    except BrokenPipeError:  # --help into `| head -1`
        return cliglobal.pipe_closed()
    from omega import logfmt

    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    try:
        logfmt.configure(level, logfmt.log_format(args.log_format))
    except ValueError as e:
        print(f"omega: {e}", file=sys.stderr)
        return cliglobal.BAD_INPUT
    from cellstate.api.client import ClientError, ServiceUnavailable
    from cellstate.api.config import ConfigError
    from cellstate.errors import EtcdAuthError, KVError
    from cellstate.store import StoreError
    from omega.cellspec import CellSpecError

    def no_server(e: BaseException) -> str:
        where = getattr(args, "cellstate", "")
        return (f"no cellstate server answered at {where} ({e}). Is `omega server` "
                "running? Give its address with --cellstate HOST:PORT. (A TLS server "
                "refuses plaintext clients and certificates of another CA the same way: "
                "check --ca, --cert, --insecure.)")

    def no_etcd(e: BaseException) -> str:
        where = getattr(args, "etcd", "") or "the configured endpoints"
        return f"etcd did not answer at {where}: {e}"

    return cliglobal.run(args.command, lambda: _dispatch(args), [
        (ServiceUnavailable, cliglobal.UNREACHABLE, no_server),
        # etcd answered, and refused these credentials: refused, not unreachable.
        (EtcdAuthError, cliglobal.BAD_INPUT, lambda e: f"etcd refused the call: {e}"),
        (KVError, cliglobal.UNREACHABLE, no_etcd),
        ((ModelError, ConfigError, CellSpecError, ClientError, StoreError, OSError,
          ValueError), cliglobal.BAD_INPUT, str),
    ])


def _subcommands(parser: argparse.ArgumentParser) -> Any:
    for action in parser._actions:  # argparse keeps the subparsers action only here
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError("omega's parser has no subcommands")


def _etcd_port(listen: str) -> int:
    """``omega etcd --listen``'s port: the local etcd serves on loopback only."""
    from cellstate.api.config import address
    from omega.cliglobal import check_listen

    host, _, port = address(listen, "--listen", listen=True).rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"--listen {listen}: omega etcd serves on 127.0.0.1 only (a local "
                         "etcd for one machine); run an etcd cluster for other hosts")
    check_listen(f"127.0.0.1:{port}")
    return int(port)


def _endpoints(text: str) -> tuple[str, ...]:
    from cellstate.api.config import addresses

    return addresses(text, "--cellstate")


def _dispatch(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "demo":
        from omega import logfmt
        from omega.demo import DemoOptions, run_demo

        stats = run_demo(DemoOptions(
            duration=args.duration, spec=args.spec, agents=args.agents, servers=args.servers,
            batch_instances=args.batch_instances, jobs_per_second=args.jobs_per_second,
            seed=args.seed, no_fsync=args.no_fsync, data_dir=args.data_dir,
            flow_policy=args.flow_policy, mapreduce_policy=args.mapreduce_policy,
            jobs=args.jobs, settle=args.settle, insecure=args.insecure, contention=args.contention,
            keep_going=args.keep_going, metrics=not args.no_metrics,
            dashboard=not args.no_dashboard, allow_commands=args.allow_commands,
            log_format=logfmt.log_format(args.log_format)), sys.stdout)
        return stats.exit_code
    if cmd == "etcd":
        from omega.etcd_launcher import main as etcd_main

        return etcd_main([*(["--data-dir", args.data_dir] if args.data_dir else []),
                          *(["--unsafe-no-fsync"] if args.no_fsync else []),
                          *(["--port", str(_etcd_port(args.listen))] if args.listen else [])])
    if cmd == "certs":
        return _certs(args)
    if cmd == "server":
        return _server(args)
    if cmd == "agent":
        from omega.agent_process import AgentProcessConfig, run_agent
        from omega.command_policy import CommandPolicy
        from omega.signals import stop_event_on_signals

        tls = tls_from_args(args)
        config = AgentProcessConfig(
            _endpoints(args.cellstate), Path(args.spec), args.index, args.count,
            args.id or _cert_name(tls, "agent"),
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
    if cmd == "scheduler":
        return _scheduler(args)
    if cmd == "workload":
        return _workload(args)
    if cmd in ("check", "recover"):
        return _admin(args)
    if cmd == "etcd-auth":
        return _etcd_auth(args)
    runner: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if runner is not None:  # simulate, and the commands of omega's own modules
        return runner(args)
    from cellstate.api.client import CellClient
    from omega.tables import jobs_table, machines_table

    tls = tls_from_args(args)
    with CellClient(_endpoints(args.cellstate), retry_for=5.0, tls=tls) as client:
        if cmd == "submit":
            jobs = _job_docs(args, _cert_name(tls, "user") or os.environ.get("USER", "nobody"))
            for doc in jobs:
                client.submit_job(doc, args.allow_unknown_scheduler)
            ids = [str(d.get("id")) for d in jobs]
            _emit(args, {"submitted": ids}, "\n".join(f"submitted {i}" for i in ids))
        elif cmd == "jobs":
            listed = client.list_jobs(args.scheduler, args.state, args.limit,
                                      newest_first=not args.oldest_first)
            _emit(args, listed, lambda wide: jobs_table(listed, wide))
        elif cmd in ("job", "why"):
            from omega.jobview import job_text, why_text

            info = client.get_job(args.job_id)
            if cmd == "why":
                from omega.jobview import waiting

                _emit(args, {"job": args.job_id, "state": info["state"],
                             "pending": waiting(info),
                             "reason": info.get("reason", ""), **info.get("why", {})},
                      why_text(info))
            else:
                _emit(args, info, job_text(info))
        elif cmd == "kill":
            revision = client.kill_job(args.job_id, args.reason, os.environ.get("USER", "user"))
            _emit(args, {"job": args.job_id, "revision": revision}, f"killed {args.job_id}")
        elif cmd == "machines":
            machines = client.list_machines(args.state, args.limit)
            _emit(args, machines, lambda wide: machines_table(machines, wide))
        elif cmd == "shares":
            from omega.shares import shares, shares_text

            doc = shares(client, args.scheduler, args.cell, args.delta, args.weight)
            _emit(args, doc, shares_text(doc))
        elif cmd == "status":
            from omega.statusfmt import status_text

            status = client.status()
            _emit(args, status, status_text(status))
    return 0


def _server(args: argparse.Namespace) -> int:
    import attrs

    from cellstate.api.config import address, addresses, read_toml, server_config
    from cellstate.api.server import CellStateServer
    from cellstate.gc_tuning import tune_for_large_heap
    from omega.signals import stop_event_on_signals

    doc = read_toml(args.config) if args.config else {}
    config = server_config(doc, args.config or "")
    if args.listen:
        listen = address(args.listen, "--listen", listen=True)
        config = attrs.evolve(config, listen=listen,
                              name=config.name if doc.get("name") else listen)
    if args.etcd:
        config = attrs.evolve(config, etcd=addresses(args.etcd, "--etcd"))
    if args.cell:
        config = attrs.evolve(config, cell=check_name(args.cell, "--cell"))
    if args.name:
        config = attrs.evolve(config, name=args.name)
    if args.cert or args.insecure or config.tls is None:
        if args.insecure and config.tls is not None:
            raise ValueError(f"--insecure, but {args.config} has a [tls] table: give one")
        config = attrs.evolve(config, tls=tls_from_args(args))
    config = attrs.evolve(config, etcd_access=etcd_access_from_args(args, config.etcd_access))
    if config.etcd_access.anonymous:
        print(f"WARNING: omega server: etcd without credentials "
              f"({config.etcd_access.describe()}): whoever reaches etcd owns the cell; "
              "lock it down (docs/security.md, --etcd-cert or [etcd] cert)",
              file=sys.stderr, flush=True)
    from omega.cliglobal import check_listen, start_server
    from omega.logfmt import announce

    check_listen(config.listen)  # before loading the cell: a taken port fails at once
    stop = stop_event_on_signals()
    kv = config.etcd_access.connect(config.etcd, config.cell)
    try:
        server = CellStateServer(kv, config)
        exporter = contextlib.ExitStack()
        if args.metrics:
            from cellstate.api.metrics import CellCollector, ServerMetrics, serving

            registry = exporter.enter_context(serving(args.metrics,
                                                      CellCollector(server.service)))
            server.service.metrics = ServerMetrics(registry)
        exporter.enter_context(contextlib.closing(_Stopper(server)))
        port = start_server(server, config.listen)
        tune_for_large_heap()  # the cell is loaded: keep the collector off it
        announce("cellstate %s serving cell %s on port %d (etcd %s, %s; %s)", config.name,
                 config.cell, port, ",".join(config.etcd), config.etcd_access.describe(),
                 "mutual TLS" if config.tls else "PLAINTEXT, --insecure")
        with exporter:
            stop.wait()
    finally:
        kv.close()
    return 0


class _Stopper:
    """``server.stop()`` as a ``close()`` for an exit stack."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def close(self) -> None:
        self.server.stop()


def scheduler_process_config(args: argparse.Namespace) -> SchedulerProcessConfig:
    """The scheduler process's configuration from ``omega scheduler``'s arguments and
    its config file. Two forms: ``omega scheduler SCHEDULER [--policy P]`` runs the
    registered policy SCHEDULER (named SCHEDULER unless --name or the file names it)
    and hands P to it as its ``policy`` option; without SCHEDULER, ``--policy`` is the
    registered policy, as it always was."""
    from cellstate.api.config import read_toml
    from schedulers.process import scheduler_config

    doc = read_toml(args.config) if args.config else {}
    section = doc.get("scheduler")
    in_file = set(section) if isinstance(section, dict) else set()
    options = options_from_flags(args.option)
    name, policy = args.name, args.policy
    if args.scheduler:
        if policy is not None:
            if "policy" in options:
                raise ValueError("give the policy's `policy` option once: --policy or "
                                 "--option policy=..., not both")
            options["policy"] = policy
        policy = args.scheduler
        if name is None and "name" not in in_file:
            name = args.scheduler
    elif policy is not None:
        _hint_flow_form(policy)
    overrides = {"name": name, "policy": policy, "instance": args.instance,
                 "cell": args.cell, "mode": args.mode, "detection": args.detection,
                 "seed": args.seed}
    from omega.clientconfig import default

    overrides["cellstate"] = args.cellstate or (
        None if "cellstate" in in_file else default("cellstate", DEFAULT_CELLSTATE))
    return scheduler_config(doc, overrides, args.config or "", options)


def _scheduler_tls(args: argparse.Namespace, config: SchedulerProcessConfig,
                   ) -> SchedulerProcessConfig:
    """The scheduler's TLS files; its certificate must name it (``scheduler:NAME``)."""
    import attrs

    tls = tls_from_args(args)
    name = _cert_name(tls, "scheduler")
    if tls is not None and name != config.name:
        raise ValueError(f"--cert {tls.cert} names scheduler {name!r}, not {config.name!r}: "
                         "the server would refuse every call")
    return attrs.evolve(config, tls=tls)


def _cert_name(tls: Any, kind: str) -> str:
    """The name of a ``kind:NAME`` certificate, or "" (no TLS, or another kind)."""
    from omega.security import certificate_identity

    if tls is None:
        return ""
    who = certificate_identity(tls.cert)
    return who.name if who.kind.value == kind else ""


def _certs(args: argparse.Namespace) -> int:
    from cellstate.api.auth import parse_identity
    from omega.certs import DEFAULT_HOSTS, DevCA, cell_identities
    from schedulers.registry import Registry

    who = ([parse_identity(i, "KIND:NAME") for i in args.identities] if args.identities else
           cell_identities(sorted(Registry.from_entry_points().names()), args.agents))
    hosts = args.host or [*DEFAULT_HOSTS, "cellstate-0", "cellstate-1", "cellstate-2"]
    ca = DevCA(Path(args.dir), Path(args.ca_key) if args.ca_key else None)
    for identity in who:
        files = ca.files(identity)
        if not (args.keep and files.cert.exists() and files.key.exists()):
            files = ca.issue(identity, hosts, args.days)
        print(f"{identity}: {files.cert} {files.key}")
    for member in args.etcd_member:
        files = ca.issue_etcd_member(member, DEFAULT_HOSTS, keep=args.keep)
        print(f"etcd member {member}: {files.cert} {files.key}")
    if args.etcd_member:
        files = ca.issue_etcd_root(keep=args.keep)
        print(f"etcd root user: {files.cert} {files.key}")
    print(f"CA: {ca.ca_path} (its key {ca.key_path} signs new "
          "certificates: keep it private)")
    return 0


def _hint_flow_form(policy: str) -> None:
    """`--policy quincy` without SCHEDULER names a registered policy; a flow cost model
    there is the newer form mistyped: say which command was meant."""
    from schedulers.registry import Registry

    if policy in Registry.from_entry_points().names():
        return
    from schedulers.flow.costs import COST_MODELS

    if policy in COST_MODELS:
        raise ValueError(f"no scheduler policy named {policy!r}; {policy} is a cost model of "
                         f"the flow scheduler: omega scheduler flow --policy {policy}")


def _scheduler(args: argparse.Namespace) -> int:
    import attrs

    from omega.signals import stop_event_on_signals
    from schedulers.process import make_policy, run_scheduler
    from schedulers.registry import Registry

    config = scheduler_process_config(args)
    # The policy before the certificate: `omega scheduler nosuch` with a certificate
    # of another scheduler is a policy that does not exist, and says so.
    make_policy(Registry.from_entry_points(), config)
    config = attrs.evolve(_scheduler_tls(args, config), metrics=args.metrics)
    run_scheduler(config, stop_event_on_signals())  # bad options stop it before it connects
    return 0


def _workload(args: argparse.Namespace) -> int:
    from cellstate.api.client import CellClient
    from cellstate.model import Job
    from cellstate.store import StoreError
    from omega.signals import stop_event_on_signals
    from omega.workload import CachedHosts, WorkloadOptions, generate

    if args.flow_fraction + args.mapreduce_fraction + args.fair_fraction > 0.8:
        raise ValueError(f"--flow-fraction ({args.flow_fraction:g}), --mapreduce-fraction "
                         f"({args.mapreduce_fraction:g}) and --fair-fraction "
                         f"({args.fair_fraction:g}) together must be at most 0.8 (the "
                         "service scheduler's 0.2 comes first)")
    stop = stop_event_on_signals()
    if args.duration:
        threading.Timer(args.duration, stop.set).start()
    with CellClient(_endpoints(args.cellstate), tls=tls_from_args(args)) as client:
        opts = WorkloadOptions(args.jobs_per_second, flow_fraction=args.flow_fraction,
                               mapreduce_fraction=args.mapreduce_fraction,
                               fair_fraction=args.fair_fraction, seed=args.seed,
                               prefix=args.prefix)
        hosts = CachedHosts(lambda: [m["id"] for m in client.list_machines()], time.monotonic)
        refused: list[str] = []

        def submit(job: Job) -> None:
            try:
                client.submit_job(job)
            except StoreError as e:  # refused (say, its scheduler is not up yet): go on
                refused.append(job.id)
                logging.getLogger("omega.workload").warning("%s", e)

        n = generate(submit, opts, stop, hosts=hosts)
    from omega.logfmt import announce

    announce("submitted %d jobs (%d refused)", n - len(refused), len(refused))
    return 0


def _admin(args: argparse.Namespace) -> int:
    from cellstate.api.config import addresses
    from cellstate.invariants import layout_violations, violations
    from cellstate.kv.base import range_all
    from cellstate.replica import snapshot_from_kvs
    from cellstate.store import CellStore

    kv = etcd_access_from_args(args).connect(addresses(args.etcd, "--etcd"), args.cell)
    try:
        store = CellStore(kv, args.cell)
        if args.command == "recover":
            touched = store.recover()
            _emit(args, {"gangs": touched}, f"settled or cleared {len(touched)} gang(s)")
            return 0
        res = range_all(kv, store.keys.root)
        snap = snapshot_from_kvs(store.keys, res.kvs, res.revision)
        problems = violations(snap) + layout_violations(store.keys, res.kvs)
        _emit(args, {"revision": snap.revision, "violations": problems},
              "\n".join(problems) or f"cell {args.cell} at revision {snap.revision}: ok")
        return 1 if problems else 0
    finally:
        kv.close()


def _etcd_auth(args: argparse.Namespace) -> int:
    from cellstate.api.config import addresses
    from cellstate.etcd_auth import RoleKind, lock_down

    users = [_etcd_user(spec, RoleKind.SERVER) for spec in args.server]
    users += [_etcd_user(spec, RoleKind.READER) for spec in args.reader]
    root = (_password(Path(args.root_password_file), "--root-password-file")
            if args.root_password_file else None)
    access = etcd_access_from_args(args)
    kv = access.connect(addresses(args.etcd, "--etcd"), args.cell)
    try:
        made = lock_down(kv, args.cell, users, root)
    finally:
        kv.close()
    print(f"etcd auth on for cell {args.cell}: "
          f"{'made ' + ', '.join(made) if made else 'everything was there already'}")
    return 0


def _etcd_user(spec: str, kind: str) -> Any:
    from cellstate.etcd_auth import EtcdUser

    name, _, password_file = spec.partition("=")
    if not name:
        raise ValueError(f"--{kind} {spec!r}: no user name")
    password = _password(Path(password_file), f"--{kind} {name}") if password_file else None
    return EtcdUser(name, kind, password)


def _password(path: Path, where: str) -> str:
    password = path.read_text().strip()
    if not password:
        raise ValueError(f"{where}: {path} is empty")
    return password


# -- job specs from files and flags ----------------------------------------------------


def _job_docs(args: argparse.Namespace, owner: str) -> list[dict[str, Any]]:
    command = shlex.split(args.task_command) if args.task_command else []
    if args.file:
        if args.id or command:
            raise ValueError("give either --file or --id/flags, not both")
        return load_job_file(Path(args.file))
    if not args.id:
        raise ValueError("give a job spec with --file, or at least --id (see omega submit -h)")
    doc: dict[str, Any] = {
        "id": args.id, "owner": args.owner or owner, "scheduler": args.scheduler,
        "task_count": args.tasks,
        "task_resources": {"cpu": args.cpu, "mem": args.mem,
                           **({"gpu": args.gpu} if args.gpu else {})},
        "kind": args.kind, "precedence": args.precedence, "gang": args.gang,
    }
    if args.priority:
        doc["priority"] = args.priority
    if args.duration is not None:
        doc["duration"] = args.duration
    if command:
        doc["command"] = command
    return [doc]


# -- output --------------------------------------------------------------------------


def _emit(args: argparse.Namespace, doc: object, text: str | Callable[[bool], str]) -> None:
    """``doc`` as JSON or ``text``, as the output flags say (omega/cliglobal.py)."""
    from omega.cliglobal import emit

    emit(args, doc, text)


if __name__ == "__main__":
    sys.exit(main())

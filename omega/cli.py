"""The `omega` command line: start each process, submit and inspect jobs, run the demo.

Each command is a module of its own in :mod:`omega.commands` (its flags and its
handler); this module builds the parser from them, parses (the global flags of
:mod:`omega.cliglobal` anywhere on the line) and runs the handler, turning expected
failures into one line and a documented exit code.

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
import logging
import sys
from collections.abc import Sequence
from typing import Any

from cellstate.model import ModelError

# Kept here for callers of the command line's pieces (tests, docs).
from omega.commands.common import (
    DEFAULT_CELLSTATE as DEFAULT_CELLSTATE,
    option_value as option_value,
    options_from_flags as options_from_flags,
)
from omega.commands.scheduler import scheduler_process_config as scheduler_process_config


def build_parser() -> argparse.ArgumentParser:
    from omega.cliglobal import install
    from omega.commands import register_all

    p = argparse.ArgumentParser(
        prog="omega", description="Omega-style shared-state cell.",
        epilog="Global flags (-v, --json, -o) go before or after the command. Exit codes: "
               "0 ok, 1 invariant broken (check, demo), 2 bad input or refused, 3 no "
               "server answered, 4 cannot listen, 130 interrupted, 141 output closed.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_all(sub)
    install(p, sub)
    return p


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

    return cliglobal.run(args.command, lambda: args.func(args), [
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


if __name__ == "__main__":
    sys.exit(main())

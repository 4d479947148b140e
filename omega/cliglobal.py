"""What every ``omega`` command shares: the global flags (accepted before or after the
subcommand), the output format, the exit codes, and how an expected failure ends the
process (a message on stderr and a documented code, never a traceback).

Exit codes (docs/operations.md, "Exit codes")::

    0   ok
    1   `check`: an invariant is broken; `demo`: its final checks failed
    2   bad input (flags, files, specs) or a request the cell refused
    3   a server did not answer (the cellstate service, or etcd for server/check/recover)
    4   cannot listen on the address given (in use, or not allowed)
    130 interrupted (Ctrl-C)
    141 the output was closed early (`omega jobs | head -1`): nothing is printed
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, Protocol

OK, BROKEN, BAD_INPUT, UNREACHABLE, CANNOT_LISTEN = 0, 1, 2, 3, 4
INTERRUPTED, PIPE_CLOSED = 130, 128 + signal.SIGPIPE
OUTPUTS = ("table", "wide", "json")


# What a bind fails with when the address is taken, not ours, or not allowed.
_LISTEN_ERRORS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


class CannotListen(OSError):
    """The address to serve on is taken or not allowed (exit 4)."""


def version() -> str:
    try:
        return metadata.version("omega-cell")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def add_global_flags(p: argparse.ArgumentParser, top: bool) -> None:
    """The flags every command takes. On subcommands their default is "not given", so
    that a flag given before the subcommand is not undone by the subcommand's default;
    a flag a subcommand already defines (say, its own ``-o``) is left to it."""
    taken = set(p._option_string_actions)  # argparse has no public accessor for this

    def add(*names: str, **kw: Any) -> None:
        if taken.intersection(names):
            return
        if not top:
            kw["default"] = argparse.SUPPRESS
        p.add_argument(*names, **kw)

    add("-v", "--verbose", action="count", default=0,
        help="log more (-vv: debug); anywhere on the line")
    add("--json", action="store_true", default=False,
        help="machine-readable output (same as -o json); anywhere on the line")
    add("-o", "--output", choices=OUTPUTS, default=None,
        help="output format: table (default), wide (more columns) or json; default "
             "$OMEGA_OUTPUT or the config file's")
    add("--log-format", choices=("text", "json"), default=None,
        help="log lines as text (default) or one JSON object each; every line has a UTC "
             "timestamp; default $OMEGA_LOG_FORMAT or the config file's")


def install(parser: argparse.ArgumentParser, subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
            ) -> None:
    """Global flags on the top-level parser and on every subcommand, and --version."""
    parser.add_argument("--version", action="version", version=f"omega {version()}")
    add_global_flags(parser, top=True)
    for sub in subparsers.choices.values():
        add_global_flags(sub, top=False)


def output_format(args: argparse.Namespace) -> str:
    """json, table or wide: ``--json`` wins, then ``-o``, then $OMEGA_OUTPUT."""
    if getattr(args, "json", False):
        return "json"
    from omega.clientconfig import default

    chosen = getattr(args, "output", None) or default("output", "") or "table"
    return chosen if chosen in OUTPUTS else "table"


def emit(args: argparse.Namespace, doc: object, text: str | Callable[[bool], str]) -> None:
    """``doc`` as JSON (``--json``, ``-o json``), else ``text`` (a string, or made
    from whether ``-o wide`` was asked for)."""
    fmt = output_format(args)
    if fmt == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(text if isinstance(text, str) else text(fmt == "wide"))


def parse(parser: argparse.ArgumentParser, subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
          argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse; an unknown flag is reported with the usage of the subcommand it was
    given to, not the top-level usage."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = getattr(args, "command", None)
        target = subparsers.choices.get(command, parser) if command else parser
        target.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def check_listen(address: str) -> None:
    """Fail early, before loading anything, when ``host:port`` cannot be listened on
    (the server's own bind is the final word; this only spares a long start-up)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError) as e:
        raise CannotListen(f"cannot listen on {address}: {e}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as s:
        # As gRPC's own bind does: a port whose last server was killed a moment ago
        # (its connections in TIME_WAIT) is free; one another process listens on is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as e:
            why = "the address is in use" if e.errno == errno.EADDRINUSE else e.strerror
            raise CannotListen(f"cannot listen on {address}: {why}") from None


class _Startable(Protocol):
    def start(self) -> int: ...

    def stop(self) -> None: ...


def start_server(server: _Startable, listen: str) -> int:
    """Start a server; if it fails, stop what it started (its threads would keep the
    process alive) and say why in words: grpc reports a bind failure as a bare
    RuntimeError."""
    try:
        return server.start()
    except BaseException as e:
        server.stop()
        if isinstance(e, RuntimeError) and "bind" in str(e).lower():
            raise CannotListen(f"cannot listen on {listen}: the address is in use or not "
                               "allowed") from None
        raise


def run(command: str, body: Callable[[], int],
        failures: Sequence[tuple[type[BaseException] | tuple[type[BaseException], ...],
                                 int, Callable[[BaseException], str]]]) -> int:
    """Run a command's body; each expected failure (``failures``: exception types,
    exit code, message) ends it with ``omega COMMAND: message`` on stderr and its
    code. A closed output ends it quietly (141), Ctrl-C with 130."""
    try:
        code = body()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return pipe_closed()
    except KeyboardInterrupt:
        print(f"omega {command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except CannotListen as e:
        print(f"omega {command}: {e}", file=sys.stderr)
        return CANNOT_LISTEN
    except Exception as e:
        if isinstance(e, OSError) and e.errno in _LISTEN_ERRORS and str(
                e.strerror).startswith("cannot "):
            print(f"omega {command}: {e.strerror}", file=sys.stderr)  # a metrics listener
            return CANNOT_LISTEN
        for kinds, code, message in failures:
            if isinstance(e, kinds):
                print(f"omega {command}: {message(e)}", file=sys.stderr)
                return code
        raise


def pipe_closed() -> int:
    # Python would complain again when it flushes stdout at exit: point it at
    # /dev/null first (the recipe in the signal module's documentation).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return PIPE_CLOSED


def cell_client(args: argparse.Namespace, retry_for: float = 5.0) -> Any:
    """A client of the cellstate servers ``--cellstate`` names, with the command's TLS
    flags (a CellClient; imported here, not at the top: most commands need none)."""
    from cellstate.api.client import CellClient
    from cellstate.api.config import addresses
    from omega.security import tls_from_args

    return CellClient(addresses(args.cellstate, "--cellstate"), retry_for=retry_for,
                      tls=tls_from_args(args))

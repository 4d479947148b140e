"""What the commands share: their flags' types and the cellstate flag, the address
and certificate helpers, and the output (omega/cliglobal.py has the global flags)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

DEFAULT_CELLSTATE = "127.0.0.1:7070"


def positive(kind: type[float] | type[int]) -> Callable[[str], float | int]:
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


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 0.8:  # the service scheduler's 0.2 comes first
        raise argparse.ArgumentTypeError(f"must be from 0 to 0.8, got {text}")
    return value


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of at least 0")
    return v


def user_weight(text: str) -> tuple[str, float]:
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


def non_negative_int(text: str) -> int:
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


def option(text: str) -> tuple[str, int | float | bool | str]:
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


def cellstate_flag(p: argparse.ArgumentParser) -> None:
    from omega.clientconfig import default

    p.add_argument("--cellstate", default=default("cellstate", DEFAULT_CELLSTATE),
                   help="cellstate server address(es), comma-separated (default "
                        f"$OMEGA_CELLSTATE, the config file's, or {DEFAULT_CELLSTATE})")


def endpoints(text: str) -> tuple[str, ...]:
    from cellstate.api.config import addresses

    return addresses(text, "--cellstate")


def cert_name(tls: Any, kind: str) -> str:
    """The name of a ``kind:NAME`` certificate, or "" (no TLS, or another kind)."""
    from omega.security import certificate_identity

    if tls is None:
        return ""
    who = certificate_identity(tls.cert)
    return who.name if who.kind.value == kind else ""


def emit(args: argparse.Namespace, doc: object, text: str | Callable[[bool], str]) -> None:
    """``doc`` as JSON or ``text``, as the output flags say (omega/cliglobal.py)."""
    from omega.cliglobal import emit as cliglobal_emit

    cliglobal_emit(args, doc, text)


def cell_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", default="default", help="cell name (default 'default')")


def watch_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-w", "--watch", action="store_true",
                   help=f"keep watching: {what} (Ctrl-C stops)")


def snapshots(args: argparse.Namespace) -> Iterator[Any]:
    """The cell as a server's sync stream shows it: its snapshot at one revision, then
    (for ``--watch``) a newer one each time the cell changed, at most once a second.
    Ctrl-C ends a watch (exit 130, as every command)."""
    from cellstate.api.client import remote_replica
    from omega.cliglobal import cell_client

    with cell_client(args) as client:
        replica = remote_replica(client, getattr(args, "cell", "default"))
        replica.load()
        snap = replica.snapshot()
        yield snap
        while getattr(args, "watch", False):
            replica.pump(timeout=1.0)
            newer = replica.snapshot()
            if newer.revision != snap.revision:
                snap = newer
                yield snap

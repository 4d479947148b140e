"""``omega limits``: each scheduler's limits (Omega §3.4) and what it holds of them, and
an operator's live change of one scheduler's limits.

    omega limits                      # every scheduler with limits
    omega limits batch                # one scheduler's
    omega limits batch --max-resources cpu=2000,mem=8000 --max-precedence 4
    omega limits batch --max-resources none   # no resource limit any more
    omega limits fair --share default=cpu=100 --share alice=cpu=200 --quota bob=count=50

A change is one call to a cellstate server (operators only), which rewrites the cell's
config from that revision on: every scheduler's runtime sees it (a job held back by the
old limit runs at once if the new one lets it), every server's store judges claims by
it. A field not given keeps its value. A server whose configuration has ``[limits.NAME]``
tables writes them at its start-up, over what was set here (docs/operations.md).
"""

from __future__ import annotations

import argparse
from typing import Any

_NONE = "none"


ORDER = 37


def register(sub: Any) -> None:
    from omega.commands.common import cellstate_flag

    p = sub.add_parser(
        "limits", help="show schedulers' limits and what they hold; set one's (operators)",
        description="Show each scheduler's limits and what it holds of them, or, with "
                    "--max-precedence or --max-resources, change one scheduler's limits "
                    "(operators only; a field not given keeps its value).")
    cellstate_flag(p)
    p.add_argument("scheduler", nargs="?", metavar="SCHEDULER",
                   help="the scheduler to show or change (default: show every one)")
    # Not given: no attribute at all (None is a value one may give: 'none').
    p.add_argument("--max-precedence", type=_precedence, metavar="N|none",
                   default=argparse.SUPPRESS,
                   help="the highest precedence its jobs may have ('none': no limit)")
    p.add_argument("--max-resources", type=_resources, metavar="DIM=AMOUNT,...|none",
                   default=argparse.SUPPRESS,
                   help="what it may hold in all, e.g. cpu=2000,mem=8000 (a dimension "
                        "not named is not limited; 'none': no resource limit)")
    p.add_argument("--share", type=_user_entry, action="append", metavar="USER=DIM=AMOUNT,...",
                   help="a fair scheduler's user's share (Cook's divisors), e.g. "
                        "alice=cpu=200,mem=800; 'default' stands for users not named; "
                        "USER=none removes it (repeat for several users)")
    p.add_argument("--quota", type=_user_entry, action="append",
                   metavar="USER=count=N,DIM=AMOUNT,...",
                   help="a fair scheduler's user's quota: at most count running tasks "
                        "holding at most these amounts, e.g. bob=count=50,cpu=100; "
                        "'default' for users not named; USER=none removes it")
    p.set_defaults(func=run)


def _user_entry(text: str) -> tuple[str, dict[str, float] | None]:
    user, sep, rest = text.partition("=")
    if not sep or not user.strip() or not rest:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not USER=DIM=AMOUNT,... (e.g. alice=cpu=200,mem=800, "
            "or alice=none)")
    entry = _resources(rest)
    if entry is not None and "count" in entry and float(entry["count"]).is_integer():
        # A whole count is an integer to the config (1.5 stays a float: refused there).
        entry = {**entry, "count": int(entry["count"])}
    return user.strip(), entry


def _precedence(text: str) -> int | None:
    if text == _NONE:
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number or 'none'") from None


def _resources(text: str) -> dict[str, float] | None:
    if text == _NONE:
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        dim, sep, amount = part.partition("=")
        if not sep or not dim.strip():
            raise argparse.ArgumentTypeError(
                f"{part!r} is not DIMENSION=AMOUNT (e.g. cpu=2000,mem=8000, or 'none')")
        try:
            out[dim.strip()] = float(amount)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{dim.strip()}: {amount!r} is not a number") from None
    return out


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client, emit
    from omega.statusfmt import limits_text

    changes: dict[str, Any] = {name: getattr(args, name)
                               for name in ("max_precedence", "max_resources")
                               if hasattr(args, name)}
    for flag, field in (("share", "shares"), ("quota", "quotas")):
        if getattr(args, flag):
            changes[field] = dict(getattr(args, flag))
    with cell_client(args) as client:
        if changes:
            if args.scheduler is None:
                raise ValueError("name the scheduler whose limits to change "
                                 "(omega limits SCHEDULER --max-resources ...)")
            done = client.set_limits(args.scheduler, changes)
            what = ("unchanged" if not done["revision"]
                    else f"set (revision {done['revision']})")
            emit(args, done, f"limits of {args.scheduler} {what}: "
                             f"{limits_text(done)}")
            return 0
        limits = client.status().get("limits") or {}
    if args.scheduler is not None:
        if args.scheduler not in limits:
            raise ValueError(f"scheduler {args.scheduler!r} has no limits in this cell "
                             f"(schedulers with limits: {', '.join(sorted(limits)) or 'none'})")
        limits = {args.scheduler: limits[args.scheduler]}
    emit(args, limits, "\n".join(f"limits of {name}: {limits_text(lim)}"
                                 for name, lim in sorted(limits.items()))
         or "no scheduler has limits in this cell")
    return 0

"""``omega events [--job J] [--machine M] [-w]``: what happened to the cell's tasks,
oldest first: placed, moved, preempted (by whom, for which task), lost (with their
machine), finished, failed, killed (by whom, why), each with its time; from the task
records' histories (omega/cellview.py), so every reader sees the same."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from omega.commands.common import (
    cell_flag,
    cellstate_flag,
    emit,
    non_negative_int,
    snapshots,
    watch_flag,
)

ORDER = 27


def register(sub: Any) -> None:
    p = sub.add_parser("events", help="the history of the cell's tasks: placements, "
                                      "preemptions, losses, kills, ends (-w: follow)")
    cellstate_flag(p)
    cell_flag(p)
    p.add_argument("--job", default="", help="only this job's tasks")
    p.add_argument("--machine", default="", help="only events on this machine")
    p.add_argument("--since", type=non_negative_int, default=0, metavar="SECONDS",
                   help="only the last SECONDS seconds (default 0: every event kept)")
    p.add_argument("--limit", type=non_negative_int, default=50,
                   help="at most the latest N (default 50; 0: all)")
    watch_flag(p, "print each new event as it happens")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cellview import events, events_table

    since = time.time() - args.since if args.since else 0.0
    seen: set[tuple[str, float, str]] = set()
    for n, snap in enumerate(snapshots(args)):
        rows = [e for e in events(snap, args.job, args.machine, since)
                if (e.task, e.at, e.event) not in seen]
        if n == 0 and args.limit:
            rows = rows[-args.limit:]
        seen.update((e.task, e.at, e.event) for e in rows)
        if n == 0:
            emit(args, [e.doc() for e in rows], events_table(rows))
        elif rows:  # a watch: the new ones, as table rows or JSON lines
            emit(args, [e.doc() for e in rows], events_table(rows, header=False))
        sys.stdout.flush()
    return 0

"""``omega top [--by machine|job|scheduler] [-w]``: the busiest machines (by their
fullest resource), or the jobs or schedulers holding the most, from one snapshot of
the cell; ``-w`` shows it again whenever the cell changes (at most once a second)."""

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

ORDER = 36


def register(sub: Any) -> None:
    p = sub.add_parser("top", help="the busiest machines, or the jobs or schedulers "
                                   "holding the most (-w: keep showing)")
    cellstate_flag(p)
    cell_flag(p)
    p.add_argument("--by", choices=["machine", "job", "scheduler"], default="machine",
                   help="what to rank (default machine)")
    p.add_argument("--limit", type=non_negative_int, default=20,
                   help="at most N rows (default 20; 0: all)")
    watch_flag(p, "show it again whenever the cell changes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cellview import top_doc, top_text

    last = 0.0
    for snap in snapshots(args):
        if args.watch:  # at most once a second: a busy cell changes many times a second
            time.sleep(max(0.0, last + 1.0 - time.monotonic()))
            last = time.monotonic()
        rows = top_doc(snap, args.by, args.limit)
        emit(args, rows, top_text(rows, args.by, snap.revision))
        sys.stdout.flush()
    return 0

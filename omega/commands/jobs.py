"""``omega jobs``: the cell's jobs, newest first."""

from __future__ import annotations

import argparse
from typing import Any

from omega.commands.common import cellstate_flag, emit, non_negative_int

ORDER = 21


def register(sub: Any) -> None:
    j = sub.add_parser("jobs", help="list jobs, newest first")
    cellstate_flag(j)
    j.add_argument("--scheduler", default="", help="only this scheduler's jobs")
    j.add_argument("--status", "--state", dest="state", default="",
                   choices=["", "pending", "running", "finished", "failed", "abandoned",
                            "killed"], help="only jobs in this state")
    j.add_argument("--limit", type=non_negative_int, default=0,
                   help="at most this many jobs (default 0: all)")
    j.add_argument("--oldest-first", action="store_true",
                   help="oldest submission first (default: newest first)")
    j.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client
    from omega.tables import jobs_table

    with cell_client(args) as client:
        listed = client.list_jobs(args.scheduler, args.state, args.limit,
                                  newest_first=not args.oldest_first)
        emit(args, listed, lambda wide: jobs_table(listed, wide))
    return 0

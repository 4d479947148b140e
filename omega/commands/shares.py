"""``omega shares``: each user's share of a fair scheduler and what their next
waiting task would do."""

from __future__ import annotations

import argparse
import time
from typing import Any

from omega.commands.common import cellstate_flag, emit, non_negative_float, user_weight

ORDER = 40


def register(sub: Any) -> None:
    sh = sub.add_parser("shares", help="each user's share of a fair scheduler and what "
                                       "their next waiting task would do now")
    cellstate_flag(sh)
    sh.add_argument("--scheduler", default="fair", help="the fair scheduler's name (default "
                                                         "fair)")
    sh.add_argument("--cell", default="default", help="cell name (default 'default')")
    sh.add_argument("--delta", type=non_negative_float, default=None,
                    help="the tolerance in CRS (default: what a live instance reports, "
                         "else 0.05)")
    sh.add_argument("--weight", type=user_weight, action="append", default=[],
                    metavar="USER=W", help="a user's weight (default: what a live instance "
                                           "reports, else 1); repeatable")
    sh.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client

    with cell_client(args) as client:
        from omega.shares import shares, shares_text

        doc = shares(client, args.scheduler, args.cell, args.delta, args.weight,
                     time.time())
        emit(args, doc, shares_text(doc))
    return 0

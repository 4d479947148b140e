"""``omega machines``: the cell's machines."""

from __future__ import annotations

import argparse
from typing import Any

from omega.commands.common import cellstate_flag, emit, non_negative_int

ORDER = 30


def register(sub: Any) -> None:
    m = sub.add_parser("machines", help="list machines")
    cellstate_flag(m)
    m.add_argument("--status", "--state", dest="state", default="",
                   choices=["", "up", "cordoned", "draining", "down"],
                   help="only machines in this state")
    m.add_argument("--limit", type=non_negative_int, default=0,
                   help="at most this many machines (default 0: all)")
    m.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client
    from omega.tables import machines_table

    with cell_client(args) as client:
        machines = client.list_machines(args.state, args.limit)
        emit(args, machines, lambda wide: machines_table(machines, wide))
    return 0

"""``omega machine ID``: one machine described (as ``kubectl describe node``): its
state, agent, rack and labels, capacity and use, each task it runs with its start,
and the latest events of tasks on it."""

from __future__ import annotations

import argparse
import time
from typing import Any

from omega.commands.common import cell_flag, cellstate_flag, emit, snapshots

ORDER = 30


def register(sub: Any) -> None:
    p = sub.add_parser("machine", help="describe one machine: state, capacity and use, "
                                       "its tasks, recent events")
    cellstate_flag(p)
    cell_flag(p)
    p.add_argument("machine_id", metavar="MACHINE", help="the machine's id")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cellview import machine_doc, machine_text

    snap = next(snapshots(args))
    doc = machine_doc(snap, args.machine_id, time.time())
    emit(args, doc, machine_text(doc))
    return 0

"""``omega status``: utilization, jobs and tasks by state, each scheduler."""

from __future__ import annotations

import argparse
from typing import Any

from omega.commands.common import cellstate_flag, emit

ORDER = 35


def register(sub: Any) -> None:
    st = sub.add_parser("status", help="cell status: utilization, jobs, per-scheduler metrics")
    cellstate_flag(st)
    st.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client

    with cell_client(args) as client:
        from omega.statusfmt import status_text

        status = client.status()
        emit(args, status, status_text(status))
    return 0

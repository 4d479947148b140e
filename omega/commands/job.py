"""``omega job JOB``, ``omega why JOB`` and ``omega kill JOB``: one job, why its
tasks wait, and ending it."""

from __future__ import annotations

import argparse
import os
from typing import Any

from omega.commands.common import cellstate_flag, emit

ORDER = 22


def register(sub: Any) -> None:
    for name, text in (("job", "show one job, its tasks and why any wait"),
                       ("why", "why a job's tasks are pending: the cell's reasons and each "
                               "scheduler's last attempt"),
                       ("kill", "kill a job")):
        x = sub.add_parser(name, help=text)
        cellstate_flag(x)
        x.add_argument("job_id", metavar="JOB", help="the job's id")
        if name == "kill":
            x.add_argument("--reason", default="killed by a user",
                           help="why, kept with the job (default 'killed by a user')")
        x.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client

    cmd = args.command
    with cell_client(args) as client:
        if cmd == "kill":
            revision = client.kill_job(args.job_id, args.reason, os.environ.get("USER", "user"))
            emit(args, {"job": args.job_id, "revision": revision}, f"killed {args.job_id}")
            return 0
        from omega.jobview import job_text, why_text

        info = client.get_job(args.job_id)
        if cmd == "why":
            from omega.jobview import waiting

            emit(args, {"job": args.job_id, "state": info["state"],
                         "pending": waiting(info),
                         "reason": info.get("reason", ""), **info.get("why", {})},
                  why_text(info))
        else:
            emit(args, info, job_text(info))
    return 0

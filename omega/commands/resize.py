"""``omega resize JOB --tasks N``: grow a job, or scale it down (the running tasks
beyond the new count stop, the highest index first, as killed).

One call to a cellstate server, which authorizes it (the job's owner, an operator or
its scheduler) and has the store's judge decide it (``decisions.resize_job``).
"""

from __future__ import annotations

import argparse
from typing import Any

ORDER = 25


def register(sub: Any) -> None:
    from omega.commands.common import cellstate_flag, positive

    positive_int = positive(int)
    r = sub.add_parser("resize", help="change a job's task count (grow it, or shrink it: "
                                      "its highest tasks stop first)")
    cellstate_flag(r)
    r.add_argument("job_id", metavar="JOB", help="the job's id")
    r.add_argument("--tasks", type=positive_int, required=True,
                   help="the job's new number of tasks")
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client, emit

    with cell_client(args) as client:
        revision = client.resize(args.job_id, args.tasks)
    emit(args, {"job": args.job_id, "task_count": args.tasks, "revision": revision},
         f"job {args.job_id}: {args.tasks} tasks (revision {revision})")
    return 0

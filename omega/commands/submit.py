"""``omega submit``: submit a job from a spec file or flags."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from omega.commands.common import cellstate_flag, cert_name, emit, non_negative_int, positive
from omega.jobfile import load_job_file

ORDER = 20


def register(sub: Any) -> None:
    sm = sub.add_parser("submit", help="submit a job from a spec file or flags")
    cellstate_flag(sm)
    sm.add_argument("--file", help="job spec (JSON or TOML): one job, or {\"jobs\": [...]}")
    sm.add_argument("--id", help="the job's id (letters, digits, '_', '.', '-'); new")
    sm.add_argument("--scheduler", default="batch",
                    help="the scheduler that places it (default batch)")
    sm.add_argument("--tasks", type=positive(int), default=1,
                    help="number of tasks (default 1)")
    sm.add_argument("--cpu", type=positive(float), default=1.0,
                    help="CPU cores per task (default 1; fractions allowed)")
    sm.add_argument("--mem", type=positive(float), default=1.0,
                    help="memory per task, GiB (default 1)")
    sm.add_argument("--gpu", type=positive(float), default=None,
                    help="GPUs per task (default none)")
    sm.add_argument("--kind", choices=["batch", "service"], default="batch",
                    help="batch (runs to completion, default) or service (long-running)")
    sm.add_argument("--precedence", type=non_negative_int, default=0,
                    help="higher evicts lower (default 0; at most the scheduler's limit)")
    sm.add_argument("--priority", type=int, default=0,
                    help="the job's rank among its owner's own jobs, higher first (a fair "
                         "scheduler orders each owner's jobs by it; default 0)")
    sm.add_argument("--gang", action="store_true", help="all tasks or none")
    sm.add_argument("--allow-unknown-scheduler", action="store_true",
                    help="accept it even if its scheduler has not run in the cell yet "
                         "(about to be started); otherwise refused once any has")
    sm.add_argument("--owner", help="the job's owner (default: the name of a user:NAME "
                                    "certificate, else $USER)")
    sm.add_argument("--duration", type=positive(float), help="seconds each task runs")
    sm.add_argument("--command", dest="task_command", default="",
                    help="a command each task runs, e.g. --command 'sleep 30' (split like a "
                         "shell would, but run without one)")
    sm.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client
    from omega.security import tls_from_args

    tls = tls_from_args(args)
    with cell_client(args) as client:
        jobs = _job_docs(args, cert_name(tls, "user") or os.environ.get("USER", "nobody"))
        for doc in jobs:
            client.submit_job(doc, args.allow_unknown_scheduler)
        ids = [str(d.get("id")) for d in jobs]
        emit(args, {"submitted": ids}, "\n".join(f"submitted {i}" for i in ids))
    return 0


def _job_docs(args: argparse.Namespace, owner: str) -> list[dict[str, Any]]:
    command = shlex.split(args.task_command) if args.task_command else []
    if args.file:
        if args.id or command:
            raise ValueError("give either --file or --id/flags, not both")
        return load_job_file(Path(args.file))
    if not args.id:
        raise ValueError("give a job spec with --file, or at least --id (see omega submit -h)")
    doc: dict[str, Any] = {
        "id": args.id, "owner": args.owner or owner, "scheduler": args.scheduler,
        "task_count": args.tasks,
        "task_resources": {"cpu": args.cpu, "mem": args.mem,
                           **({"gpu": args.gpu} if args.gpu else {})},
        "kind": args.kind, "precedence": args.precedence, "gang": args.gang,
    }
    if args.priority:
        doc["priority"] = args.priority
    if args.duration is not None:
        doc["duration"] = args.duration
    if command:
        doc["command"] = command
    return [doc]

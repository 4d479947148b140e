"""``omega jobs``: the cell's jobs, newest first."""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

from omega.commands.common import cellstate_flag, emit, non_negative_int, positive

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
    j.add_argument("--owner", default="", help="only this owner's jobs")
    j.add_argument("-l", "--label", action="append", default=[], type=_label,
                   metavar="KEY=VALUE",
                   help="only jobs with this label (repeatable: all of them; KEY alone: "
                        "any value)")
    j.add_argument("-w", "--watch", action="store_true",
                   help="keep watching: show the list again whenever it changes (checked "
                        "every --interval seconds; Ctrl-C stops)")
    j.add_argument("--interval", type=positive(float), default=2.0,
                   help="with --watch: seconds between looks (default 2)")
    j.set_defaults(func=run)


def _label(text: str) -> tuple[str, str | None]:
    key, sep, value = text.partition("=")
    if not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE or KEY")
    return key, value if sep else None


def matches(spec: dict[str, Any], owner: str, labels: list[tuple[str, str | None]]) -> bool:
    """Whether a job's spec passes the --owner and --label filters."""
    if owner and spec.get("owner", "") != owner:
        return False
    have = spec.get("labels") or {}
    return all(k in have and (v is None or have[k] == v) for k, v in labels)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client
    from omega.tables import jobs_table

    filtered = bool(args.owner or args.label)
    shown: list[dict[str, Any]] | None = None
    with cell_client(args) as client:
        while True:
            # The filters are the client's (the service lists by scheduler and state):
            # with one, the limit applies after it.
            listed = client.list_jobs(args.scheduler, args.state,
                                      0 if filtered else args.limit,
                                      newest_first=not args.oldest_first)
            listed = [j for j in listed if matches(j["spec"], args.owner, args.label)]
            if filtered and args.limit:
                listed = listed[:args.limit]
            if listed != shown:
                if shown is not None:
                    print(f"-- {time.strftime('%H:%M:%S')}", flush=True)
                emit(args, listed, functools.partial(jobs_table, listed))
                sys.stdout.flush()
                shown = listed
            if not args.watch:
                return 0
            time.sleep(args.interval)

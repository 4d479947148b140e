"""``omega logs JOB [TASK]``: the output of a job's command tasks.

An agent started with ``--log-dir DIR`` appends what task ``JOB/INDEX`` writes (stdout
and stderr) to ``DIR/JOB/INDEX.log``. This command asks the cell which of the job's
tasks ran and where, and prints their logs from the same folder (``--log-dir``,
$OMEGA_LOG_DIR or the config file's ``log_dir``): the agents' folder as this host sees
it (the agent's own host, or a shared mount).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ORDER = 24


def register(sub: Any) -> None:
    from omega.clientconfig import default
    from omega.commands.common import cellstate_flag, non_negative_int

    p = sub.add_parser("logs", help="print the output of a job's command tasks",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    cellstate_flag(p)
    p.add_argument("job_id", metavar="JOB", help="the job's id")
    p.add_argument("task", metavar="TASK", nargs="?", type=non_negative_int,
                   help="the task's index (default: every task that has run)")
    p.add_argument("--log-dir", default=default("log_dir"),
                   help="the agents' --log-dir (default $OMEGA_LOG_DIR or the config "
                        "file's log_dir)")
    p.add_argument("--tail", type=non_negative_int, default=0,
                   help="only the last N lines of each log (default 0: all)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="with TASK: print what the task writes as it writes it, until it "
                        "ends (Ctrl-C stops)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client, emit

    if not args.log_dir:
        raise ValueError("give the agents' log folder: --log-dir DIR (or $OMEGA_LOG_DIR, or "
                         "log_dir in the config file)")
    root = Path(args.log_dir)
    with cell_client(args) as client:
        info = client.get_job(args.job_id)
    count = int(info["spec"].get("task_count", 0))
    if args.task is not None and args.task >= count:
        raise ValueError(f"job {args.job_id} has {count} task(s): there is no task "
                         f"{args.task}")
    ran = {t["index"]: t for t in info.get("tasks", []) if t["state"] != "pending"}
    indices = [args.task] if args.task is not None else sorted(ran)
    logs = [_log(root, args.job_id, i, ran.get(i), args.tail) for i in indices]
    if args.follow:
        if args.task is None:
            raise ValueError("--follow follows one task: give its index (omega logs JOB "
                             "TASK -f)")
        return _follow(args, root)
    if args.task is not None and logs[0]["text"] is None:
        raise ValueError(f"no log of task {args.job_id}/{args.task} under {root} "
                         f"({logs[0]['why']})")
    emit(args, logs, lambda wide: _text(logs, single=args.task is not None))
    return 0


# A followed task is done once it is in one of these states (and its log is read out).
_ENDED = frozenset({"finished", "failed", "killed", "lost", "preempted"})


def _follow(args: argparse.Namespace, root: Path) -> int:
    """Print the task's log as it grows (from --tail N lines before the end), until the
    cell says the task ended and nothing more was written."""
    import sys
    import time

    from omega.cliglobal import cell_client

    path = root / args.job_id / f"{args.task}.log"
    offset = 0
    if args.tail and path.exists():
        lines = path.read_bytes().splitlines(keepends=True)
        offset = path.stat().st_size - sum(len(x) for x in lines[-args.tail:])
    with cell_client(args) as client:
        while True:
            state = _state(client.get_job(args.job_id), args.task)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            if chunk:
                offset += len(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            elif state in _ENDED:
                return 0
            else:
                time.sleep(0.5)


def _state(info: dict[str, Any], index: int) -> str:
    for t in info.get("tasks", []):
        if t["index"] == index:
            return str(t["state"])
    return "pending"


def _log(root: Path, job: str, index: int, task: dict[str, Any] | None, tail: int,
         ) -> dict[str, Any]:
    out: dict[str, Any] = {"task": f"{job}/{index}", "state": (task or {}).get("state",
                                                                             "pending"),
                           "machine": (task or {}).get("machine", ""), "text": None}
    path = root / job / f"{index}.log"
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        out["why"] = ("it has not run" if task is None else
                      f"it ran on {out['machine'] or 'a machine'} whose agent writes no log "
                      "here (agents need --log-dir; a job without a command writes none)")
        return out
    lines = text.splitlines()
    out["text"] = "\n".join(lines[-tail:] if tail else lines)
    out["path"] = str(path)
    return out


def _text(logs: list[dict[str, Any]], single: bool) -> str:
    if single:
        return str(logs[0]["text"])
    parts = []
    for log in logs:
        where = f" on {log['machine']}" if log["machine"] else ""
        body = log["text"] if log["text"] is not None else f"(no log: {log['why']})"
        parts.append(f"==> {log['task']} ({log['state']}{where}) <==\n{body}")
    return "\n\n".join(parts) or "no task of this job has run yet"

"""``omega update JOB [--command C] [--cpu N] [--mem N] [--duration S] [--batch N]``: a
rolling update of a job, as a Kubernetes Deployment rolls a new ReplicaSet in.

The cell's jobs are immutable (only their task count changes), so an update is a new
job, ``JOB.v2`` (then ``.v3``...), with the changed spec and the label
``omega.replaces=JOB``, grown while the old one shrinks, ``--batch`` tasks at a time:
each step first takes ``--batch`` tasks off the old job (its highest indexes stop, as
``omega resize`` does) and then asks for as many more of the new, and waits until they
run before the next step. Room is made before it is taken, so the job's anti-affinity
(tasks kept apart by label) and the cell's capacity hold all along; at most
``--batch`` tasks are missing at any time. The old job is killed once its last task
is replaced. If a step's new tasks do not all run within ``--timeout`` seconds the
update stops where it is and says so (both jobs are left as they are: ``omega why
JOB.vN`` says why its tasks wait).
"""

from __future__ import annotations

import argparse
import re
import shlex
import time
from typing import Any

from omega.commands.common import cellstate_flag, positive

ORDER = 26
REPLACES = "omega.replaces"  # the label a new version carries: the job it replaces


def register(sub: Any) -> None:
    p = sub.add_parser("update", help="roll a job over to a new spec (command, cpu, mem, "
                                      "duration), a batch of tasks at a time")
    cellstate_flag(p)
    p.add_argument("job_id", metavar="JOB", help="the running job to update")
    p.add_argument("--command", dest="task_command", help="the new command of each task")
    p.add_argument("--duration", type=positive(float), help="the new seconds each task runs")
    p.add_argument("--cpu", type=positive(float), help="the new CPU cores per task")
    p.add_argument("--mem", type=positive(float), help="the new memory per task, GiB")
    p.add_argument("--batch", type=positive(int), default=1,
                   help="tasks replaced at a time (default 1)")
    p.add_argument("--timeout", type=positive(float), default=120.0,
                   help="seconds a step's new tasks may take to run (default 120)")
    p.set_defaults(func=run)


def next_version(job_id: str) -> str:
    """``web`` -> ``web.v2``, ``web.v2`` -> ``web.v3``."""
    m = re.fullmatch(r"(.+)\.v(\d+)", job_id)
    return f"{m.group(1)}.v{int(m.group(2)) + 1}" if m else f"{job_id}.v2"


def new_spec(spec: dict[str, Any], args: argparse.Namespace, count: int) -> dict[str, Any]:
    """The next version's spec: ``spec`` with the changes asked for."""
    changes = {k: v for k, v in (("command", args.task_command), ("duration", args.duration),
                                 ("cpu", args.cpu), ("mem", args.mem)) if v is not None}
    if not changes:
        raise ValueError("nothing to update: give --command, --duration, --cpu or --mem")
    doc = {k: v for k, v in spec.items() if k not in ("submitted_at", "task_input")}
    doc["id"] = next_version(str(spec["id"]))
    doc["task_count"] = count
    doc["labels"] = {**(spec.get("labels") or {}), REPLACES: spec["id"]}
    resources = dict(spec["task_resources"])
    for dim in ("cpu", "mem"):
        if dim in changes:
            resources[dim] = changes[dim]
    doc["task_resources"] = resources
    if "command" in changes:
        doc["command"] = shlex.split(changes["command"])
        doc.pop("duration", None)
    if "duration" in changes:
        doc["duration"] = changes["duration"]
        doc.pop("command", None)
    return doc


def run(args: argparse.Namespace) -> int:
    from omega.cliglobal import cell_client

    with cell_client(args) as client:
        info = client.get_job(args.job_id)
        spec = info["spec"]
        if info["state"] not in ("running", "pending"):
            raise ValueError(f"job {args.job_id} is {info['state']}: only a running or "
                             "pending job is updated")
        if spec.get("gang") or spec.get("mapreduce"):
            what = "gang" if spec.get("gang") else "MapReduce job"
            raise ValueError(f"job {args.job_id} is a {what}: its tasks run together, so it "
                             "cannot be rolled over a batch at a time")
        total = int(spec["task_count"])
        first = new_spec(spec, args, min(args.batch, total))  # bad changes: nothing done
        new_id = str(first["id"])
        moved = 0
        while moved < total:
            step = min(args.batch, total - moved)
            left = total - moved - step
            if left:
                client.resize(args.job_id, left)
            else:
                client.kill_job(args.job_id, f"replaced by {new_id}",
                                f"omega update to {new_id}")
            if moved == 0:
                client.submit_job(first)
            else:
                client.resize(new_id, moved + step)
            moved += step
            _wait_running(client, new_id, moved, args.timeout, args.job_id, left)
            print(f"{new_id}: {moved}/{total} task(s) running; {args.job_id}: "
                  f"{left or 'none left (killed)'}", flush=True)
    print(f"updated {args.job_id} -> {new_id}")
    return 0


def _wait_running(client: Any, job_id: str, count: int, timeout: float, old: str,
                  left: int) -> None:
    deadline = time.monotonic() + timeout
    while True:
        running = int(client.get_job(job_id)["task_states"].get("running", 0))
        if running >= count:
            return
        if time.monotonic() >= deadline:
            raise ValueError(
                f"update stopped: {job_id} has {running} of {count} task(s) running after "
                f"{timeout:g} s; {old} keeps {left} (both left as they are; omega why "
                f"{job_id} says why its tasks wait)")
        time.sleep(0.5)

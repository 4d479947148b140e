"""How ``omega job`` and ``omega why`` show one job: its state, its tasks, and why the
tasks that wait are waiting (the cell's own reasons and each scheduler instance's
report of its last attempt, as the cellstate service returns them under ``why``)."""

from __future__ import annotations

import time
from typing import Any


def job_text(info: dict[str, Any], now: float | None = None) -> str:
    """The job, its tasks (one line each) and, when some wait, why."""
    lines = [_head(info)]
    spec = info["spec"]
    for t in info.get("tasks", []):
        lines.append(f"  {spec['id']}/{t['index']:<5} {t['state']:<10} {t['machine']:<10}"
                     f"{_run(t)}".rstrip())
    why = why_lines(info, now)
    if why:
        lines.append("why pending:")
        lines.extend(why)
    return "\n".join(lines)


# The states of a task that waits to be placed: never placed, or placed and taken off
# (its machine failed or was drained, or it was preempted). A scheduler's "fit
# nowhere" counts all of them, so `omega why` does too (issue 34).
WAITING = ("pending", "lost", "preempted")


def waiting(info: dict[str, Any]) -> int:
    """How many of the job's tasks wait to be placed (:data:`WAITING`)."""
    states = info.get("task_states", {})
    return sum(int(states.get(s, 0)) for s in WAITING)


def why_text(info: dict[str, Any], now: float | None = None) -> str:
    """The job's state and why its waiting tasks wait (``omega why``)."""
    states = info.get("task_states", {})
    pending = waiting(info)
    head = _head(info)
    if info.get("reason"):
        return head
    if not pending:
        return head + "\n  nothing is pending"
    lines = why_lines(info, now)
    if not lines:
        lines = ["  no scheduler has reported an attempt yet (reports arrive within a "
                 "second of one)"]
    parts = [f"{states[s]} {'never placed' if s == 'pending' else s}" for s in WAITING
             if states.get(s)]
    split = f" ({', '.join(parts)})" if len(parts) > 1 else ""
    return "\n".join([f"{head}: {pending} task(s) pending{split}", *lines])


def why_lines(info: dict[str, Any], now: float | None = None) -> list[str]:
    why = info.get("why")
    if not why:
        return []
    now = time.time() if now is None else now
    out = [f"  cell: {b['text']}" + (" (can never run)" if b.get("permanent") else "")
           for b in why.get("cell", [])]
    for r in why.get("schedulers", []):
        who = f"{r['scheduler']}/{r['instance']}"
        age = max(now - float(r.get("at", now)), 0.0)
        out.append(f"  {who}: attempt {r.get('attempts', '?')}, {age:.0f} s ago, placed "
                   f"{r.get('placed', 0)}")
        reasons = r.get("reasons", [])
        out.extend(f"    {x['code']}: {x['text']}" for x in reasons)
        if not reasons:
            out.append("    (no reason given: the rest is waiting for its retry)")
    return out


def _run(t: dict[str, Any]) -> str:
    """When its run was placed and by whom (``placed 10:02:01 by batch``) and how its
    last run ended: ``exit 1  10:02:03 -> 10:02:05 (2.0 s)``."""
    parts = []
    if t.get("placed_at"):
        parts.append(f"placed {_clock(t['placed_at'])}"
                     + (f" by {t['scheduler']}" if t.get("scheduler") else ""))
    if "exit_code" in t:
        parts.append(f"exit {t['exit_code']}")
    start, end = t.get("started_at"), t.get("ended_at")
    if start and end:
        parts.append(f"{_clock(start)} -> {_clock(end)} ({end - start:.1f} s)")
    elif start:
        parts.append(f"started {_clock(start)}")
    if t.get("detail"):
        parts.append(t["detail"])
    return "  ".join(parts)


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _head(info: dict[str, Any]) -> str:
    spec = info["spec"]
    return (f"job {spec['id']} ({spec['scheduler']}, {spec.get('kind', 'batch')}): "
            f"{info['state']}" + (f" - {info['reason']}" if info.get("reason") else ""))

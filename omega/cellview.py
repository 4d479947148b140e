"""What `omega events`, `omega machine` and `omega top` show, as pure functions of a
cell snapshot (read from a server's sync stream, as `omega plan` reads it).

Events come from the task records' histories (``TaskRecord.history``: placed, moved,
preempted, lost, finished, failed, killed, with when, where, who and why), so they are
the cell's own record, the same whichever server or process reads it; a record keeps
its latest ``HISTORY`` events, so older ones of a busy task are gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from cellstate.cell import CellSnapshot, machine_used
from cellstate.model import Machine, TaskEvent, TaskState
from omega.tables import age, table

# How an event reads, by the state the task entered.
_VERBS = {TaskState.RUNNING: "placed", TaskState.PREEMPTED: "preempted",
          TaskState.LOST: "lost", TaskState.FINISHED: "finished",
          TaskState.FAILED: "failed", TaskState.KILLED: "killed"}


@attrs.frozen
class Event:
    at: float
    task: str
    event: str  # placed, moved, preempted, lost, finished, failed, killed
    machine: str
    by: str
    why: str

    def doc(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _event(task: str, e: TaskEvent) -> Event:
    verb = "moved" if e.why.startswith("moved from") else _VERBS.get(e.state, e.state.value)
    return Event(e.at, task, verb, e.machine, e.by, e.why)


def task_events(tid: str, history: Iterable[TaskEvent]) -> list[Event]:
    """A task's events as :func:`events` lists them."""
    return [_event(tid, e) for e in history]


def events(snap: CellSnapshot, job: str = "", machine: str = "",
           since: float = 0.0) -> list[Event]:
    """Every event the cell's task records keep, oldest first (``job``, ``machine``:
    only those; ``since``: only later ones)."""
    out = []
    for tid, rec in snap.tasks.items():
        if job and rec.job != job:
            continue
        for e in rec.history:
            if e.at > since and (not machine or e.machine == machine):
                out.append(_event(tid, e))
    out.sort(key=lambda e: (e.at, e.task))
    return out


def follow(snapshots: Callable[[], CellSnapshot], job: str = "", machine: str = "",
           since: float = 0.0) -> Iterator[list[Event]]:
    """The events of each new snapshot not yielded before (``omega events -w``)."""
    seen: set[tuple[str, float, str]] = set()
    while True:
        fresh = [e for e in events(snapshots(), job, machine, since)
                 if (e.task, e.at, e.event) not in seen]
        seen.update((e.task, e.at, e.event) for e in fresh)
        yield fresh


def early_preemptions(rows: Iterable[Event], by: str, min_runtime: float
                      ) -> list[tuple[str, float]]:
    """(task, how long its run had lasted) of each preemption by scheduler ``by`` that
    came less than ``min_runtime`` after the task's placement (or move), among the
    events the records keep; ``rows`` oldest first, as :func:`events` gives them."""
    placed: dict[str, float] = {}
    out = []
    for e in rows:
        if e.event in ("placed", "moved"):
            placed[e.task] = e.at
        elif e.event == "preempted" and e.by == by and e.task in placed:
            ran = e.at - placed[e.task]
            if ran < min_runtime:
                out.append((e.task, ran))
    return out


def causeless_preemptions(rows: Iterable[Event]) -> list[str]:
    """Tasks with a preemption whose record does not say who did it and why."""
    return [e.task for e in rows if e.event == "preempted" and not (e.by and e.why)]


def events_table(rows: Iterable[Event], header: bool = True) -> str:
    lines = [[_clock(e.at), e.task, e.event, e.machine, e.by, e.why] for e in rows]
    text = table(["TIME", "TASK", "EVENT", "MACHINE", "BY", "WHY"], lines)
    return text if header else "\n".join(text.splitlines()[1:])


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


# -- omega machine ID -------------------------------------------------------------------


def machine_doc(snap: CellSnapshot, mid: str, now: float) -> dict[str, Any]:
    """A machine described: its state, where it is, capacity and use, each task it runs
    (with its start), and the latest events of tasks on it."""
    m = snap.machines.get(mid)
    if m is None:
        raise ValueError(f"unknown machine {mid!r}")
    used = machine_used(m, snap.gangs)
    tasks = []
    for tid, a in sorted(m.allocations.items()):
        rec = snap.tasks.get(tid)
        started = rec.placed_at if rec is not None else 0.0
        tasks.append({"task": tid, "scheduler": a.scheduler, "precedence": a.precedence,
                      "resources": a.resources.as_dict(), "placed_at": started,
                      "age_s": now - started if started else None})
    return {"id": m.id, "state": m.state.value, "agent": m.agent, "rack": m.rack,
            "failure_domain": m.failure_domain, "labels": dict(m.labels),
            "capacity": m.capacity.as_dict(), "used": used.as_dict(), "tasks": tasks,
            "events": [e.doc() for e in events(snap, machine=mid)[-20:]]}


def machine_text(doc: dict[str, Any]) -> str:
    cap, used = doc["capacity"], doc["used"]
    lines = [f"machine {doc['id']}: {doc['state']} (agent {doc['agent'] or '-'}, rack "
             f"{doc['rack'] or '-'}, failure domain {doc['failure_domain'] or '-'})"]
    if doc["labels"]:
        lines.append("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(doc["labels"].items())))
    lines.append("capacity: " + ", ".join(
        f"{d} {used.get(d, 0):g}/{c:g} ({100 * used.get(d, 0) / c:.0f}%)" if c else f"{d} 0/0"
        for d, c in sorted(cap.items())))
    lines.append(f"tasks: {len(doc['tasks'])}")
    if doc["tasks"]:
        rows = [[t["task"], t["scheduler"], str(t["precedence"]),
                 ", ".join(f"{d} {v:g}" for d, v in sorted(t["resources"].items())),
                 age(t["age_s"]) if t["age_s"] is not None else "-"] for t in doc["tasks"]]
        lines += ["  " + x for x in table(["TASK", "SCHEDULER", "PREC", "HOLDS", "AGE"],
                                          rows).splitlines()]
    lines.append("recent events (of tasks on it):" if doc["events"] else "no events recorded")
    if doc["events"]:
        lines += ["  " + x for x in events_table(Event(**e) for e in doc["events"]).splitlines()]
    return "\n".join(lines)


# -- omega top --------------------------------------------------------------------------


def _fullest(m: Machine, used: dict[str, float]) -> float:
    return max((used.get(d, 0) / c for d, c in m.capacity.as_dict().items() if c), default=0.0)


def top_doc(snap: CellSnapshot, by: str, limit: int) -> list[dict[str, Any]]:
    """The busiest machines (by their fullest resource), jobs or schedulers (by what
    their running tasks hold), largest first."""
    if by == "machine":
        rows: list[dict[str, Any]] = []
        for m in snap.machines.values():
            used = machine_used(m, snap.gangs).as_dict()
            rows.append({"machine": m.id, "state": m.state.value, "tasks": len(m.allocations),
                         "fullest": _fullest(m, used), "used": used,
                         "capacity": m.capacity.as_dict()})
        rows.sort(key=lambda r: (-float(r["fullest"]), str(r["machine"])))
        return rows[:limit] if limit else rows
    key = "job" if by == "job" else "scheduler"
    totals: dict[str, dict[str, Any]] = {}
    for m in snap.machines.values():
        for a in m.allocations.values():
            name = a.job if by == "job" else a.scheduler
            row = totals.setdefault(name, {key: name, "tasks": 0, "used": {}})
            row["tasks"] += 1
            for d, v in a.resources.as_dict().items():
                row["used"][d] = row["used"].get(d, 0.0) + v
    out = sorted(totals.values(), key=lambda r: (-r["used"].get("cpu", 0.0), r[key]))
    return out[:limit] if limit else out


def top_text(rows: list[dict[str, Any]], by: str, revision: int) -> str:
    head = f"top {by}s at revision {revision}"
    if by == "machine":
        lines = [[r["machine"], r["state"], str(r["tasks"]), f"{100 * r['fullest']:.0f}%",
                  *(f"{r['used'].get(d, 0):g}/{r['capacity'].get(d, 0):g}"
                    for d in ("cpu", "mem"))] for r in rows]
        return head + "\n" + table(["MACHINE", "STATE", "TASKS", "FULLEST", "CPU", "MEM"],
                                   lines, right=frozenset({2, 3, 4, 5}))
    lines = [[r["job" if by == "job" else "scheduler"], str(r["tasks"]),
              f"{r['used'].get('cpu', 0):g}", f"{r['used'].get('mem', 0):g}"] for r in rows]
    return head + "\n" + table([by.upper(), "TASKS", "CPU", "MEM"], lines,
                               right=frozenset({1, 2, 3}))

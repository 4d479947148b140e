"""What the web dashboard shows, as one JSON document built from the cell (a synced
snapshot), the service's status and what the dashboard remembers: the machines as a
heat map, each scheduler instance's busyness and conflicts over time, pending jobs
with their reasons, and recent preemptions.

Pure functions and small stores with an injected clock, so the page's content is
tested without a browser (tests/test_dashview.py) and the browser test checks only
that a person sees it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from cellstate.cell import CellSnapshot, machine_used
from cellstate.keys import KeyKind
from cellstate.model import MachineState, TaskState

HEAT_RESOURCES = ("cpu", "mem", "gpu")  # a machine's heat: its fullest of these


def machine_cells(snap: CellSnapshot) -> list[dict[str, Any]]:
    """Every machine, by rack then id: its state, how full it is (0-1, the fullest of
    cpu, mem and gpu) and its tasks."""
    out = []
    for m in sorted(snap.machines.values(), key=lambda m: (m.rack, m.id)):
        used = machine_used(m, snap.gangs)
        fill = max((used.get(r) / m.capacity.get(r) for r in HEAT_RESOURCES
                    if m.capacity.get(r) > 0), default=0.0)
        out.append({"id": m.id, "rack": m.rack, "state": m.state.value,
                    "fill": round(min(fill, 1.0), 3), "tasks": len(m.allocations),
                    "cpu": [used.get("cpu"), m.capacity.get("cpu")]})
    return out


@attrs.define
class Preemption:
    at: float
    task: str
    machine: str
    for_jobs: list[str]  # the jobs whose tasks took its place
    by: str = ""  # the scheduler that preempted it
    why: str = ""  # as its record says: "preempted for J/3"


_FOR = "preempted for "


def preemptions_in(before: CellSnapshot, after: CellSnapshot,
                   changed: Iterable[tuple[KeyKind, str]], now: float) -> list[Preemption]:
    """Tasks that went from running to preempted between two snapshots of a change
    set, each with its cause as its task record's history keeps it (when, who, for
    which task); ``now`` dates one whose record does not."""
    out = []
    for kind, tid in changed:
        if kind is not KeyKind.TASK:
            continue
        new, old = after.tasks.get(tid), before.tasks.get(tid)
        if new is None or new.state is not TaskState.PREEMPTED or old is None or (
                old.state is not TaskState.RUNNING):
            continue
        last = next((e for e in reversed(new.history) if e.state is TaskState.PREEMPTED),
                    None)
        if last is None:
            out.append(Preemption(now, tid, old.machine, []))
            continue
        taker = last.why.removeprefix(_FOR) if last.why.startswith(_FOR) else ""
        out.append(Preemption(last.at or now, tid, old.machine,
                              [taker.rpartition("/")[0] or taker] if taker else [],
                              last.by, last.why))
    return out


class PreemptionLog:
    """The last ``keep`` preemptions, fed by a replica's change listener (any thread)."""

    def __init__(self, clock: Callable[[], float], keep: int = 50) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._prev = CellSnapshot.empty()
        self._events: deque[Preemption] = deque(maxlen=keep)
        self.total = 0

    def changed(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        with self._lock:
            if changed is not None:  # after a (re)load nothing can be told apart
                found = preemptions_in(self._prev, snap, changed, self._clock())
                self._events.extend(found)
                self.total += len(found)
            self._prev = snap

    def recent(self) -> list[dict[str, Any]]:
        with self._lock:
            return [attrs.asdict(p) for p in reversed(self._events)]


class EventLog:
    """The cell's latest task events (placed, moved, preempted, lost, finished, failed,
    killed: from the task records' histories, omega/cellview.py), the newest ``keep``,
    fed by a replica's change listener (any thread): each change set's task records
    give their events newer than the last one seen of that task, so a busy cell costs
    what changed, not a scan of every task (only a (re)load scans them all)."""

    def __init__(self, keep: int = 30) -> None:
        self._lock = threading.Lock()
        self._events: deque[dict[str, Any]] = deque(maxlen=keep)
        self._last: dict[str, float] = {}  # task -> the time of its last event seen

    def changed(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        from omega.cellview import events

        with self._lock:
            if changed is None:  # a (re)load: start over from what the records keep
                found = events(snap)
                self._events.clear()
                self._last = {}
            else:
                found = []
                for kind, tid in changed:
                    rec = snap.tasks.get(tid) if kind is KeyKind.TASK else None
                    if rec is None:
                        continue
                    last = self._last.get(tid, 0.0)
                    found.extend(e for e in events_of(tid, rec.history) if e.at > last)
                found.sort(key=lambda e: (e.at, e.task))
            for e in found:
                self._last[e.task] = max(self._last.get(e.task, 0.0), e.at)
                self._events.append(e.doc())

    def recent(self) -> list[dict[str, Any]]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._events))


def events_of(tid: str, history: Sequence[Any]) -> list[Any]:
    from omega.cellview import task_events

    return task_events(tid, history)


class History:
    """Each scheduler instance's reports over time (the last ``keep`` points): busyness,
    conflict fraction, and transactions and conflicts since the point before."""

    def __init__(self, keep: int = 300) -> None:
        self._keep = keep
        self._points: dict[str, deque[dict[str, float]]] = {}
        self._last: dict[str, tuple[int, int]] = {}

    def add(self, at: float, reports: Sequence[Mapping[str, Any]]) -> None:
        for r in reports:
            key = f"{r['scheduler']}/{r['instance']}"
            txns, conflicted = int(r.get("transactions", 0)), int(r.get("conflicted", 0))
            last_txns, last_conflicted = self._last.get(key, (txns, conflicted))
            self._last[key] = (txns, conflicted)
            self._points.setdefault(key, deque(maxlen=self._keep)).append({
                "t": at, "busyness": float(r.get("busyness", 0.0)),
                "conflict_fraction": float(r.get("conflict_fraction", 0.0)),
                "transactions": max(txns - last_txns, 0),
                "conflicts": max(conflicted - last_conflicted, 0)})

    def series(self) -> dict[str, list[dict[str, float]]]:
        return {k: list(v) for k, v in sorted(self._points.items())}


def scheduler_rows(reports: Sequence[Mapping[str, Any]], history: History,
                   ) -> list[dict[str, Any]]:
    series = history.series()
    rows = []
    for r in sorted(reports, key=lambda r: (r["scheduler"], r["instance"])):
        key = f"{r['scheduler']}/{r['instance']}"
        rows.append({"instance": key, "transactions": int(r.get("transactions", 0)),
                     "conflicted": int(r.get("conflicted", 0)),
                     "tasks_placed": int(r.get("tasks_placed", 0)),
                     "busyness": float(r.get("busyness", 0.0)),
                     "conflict_fraction": float(r.get("conflict_fraction", 0.0)),
                     "history": series.get(key, [])})
    return rows


def pending_row(info: Mapping[str, Any]) -> dict[str, Any]:
    """A pending job (``GetJob``'s document) and why its tasks wait, in words."""
    spec, why = info["spec"], info.get("why") or {}
    reasons = [b["text"] for b in why.get("cell", [])]
    for r in why.get("schedulers", []):
        reasons.extend(f"{r['scheduler']}/{r['instance']}: {x['text']}"
                       for x in r.get("reasons", []))
    return {"job": spec["id"], "scheduler": spec["scheduler"],
            "pending": int(info.get("task_states", {}).get("pending", 0)),
            "tasks": int(spec.get("task_count", 0)),
            "reasons": reasons or ["waiting for its scheduler's next attempt"]}


def dashboard_doc(snap: CellSnapshot, status: Mapping[str, Any], history: History,
                  preemptions: PreemptionLog, pending: Sequence[Mapping[str, Any]],
                  now: float, events: EventLog | None = None) -> dict[str, Any]:
    cap, used = status.get("capacity", {}), status.get("used", {})
    return {
        "at": now, "revision": snap.revision, "server": status.get("server", ""),
        "machines": machine_cells(snap),
        "machines_up": sum(1 for m in snap.machines.values()
                           if m.state is not MachineState.DOWN),
        "utilization": {r: used.get(r, 0.0) / c for r, c in sorted(cap.items()) if c},
        "jobs": status.get("jobs", {}), "tasks": status.get("tasks", {}),
        "schedulers": scheduler_rows(status.get("schedulers", []), history),
        "pending": [pending_row(p) for p in pending],
        "preemptions": preemptions.recent(), "preemptions_total": preemptions.total,
        "events": events.recent() if events is not None else [],
    }

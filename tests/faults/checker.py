"""Holds a cell's whole etcd history to the store's promises, one revision at a time.

The walk is a :class:`~cellstate.replica.Replica` (the same decoding every reader
uses) fed by :class:`RevisionFeed`: the cell as it was at a start revision, then
etcd's watch from there, each revision handed over on its own (etcd may pack several
into one watch response, and a replica applies a response whole). The test etcd runs
without compaction, so the whole history is there to read.

At every revision of the cell:

* every invariant holds (:func:`cellstate.invariants.violations`);
* each acknowledgement the load driver logged for this revision is there: a committed
  claim's task runs on the claimed machine, placed at this very revision; a submitted
  job exists, written at this revision; a killed job carries its ``killed`` status;
* a task that ends (finished or failed) ends the run it had: on the machine it was
  running on (a stale report of an earlier run would name another);
* no task of a job killed at an earlier revision is placed;
* a staged gang's commit point places all of its claims at once (no reader sees part
  of it: before that revision none of them runs).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import orjson

from cellstate.cell import CellSnapshot, task_view
from cellstate.invariants import violations
from cellstate.keys import KeyKind
from cellstate.kv.base import KV, RangeResult, Watcher, WatchEvent, WatchResponse, range_all
from cellstate.model import GangState, JobState, MachineState, TaskState, split_task_id
from cellstate.replica import Replica

_ENDED = (TaskState.FINISHED, TaskState.FAILED)
_MAX_REPORTED = 20  # problems kept per kind: enough to debug, short enough to read


class _OneRevisionAtATime:
    """A watcher that hands out each revision's events as a response of its own."""

    def __init__(self, inner: Watcher) -> None:
        self._inner = inner
        self._pending: collections.deque[WatchResponse] = collections.deque()

    def next(self, timeout: float | None = None) -> WatchResponse | None:
        if not self._pending:
            response = self._inner.next(timeout)
            if response is None or not response.events:
                return response
            by_revision: dict[int, list[WatchEvent]] = {}
            for e in response.events:
                by_revision.setdefault(e.kv.mod_revision, []).append(e)
            self._pending.extend(WatchResponse(rev, tuple(events))
                                 for rev, events in sorted(by_revision.items()))
        return self._pending.popleft()

    def request_progress(self) -> None:
        self._inner.request_progress()

    def cancel(self) -> None:
        self._inner.cancel()


@attrs.frozen
class RevisionFeed:
    """A :class:`~cellstate.replica.Feed` replaying etcd's history from ``start``."""

    kv: KV
    start: int

    def load(self, prefix: bytes, revision: int = 0) -> RangeResult:
        return range_all(self.kv, prefix, revision=revision or self.start)

    def watch(self, prefix: bytes, end: bytes, start_revision: int) -> Watcher:
        return _OneRevisionAtATime(self.kv.watch(prefix, end, start_revision=start_revision))


@attrs.frozen
class Ack:
    """One acknowledgement from the driver's log."""

    op: str  # submit, commit or kill
    rev: int
    t1: float  # when the answer came (wall clock)
    job: str = ""
    task: str = ""
    machine: str = ""


def read_log(path: Path) -> list[dict[str, Any]]:
    """The driver's JSON lines (a line cut short by a crash is skipped)."""
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out


def acks_of(records: Iterable[dict[str, Any]]) -> list[Ack]:
    return [Ack(r["op"], r["rev"], r["t1"], r.get("job", ""), r.get("task", ""),
                r.get("machine", ""))
            for r in records if r["op"] in ("submit", "commit", "kill")]


@attrs.define
class History:
    """What the walk found; ``problems()`` lists every broken promise."""

    first: int = 0
    last: int = 0
    revisions: int = 0  # revisions of the cell checked
    final: CellSnapshot = attrs.field(factory=CellSnapshot.empty)
    violations: list[str] = attrs.field(factory=list)
    ack_problems: list[str] = attrs.field(factory=list)
    stale_ends: list[str] = attrs.field(factory=list)
    placed_after_kill: list[str] = attrs.field(factory=list)
    partial_gangs: list[str] = attrs.field(factory=list)
    # task -> [(revision, machine)] for every time it was placed
    placements: dict[str, list[tuple[int, str]]] = attrs.field(factory=dict)
    # (revision, machine) for every machine that went down
    machines_down: list[tuple[int, str]] = attrs.field(factory=list)
    # (revision, "instance batch/b0" or "agent agent-0") for every registration that
    # went away: a lease that lapsed or was revoked
    registrations_gone: list[tuple[int, str]] = attrs.field(factory=list)
    # gang id -> (claims, tasks staged) for every staged gang whose record went away
    # before its commit point (its committer died, say): nothing of it ever ran
    aborted_gangs: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    acks_checked: int = 0
    # (revision, task, why) for every running task recorded lost: its job was killed,
    # its machine went down or was drained (its agent's lease lapsed, an operator)
    losses: list[tuple[int, str, str]] = attrs.field(factory=list)
    # running tasks lost with none of those reasons: their agent and machine healthy
    healthy_losses: list[str] = attrs.field(factory=list)

    def problems(self) -> list[str]:
        out: list[str] = []
        for title, items in (("invariant broken", self.violations),
                             ("acknowledged but not in etcd", self.ack_problems),
                             ("stale end of a task", self.stale_ends),
                             ("placed after its job was killed", self.placed_after_kill),
                             ("gang partly placed", self.partial_gangs),
                             ("lost while its job, agent and machine were healthy",
                              self.healthy_losses)):
            out.extend(f"{title}: {item}" for item in items[:_MAX_REPORTED])
            if len(items) > _MAX_REPORTED:
                out.append(f"{title}: ... {len(items) - _MAX_REPORTED} more")
        return out

    def placements_in(self, first: int, last: int, scheduler: str = "") -> int:
        """Placements at revisions in [first, last], of ``scheduler``'s jobs if given."""
        jobs = self.final.jobs
        return sum(
            1 for tid, placed in self.placements.items() for rev, _ in placed
            if first <= rev <= last and (
                not scheduler or ((j := jobs.get(split_task_id(tid)[0])) is not None
                and j.scheduler == scheduler))
        )


class _Walk:
    def __init__(self, acks: list[Ack]) -> None:
        self.h = History()
        self.acks = sorted(acks, key=lambda a: a.rev)
        self.next_ack = 0
        self.views: dict[str, tuple[TaskState, str]] = {}
        self.machine_states: dict[str, MachineState] = {}
        self.gang_states: dict[str, GangState | None] = {}
        self.gang_claims: dict[str, int] = {}

    def seen(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        h = self.h
        if changed == [] or (h.revisions and snap.revision <= h.last):
            return  # a progress notice: nothing changed
        if not h.revisions:
            h.first = snap.revision
        h.revisions += 1
        h.last = snap.revision
        h.final = snap
        broken = violations(snap)
        if broken:
            h.violations.extend(f"revision {snap.revision}: {v}" for v in broken)
        tasks = self._changed_tasks(snap, changed)
        self._transitions(snap, tasks)
        self._machines(snap, changed)
        self._registrations(snap, changed)
        self._gangs(snap, changed)
        self._check_acks(snap)

    def _changed_tasks(self, snap: CellSnapshot,
                       changed: list[tuple[KeyKind, str]] | None) -> set[str]:
        if changed is None or any(k is KeyKind.GANG for k, _ in changed):
            # A gang's commit point changes what its tasks' records mean without
            # touching them (and a reload may change anything): look at every task.
            return {*snap.tasks.keys(), *self.views}
        return {i for k, i in changed if k is KeyKind.TASK}

    def _transitions(self, snap: CellSnapshot, tasks: set[str]) -> None:
        rev = snap.revision
        for tid in sorted(tasks):
            v = task_view(snap, tid)
            new = (v.state, v.machine)
            old = self.views.get(tid, (TaskState.PENDING, ""))
            if new == old:
                continue
            self.views[tid] = new
            if v.state is TaskState.RUNNING:
                self.h.placements.setdefault(tid, []).append((rev, v.machine))
                status = snap.statuses.get(v.job)
                if status is not None and status.state is JobState.KILLED and \
                        status.revision < rev:
                    self.h.placed_after_kill.append(
                        f"task {tid} placed on {v.machine} at revision {rev}; its job was "
                        f"killed at revision {status.revision}")
            elif old[0] is TaskState.RUNNING and v.state in _ENDED and v.machine != old[1]:
                self.h.stale_ends.append(
                    f"task {tid} running on {old[1]} recorded {v.state.value} on "
                    f"{v.machine} at revision {rev}")
            elif old[0] is TaskState.RUNNING and v.state is TaskState.LOST:
                self._lost(snap, tid, v.job, old[1])

    def _lost(self, snap: CellSnapshot, tid: str, job: str, machine: str) -> None:
        """Why a running task was lost at this revision: a task is lost only when its
        job is killed or its machine goes down or is drained."""
        rev = snap.revision
        status = snap.statuses.get(job)
        m = snap.machines.get(machine)
        if status is not None and status.state is JobState.KILLED:
            why = "killed"
        elif m is None or m.state is MachineState.DOWN:
            why = "machine down"
        elif m.state is MachineState.DRAINING:
            why = "drained"
        elif m.agent and m.agent not in snap.agents:
            why = f"agent {m.agent} gone"
        else:
            why = ""
            self.h.healthy_losses.append(
                f"task {tid} running on {machine} recorded lost at revision {rev}, its job "
                f"not killed, the machine {m.state.value} and its agent {m.agent or '-'} "
                "registered")
        self.h.losses.append((rev, tid, why or "healthy"))

    def _machines(self, snap: CellSnapshot,
                  changed: list[tuple[KeyKind, str]] | None) -> None:
        ids = snap.machines.keys() if changed is None else \
            [i for k, i in changed if k is KeyKind.MACHINE]
        for mid in ids:
            m = snap.machines.get(mid)
            state = m.state if m is not None else MachineState.DOWN
            if state is MachineState.DOWN and self.machine_states.get(mid) is not None \
                    and self.machine_states[mid] is not MachineState.DOWN:
                self.h.machines_down.append((snap.revision, mid))
            self.machine_states[mid] = state

    def _registrations(self, snap: CellSnapshot,
                       changed: list[tuple[KeyKind, str]] | None) -> None:
        for kind, ident in changed or ():
            if kind is KeyKind.INSTANCE and ident not in snap.instances:
                self.h.registrations_gone.append((snap.revision, f"instance {ident}"))
            elif kind is KeyKind.AGENT and ident not in snap.agents:
                self.h.registrations_gone.append((snap.revision, f"agent {ident}"))

    def _gangs(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        """A staged gang's commit point places every one of its claims at once."""
        for kind, gid in changed or ():
            if kind is not KeyKind.GANG:
                continue
            g = snap.gangs.get(gid)
            was = self.gang_states.get(gid)
            self.gang_states[gid] = g.state if g is not None else None
            if g is None and was is GangState.PREPARING:
                staged = sum(1 for rec in snap.tasks.values() if rec.gang == gid)
                self.h.aborted_gangs[gid] = (self.gang_claims.get(gid, 0), staged)
            if g is not None:
                self.gang_claims[gid] = g.claims
            if g is None or g.state is not GangState.COMMITTED or was is GangState.COMMITTED:
                continue
            placed = sum(1 for rec in snap.tasks.values() if rec.gang == gid
                         and task_view(snap, rec.id).state is TaskState.RUNNING)
            if placed != g.claims:
                self.h.partial_gangs.append(
                    f"gang {gid} committed at revision {snap.revision} with {placed} of its "
                    f"{g.claims} claims running")

    def _state(self, tid: str) -> TaskState:
        return self.views.get(tid, (TaskState.PENDING, ""))[0]

    def _check_acks(self, snap: CellSnapshot) -> None:
        rev = snap.revision
        while self.next_ack < len(self.acks) and self.acks[self.next_ack].rev <= rev:
            a = self.acks[self.next_ack]
            self.next_ack += 1
            self.h.acks_checked += 1
            problem = _ack_problem(a, snap) if a.rev == rev else \
                "the cell did not change at that revision"
            if problem:
                self.h.ack_problems.append(f"{a.op} of {a.task or a.job} acknowledged at "
                                           f"revision {a.rev}: {problem}")

    def finish(self) -> History:
        for a in self.acks[self.next_ack:]:
            self.h.ack_problems.append(f"{a.op} of {a.task or a.job} acknowledged at revision "
                                       f"{a.rev}, past the last revision {self.h.last}")
        return self.h


def _ack_problem(a: Ack, snap: CellSnapshot) -> str:
    rev = snap.revision
    if a.op == "commit":
        v = task_view(snap, a.task)
        if v.state is not TaskState.RUNNING or v.machine != a.machine:
            return f"the task is {v.state.value} on {v.machine or 'no machine'}, not " \
                   f"running on {a.machine}"
        # A commit's revision is that of its last write (CommitResult.revision): a
        # commit that took several etcd transactions (its guards failed for some
        # machines, which it decided again) wrote some claims before it.
        rec = snap.tasks.get(a.task)
        if rec is None or rec.revision > rev:
            return "the task's record was not written by that revision"
        return ""
    if a.op == "submit":
        job = snap.jobs.get(a.job)
        if job is None or job.revision != rev:
            return "no such job written at that revision"
        return ""
    status = snap.statuses.get(a.job)
    if status is None or status.state is not JobState.KILLED:
        return "the job has no killed status"
    return ""


def walk(kv: KV, cell: str, acks: list[Ack], until: int, start: int = 1) -> History:
    """Walk the cell's history from revision ``start`` to ``until`` (etcd must keep it
    all: run it without compaction) and check every revision."""
    w = _Walk(acks)
    replica = Replica(RevisionFeed(kv, start), cell)
    replica.on_changes(w.seen)
    try:
        replica.load()
        idle = 0
        while replica.revision < until:
            if replica.pump(timeout=0.5):
                idle = 0
                continue
            # The last revisions may not touch the cell: a progress notice says so.
            replica.request_progress()
            idle += 1
            if idle > 20:
                raise AssertionError(f"etcd's history stopped at revision {replica.revision}, "
                                     f"before {until}")
    finally:
        replica.stop()
    return w.finish()

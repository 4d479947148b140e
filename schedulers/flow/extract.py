"""From a solved flow to claims: placements, migrations and preemptions in one pass.

Flow leaves a job's waiting node (``W``) or a group of its running tasks (``G``) as
units that travel through aggregators to a machine or straight to the sink. The pass
walks the arcs that carry flow in layer order (sources, then shape-to-rack, then into
machines), handing units on first in, first out: every unit reaching a machine is one
task arriving there. Units inside an aggregator are interchangeable (they all have the
aggregator's shape, and no arc past it depends on the job), so any hand-over gives a
placement of the same cost. Units a ``G`` node keeps on its own machine change
nothing and are never looked at: the pass only sees what moves.

Then each arriving unit becomes a task index and a claim, checked with the store's own
fit rules against the decision's view (``schedulers.placement.why_not``), which sees
the claims made so far. This is the repair step: the network counts a machine's room
in slots of the smallest shape, so tasks of several shapes may add up to more than the
machine has in some dimension, or break a job's tasks-per-machine or affinity rule;
such arrivals are dropped and their tasks wait for the next round. Tasks preempted by
the flow are evicted only by an arrival that needs their room and has a higher
precedence (the store's rule); others keep running. Tasks that ended, were placed by
someone else or whose job was killed while the solver ran (``latest``) are dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import attrs
import numpy as np

from cellstate.cell import CellSnapshot, task_view
from cellstate.fit import Rule
from cellstate.model import PLACEABLE, Allocation, Claim, TaskState, task_id
from schedulers.api import CellView
from schedulers.flow.graph import ArcKind, GraphManager
from schedulers.flow.network import Arrays
from schedulers.placement import why_not

_LAYER = np.zeros(max(ArcKind) + 1, dtype=np.int8)
_LAYER[ArcKind.TO_RACK] = 1
_LAYER[ArcKind.INTO_MACHINE] = 2


@attrs.frozen
class Arrival:
    job: str
    machine: str
    origin: str  # the machine a migrating task leaves; "" for a waiting task


@attrs.define
class Extraction:
    claims: list[Claim] = attrs.field(factory=list)
    unscheduled: dict[str, int] = attrs.field(factory=dict)  # job -> units left waiting
    placed: int = 0
    migrated: int = 0
    preempted: int = 0
    repaired: int = 0  # arrivals the fit rules turned back
    stale: int = 0  # tasks that changed while the solver ran
    moved: list[tuple[str, str]] = attrs.field(factory=list)  # (task, machine left)
    why: dict[str, str] = attrs.field(factory=dict)  # job -> why an arrival was dropped
    turned_back: set[tuple[str, str]] = attrs.field(factory=set)  # (job, machine)


def arrivals(graph: GraphManager, net: Arrays, flow: np.ndarray
             ) -> tuple[list[Arrival], dict[str, int], dict[tuple[str, str, bool], int]]:
    """Every unit that arrives on a machine (not counting units that stay), the units
    left unscheduled per job, and the units preempted per (job, machine, own)."""
    moving = (flow > 0) & (net.kind != ArcKind.STAY) & (net.kind != ArcKind.TO_SINK)
    idx = np.flatnonzero(moving)
    idx = idx[np.argsort(_LAYER[net.kind[idx]], kind="stable")]
    queues: dict[tuple[object, ...], deque[list[object]]] = {}
    out: list[Arrival] = []
    unscheduled: dict[str, int] = {}
    preempted: dict[tuple[str, str, bool], int] = {}
    key = graph.net.node_key
    for i in idx.tolist():
        f = int(flow[i])
        kind = int(net.kind[i])
        tail, head = key(int(net.tail[i])), key(int(net.head[i]))
        if kind == ArcKind.UNSCHEDULED:
            jid = str(tail[1])
            unscheduled[jid] = unscheduled.get(jid, 0) + f
            continue
        if kind == ArcKind.PREEMPT:
            k = (str(tail[1]), str(tail[2]), tail[0] == "G")
            preempted[k] = preempted.get(k, 0) + f
            continue
        if tail[0] in ("W", "G", "O"):
            units: list[list[object]] = [[tail[1], tail[2] if tail[0] == "G" else "", f]]
        else:
            units = _take(queues[tail], f)
        if head[0] == "M":
            mid = str(head[1])
            out.extend(Arrival(str(j), mid, str(o)) for j, o, n in units
                       for _ in range(int(n)))  # type: ignore[call-overload]
        else:
            queues.setdefault(head, deque()).extend(units)
    return out, unscheduled, preempted


def _take(q: deque[list[object]], f: int) -> list[list[object]]:
    out = []
    while f:
        unit = q[0]
        n = int(unit[2])  # type: ignore[call-overload]
        if n <= f:
            out.append(q.popleft())
            f -= n
        else:
            out.append([unit[0], unit[1], f])
            unit[2] = n - f
            f = 0
    return out


def extract(graph: GraphManager, net: Arrays, flow: np.ndarray, view: CellView,
            latest: CellSnapshot | None = None) -> Extraction:
    """Claims for everything the flow changes (see the module docstring)."""
    units, unscheduled, preempted = arrivals(graph, net, flow)
    ex = Extraction(unscheduled=dict(unscheduled))
    snap = view.snap
    waiting = {j: deque(graph.waiting_of(j)) for j in {a.job for a in units if not a.origin}}
    leaving: dict[tuple[str, str], deque[int]] = {}
    victims: dict[str, list[Allocation]] = {}  # machine -> preemptible allocations
    for (jid, mid, own), n in preempted.items():
        m = snap.machines.get(mid)
        if m is None:
            continue
        indexes = [i for i in graph.group_of(jid, mid, own) if not own or graph.movable(jid, i)]
        for i in indexes[:n]:
            alloc = m.allocations.get(task_id(jid, i))
            if alloc is not None:
                victims.setdefault(mid, []).append(alloc)
    victims = {mid: sorted(v, key=lambda v: v.precedence) for mid, v in victims.items()}

    def next_task(a: Arrival) -> int | None:
        if not a.origin:
            pool = waiting[a.job]
            while pool:
                i = pool.popleft()
                # The network was built from the snapshot, which does not show this
                # scheduler's own claims in flight (the view does).
                if _still_waiting(latest, a.job, i) and not view.claimed(task_id(a.job, i)):
                    return i
                ex.stale += 1
            return None
        k = (a.job, a.origin)
        if k not in leaving:
            leaving[k] = deque(i for i in graph.group_of(a.job, a.origin)
                               if graph.movable(a.job, i))
        pool = leaving[k]
        while pool:
            i = pool.popleft()
            if _still_running(latest, a.job, i, a.origin):
                return i
            ex.stale += 1
        return None

    # Migrations first: they free room that arrivals on their old machines may need;
    # what does not fit is tried once more after everything else has been claimed.
    todo = sorted(units, key=lambda a: (not a.origin, a.machine))
    bound: list[tuple[Arrival, int]] = []
    for a in todo:
        if a.origin == a.machine:
            continue  # left through the aggregator and came back: stays
        index = next_task(a)
        if index is not None:
            bound.append((a, index))
    retry: list[tuple[Arrival, int]] = []
    for a, i in bound:
        if not _place(ex, view, a, i, victims, final=False):
            retry.append((a, i))
    for a, i in retry:
        _place(ex, view, a, i, victims, final=True)
    return ex


def _place(ex: Extraction, view: CellView, a: Arrival, index: int,
           victims: dict[str, list[Allocation]], final: bool) -> bool:
    job = view.jobs.get(a.job)
    m = view.machine(a.machine)
    if job is None or m is None:
        ex.stale += 1
        return True
    miss = why_not(view, job, m)
    chosen: list[Allocation] = []
    if miss is not None and miss.rule is Rule.RESOURCES:
        # Evict the fewest preempted tasks (lowest precedence first) that make room.
        for v in victims.get(a.machine, ()):
            if v.precedence >= job.precedence:
                continue
            chosen.append(v)
            miss = why_not(view, job, m, chosen)
            if miss is None:
                break
    if miss is not None:
        if final:
            ex.repaired += 1
            ex.turned_back.add((a.job, a.machine))
            ex.unscheduled[a.job] = ex.unscheduled.get(a.job, 0) + 1
            ex.why.setdefault(a.job, f"{miss.label} on {a.machine!r} once this round's "
                              "other placements are counted")
        return False
    ex.claims.append(view.claim(job, index, a.machine, evict=[v.task for v in chosen],
                                moves_from=a.origin))
    ex.preempted += len(chosen)
    for v in chosen:
        ex.moved.append((v.task, a.machine))
        victims[a.machine].remove(v)
    if a.origin:
        ex.migrated += 1
        ex.moved.append((task_id(a.job, index), a.origin))
    else:
        ex.placed += 1
    return True


def _still_waiting(latest: CellSnapshot | None, jid: str, index: int) -> bool:
    if latest is None:
        return True
    if jid in latest.statuses or jid not in latest.jobs:
        return False
    v = task_view(latest, task_id(jid, index))
    return v.state in PLACEABLE and not v.reserved_by


def _still_running(latest: CellSnapshot | None, jid: str, index: int, mid: str) -> bool:
    if latest is None:
        return True
    if jid in latest.statuses or jid not in latest.jobs:
        return False
    v = task_view(latest, task_id(jid, index))
    return v.state is TaskState.RUNNING and v.machine == mid


def claims_by_job(claims: Sequence[Claim]) -> dict[str, list[Claim]]:
    out: dict[str, list[Claim]] = {}
    for c in claims:
        out.setdefault(c.job, []).append(c)
    return out

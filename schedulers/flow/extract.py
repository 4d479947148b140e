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
such an arrival tries the cheapest machines the flow left room on for its shape
(spilling, into free room only) and otherwise waits for the next round. Tasks preempted by
the flow are evicted only by an arrival that needs their room and has a higher
precedence (the store's rule); others keep running. Tasks that ended, were placed by
someone else or whose job was killed while the solver ran (``latest``) are dropped.

Most arrivals need none of that: a waiting task of a job with no constraint (and no
job in the cell with an anti-affinity rule) on a machine that is up, the network
counted and the view shows as the snapshot does, where it fits. Those are claimed in
bulk (:func:`_claim_plain`): per machine and job the room is asked once for the run
of arrivals there (``Resources.fit_times``, the same float operations as asking task
by task) and the claims are made together (``CellView.claim_many``); at the first
arrival it cannot settle so, that arrival and the rest of its machine's take the
per-unit path above. Before that, all machines are looked at at once (:func:`_proven`):
the graph manager keeps what holds each machine and what it may hold as rows of
floats (``GraphManager.fit_rows``), and a machine whose arrivals, added up on arrays,
stay within that with a margin is claimed without asking at all (most are: a round's
1,500 arrivals land on as many machines). The claims, their order and everything
counted are the same as checking every arrival on its own (``per_unit=True``,
``tests/test_flow_extract_bulk.py``, ``tests/test_flow_graph.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

import attrs
import numpy as np

from cellstate.cell import CellSnapshot, task_view
from cellstate.fit import Rule
from cellstate.model import (
    PLACEABLE,
    Allocation,
    Claim,
    Job,
    Machine,
    MachineState,
    Resources,
    TaskState,
    split_task_id,
    task_id,
)
from schedulers.api import CellView
from schedulers.flow.graph import ArcKind, GraphManager
from schedulers.flow.network import Arrays, NodeKey
from schedulers.placement import calm, founds_group, why_not

_LAYER = np.zeros(max(ArcKind) + 1, dtype=np.int8)
_LAYER[ArcKind.TO_RACK] = 1
_LAYER[ArcKind.INTO_MACHINE] = 2
_FROM_SOURCE = np.zeros(max(ArcKind) + 1, dtype=bool)
_FROM_SOURCE[[ArcKind.TO_CLUSTER, ArcKind.PREFERENCE, ArcKind.MIGRATE]] = True
_FROM_AGGREGATOR = np.zeros(max(ArcKind) + 1, dtype=bool)
_FROM_AGGREGATOR[[ArcKind.TO_RACK, ArcKind.INTO_MACHINE]] = True
_MOVING = _FROM_SOURCE | _FROM_AGGREGATOR
_MOVING[[ArcKind.UNSCHEDULED, ArcKind.PREEMPT]] = True


class Arrival(NamedTuple):
    source: NodeKey  # the W node of a job's waiting tasks, or a G node of running ones
    machine: str


@attrs.define
class Extraction:
    claims: list[Claim] = attrs.field(factory=list)
    unscheduled: dict[str, int] = attrs.field(factory=dict)  # job -> units left waiting
    placed: int = 0
    bulk: int = 0  # of those, claimed with their machine's others at once (_claim_plain)
    proven: int = 0  # of those, on machines where all surely fit (_proven): none asked
    migrated: int = 0
    preempted: int = 0
    repaired: int = 0  # arrivals the fit rules turned back
    spilled: int = 0  # turned back, then placed on another machine with room
    stale: int = 0  # tasks that changed while the solver ran
    moved: list[tuple[str, str]] = attrs.field(factory=list)  # (task, machine left)
    why: dict[str, str] = attrs.field(factory=dict)  # job -> why an arrival was dropped
    turned_back: set[tuple[str, str]] = attrs.field(factory=set)  # (job, machine)


def arrivals(graph: GraphManager, net: Arrays, flow: np.ndarray
             ) -> tuple[list[Arrival], dict[str, int], dict[NodeKey, int]]:
    """Every unit that arrives on a machine (not counting units that stay), the units
    left unscheduled per job, and the units preempted per group node.

    Units are handed on through each aggregator first in, first out, arcs taken in
    layer order then by index: the k-th unit to leave an aggregator is the k-th to
    enter it. That pairing is done on arrays, aggregators fed only by sources (the
    cluster aggregators) first, then those they feed (racks)."""
    srcs, ats, unscheduled, preempted = _arrival_nodes(graph, net, flow)
    sources, machines = _keys(graph, srcs, ats)
    # tuple.__new__: what Arrival(...) does, without a Python call per unit.
    new = tuple.__new__
    out = [new(Arrival, (sources[s_i], machines[m_i]))
           for s_i, m_i in zip(srcs, ats, strict=True)]
    return out, unscheduled, preempted


def _arrival_nodes(graph: GraphManager, net: Arrays, flow: np.ndarray
                   ) -> tuple[list[int], list[int], dict[str, int], dict[NodeKey, int]]:
    """:func:`arrivals` as node indexes: each unit's source node and machine node, in
    the order units reach their machine."""
    kinds = net.kind
    # Flow first: few arcs carry any, and indexing by a million int8 kinds converts
    # them all to intp (5-15 ms on the 1.2 M slots of a full 12,500-machine cell).
    # Nor is every carrying arc looked up: with a node per running task, most of them
    # are the 150,000 STAY arcs, which compare as int8 in one pass.
    carrying = np.flatnonzero((flow > 0) & (kinds != ArcKind.STAY))
    carrying = carrying[_MOVING[kinds[carrying]]]
    ck = kinds[carrying]
    key = graph.net.node_key
    unscheduled: dict[str, int] = {}
    for i in carrying[ck == ArcKind.UNSCHEDULED].tolist():
        jid = str(key(int(net.tail[i]))[1])
        unscheduled[jid] = unscheduled.get(jid, 0) + int(flow[i])
    preempted: dict[NodeKey, int] = {}
    for i in carrying[ck == ArcKind.PREEMPT].tolist():
        tail = key(int(net.tail[i]))
        preempted[tail] = preempted.get(tail, 0) + int(flow[i])
    # Units leaving their source (a W or G node): to an aggregator or a machine.
    first = carrying[_FROM_SOURCE[ck]]
    units = np.repeat(first, flow[first])
    src = net.tail[units]
    at = net.head[units]
    order = units  # arc index: the order units entered their aggregator within a layer
    layer = np.zeros(len(units), dtype=np.int8)
    onward = carrying[_FROM_AGGREGATOR[ck]]
    if onward.size:
        # Aggregators: tails of onward arcs. Cluster aggregators are those a TO_RACK
        # arc leaves or a source feeds through TO_CLUSTER / MIGRATE.
        agg_tail = net.tail[onward]
        cluster = np.zeros(net.nodes, dtype=bool)
        cluster[net.tail[onward[kinds[onward] == ArcKind.TO_RACK]]] = True
        fed = first[(kinds[first] == ArcKind.TO_CLUSTER) | (kinds[first] == ArcKind.MIGRATE)]
        cluster[net.head[fed]] = True
        is_agg = np.zeros(net.nodes, dtype=bool)
        is_agg[agg_tail] = True
        for level in (True, False):  # cluster aggregators, then the rest (racks)
            outs = onward[cluster[agg_tail] == level]
            if not outs.size:
                continue
            outs = outs[np.lexsort((outs, _LAYER[kinds[outs]], net.tail[outs]))]
            out_units = np.repeat(outs, flow[outs])
            here = is_agg[at] & (cluster[at] == level)
            pick = np.flatnonzero(here)
            pick = pick[np.lexsort((order[pick], layer[pick], at[pick]))]
            if len(pick) != len(out_units):
                raise ValueError("flow not conserved at an aggregator")
            moved_src = src[pick]
            moved_at = net.head[out_units]
            keep = ~here
            src = np.concatenate([src[keep], moved_src])
            at = np.concatenate([at[keep], moved_at])
            order = np.concatenate([order[keep], out_units])
            layer = np.concatenate([layer[keep], _LAYER[kinds[out_units]]])
    # In the order units reached their machine: by the delivering arc's layer and
    # index, one arc's units in the order they left the aggregator (a stable sort).
    final = np.lexsort((order, layer))
    return src[final].tolist(), at[final].tolist(), unscheduled, preempted


def _keys(graph: GraphManager, srcs: list[int], ats: list[int]
          ) -> tuple[dict[int, NodeKey], dict[int, str]]:
    """The key of each source node and the id of each machine node named."""
    key = graph.net.node_key
    named = set(srcs)
    sources = dict(zip(named, map(key, named), strict=True))
    return sources, {i: str(key(i)[1]) for i in set(ats)}


class _Waiting(NamedTuple):
    """Arrivals of waiting tasks, in the order they are claimed: by machine, each
    machine's in the order they reached it. Parallel lists, one entry per task."""

    sources: list[NodeKey]
    machines: list[str]
    jobs: list[str]
    indexes: list[int]


def extract(graph: GraphManager, net: Arrays, flow: np.ndarray, view: CellView,
            latest: CellSnapshot | None = None, *, per_unit: bool = False) -> Extraction:
    """Claims for everything the flow changes (see the module docstring).
    ``per_unit``: check every arrival on its own, never a machine's together (the
    reference :func:`_claim_plain` gives the same claims as)."""
    srcs, ats, unscheduled, preempted = _arrival_nodes(graph, net, flow)
    sources, machines = _keys(graph, srcs, ats)
    ex = Extraction(unscheduled=dict(unscheduled))
    pools: dict[NodeKey, deque[tuple[str, int]]] = {}

    def pool(src: NodeKey) -> deque[tuple[str, int]]:
        p = pools.get(src)
        if p is None:
            if src[0] == "W":
                jid = str(src[1])
                p = (deque([(jid, int(str(src[2])))]) if len(src) == 3  # its own node
                     else deque((jid, i) for i in graph.sharing_of(jid)))
            else:
                p = deque(split_task_id(t) for t in graph.group_tasks(src))
            pools[src] = p
        return p

    current = _Current(latest, view)

    def take(src: NodeKey) -> tuple[str, int] | None:
        if src[0] == "W" and len(src) == 3:  # a task's own node: that task (once)
            jid, i = str(src[1]), int(str(src[2]))
            if current.waiting(jid, i):
                return jid, i
            ex.stale += 1
            return None
        p = pool(src)
        while p:
            jid, i = p.popleft()
            ok = (current.waiting(jid, i) if src[0] == "W"
                  else _still_running(latest, jid, i, str(src[1])))
            if ok:
                return jid, i
            ex.stale += 1
        return None

    used = _Used(graph, view)
    # Migrations first: they free room that arrivals on their old machines may need;
    # what does not fit is tried once more after everything else has been claimed.
    # Each kind by machine, stably (a sort on arrays: no Python call per unit).
    by_id = sorted(machines, key=machines.__getitem__)
    rank = np.zeros(net.nodes, dtype=np.int64)
    rank[by_id] = np.arange(len(by_id))
    waits = np.zeros(net.nodes, dtype=bool)
    waits[[i for i, k in sources.items() if k[0] == "W"]] = True
    src_a, at_a = np.array(srcs, dtype=np.int64), np.array(ats, dtype=np.int64)
    ordered = np.lexsort((np.arange(len(srcs)), rank[at_a], waits[src_a]))
    moves = int(len(srcs) - np.count_nonzero(waits[src_a]))
    bound: list[tuple[Arrival, str, int]] = []
    for s_i, m_i in zip(src_a[ordered[:moves]].tolist(), at_a[ordered[:moves]].tolist(),
                        strict=True):
        src, mid = sources[s_i], machines[m_i]
        if src[0] == "G" and src[1] == mid:
            continue  # left through the aggregator and came back: stays
        got = take(src)
        if got is not None:
            bound.append((Arrival(src, mid), *got))
    waiting = _Waiting([], [], [], [])
    w_src, w_mid, w_job, w_index = waiting
    still = current.waiting
    for s_i, m_i in zip(src_a[ordered[moves:]].tolist(), at_a[ordered[moves:]].tolist(),
                        strict=True):
        src = sources[s_i]
        if len(src) == 3:  # a task's own node: that task (once), as take() does
            jid, i = cast(str, src[1]), cast(int, src[2])
            if not still(jid, i):
                ex.stale += 1
                continue
        else:
            got = take(src)
            if got is None:
                continue
            jid, i = got
        w_src.append(src)
        w_mid.append(machines[m_i])
        w_job.append(jid)
        w_index.append(i)
    # Preempted units: what is left of their groups once the migrations took theirs.
    victims: dict[str, list[Allocation]] = {}
    snap = view.snap
    for src, n in preempted.items():
        mid = str(src[1])
        m = snap.machines.get(mid)
        for _ in range(n):
            got = take(src)
            if got is None or m is None:
                break
            alloc = m.allocations.get(task_id(*got))
            if alloc is not None:
                victims.setdefault(mid, []).append(alloc)
    for v in victims.values():
        v.sort(key=lambda a: a.precedence)
    # An arrival larger than the room the flow freed for it (one slot in the network,
    # several tasks' room on the machine) may evict further re-offered tasks of lower
    # precedence there, lowest first: those neither moving nor preempted already.
    taken = {v.task for vs in victims.values() for v in vs}
    taken.update(task_id(jid, i) for a, jid, i in bound)
    victims = _Victims(victims, lambda mid: _spare(graph, snap, mid, taken))
    retry: list[tuple[Arrival, str, int]] = []
    for a, jid, i in bound:
        if not _place(ex, view, used, a, jid, i, victims, final=False):
            retry.append((a, jid, i))
    k, n = 0, len(waiting.machines)
    # Machines whose arrivals all surely fit, proven on arrays for all at once.
    proven = {} if per_unit else _proven(graph, view, used, waiting)
    while k < n:
        if not per_unit:
            # Claimed together for as long as they surely fit, then the rest of the
            # machine where that stopped one by one.
            k = _claim_plain(ex, view, used, waiting, k, proven)
            if k == n:
                break
        mid = waiting.machines[k]
        while k < n and waiting.machines[k] == mid:
            a, jid, i = Arrival(waiting.sources[k], mid), waiting.jobs[k], waiting.indexes[k]
            if not _place(ex, view, used, a, jid, i, victims, final=False):
                retry.append((a, jid, i))
            k += 1
    spare: Spare | None = None
    for a, jid, i in retry:
        if _place(ex, view, used, a, jid, i, victims, final=False):
            continue
        if a.source[0] == "W":
            # Spill: the next cheapest machines the flow left room on for this shape.
            spare = spare or Spare(graph, net, flow)
            entry = graph.jobs.get(jid)
            if entry is not None and any(
                    _place(ex, view, used, Arrival(a.source, mid), jid, i, victims,
                           final=False, evict=False)
                    for mid in spare.machines(entry.shape)):
                ex.spilled += 1
                continue
        _place(ex, view, used, a, jid, i, victims, final=True)
    return ex


def _spare(graph: GraphManager, snap: CellSnapshot, mid: str, taken: set[str]
           ) -> list[Allocation]:
    """Re-offered, movable tasks on ``mid`` the flow neither preempts nor moves, lowest
    precedence first; only of groups the cost model lets be preempted (a preemption
    arc), so a model that never preempts never evicts."""
    me = graph.machines.get(mid)
    m = snap.machines.get(mid)
    if me is None or m is None or not me.groups:
        return []
    out = []
    for gk in me.groups:
        node: NodeKey = ("G", mid, gk)
        if not any(graph.net.arc(s).kind == ArcKind.PREEMPT for s in graph.net.arcs_of(node)):
            continue
        for tid in graph.group_tasks(node):
            a = m.allocations.get(tid)
            if a is not None and tid not in taken:
                out.append(a)
    return sorted(out, key=lambda a: a.precedence)


class Spare:
    """Machines with room the flow did not use, per task shape, cheapest first: where a
    task the repair turned back may go instead, still near the flow's choice."""

    TRIES = 8  # machines tried per turned-back task

    def __init__(self, graph: GraphManager, net: Arrays, flow: np.ndarray) -> None:
        into = np.flatnonzero((net.kind == ArcKind.INTO_MACHINE) & (flow < net.capacity))
        into = into[np.argsort(net.cost[into], kind="stable")]
        self._by_shape: dict[object, list[str]] = {}
        key = graph.net.node_key
        for i in into.tolist():
            tail, head = key(int(net.tail[i])), key(int(net.head[i]))
            self._by_shape.setdefault(tail[1], []).append(str(head[1]))

    def machines(self, shape: object) -> list[str]:
        return self._by_shape.get(shape, [])[:self.TRIES]


class _Victims(dict[str, list[Allocation]]):
    """Per machine, whom an arrival there may evict: the tasks the flow preempted, then
    (looked up the first time an arrival needs more room) the other movable ones."""

    def __init__(self, chosen: dict[str, list[Allocation]],
                 more: Callable[[str], list[Allocation]]) -> None:
        super().__init__(chosen)
        self._more = more
        self._asked: set[str] = set()

    def get_all(self, mid: str) -> list[Allocation]:
        if mid not in self._asked:
            self._asked.add(mid)
            extra = self._more(mid)
            if extra:
                self.setdefault(mid, []).extend(extra)
        return self.get(mid, [])


class _Used:
    """What holds each machine as the view shows it, counted without summing the
    machine's allocations where the graph manager already counts them: a record the
    network was brought to, plus this extraction's own placements on it. The store
    validates every claim all the same; this only spares the repair step reading a
    dozen allocations per claim on records decoded since the last round."""

    def __init__(self, graph: GraphManager, view: CellView) -> None:
        self._graph = graph
        self._view = view
        self._used: dict[str, Resources] = {}
        self._off: set[str] = set()  # machines counted the usual way (fit.misfit)
        self._added: dict[str, list[Resources]] = {}  # placements not in _used yet
        # No job with an anti-affinity rule: the fit rules need not read each
        # machine's jobs (asked once for the whole extraction).
        self.calm = calm(view)
        self._plain: dict[str, bool] = {}
        # Machines whose arrivals were claimed on a proof (_proven), not counted yet:
        # machine -> the jobs of those placements, in order. Counted (used_on, then
        # each placement added) only if asked about again, which few are.
        self._proven: dict[str, list[Job]] = {}

    def touched(self) -> set[str]:
        """Machines this extraction counts already, or counts the usual way."""
        return self._used.keys() | self._off | self._proven.keys()

    def bulk(self, mid: str, jobs: list[Job]) -> None:
        """Placements of one task of each of ``jobs`` on ``mid``, a machine not
        counted yet whose record is the snapshot's and the network's (_proven): what
        :meth:`added` counts, summed only if the machine is asked about again."""
        self._proven[mid] = jobs

    def _count_proven(self, mid: str) -> None:
        jobs = self._proven.pop(mid)
        m = self._view.snap.machines.get(mid)
        u = self._graph.used_on(m) if m is not None else None
        assert u is not None, "a proven machine is counted by the network"
        self._used[mid] = u
        self._added.setdefault(mid, []).extend(j.task_resources for j in jobs)

    def plain(self, job: Job) -> bool:
        """Whether only room can keep a task of ``job`` off a machine that is up: no
        selector, tasks-per-machine, affinity or anti-affinity rule of its own, and no
        job in the view with an anti-affinity rule."""
        p = self._plain.get(job.id)
        if p is None:
            c = job.constraints
            p = self._plain[job.id] = self.calm and not (
                c.machine_selector or c.max_per_machine or c.affinity or c.anti_affinity)
        return p

    def known(self, mid: str) -> Resources | None:
        """What holds ``mid`` if this extraction counts it already (:meth:`of` asked
        before), with its placements since."""
        if mid in self._proven:
            self._count_proven(mid)
        u = self._used.get(mid)
        if u is not None:
            added = self._added.pop(mid, None)
            if added:
                for need in added:
                    u = u + need
                self._used[mid] = u
        return u

    def counted(self, m: Machine, overlaid: Callable[[str], bool]) -> Resources | None:
        """:meth:`known`, or else :meth:`of` where the view shows the snapshot's
        record ``m`` (``overlaid``: ``CellView.overlaid``, asked only then); None
        where the view shows claims on the machine or it is not counted here."""
        mid = m.id
        if mid in self._proven:
            self._count_proven(mid)
        u = self._used.get(mid)
        if u is not None:
            return self.known(mid) if mid in self._added else u
        if mid in self._off or overlaid(mid):
            return None
        u = self._graph.used_on(m)
        if u is None:
            self._off.add(mid)
        else:
            self._used[mid] = u
        return u

    def of(self, m: Machine) -> Resources | None:
        mid = m.id
        if mid in self._proven:
            self._count_proven(mid)
        if mid in self._off:
            return None
        u = self.known(mid)
        if u is None:
            # The view shows the snapshot's record only where no claim of this
            # scheduler's lies on it yet (committed earlier, not in the snapshot).
            u = (self._graph.used_on(m) if self._view.snap.machines.get(mid) is m
                 else None)
            if u is None:
                self._off.add(mid)
            else:
                self._used[mid] = u
        return u

    def added(self, mid: str, need: Resources, count: int) -> None:
        """``count`` placements of ``need`` on ``mid`` (counted already, :meth:`of`),
        none evicting or moving: what :meth:`claimed` counts of each."""
        self._added.setdefault(mid, []).extend([need] * count)

    def claimed(self, c: Claim, need: Resources) -> None:
        """Count a claim just made: a placement adds to its machine; anything that
        also frees room (an eviction, a move) leaves both machines to the usual sum."""
        for mid in (c.machine, c.moves_from):
            if mid in self._proven:
                self._count_proven(mid)
        if c.evict or c.moves_from or c.machine not in self._used:
            for mid in (c.machine, c.moves_from):
                if mid:
                    self._used.pop(mid, None)
                    self._added.pop(mid, None)
                    self._off.add(mid)
        else:
            # Summed when the machine is asked about again (most are not).
            self._added.setdefault(c.machine, []).append(need)


def _proven(graph: GraphManager, view: CellView, used: _Used, waiting: _Waiting
            ) -> dict[str, int]:
    """The machines where :func:`_claim_plain` would claim every waiting arrival in
    bulk, each with the index past its last arrival: every arrival there of a plain
    job (:meth:`_Used.plain`), the machine up and counted by the network as the
    snapshot shows it (``GraphManager.fit_rows``), no claim on it yet in the view nor
    counted by this extraction, and the sum of what all its arrivals need, added up
    on arrays, within what it may hold with a margin (so each ``fit_times`` along the
    way surely says yes). Worked out for all machines at once; the others take the
    usual path."""
    mids, jids = waiting.machines, waiting.jobs
    n = len(mids)
    if not n:
        return {}
    jobs = view.jobs
    job_of: dict[str, int] = {}
    needs: list[Resources | None] = []
    for jid in dict.fromkeys(jids):
        job = jobs.get(jid)
        job_of[jid] = len(needs)
        needs.append(job.task_resources if job is not None and used.plain(job) else None)
    # Machine runs: the arrivals are grouped by machine, in the order claimed.
    starts = [0, *(k for k in range(1, n) if mids[k] != mids[k - 1])]
    machines = [mids[k] for k in starts]
    dims, held, limit, counted = graph.fit_rows(view.snap, machines)
    # A job needing a dimension no machine counted has no column: never proven.
    table = np.zeros((len(needs), len(dims)), dtype=np.float64)
    plain = np.zeros(len(needs), dtype=bool)
    for j, need in enumerate(needs):
        if need is not None and all(d in dims for d, _ in need.amounts):
            plain[j] = True
            for d, a in need.amounts:
                table[j, dims[d]] = a
    of_arrival = np.array([job_of[j] for j in jids], dtype=np.int64)
    at = np.array(starts, dtype=np.int64)
    all_plain = np.minimum.reduceat(plain[of_arrival], at)
    total = held + np.add.reduceat(table[of_arrival], at, axis=0)
    ok = counted & all_plain & (total <= limit).all(axis=1)
    # Claims already on a machine (migrations, claims since the snapshot): the view
    # shows it other than the snapshot, and _claim_plain would stop there.
    gone = used.touched()
    overlaid = view.overlaid
    ends = [*starts[1:], n]
    return {mid: end for mid, end, good in zip(machines, ends, ok.tolist(), strict=True)
            if good and mid not in gone and not overlaid(mid)}


def _claim_plain(ex: Extraction, view: CellView, used: _Used, waiting: _Waiting,
                 start: int, proven: dict[str, int]) -> int:
    """Claim the arrivals ``waiting[start:]`` in order for as long as :func:`_place`
    would claim each with the resource rule alone, with the same claims: jobs with no
    constraint and no neighbour's in the cell (:meth:`_Used.plain`), machines that are
    up and counted, the room asked once per machine and job (``Resources.fit_times``)
    and the claims made together (``CellView.claim_many``). Returns the index of the
    first arrival it could not claim so: that one and the rest of its machine's need
    :func:`_place`."""
    mids, jids, idxs = waiting.machines, waiting.jobs, waiting.indexes
    jobs, n = view.jobs, len(mids)
    snap_get, overlaid = view.snap.machines.get, view.overlaid
    batch: list[Job] = []
    indexes: list[int] = []
    records: list[Machine] = []

    k, mid, jid = start, "", ""
    u: Resources | None = None
    m: Machine | None = None
    job: Job | None = None
    while k < n:
        if mids[k] != mid:
            end = proven.get(mids[k])
            if end is not None:
                # Every arrival here surely fits (_proven): claimed without asking.
                mid = mids[k]
                m = snap_get(mid)
                assert m is not None  # counted by the network (_proven)
                placed = list(map(jobs.__getitem__, jids[k:end]))
                batch.extend(placed)
                indexes.extend(idxs[k:end])
                records.extend([m] * (end - k))
                used.bulk(mid, placed)
                ex.proven += end - k
                k, mid, jid = end, "", ""
                continue
            mid = mids[k]
            # As _place finds the machine and what holds it, where the view shows
            # the snapshot's record (no claim of this decision's on it yet).
            m = snap_get(mid)
            if m is None or m.state is not MachineState.UP:
                break
            u = used.counted(m, overlaid)
            if u is None:
                break
        if jids[k] != jid:
            jid = jids[k]
            job = jobs.get(jid)
            if job is None or not used.plain(job):
                break
            need = job.task_resources
        run = k + 1
        while run < n and jids[run] == jid and mids[run] == mid:
            run += 1
        assert u is not None and m is not None and job is not None
        count = u.fit_times(need, m.capacity, run - k)
        if count:
            if count == 1:
                batch.append(job)
                indexes.append(idxs[k])
                records.append(m)
            else:
                batch.extend([job] * count)
                indexes.extend(idxs[k:k + count])
                records.extend([m] * count)
            # What holds the machine now, summed only if asked again.
            used.added(mid, need, count)
            if count < run - k or (run < n and mids[run] == mid):
                u = used.known(mid)
        k += count
        if k < run:
            break
    if indexes:
        ex.claims.extend(view.claim_many(batch, indexes, records))
        ex.placed += len(indexes)
        ex.bulk += len(indexes)
    return k


def _place(ex: Extraction, view: CellView, used: _Used, a: Arrival, jid: str, index: int,
           victims: _Victims, final: bool, evict: bool = True) -> bool:
    """Claim task ``index`` of ``jid`` on the arrival's machine if the fit rules let it
    (evicting lower-precedence tasks there when ``evict``); count it otherwise when
    ``final``. A spilled task (``evict`` False) takes only room that is free: the flow
    chose neither that machine nor any eviction there."""
    origin = str(a.source[1]) if a.source[0] == "G" else ""
    job = view.jobs.get(jid)
    plain = not origin and job is not None and used.plain(job)
    u = used.known(a.machine) if plain else None
    # Counted already: the snapshot's record has the machine's state and capacity
    # (the view's would be its allocations copied with this decision's claims added).
    m = view.snap.machines.get(a.machine) if u is not None else view.machine(a.machine)
    if job is None or m is None:
        ex.stale += 1
        return True
    if u is None:
        u = used.of(m)
    if (plain and m.state is MachineState.UP and u is not None
            and u.exceeding_with(job.task_resources, m.capacity) is None):
        # Nothing but room can keep it off (no constraint of its own, none of any
        # neighbour's), and there is room: the resource rule alone, on the count the
        # view keeps.
        miss, founding = None, False
    else:
        m = view.machine(a.machine)
        assert m is not None
        # The first claim of an affinity group the view has none of founds it (the
        # store's rule); without it the repair step would refuse what the store accepts.
        founding = founds_group(view, job)
        miss = why_not(view, job, m, founding=founding, used=u, calm=used.calm)
    chosen: list[Allocation] = []
    if miss is not None and miss.rule is Rule.RESOURCES and job.precedence > 0 and evict:
        # Evict the fewest preempted tasks (lowest precedence first) that make room.
        for v in victims.get_all(a.machine):
            if v.precedence >= job.precedence:
                continue
            chosen.append(v)
            miss = why_not(view, job, m, chosen, founding, calm=used.calm)
            if miss is None:
                break
    if miss is not None:
        if final:
            ex.repaired += 1
            ex.turned_back.add((jid, a.machine))
            if not origin:
                ex.unscheduled[jid] = ex.unscheduled.get(jid, 0) + 1
            ex.why.setdefault(jid, f"{miss.label} on {a.machine!r} once this round's "
                              "other placements are counted")
        return False
    claim = view.claim(job, index, a.machine,
                       evict=[v.task for v in chosen] if chosen else (), moves_from=origin)
    used.claimed(claim, job.task_resources)
    ex.claims.append(claim)
    ex.preempted += len(chosen)
    for v in chosen:
        ex.moved.append((v.task, a.machine))
        victims[a.machine].remove(v)
    if origin:
        ex.migrated += 1
        ex.moved.append((task_id(jid, index), origin))
    else:
        ex.placed += 1
    return True


class _Current:
    """Whether tasks are still as the network saw them when the solver started:
    ``latest`` (None: not known, all are) and this decision's view, each job's own
    record looked up once."""

    def __init__(self, latest: CellSnapshot | None, view: CellView) -> None:
        self._latest = latest
        self._claimed = view.claimed
        self._jobs: dict[str, bool] = {}  # job -> neither gone nor ended in latest

    def waiting(self, jid: str, index: int) -> bool:
        tid = f"{jid}/{index}"  # task_id
        if self._claimed(tid):
            return False  # claimed by an earlier round, not yet in the snapshot
        latest = self._latest
        if latest is None:
            return True
        ok = self._jobs.get(jid)
        if ok is None:
            ok = self._jobs[jid] = jid not in latest.statuses and jid in latest.jobs
        if not ok:
            return False
        if tid not in latest.tasks:
            return True  # no record: pending (task_view)
        v = task_view(latest, tid)
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

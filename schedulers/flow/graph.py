"""The graph manager: keeps the flow network in step with the cell, change by change.

It is the only code that edits the network, and it edits it only from the change sets
the replica reports (``Context.changes``): a changed job, task or machine replaces the
arcs of that job, group or machine and nothing else. A full build happens at the first
round, after a reload of the replica, and when the scheduler's instances change (the
jobs this instance owns move). ``tests/test_flow_graph.py`` checks that a network
updated through random change sequences equals one built from scratch.

Shape of the network (see ``costs.py`` for the arc kinds a cost model prices):

* a job's waiting tasks are one node ``W`` with supply k (tasks of a job are identical:
  same resources, constraints, input), and its running tasks on one machine are one
  node ``G`` with supply = their count, so the network grows with jobs and machines,
  not with tasks;
* jobs whose tasks have the same resources and machine selector share an aggregator
  ``E`` (Firmament's task equivalence class); an arc from it (or from its rack
  aggregator ``R``) into a machine exists only where one such task fits in every
  dimension, with the capacity of how many fit;
* a machine's arcs to the sink carry at most ``slots`` units: how many tasks of the
  smallest shape fit in what the tasks outside the network leave. Tasks of different
  shapes share that count, so the flow into one machine can still be too much in some
  dimension; the extraction's repair step (``extract.py``) takes it back to what fits.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from cellstate.cell import CellSnapshot, alloc_placed, holding, machine_used, task_view
from cellstate.keys import KeyKind
from cellstate.model import (
    PLACEABLE,
    Job,
    Machine,
    MachineState,
    Resources,
    Selector,
    split_task_id,
    sum_resources,
    task_id,
)
from schedulers.flow.costs import CostModel, Group, MachineLoad
from schedulers.flow.network import MAX_CAPACITY, Arc, FlowNetwork, NodeKey
from schedulers.runtime import owner_of

SINK: NodeKey = ("S",)
#: Most tasks of one shape counted as fitting on one machine.
MAX_FIT = 100_000


class ArcKind(enum.IntEnum):
    TO_CLUSTER = 1  # W -> E
    PREFERENCE = 2  # W -> M or W -> R
    UNSCHEDULED = 3  # W -> S
    STAY = 4  # G -> its machine
    MIGRATE = 5  # G -> E
    PREEMPT = 6  # G -> S
    TO_RACK = 7  # E -> R
    INTO_MACHINE = 8  # E -> M or R -> M
    TO_SINK = 9  # M -> S


@attrs.frozen
class Shape:
    """What makes tasks interchangeable on any machine."""

    resources: Resources
    selector: Selector


def shape_of(job: Job) -> Shape:
    return Shape(job.task_resources, job.constraints.machine_selector)


def fit_count(avail: Resources, shape: Shape, m: Machine) -> int:
    """How many tasks of ``shape`` fit in ``avail`` on ``m`` (0 where one does not)."""
    if m.state is not MachineState.UP:
        return 0
    # The same test as cellstate.fit.selector, on the shape rather than a job.
    if shape.selector and not all(r.matches(m.label(r.key)) for r in shape.selector):
        return 0
    n = MAX_FIT
    for dim, amount in shape.resources.amounts:
        if amount <= 0:
            continue
        n = min(n, math.floor(avail.get(dim) / amount + 1e-9))
        if n <= 0:
            return 0
    return n


@attrs.define
class JobEntry:
    job: Job
    shape: Shape
    waiting: set[int]
    groups: set[str] = attrs.field(factory=set)  # machines where it has re-offered tasks
    prefs: set[str] = attrs.field(factory=set)  # machines it has preference arcs into
    unscheduled_slot: int = -1


@attrs.define
class MachineEntry:
    machine: Machine
    avail: Resources  # capacity minus what the tasks outside the network hold
    load: MachineLoad
    groups: dict[str, list[int]]  # job -> indexes of its re-offered tasks here
    others: dict[str, list[int]]  # another scheduler's job -> its preemptible tasks here


@attrs.frozen
class UpdateStats:
    full: bool
    jobs: int  # jobs whose arcs were replaced
    machines: int


class GraphManager:
    def __init__(self, model: CostModel, scheduler: str, instance: str = "0", *,
                 move_guard: float = 60.0, preempt_below: int | None = None) -> None:
        self.model = model
        self.scheduler = scheduler
        self.instance = instance
        self.move_guard = move_guard
        self.preempt_below = preempt_below
        self.reoffers = (type(model).migrate is not CostModel.migrate
                         or type(model).preempt is not CostModel.preempt)
        self._reset()

    def _reset(self) -> None:
        self.net = FlowNetwork()
        self.jobs: dict[str, JobEntry] = {}
        self.machines: dict[str, MachineEntry] = {}
        self.shapes: dict[Shape, int] = {}  # shape -> jobs of it
        self.racks: dict[str, str] = {}  # machine -> rack
        self._rack_set: set[str] = set()
        self._pref_in: dict[str, set[str]] = {}  # machine -> jobs preferring it
        self._members: tuple[str, ...] = ()
        self._moved_at: dict[str, float] = {}  # task -> when this scheduler moved it
        self._guards: list[tuple[float, str, str]] = []  # (expiry, task or "", machine)
        # (shape, machine) -> until when arrivals there may not count on reclaimed room
        self._blocked: dict[tuple[Shape, str], float] = {}
        self._stale_machines: set[str] = set()  # to reload at the next update
        self._snap: CellSnapshot | None = None
        self._now = 0.0
        self.built = False

    # -- the public steps ----------------------------------------------------------------

    def update(self, snap: CellSnapshot, changes: Iterable[tuple[KeyKind, str]] | None,
               now: float) -> UpdateStats:
        """Bring the network to ``snap`` given what changed since the last update
        (None: anything), with time-dependent costs as at ``now``."""
        self._snap, self._now = snap, now
        members = tuple(snap.live_instances(self.scheduler)) or (self.instance,)
        if changes is None or not self.built or members != self._members:
            return self.rebuild(snap, now)
        full: set[str] = set()
        tasks: set[str] = set()
        machines: set[str] = set()
        gangs = False
        for kind, ident in changes:
            if kind is KeyKind.JOB or kind is KeyKind.STATUS:
                full.add(ident)
            elif kind is KeyKind.TASK:
                tasks.add(ident)
            elif kind is KeyKind.MACHINE:
                machines.add(ident)
            elif kind is KeyKind.ALLOC:
                machines.add(ident.partition("/")[0])
            elif kind is KeyKind.GANG:
                gangs = True
        if gangs:
            full.update(j for j, e in self.jobs.items() if e.job.gang)
        return self._apply(snap, full, tasks, machines, now)

    def rebuild(self, snap: CellSnapshot, now: float) -> UpdateStats:
        moved, guards, blocked = self._moved_at, self._guards, self._blocked
        self._reset()
        self._moved_at, self._guards, self._blocked = moved, guards, blocked
        self._snap, self._now = snap, now
        self._members = tuple(snap.live_instances(self.scheduler)) or (self.instance,)
        self.built = True
        return self._apply(snap, set(snap.jobs.keys()), set(), set(snap.machines.keys()), now,
                           full_build=True)

    def note_moved(self, tasks: Iterable[tuple[str, str]], now: float) -> None:
        """The policy moved or preempted these (task, machine it left): they may not be
        moved again for ``move_guard`` seconds (the flapping guard)."""
        for tid, mid in tasks:
            self._moved_at[tid] = now
            heapq.heappush(self._guards, (now + self.move_guard, tid, mid))

    def block(self, jid: str, mid: str, now: float) -> None:
        """An arrival of ``jid`` on ``mid`` counted on room its re-offered tasks hold
        and the repair step turned it back (tasks of several shapes add up differently
        than slots do): for ``move_guard`` seconds, arrivals of its shape there get
        only the room that is free, so the same solution is not found again."""
        e = self.jobs.get(jid)
        if e is None:
            return
        until = now + max(self.move_guard, 1.0)
        self._blocked[(e.shape, mid)] = until
        heapq.heappush(self._guards, (until, "", mid))
        self._stale_machines.add(mid)

    # -- applying changes ------------------------------------------------------------------

    def _apply(self, snap: CellSnapshot, full: set[str], tasks: set[str], machines: set[str],
               now: float, full_build: bool = False) -> UpdateStats:
        rearc: set[str] = set()
        for jid in full:
            self._load_job(snap, jid, machines)
            rearc.add(jid)
        for tid in tasks:
            jid, index = split_task_id(tid)
            e = self.jobs.get(jid)
            if e is None or jid in full:
                continue
            if self._waits(snap, tid):
                if index not in e.waiting:
                    e.waiting.add(index)
                    rearc.add(jid)
            elif index in e.waiting:
                e.waiting.discard(index)
                rearc.add(jid)
        shapes = {e.shape for e in self.jobs.values()}
        new_shapes = shapes - set(self.shapes)
        if shapes != set(self.shapes):
            # A new shape needs its arcs into every machine; a gone one leaves them.
            machines = set(snap.machines.keys()) | set(self.machines)
        self.shapes = {}
        for e in self.jobs.values():
            self.shapes[e.shape] = self.shapes.get(e.shape, 0) + 1
        racks_changed = full_build
        for mid in machines:
            m = snap.machines.get(mid)
            rack = m.rack if m is not None else None
            if self.racks.get(mid) != rack:
                racks_changed = True
                if rack is None:
                    self.racks.pop(mid, None)
                else:
                    self.racks[mid] = rack
        if racks_changed:
            self._rack_set = set(self.racks.values())
            for s in self.shapes:
                self._shape_arcs(s)
        else:
            for s in new_shapes:
                self._shape_arcs(s)  # its aggregator's arcs to the racks
        for s in list(self._shaped_owners()):
            if s not in self.shapes:
                self.net.drop(("E", s))
        # Guards that expire make their groups movable again.
        while self._guards and self._guards[0][0] <= now:
            _, tid, mid = heapq.heappop(self._guards)
            machines.add(mid)
            # A moved task is guarded where it runs now, not on the machine it left.
            rec = snap.tasks.get(tid) if tid else None
            if rec is not None and rec.machine:
                machines.add(rec.machine)
        for key in [k for k, until in self._blocked.items() if until <= now]:
            del self._blocked[key]
        machines |= self._stale_machines
        self._stale_machines = set()
        for mid in machines:
            self._load_machine(snap, mid, rearc)
        for jid in rearc:
            self._job_arcs(jid, now)
        for jid, e in self.jobs.items():
            if jid not in rearc and e.unscheduled_slot >= 0:
                self.net.set_cost(e.unscheduled_slot, self.model.unscheduled(
                    e.job, max(now - e.job.submitted_at, 0.0)))
        total = sum(len(e.waiting) for e in self.jobs.values()) + sum(
            len(ix) for me in self.machines.values()
            for ix in (*me.groups.values(), *me.others.values()))
        self.net.set_supply(SINK, -total)
        return UpdateStats(full_build, len(rearc), len(machines))

    def _shaped_owners(self) -> Iterable[Shape]:
        for owner in self.net.owners():
            if owner[0] == "E":
                yield owner[1]  # type: ignore[misc]

    def _owns(self, snap: CellSnapshot, job: Job | None) -> bool:
        return (job is not None and job.scheduler == self.scheduler
                and job.id not in snap.statuses
                and owner_of(job.id, self._members) == self.instance)

    def _waits(self, snap: CellSnapshot, tid: str) -> bool:
        v = task_view(snap, tid)
        return v.state in PLACEABLE and not v.reserved_by

    def _load_job(self, snap: CellSnapshot, jid: str, machines: set[str]) -> None:
        job = snap.jobs.get(jid)
        old = self.jobs.get(jid)
        if not self._owns(snap, job):
            if old is not None:
                self._forget_job(jid, old)
                machines.update(old.groups)  # its tasks there are no longer re-offered
            return
        assert job is not None
        waiting = {i for i in range(job.task_count) if self._waits(snap, task_id(jid, i))}
        if old is None:
            self.jobs[jid] = JobEntry(job, shape_of(job), waiting)
            # Tasks already running (a rebuild) are found from their machines.
            if self.built and not machines.issuperset(self.machines):
                machines.update(self._machines_of(snap, jid, job))
        else:
            old.job, old.waiting = job, waiting
            if old.shape != shape_of(job):
                old.shape = shape_of(job)
                machines.update(old.groups)

    def _machines_of(self, snap: CellSnapshot, jid: str, job: Job) -> set[str]:
        out = set()
        for i in range(job.task_count):
            rec = snap.tasks.get(task_id(jid, i))
            if rec is not None and rec.machine:
                out.add(rec.machine)
        return out

    def _forget_job(self, jid: str, e: JobEntry) -> None:
        self.net.drop(("W", jid))
        self.net.set_supply(("W", jid), 0)
        for mid in e.prefs:
            self._pref_in.get(mid, set()).discard(jid)
        del self.jobs[jid]

    def _load_machine(self, snap: CellSnapshot, mid: str, rearc: set[str]) -> None:
        m = snap.machines.get(mid)
        old = self.machines.pop(mid, None)
        old_groups = set(old.groups) if old is not None else set()
        old_others = set(old.others) if old is not None else set()
        if m is None:
            self.net.drop(("M", mid))
            for jid in old_groups | old_others:
                self._group_arcs(jid, mid, [], own=jid in old_groups)
            for jid in self._pref_in.get(mid, ()):
                rearc.add(jid)
            return
        groups: dict[str, list[int]] = {}
        others: dict[str, list[int]] = {}
        outside: list[Resources] = []
        for a in holding(m, snap.gangs):
            e = self.jobs.get(a.job)
            placed = alloc_placed(a, snap.gangs) and not a.evicted_by
            if placed and self.reoffers and e is not None and a.scheduler == self.scheduler:
                groups.setdefault(a.job, []).append(split_task_id(a.task)[1])
            elif (placed and self.preempt_below is not None and a.scheduler != self.scheduler
                  and not a.gang and a.precedence < self.preempt_below
                  and a.job in snap.jobs):
                others.setdefault(a.job, []).append(split_task_id(a.task)[1])
            else:
                outside.append(a.resources)
        avail = m.capacity - sum_resources(outside)
        share = 0.0
        for dim, cap in m.capacity.amounts:
            if cap > 0:
                share = max(share, 1.0 - avail.get(dim) / cap)
        reoffered = sum(len(ix) for ix in groups.values()) + sum(
            len(ix) for ix in others.values())
        used = machine_used(m, snap.gangs)
        free = m.capacity - used
        fits = {s: fit_count(free, s, m) for s in self.shapes}
        # Room the re-offered tasks hold, usable only when some of them leave.
        reclaim = {s: max(fit_count(avail, s, m) - fits[s], 0) for s in self.shapes}
        slots = max([0, *(reoffered + n for n in fits.values()),
                     *(fits[s] + reclaim[s] for s in self.shapes)])
        load = MachineLoad(m, slots, min(max(share, 0.0), 1.0), used)
        for ix in groups.values():
            ix.sort()
        for ix in others.values():
            ix.sort()
        self.machines[mid] = MachineEntry(m, avail, load, groups, others)
        arcs: list[Arc] = []
        into = self.model.machine_arc(load)
        extra = self.model.reclaim(load) if reoffered else None
        for s in self.shapes:
            src: NodeKey = ("R", s, m.rack) if self.model.uses_racks else ("E", s)
            if fits[s] > 0:
                arcs.append(Arc(src, ("M", mid), fits[s], into, 0, ArcKind.INTO_MACHINE))
            if extra is not None and reclaim[s] > 0 and (
                    self._blocked.get((s, mid), -math.inf) <= self._now):
                arcs.append(Arc(src, ("M", mid), reclaim[s], into + extra, 0,
                                ArcKind.INTO_MACHINE))
        arcs.extend(Arc(("M", mid), SINK, cap, cost, 0, ArcKind.TO_SINK)
                    for cap, cost in self.model.sink_tiers(load) if cap > 0)
        self.net.set_arcs(("M", mid), arcs)
        for jid in old_groups | set(groups):
            self._group_arcs(jid, mid, groups.get(jid, []), own=True)
        for jid in old_others | set(others):
            self._group_arcs(jid, mid, others.get(jid, []), own=False)
        rearc.update(self._pref_in.get(mid, ()))

    def _group_arcs(self, jid: str, mid: str, indexes: list[int], own: bool) -> None:
        key: NodeKey = ("G", jid, mid) if own else ("O", jid, mid)
        e = self.jobs.get(jid) if own else None
        if not indexes:
            self.net.drop(key)
            self.net.set_supply(key, 0)
            if e is not None:
                e.groups.discard(mid)
            return
        snap = self._snap
        assert snap is not None
        job = e.job if e is not None else snap.jobs[jid]
        movable = sum(1 for i in indexes
                      if self._now - self._moved_at.get(task_id(jid, i), -math.inf)
                      >= self.move_guard)
        g = Group(job, mid, len(indexes), movable, own)
        arcs = [Arc(key, ("M", mid), g.count, self.model.stay(g), 0, ArcKind.STAY)]
        if movable:
            if own:
                cost = self.model.migrate(g)
                if cost is not None:
                    arcs.append(Arc(key, ("E", shape_of(job)), movable, cost, 0,
                                    ArcKind.MIGRATE))
            cost = self.model.preempt(g, 0.0)
            if cost is not None:
                arcs.append(Arc(key, SINK, movable, cost, 0, ArcKind.PREEMPT))
        self.net.set_arcs(key, arcs)
        self.net.set_supply(key, g.count)
        if e is not None:
            e.groups.add(mid)

    def _shape_arcs(self, s: Shape) -> None:
        if not self.model.uses_racks:
            return
        self.net.set_arcs(("E", s), [Arc(("E", s), ("R", s, rack), MAX_CAPACITY, 0, 0,
                                          ArcKind.TO_RACK) for rack in sorted(self._rack_set)])

    def _job_arcs(self, jid: str, now: float) -> None:
        e = self.jobs.get(jid)
        if e is None:
            return
        for mid in e.prefs:
            self._pref_in.get(mid, set()).discard(jid)
        e.prefs = set()
        k = len(e.waiting)
        w: NodeKey = ("W", jid)
        self.net.set_supply(w, k)
        if k == 0:
            self.net.drop(w)
            e.unscheduled_slot = -1
            return
        job = e.job
        arcs = [Arc(w, SINK, k, self.model.unscheduled(job, max(now - job.submitted_at, 0.0)),
                    0, ArcKind.UNSCHEDULED),
                Arc(w, ("E", e.shape), k, self.model.to_cluster(job), 0, ArcKind.TO_CLUSTER)]
        for p in self.model.preferences(job, self.racks):
            if p.machine:
                me = self.machines.get(p.machine)
                n = fit_count(me.avail, e.shape, me.machine) if me is not None else 0
                if n > 0:
                    arcs.append(Arc(w, ("M", p.machine), min(k, n), p.cost, 0,
                                    ArcKind.PREFERENCE))
                if me is not None:
                    e.prefs.add(p.machine)
                    self._pref_in.setdefault(p.machine, set()).add(jid)
            elif p.rack in self._rack_set and self.model.uses_racks:
                arcs.append(Arc(w, ("R", e.shape, p.rack), k, p.cost, 0, ArcKind.PREFERENCE))
        slots = self.net.set_arcs(w, arcs)
        e.unscheduled_slot = slots[0]

    # -- what the extraction needs -----------------------------------------------------------

    def waiting_of(self, jid: str) -> list[int]:
        e = self.jobs.get(jid)
        return sorted(e.waiting) if e is not None else []

    def group_of(self, jid: str, mid: str, own: bool = True) -> list[int]:
        me = self.machines.get(mid)
        if me is None:
            return []
        return list((me.groups if own else me.others).get(jid, []))

    def movable(self, jid: str, index: int) -> bool:
        return self._now - self._moved_at.get(task_id(jid, index), -math.inf) >= self.move_guard

    def describe(self) -> Mapping[str, Any]:
        return {"nodes": self.net.node_count, "arcs": self.net.arc_count,
                "jobs": len(self.jobs), "machines": len(self.machines),
                "shapes": len(self.shapes)}

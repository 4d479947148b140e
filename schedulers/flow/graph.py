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
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any, NamedTuple, TypeVar, cast

import attrs
import numpy as np
import numpy.typing as npt

from cellstate.cell import CellSnapshot, alloc_placed, holding, task_view
from cellstate.keys import KeyKind
from cellstate.model import (
    FIT_SLACK,
    PLACEABLE,
    Allocation,
    Job,
    Machine,
    MachineState,
    Resources,
    Selector,
    TaskState,
    split_task_id,
    sum_resources,
    task_id,
    trusted_resources,
)
from schedulers.flow.costs import (
    CostModel,
    Group,
    MachineBatch,
    MachineLoad,
    Racks,
    TaskCosts,
    TaskPrices,
)
from schedulers.flow.network import MAX_CAPACITY, Arc, FlowNetwork, NodeKey
from schedulers.runtime import owner_of

SINK: NodeKey = ("S",)
_PRICES = itemgetter(0)  # of a JobEntry.prices row: its table
_ROW = itemgetter(1)  # and its row there
_T = TypeVar("_T")
#: Most tasks of one shape counted as fitting on one machine.
MAX_FIT = 100_000
# How far below that limit a sum of a machine's arrivals, added up on arrays, must
# stay for the fit to be proven: far more than the rounding of a dozen additions
# (about 1e-15 of the capacity), far less than the slack itself.
_PROOF_MARGIN = 1e-12


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
    LEAVE_UNSCHEDULED = 10  # U -> S


@attrs.frozen(cache_hash=True)
class Shape:
    """What makes tasks interchangeable on any machine."""

    resources: Resources
    selector: Selector


def shape_of(job: Job) -> Shape:
    return Shape(job.task_resources, job.constraints.machine_selector)


def _selects(shape: Shape, m: Machine) -> bool:
    """The same test as cellstate.fit.selector, on the shape rather than a job."""
    return not shape.selector or all(r.matches(m.label(r.key)) for r in shape.selector)


def fit_count(avail: Resources, shape: Shape, m: Machine,
              dims: tuple[str, ...] | None = None) -> int:
    """How many tasks of ``shape`` fit in ``avail`` on ``m`` (0 where one does not),
    counting the dimensions ``dims`` only (None: all; ``CostModel.dimensions``)."""
    if m.state is not MachineState.UP or not _selects(shape, m):
        return 0
    n = MAX_FIT
    for dim, amount in shape.resources.amounts:
        if amount <= 0 or (dims is not None and dim not in dims):
            continue
        n = min(n, math.floor(avail.get(dim) / amount + FIT_SLACK))
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
    gkey: GroupKey | None = None  # the group its running tasks join (made once)
    # Tasks the cost model prices on their own (None: like the job's others), asked
    # once per task; and the waiting ones that have a node of their own now.
    costs: dict[int, TaskCosts | None] = attrs.field(factory=dict)
    # Tasks priced on their own many at once (CostModel.task_prices): their batch and
    # position there; made into TaskCosts (costs) only where one is asked for.
    prices: dict[int, tuple[TaskPrices, int]] = attrs.field(factory=dict)
    task_nodes: set[int] = attrs.field(factory=set)


class _NewNodes(NamedTuple):
    """Task nodes to add (:meth:`GraphManager._add_task_nodes`): the waiting tasks
    ``tasks`` of a job, priced at ``rows`` of ``prices``, waited ``waited`` seconds."""

    entry: JobEntry
    prices: TaskPrices
    rows: list[int]
    tasks: list[int]
    waited: float


@attrs.frozen(cache_hash=True)
class GroupKey:
    """What makes running tasks on one machine interchangeable for the network: the
    same shape and precedence, and both this scheduler's (movable) or both another's
    (preemptible only). Their node ``("G", machine, key)`` has supply = their count."""

    shape: Shape
    precedence: int
    own: bool
    task: str = ""  # a running task with a node of its own (priced on its own)


class Layout(NamedTuple):
    """Where a machine's arcs in sit, as :meth:`GraphManager._machine_arcs` made them:
    for the shapes ``order`` (the graph manager's, that very tuple), whether each may
    use the machine now (``gate``: up, selector matched), the positions in ``order``
    of the shapes that could ever fit (``eligible``), and the slots of their arcs in
    (``fits``; ``reclaim``: the arcs into reclaimed room, None if the model has none)."""

    order: tuple[Shape, ...]
    gate: tuple[bool, ...]
    eligible: list[int]
    fits: list[int]
    reclaim: list[int] | None


def _fit_counts(room: npt.NDArray[np.float64], amounts: npt.NDArray[np.float64],
                gate: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """:func:`fit_count` for many machines (rows of ``room``) and shapes (rows of
    ``amounts``) at once, with the same float operations."""
    out = np.full((room.shape[0], amounts.shape[0]), MAX_FIT, dtype=np.int64)
    for i in range(amounts.shape[0]):
        cols = np.flatnonzero(amounts[i] > 0)
        if len(cols):
            n = np.floor(room[:, cols] / amounts[i, cols] + FIT_SLACK).min(axis=1)
            out[:, i] = np.clip(n, 0, MAX_FIT)
    out[~gate] = 0
    return out


@attrs.define
class MachineEntry:
    machine: Machine
    avail: Resources  # capacity minus what the tasks outside the network hold
    groups: dict[GroupKey, set[str]]  # re-offered task ids here
    movable: dict[GroupKey, int]  # of which not moved too recently
    jobs: dict[str, int]  # this scheduler's jobs -> their re-offered tasks here
    where: dict[str, GroupKey]  # re-offered task -> its group
    tier_key: object = None  # what the machine's sink arcs were made from
    tagged: bool = False  # some allocation has gang or eviction tags: no deltas
    eligible: dict[Shape, bool] = attrs.field(factory=dict)  # could it ever fit here
    # Whether a shape could fit by capacity and selector, whatever the machine's state
    # (GraphManager._could_fit): kept while the record keeps them (_same_record).
    could: dict[Shape, bool] = attrs.field(factory=dict)
    layout: Layout | None = None  # of its arcs in
    share_of: Resources | None = None  # the ``avail`` that ``share`` was worked out for
    share: float = 0.0
    # ``avail`` in the dimensions the fit rule counts, and for which avail and list
    # of dimensions
    avail_row: tuple[Resources | None, list[str] | None, list[float]] = (None, None, [])
    # The re-offered tasks counted by their resources, kept as they come and go: with a
    # node per running task a machine has a dozen groups, and the extraction asks what
    # holds a machine once per placement.
    shape_counts: dict[Resources, int] = attrs.field(factory=dict)
    # capacity less avail, and for which avail (the entry's record keeps its capacity:
    # _same_record); the extraction remembers used() itself for the round
    outside_of: tuple[Resources | None, Resources | None] = (None, None)

    def add(self, gk: GroupKey, a: Allocation) -> bool:
        """Whether ``a``'s job had no re-offered task here before."""
        tids = self.groups.setdefault(gk, set())
        if a.task not in tids:
            tids.add(a.task)
            r = gk.shape.resources
            self.shape_counts[r] = self.shape_counts.get(r, 0) + 1
        self.where[a.task] = gk
        if gk.own:
            n = self.jobs.get(a.job, 0)
            self.jobs[a.job] = n + 1
            return not n
        return False

    def remove(self, tid: str) -> tuple[GroupKey | None, bool]:
        """The group ``tid`` left, and whether its job has no re-offered task here
        now."""
        gk = self.where.pop(tid, None)
        if gk is not None:
            tids = self.groups[gk]
            if tid in tids:
                tids.discard(tid)
                r = gk.shape.resources
                n = self.shape_counts[r] - 1
                if n:
                    self.shape_counts[r] = n
                else:
                    del self.shape_counts[r]
            if gk.own:
                jid = tid.rpartition("/")[0]
                n = self.jobs[jid] - 1
                if n:
                    self.jobs[jid] = n
                else:
                    del self.jobs[jid]
                    return gk, True
        return gk, False

    def _by_shape(self) -> dict[Resources, int]:
        """The re-offered tasks counted by their resources (a machine's tasks with
        nodes of their own are one group each, mostly of one shape)."""
        return self.shape_counts

    def free_amounts(self) -> dict[str, float]:
        """What no allocation holds: ``avail`` less the re-offered tasks."""
        amounts = dict(self.avail.amounts)
        for r, n in self._by_shape().items():
            for dim, amount in r.amounts:
                amounts[dim] = amounts.get(dim, 0.0) - amount * n
        return amounts

    def reoffered(self) -> int:
        return sum(self.shape_counts.values())

    def used(self) -> Resources:
        """What the machine's allocations hold as this entry counts them: the tasks
        outside the network (capacity less ``avail``) and the re-offered ones."""
        avail, outside = self.outside_of
        if avail is not self.avail or outside is None:
            # Most machines hold nothing outside the network: no subtraction then.
            cap = self.machine.capacity
            outside = _NOTHING if self.avail == cap else cap - self.avail
            self.outside_of = (self.avail, outside)
        counts = self._by_shape()
        a = outside.amounts
        if len(a) == 2 and not counts:
            if abs(a[0][1]) > 1e-9 and abs(a[1][1]) > 1e-9:
                return outside
        elif len(counts) == 1:
            # One shape over two dimensions, none outside or the same two (the usual
            # machine): the sums below without the dict.
            ((r, n),) = counts.items()
            b = r.amounts
            if len(b) == 2 and (not a or (len(a) == 2 and b[0][0] == a[0][0]
                                          and b[1][0] == a[1][0])):
                s0 = (a[0][1] if a else 0.0) + b[0][1] * n
                s1 = (a[1][1] if a else 0.0) + b[1][1] * n
                if abs(s0) > 1e-9 and abs(s1) > 1e-9:
                    return trusted_resources(((b[0][0], s0), (b[1][0], s1)))
        amounts = dict(a)
        for r, n in counts.items():
            for dim, amount in r.amounts:
                amounts[dim] = amounts.get(dim, 0.0) + amount * n
        return Resources(tuple(sorted((d, a) for d, a in amounts.items() if abs(a) > 1e-9)))


_NOTHING = Resources()


def _same_record(a: Machine, b: Machine) -> bool:
    """Whether two versions of a machine differ in their allocations at most."""
    return (a.capacity == b.capacity and a.state is b.state and a.rack == b.rack
            and a.labels == b.labels and a.failure_domain == b.failure_domain)


@attrs.frozen
class UpdateStats:
    full: bool
    jobs: int  # jobs whose arcs were replaced
    machines: int
    batched: int = 0  # of those machines, updated together (_flush_machines)


class GraphManager:
    def __init__(self, model: CostModel, scheduler: str, instance: str = "0", *,
                 move_guard: float = 60.0, preempt_below: int | None = None,
                 batch: bool = True) -> None:
        """``batch`` False: every machine's arcs are worked out one by one
        (``_machine_arcs``), the reference the batched update is tested against."""
        self.model = model
        self.scheduler = scheduler
        self.instance = instance
        self.move_guard = move_guard
        self.preempt_below = preempt_below
        self.reoffers = (type(model).migrate is not CostModel.migrate
                         or type(model).preempt is not CostModel.preempt)
        # Machines are updated in batches where the model prices them in batches.
        self._batch = batch and model.machine_costs(MachineBatch(
            [], np.zeros(0, dtype=np.int64), np.zeros(0), list)) is not None
        self._reset()

    def _reset(self) -> None:
        self.net = FlowNetwork()
        self.jobs: dict[str, JobEntry] = {}
        self._waiting_jobs: set[str] = set()  # jobs with waiting tasks
        self.machines: dict[str, MachineEntry] = {}
        self.shapes: dict[Shape, int] = {}  # shape -> jobs of it
        self.racks: dict[str, str] = {}  # machine -> rack
        self._rack_set: set[str] = set()
        self._layout = Racks()  # self.racks as cost models see them
        # Per shape, whether it could ever fit each machine of the layout (-1: not
        # known yet), by layout position (_could_many).
        self._could: dict[Shape, npt.NDArray[np.int8]] = {}
        # Per resource dimension, each layout machine's capacity in it (NaN: not known,
        # its entry made again since), for _could_many's first look at a shape.
        self._capacity: dict[str, npt.NDArray[np.float64]] = {}
        self._machine_keys: tuple[Sequence[str], list[NodeKey]] = ((), [])
        self._task_jobs: set[str] = set()  # jobs with a task priced on its own
        self._runs = _Continuations()  # running tasks with a node of their own
        self._pref_in: dict[str, set[str]] = {}  # machine -> jobs preferring it
        self._members: tuple[str, ...] = ()
        self._moved_at: dict[str, float] = {}  # task -> when this scheduler moved it
        self._guards: list[tuple[float, str, str]] = []  # (expiry, task or "", machine)
        # (shape, machine) -> until when arrivals there may not count on reclaimed room
        self._blocked: dict[tuple[Shape, str], float] = {}
        self._stale_machines: set[str] = set()  # to reload at the next update
        self._shape_owners: set[Shape] = set()  # shapes whose E node owns arcs
        self._group_costs: dict[NodeKey, tuple[int, int | None, int | None]] = {}
        self._shape_order: tuple[Shape, ...] = ()  # self.shapes, a new tuple when they change
        self._table: tuple[tuple[Shape, ...], list[str], npt.NDArray[np.float64]] | None = None
        self._pending: list[str] = []  # machines whose arcs _flush_machines works out
        # Group arcs' new numbers, written at once after the machines: (slots,
        # capacity, cost, lower), in step.
        self._writes: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
        # One object per distinct shape and group key: dict look-ups by them then find
        # the very object and skip comparing fields.
        self._interned: dict[Any, Any] = {}
        self._rows = FitRows()
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
                machines.add(ident.partition("/")[0])  # keys.split_alloc's machine
            elif kind is KeyKind.GANG:
                gangs = True
        if gangs:
            full.update(j for j, e in self.jobs.items() if e.job.gang)
        if self._task_jobs and any(self._layout_changed(snap, mid) for mid in machines):
            # Tasks priced on their own are priced from the cell's layout (racks,
            # machines' capacities and labels); it changes rarely, and then every
            # such task's arcs are made again.
            return self.rebuild(snap, now)
        return self._apply(snap, full, tasks, machines, now)

    def _layout_changed(self, snap: CellSnapshot, mid: str) -> bool:
        m = snap.machines.get(mid)
        me = self.machines.get(mid)
        if m is None or me is None:
            return m is not None or me is not None
        old = me.machine
        return not (old is m or (old.capacity == m.capacity and old.rack == m.rack
                                 and old.labels == m.labels))

    def rebuild(self, snap: CellSnapshot, now: float) -> UpdateStats:
        moved, guards, blocked = self._moved_at, self._guards, self._blocked
        started = self._runs.started
        self._reset()
        self._moved_at, self._guards, self._blocked = moved, guards, blocked
        # When running tasks started, as this scheduler first saw them running (the
        # cell keeps no start time): the continuation discount goes on from there.
        self._runs.started = started
        self._snap, self._now = snap, now
        self._members = tuple(snap.live_instances(self.scheduler)) or (self.instance,)
        self.built = True
        stats = self._apply(snap, set(snap.jobs.keys()), set(), set(snap.machines.keys()), now,
                            full_build=True)
        self._runs.prune()
        return stats

    def note_moved(self, tasks: Iterable[tuple[str, str]], now: float) -> None:
        """The policy moved or preempted these (task, machine it left): they may not be
        moved again for ``move_guard`` seconds (the flapping guard)."""
        for tid, mid in tasks:
            self._moved_at[tid] = now
            heapq.heappush(self._guards, (now + self.move_guard, tid, mid))
            self._stale_machines.add(mid)

    def started(self) -> dict[tuple[str, str], float]:
        """When each running task with a node of its own was first seen running on
        its machine ((task, machine) -> time): the cell keeps no start time, so a
        graph manager that takes over another's network (tests) is told these."""
        return dict(self._runs.started)

    def note_started(self, started: Mapping[tuple[str, str], float]) -> None:
        self._runs.started.update(started)

    def due(self, now: float) -> bool:
        """Whether a guard or a block runs out by ``now``: the network changes then,
        though nothing in the cell did."""
        return bool(self._guards) and self._guards[0][0] <= now

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
        # Machines whose allocations must be classified again from scratch (a job
        # joined or left the network, or its group changed); the others are updated
        # from the allocations that changed.
        reload: set[str] = set(machines) if full_build else set()
        # Sorted wherever the order decides which slots arcs take: the same cell and
        # changes give the same arrays (and solution) whatever the hash seed.
        for jid in sorted(full):
            self._load_job(snap, jid, reload)
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
        if full:
            # Only a job loaded again (or gone) changes the shapes: an update without
            # one skips these passes over every job, which would otherwise be most of
            # a small update's cost (changes taken in between rounds come a few at a
            # time).
            shapes = {e.shape for e in self.jobs.values()}
            if shapes != set(self.shapes):
                # A new shape needs its arcs into every machine; a gone one leaves them.
                machines = set(snap.machines.keys()) | set(self.machines)
            self.shapes = {}
            for e in self.jobs.values():
                self.shapes[e.shape] = self.shapes.get(e.shape, 0) + 1
            if tuple(self.shapes) != self._shape_order:
                self._shape_order = tuple(self.shapes)
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
            self._layout = Racks(self.racks)
            self._could = {}
            self._capacity = {}
            # A job's arcs to racks and the cluster are priced on the layout.
            rearc.update(j for j, e in self.jobs.items() if e.job.input)
        if self.model.uses_racks:  # else a shape's aggregator has no arcs of its own
            for s in (self.shapes if racks_changed
                      else sorted(self.shapes.keys() - self._shape_owners, key=repr)):
                self._shape_arcs(s)
        for s in sorted(self._shape_owners - self.shapes.keys(), key=repr):
            self.net.drop(("E", s))
        self._shape_owners &= self.shapes.keys()
        # Guards that expire make their groups movable again.
        while self._guards and self._guards[0][0] <= now:
            # The task may run elsewhere by now (moved): both machines change.
            _, tid, mid = heapq.heappop(self._guards)
            machines.add(mid)
            rec = snap.tasks.get(tid) if tid else None
            if rec is not None and rec.machine:
                machines.add(rec.machine)
            if tid and self._moved_at.get(tid, math.inf) + self.move_guard <= now:
                del self._moved_at[tid]
        for key in [k for k, until in self._blocked.items() if until <= now]:
            del self._blocked[key]
        machines |= self._stale_machines | reload
        self._stale_machines = set()
        for mid in sorted(machines):
            self._load_machine(snap, mid, rearc, mid in reload)
        batched = self._flush_machines()
        # Safe only now: each group's arcs were renumbered once, by its machine, and
        # no slot of them was freed since.
        w_slot, w_cap, w_cost, w_lower = self._writes
        self.net.write(*(np.array(w, dtype=np.int64) for w in (w_slot, w_cap, w_cost, w_lower)))
        self._writes = ([], [], [], [])
        # A round's arriving jobs priced, and their task nodes added, all together: one
        # pass of array operations each, not one per job.
        self._price_waiting([self.jobs[j] for j in sorted(rearc) if j in self.jobs])
        fresh: list[_NewNodes] = []
        for jid in sorted(rearc):
            self._job_arcs(jid, now, jid in full, fresh)
            # Every job whose waiting tasks changed is in rearc: the others keep theirs.
            e = self.jobs.get(jid)
            if e is not None and e.waiting:
                self._waiting_jobs.add(jid)
            else:
                self._waiting_jobs.discard(jid)
        self._add_task_nodes(fresh)
        for jid in self._waiting_jobs:
            if jid not in rearc:
                e = self.jobs[jid]
                job = e.job
                waited = max(now - job.submitted_at, 0.0)
                # Position 0: the unscheduled arc (see _job_arcs).
                if self.net.slots_of(("W", jid)) is not None:
                    self.net.set_cost(("W", jid), 0, self.model.unscheduled(job, waited))
                if e.task_nodes:
                    self._wait_costs(e, waited)
        self._runs.write(self.net, self.model, now)
        self._rows.refresh(self, snap)
        self.net.set_supply(SINK, 0)
        self.net.set_supply(SINK, -self.net.total_supply)
        return UpdateStats(full_build, len(rearc), len(machines), batched)

    def _intern(self, x: _T) -> _T:
        return self._interned.setdefault(x, x)  # type: ignore[no-any-return]

    def _owns(self, snap: CellSnapshot, job: Job | None) -> bool:
        return (job is not None and job.scheduler == self.scheduler
                and job.id not in snap.statuses
                and owner_of(job.id, self._members) == self.instance)

    def _waits(self, snap: CellSnapshot, tid: str) -> bool:
        rec = snap.tasks.get(tid)
        if rec is None:
            return True  # pending
        if not rec.gang:
            if rec.state is not TaskState.RUNNING:
                return rec.state in PLACEABLE  # what task_view says of such a record
            m = snap.machines.get(rec.machine)
            if m is None or not m.has_tags:
                return False  # no gang evicts it: running, as task_view says
        v = task_view(snap, tid)
        return v.state in PLACEABLE and not v.reserved_by

    def _load_job(self, snap: CellSnapshot, jid: str, machines: set[str]) -> None:
        """``machines``: where allocations must be classified again because of it."""
        job = snap.jobs.get(jid)
        old = self.jobs.get(jid)
        if not self._owns(snap, job):
            if old is not None:
                self._forget_job(jid, old)
                machines.update(old.groups)  # its tasks there are no longer re-offered
            return
        assert job is not None
        n = job.task_count
        ids = list(map(task_id, repeat(jid, n), range(n)))
        records = list(map(snap.tasks.get, ids))
        if records.count(None) == n:
            # No task has a record (a job just submitted): every one waits (_waits),
            # and none runs anywhere.
            waiting = set(range(n))
            running: set[str] = set()
        else:
            waiting = {i for i, tid in enumerate(ids) if self._waits(snap, tid)}
            running = {r.machine for r in records if r is not None and r.machine}
        if old is None:
            self.jobs[jid] = JobEntry(job, self._intern(shape_of(job)), waiting)
            # Tasks already running (a rebuild) are found from their machines.
            if self.built and not machines.issuperset(self.machines):
                machines.update(running)
        else:
            if old.shape != shape_of(job) or old.job.precedence != job.precedence:
                old.shape, old.gkey = self._intern(shape_of(job)), None
                machines.update(old.groups)
            if old.job.task_input != job.task_input and (old.costs or old.prices):
                old.costs, old.prices = {}, {}
                machines.update(old.groups)
            old.job, old.waiting = job, waiting

    def _forget_job(self, jid: str, e: JobEntry) -> None:
        self.net.drop(("W", jid))
        self.net.set_supply(("W", jid), 0)
        for i in e.task_nodes:
            self.net.drop(("W", jid, i))
            self.net.set_supply(("W", jid, i), 0)
        self.net.drop(("U", jid))
        self._task_jobs.discard(jid)
        for mid in e.prefs:
            self._pref_in.get(mid, set()).discard(jid)
        del self.jobs[jid]

    def _load_machine(self, snap: CellSnapshot, mid: str, rearc: set[str],
                      reload: bool = False) -> None:
        self._rows.stale.add(mid)  # what holds it may change: its row is worked out again
        m = snap.machines.get(mid)
        old = self.machines.get(mid)
        preferring = self._pref_in.get(mid)
        if preferring:
            rearc.update(preferring)
        if m is None:
            self.machines.pop(mid, None)
            self._forget_could(mid)
            self.net.drop(("M", mid))
            self.net.drop(("T", mid))
            if old is not None:
                for gk in old.groups:
                    self._group_arcs(mid, gk, 0, 0)
                self._note_jobs(mid, set(old.jobs), set())
            return
        touched: dict[GroupKey, None] | None = None
        if not (old is None or reload or old.tagged or not _same_record(old.machine, m)):
            touched = self._delta(snap, old, m)
        if touched is not None:
            assert old is not None
            me = old
            me.machine = m
            if (self._batch and me.layout is not None
                    and me.layout.order is self._shape_order):
                # Only allocations changed and the arcs into the machine are laid out
                # for today's shapes: their numbers are worked out with every other
                # such machine's, at once (_flush_machines).
                self._pending.append(mid)
            else:
                self._machine_arcs(mid, me)
        else:
            me = self._classify(snap, m)
            touched = dict.fromkeys([*me.groups, *(old.groups if old is not None else ())])
            self._note_jobs(mid, set(old.jobs) if old is not None else set(), set(me.jobs))
            self.machines[mid] = me
            self._forget_could(mid)
            self._machine_arcs(mid, me)
        for gk in [*me.groups, *(gk for gk in touched if gk not in me.groups)]:
            tids = me.groups.get(gk)
            if not tids:
                me.groups.pop(gk, None)
                me.movable.pop(gk, None)
                self._group_arcs(mid, gk, 0, 0)
                continue
            movable = (sum(1 for t in tids if self._movable(t)) if self._moved_at
                       else len(tids))
            if gk in touched or movable != me.movable.get(gk):
                me.movable[gk] = movable
                self._group_arcs(mid, gk, len(tids), movable)

    def _machine_arcs(self, mid: str, me: MachineEntry) -> None:
        """The arcs into a machine and from it to the sink, one machine at a time: the
        reference that :meth:`_flush_machines` gives the same arcs as, for many."""
        m = me.machine
        avail = me.avail
        share = 0.0
        for dim, cap in m.capacity.amounts:
            if cap > 0:
                share = max(share, 1.0 - avail.get(dim) / cap)
        reoffered = me.reoffered()
        free = Resources(tuple(sorted(me.free_amounts().items())))
        used = m.capacity - free
        dims = self.model.dimensions
        fits = {s: fit_count(free, s, m, dims) for s in self.shapes}
        # Room the re-offered tasks hold, usable only when some of them leave.
        reclaim = {s: max(fit_count(avail, s, m, dims) - fits[s], 0) for s in self.shapes}
        # At least the re-offered tasks: they must reach the sink by staying even when
        # no shape of this scheduler's (it has no job) counts them.
        slots = max([reoffered, *(reoffered + n for n in fits.values()),
                     *(fits[s] + reclaim[s] for s in self.shapes)])
        load = MachineLoad(m, slots, min(max(share, 0.0), 1.0), used, m.capacity - avail)
        arcs: list[Arc] = []
        into = self.model.machine_arc(load)
        # Asked even while no re-offered task runs here: the reclaim arcs then have
        # capacity 0 (free room is all the room), and they keep their slots for when
        # tasks arrive.
        extra = self.model.reclaim(load)
        # An arc for every shape that could ever fit here, with capacity 0 while none
        # fits now: the arcs keep their slots from one update to the next and only
        # their numbers change, in place (an arc of capacity 0 is no arc at all to the
        # solver and to FlowNetwork.canonical).
        order = self._shape_order
        eligible: list[int] = []
        for i, s in enumerate(order):
            ok = me.eligible.get(s)
            if ok is None:
                ok = me.eligible[s] = fit_count(m.capacity, s, m) > 0
            if not ok:
                continue
            eligible.append(i)
            src: NodeKey = ("R", s, m.rack) if self.model.uses_racks else ("E", s)
            arcs.append(Arc(src, ("M", mid), fits[s], into, 0, ArcKind.INTO_MACHINE))
            if extra is not None:
                room = (reclaim[s] if self._blocked.get((s, mid), -math.inf) <= self._now
                        else 0)
                arcs.append(Arc(src, ("M", mid), room, into + extra, 0,
                                ArcKind.INTO_MACHINE))
        placed = self.net.set_arcs(("M", mid), arcs)
        gate = tuple(m.state is MachineState.UP and _selects(s, m) for s in order)
        me.layout = Layout(order, gate, eligible, placed[::2] if extra is not None else placed,
                           placed[1::2] if extra is not None else None)
        me.share_of, me.share = avail, load.others
        self._tiers(mid, me, load)

    def _tiers(self, mid: str, me: MachineEntry, load: MachineLoad) -> None:
        # A separate owner: the tiers change with the machine's load from others,
        # not with every placement of this scheduler's tasks.
        tier_key = (load.slots, load.others,
                    (load.used, load.outside) if self.model.tiers_use_usage else None)
        if tier_key != me.tier_key:
            me.tier_key = tier_key
            self.net.set_arcs(("T", mid), [
                Arc(("M", mid), SINK, cap, cost, 0, ArcKind.TO_SINK)
                for cap, cost in self.model.sink_tiers(load) if cap > 0])

    def _flush_machines(self) -> int:
        """The arcs of every machine :meth:`_load_machine` left pending, worked out
        together on arrays: the same numbers :meth:`_machine_arcs` gives machine by
        machine (the same fit rule, the same float operations, the cost model's batch
        method), written into the slots the arcs already have."""
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        mes = [self.machines[mid] for mid in pending]
        n, order = len(mes), self._shape_order
        dims, amounts = self._shape_table()
        col = {d: j for j, d in enumerate(dims)}
        avail_rows: list[list[float]] = []
        room_rows: list[list[float]] = []
        for me in mes:
            cached = me.avail_row
            if cached[0] is me.avail and cached[1] is dims:
                row = cached[2]
            else:
                row = [me.avail.get(d) for d in dims]
                me.avail_row = (me.avail, dims, row)
            avail_rows.append(row)
            row = row.copy()
            # As MachineEntry.free_amounts, shape by shape in the same order, so the
            # floats come out the same.
            for res, k in me._by_shape().items():
                for d, a in res.amounts:
                    j = col.get(d)
                    if j is not None:
                        row[j] -= a * k
            room_rows.append(row)
        avail = np.array(avail_rows, dtype=np.float64).reshape(n, len(dims))
        room = np.array(room_rows, dtype=np.float64).reshape(n, len(dims))
        gate = np.array([me.layout.gate for me in mes if me.layout is not None],
                        dtype=bool).reshape(n, len(order))
        fits = _fit_counts(room, amounts, gate)
        reclaim = np.maximum(_fit_counts(avail, amounts, gate) - fits, 0)
        reoffered = np.array([me.reoffered() for me in mes], dtype=np.int64)
        slots = reoffered.copy()
        if order:
            slots = np.maximum(slots, np.maximum((reoffered[:, None] + fits).max(axis=1),
                                                 (fits + reclaim).max(axis=1)))
        others = np.array([self._share(me) for me in mes], dtype=np.float64)
        frees: list[dict[str, float]] = []

        def free() -> list[dict[str, float]]:
            if not frees:
                frees.extend(me.free_amounts() for me in mes)
            return frees

        batch = MachineBatch([me.machine for me in mes], slots, others, free)
        priced = self.model.machine_costs(batch)
        if priced is None:
            for mid, me in zip(pending, mes, strict=True):
                self._machine_arcs(mid, me)
            return 0
        into, extra = priced
        rows: list[int] = []
        cols: list[int] = []
        fit_slots: list[int] = []
        reclaim_slots: list[int] = []
        redo: list[int] = []
        for i, me in enumerate(mes):
            lay = me.layout
            assert lay is not None
            if (lay.reclaim is None) != (extra is None):
                redo.append(i)  # the model's reclaim arcs came or went here
                continue
            rows.extend([i] * len(lay.eligible))
            cols.extend(lay.eligible)
            fit_slots.extend(lay.fits)
            if lay.reclaim is not None:
                reclaim_slots.extend(lay.reclaim)
        r, c = np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)
        self.net.write(np.array(fit_slots, dtype=np.int64), fits[r, c], into[r])
        if extra is not None:
            blocked = np.zeros((n, len(order)), dtype=bool)
            if self._blocked:
                row_of = {mid: i for i, mid in enumerate(pending)}
                col_of = {s: i for i, s in enumerate(order)}
                for s, mid in self._blocked:  # expired blocks are gone already
                    if mid in row_of and s in col_of:
                        blocked[row_of[mid], col_of[s]] = True
            self.net.write(np.array(reclaim_slots, dtype=np.int64),
                           np.where(blocked[r, c], 0, reclaim[r, c]), into[r] + extra[r])
        slot_list, other_list = slots.tolist(), others.tolist()
        redone = set(redo)
        usage = self.model.tiers_use_usage
        for i, (mid, me) in enumerate(zip(pending, mes, strict=True)):
            if i in redone:
                continue
            key = (slot_list[i], other_list[i], None)
            if usage or key != me.tier_key:
                self._tiers(mid, me, MachineLoad(
                    me.machine, slot_list[i], other_list[i],
                    me.machine.capacity - Resources(tuple(sorted(free()[i].items()))),
                    me.machine.capacity - me.avail))
        for i in redo:
            self._machine_arcs(pending[i], mes[i])
        return n - len(redo)

    def _shape_table(self) -> tuple[list[str], npt.NDArray[np.float64]]:
        """The dimensions the fit rule counts for today's shapes, and each shape's
        amount in each (0 where it is not counted), as :func:`fit_count` reads them."""
        if self._table is None or self._table[0] is not self._shape_order:
            counted = self.model.dimensions
            dims = sorted({d for s in self._shape_order for d, a in s.resources.amounts
                           if a > 0 and (counted is None or d in counted)})
            amounts = np.zeros((len(self._shape_order), len(dims)), dtype=np.float64)
            for i, s in enumerate(self._shape_order):
                for d, a in s.resources.amounts:
                    if a > 0 and d in dims:
                        amounts[i, dims.index(d)] = a
            self._table = (self._shape_order, dims, amounts)
        return self._table[1], self._table[2]

    @staticmethod
    def _share(me: MachineEntry) -> float:
        """``MachineLoad.others``, worked out again only when ``avail`` changed."""
        if me.share_of is not me.avail:
            share = 0.0
            for dim, cap in me.machine.capacity.amounts:
                if cap > 0:
                    share = max(share, 1.0 - me.avail.get(dim) / cap)
            me.share_of, me.share = me.avail, min(max(share, 0.0), 1.0)
        return me.share

    def _classify(self, snap: CellSnapshot, m: Machine) -> MachineEntry:
        """A machine's allocations sorted into the network's groups and the rest."""
        me = MachineEntry(m, m.capacity, {}, {}, {}, {})
        outside: list[Resources] = []
        for a in holding(m, snap.gangs):
            gk = self._group_of(snap, a)
            if gk is None:
                outside.append(a.resources)
            else:
                me.add(gk, a)
        me.avail = m.capacity - sum_resources(outside)
        me.tagged = m.has_tags
        return me

    def _group_of(self, snap: CellSnapshot, a: Allocation) -> GroupKey | None:
        """The group a running allocation joins, or None if it stays outside the
        network (another scheduler's, a gang's, not placed yet)."""
        if a.evicted_by or (a.gang and not alloc_placed(a, snap.gangs)):
            return None
        if a.scheduler == self.scheduler:
            e = self.jobs.get(a.job)
            if e is None or not self.reoffers:
                return None
            if e.job.task_input and self._task_costs(e, split_task_id(a.task)[1]) is not None:
                return self._intern(GroupKey(e.shape, e.job.precedence, True, a.task))
            if e.gkey is None:
                e.gkey = self._intern(GroupKey(e.shape, e.job.precedence, True))
            return e.gkey
        if (self.preempt_below is not None and not a.gang
                and a.precedence < self.preempt_below and a.job in snap.jobs):
            return self._intern(GroupKey(Shape(a.resources, ()), a.precedence, False))
        return None

    def _delta(self, snap: CellSnapshot, me: MachineEntry, m: Machine
               ) -> dict[GroupKey, None] | None:
        """Apply the allocations that changed since ``me.machine``, whose allocations
        had no gang or eviction tags (so every one held); returns the groups touched,
        or None, changing nothing, if a changed allocation has tags."""
        before, after = me.machine.allocations, m.allocations
        # Records are decoded anew only where they changed: identity tells. (Iterated
        # in C: most machines a round touches have a dozen allocations and one change.)
        changed = sorted([*compress(after, map(is_not, map(before.get, after), after.values())),
                          *(before.keys() - after.keys())])
        for tid in changed:
            a = after.get(tid)
            if a is not None and (a.gang or a.evicted_by):
                return None
        touched: dict[GroupKey, None] = {}
        came: list[str] = []  # jobs whose first re-offered task here arrived
        left: list[str] = []  # jobs whose last one left
        for tid in changed:
            old = before.get(tid)
            if old is not None:
                gk, last = me.remove(tid)
                if gk is None:
                    me.avail = me.avail + old.resources
                else:
                    touched[gk] = None
                    if last:
                        left.append(old.job)
            new = after.get(tid)
            if new is not None:
                gk = self._group_of(snap, new)
                if gk is None:
                    me.avail = me.avail - new.resources
                else:
                    if me.add(gk, new):
                        came.append(new.job)
                    touched[gk] = None
        if came or left:
            mid = m.id
            for jid in left:
                e = self.jobs.get(jid)
                if e is not None and jid not in me.jobs:
                    e.groups.discard(mid)
            for jid in came:
                if jid in me.jobs:
                    self.jobs[jid].groups.add(mid)
        return touched

    def _note_jobs(self, mid: str, old: set[str], new: set[str]) -> None:
        for jid in old - new:
            e = self.jobs.get(jid)
            if e is not None:
                e.groups.discard(mid)
        for jid in new - old:
            self.jobs[jid].groups.add(mid)

    def _movable(self, tid: str) -> bool:
        return self._now - self._moved_at.get(tid, -math.inf) >= self.move_guard

    def _group_arcs(self, mid: str, gk: GroupKey, count: int, movable: int) -> None:
        key: NodeKey = ("G", mid, gk)
        if not count:
            self.net.drop(key)
            self.net.set_supply(key, 0)
            self._group_costs.pop(key, None)
            if gk.task:
                self._runs.remove(key)
            return
        if gk.task:
            self._task_group_arcs(key, mid, gk, movable)
            return
        costs = self._group_costs.get(key) if not self.model.group_costs_use_counts else None
        known = costs is not None  # the group's arcs exist, made from these costs
        if costs is None:
            g = Group(gk.shape.resources, gk.precedence, mid, count, movable, gk.own)
            costs = (self.model.stay(g), self.model.migrate(g) if gk.own else None,
                     self.model.preempt(g, 0.0))
            self._group_costs[key] = costs
        stay, migrate, preempt = costs
        # Tasks under the flapping guard stay: at most ``movable`` units leave in all.
        # The arcs out exist even while nothing may move (capacity 0), so that a
        # group's arcs keep their slots and change in place.
        numbers = [(count, stay, count - movable)]
        if migrate is not None:
            numbers.append((movable, migrate, 0))
        if preempt is not None:
            numbers.append((movable, preempt, 0))
        owned = self.net.slots_of(key) if known else None
        if owned is not None and len(owned) == len(numbers):
            w_slot, w_cap, w_cost, w_lower = self._writes
            w_slot.extend(owned)
            for cap, cost, lower in numbers:
                w_cap.append(cap)
                w_cost.append(cost)
                w_lower.append(lower)
        else:
            arcs = [Arc(key, ("M", mid), count, stay, count - movable, ArcKind.STAY)]
            if migrate is not None:
                arcs.append(Arc(key, ("E", gk.shape), movable, migrate, 0, ArcKind.MIGRATE))
            if preempt is not None:
                arcs.append(Arc(key, SINK, movable, preempt, 0, ArcKind.PREEMPT))
            self.net.set_arcs(key, arcs)
        self.net.set_supply(key, count)

    def _task_costs(self, e: JobEntry, index: int) -> TaskCosts | None:
        """The model's pricing of a task on its own (None: it shares its job's node),
        asked once per task and layout."""
        if not e.job.task_input:
            return None
        if index in e.costs:
            return e.costs[index]
        row = e.prices.get(index)
        tc = (row[0].costs(row[1]) if row is not None
              else self.model.task_costs(e.job, index, self._layout))
        e.costs[index] = tc
        if tc is not None:
            self._task_jobs.add(e.job.id)
        return tc

    def _wait_costs(self, e: JobEntry, waited: float) -> None:
        """The unscheduled arcs (position 0) of the job's task nodes at ``waited``:
        those priced in a batch and never asked for on their own, per batch as arrays
        (``CostModel.tasks_unscheduled``), the others one by one."""
        job = e.job
        batches: dict[int, tuple[TaskPrices, list[int], list[int]]] = {}
        # The default prices a batch task by task: no gain over asking per node.
        arrays = type(self.model).tasks_unscheduled is not CostModel.tasks_unscheduled
        for i in e.task_nodes:
            row = e.prices.get(i) if arrays and i not in e.costs else None
            if row is None:
                tc = self._task_costs(e, i)
                assert tc is not None
                self.net.set_cost(("W", job.id, i), 0,
                                  self.model.task_unscheduled(job, tc, waited))
                continue
            b = batches.get(id(row[0]))
            if b is None:
                b = batches[id(row[0])] = (row[0], [], [])
            b[1].append(row[1])
            b[2].append(self.net.slots_of(("W", job.id, i))[0])  # type: ignore[index]
        for tp, rows, slots in batches.values():
            self.net.write_costs(np.array(slots, dtype=np.int64), self.model.tasks_unscheduled(
                job, tp, waited, np.array(rows, dtype=np.int64)))

    def _price_waiting(self, entries: list[JobEntry]) -> None:
        """Prices the jobs' waiting tasks not priced yet, all at once."""
        asked: list[tuple[JobEntry, list[int]]] = []
        for e in entries:
            if e.job.task_input:
                todo = sorted(e.waiting - e.costs.keys() - e.prices.keys())
                if todo:
                    asked.append((e, todo))
        if not asked:
            return
        priced = self.model.jobs_task_prices([(e.job, todo) for e, todo in asked],
                                             self._layout)
        for (e, todo), (tp, first, tasks) in zip(asked, priced, strict=True):
            rows = range(first, first + len(tasks))
            e.prices.update(zip(tasks, zip(repeat(tp, len(rows)), rows, strict=True),
                                strict=True))
            if len(tasks) < len(todo):
                e.costs.update(dict.fromkeys([i for i in todo if i not in e.prices]))
            if tasks:
                self._task_jobs.add(e.job.id)

    @staticmethod
    def _own_of(e: JobEntry, tasks: set[int]) -> set[int]:
        """The tasks of ``tasks`` priced on their own (after :meth:`_price_waiting`:
        those with a row in a batch, or TaskCosts), by set operations: a job's 3,000
        arrivals are one intersection, not 3,000 calls."""
        own = tasks & e.prices.keys()
        if e.costs and len(own) < len(tasks):
            costs = e.costs
            own |= {i for i in tasks - own if costs.get(i) is not None}
        return own

    def _task_preferences(self, e: JobEntry, src: NodeKey, tc: TaskCosts, capacity: int,
                          extra: int, skip: str = "") -> list[Arc]:
        """A task node's direct arcs to the machines and racks it prefers: only to
        machines of the cell its shape could ever fit (capacity and selector, whatever
        their state: one that is down has no room, so no flow goes there)."""
        return [Arc(src, head, capacity, cost, 0, ArcKind.PREFERENCE)
                for head, cost in self._preference_targets(e, tc, extra, skip)]

    def _preference_targets(self, e: JobEntry, tc: TaskCosts, extra: int, skip: str = ""
                            ) -> list[tuple[NodeKey, int]]:
        """The heads and costs of :meth:`_task_preferences`."""
        out: list[tuple[NodeKey, int]] = []
        shape = e.shape
        for p in tc.preferences:
            if p.machine:
                if p.machine == skip or not self._could_run(shape, p.machine):
                    continue
                out.append((("M", p.machine), p.cost + extra))
            elif p.rack in self._rack_set and self.model.uses_racks:
                out.append((("R", shape, p.rack), p.cost + extra))
        return out

    def _could_run(self, shape: Shape, mid: str) -> bool:
        """Whether a task of ``shape`` could ever run on machine ``mid`` of the cell
        (remembered on the machine's entry while its record stays the same)."""
        assert self._snap is not None
        m = self._snap.machines.get(mid)
        me = self.machines.get(mid)
        if me is not None and me.machine is m:
            ok = me.could.get(shape)
            if ok is None:
                ok = me.could[shape] = self._could_fit(shape, me.machine)
            return ok
        return m is not None and self._could_fit(shape, m)

    def _keys_of(self, names: Sequence[str]) -> list[NodeKey]:
        """The nodes ``("M", name)`` of machines ``names`` (a price table's), made
        once for the layout's names."""
        if self._machine_keys[0] is not names:
            self._machine_keys = (names, [("M", mid) for mid in names])
        return self._machine_keys[1]

    def _could_many(self, shape: Shape, tp: TaskPrices, ms: npt.NDArray[np.int64]
                    ) -> npt.NDArray[np.bool_]:
        """:meth:`_could_run` for the machines ``ms`` of ``tp``; remembered per shape
        by layout position where ``tp`` numbers machines as the layout does, until
        the layout changes or the machine's entry is made again
        (:meth:`_forget_could`)."""
        names = tp.machine_names
        if names is not self._layout.index().machines:
            return np.array([self._could_run(shape, names[j]) for j in ms.tolist()],
                            dtype=bool)
        known = self._could.get(shape)
        if known is None:
            known = self._could[shape] = self._could_layout(shape)
        got = known[ms]
        for j in np.flatnonzero(got < 0).tolist():
            mj = int(ms[j])
            got[j] = known[mj] = self._could_run(shape, names[mj])
        return got > 0

    def _forget_could(self, mid: str) -> None:
        """A machine's entry was made again (its record changed beyond its
        allocations) or it left: what :meth:`_could_many` remembers of it goes."""
        if self._could or self._capacity:
            i = self._layout.index().position.get(mid)
            if i is not None:
                for known in self._could.values():
                    known[i] = -1
                for capacity in self._capacity.values():
                    capacity[i] = np.nan

    def _could_layout(self, shape: Shape) -> npt.NDArray[np.int8]:
        """:meth:`_could_run` for every machine of the layout at once where the shape
        has no selector (1 or 0; -1: not known, asked machine by machine): the first
        look at a shape costs array operations, not a call per machine its tasks'
        input lies on (a 3,000-task job's 9,000 copies reach most of a cell)."""
        names = self._layout.index().machines
        out = np.full(len(names), -1, dtype=np.int8)
        if shape.selector or not any(a > 0 for _, a in shape.resources.amounts):
            return out  # labels to match, or nothing to fit (but a machine to exist)
        ok = np.ones(len(names), dtype=bool)
        unknown = np.zeros(len(names), dtype=bool)
        for dim, amount in shape.resources.amounts:
            if amount > 0:
                capacity = self._capacities(dim)
                unknown |= np.isnan(capacity)
                # _could_fit's test, on the same floats
                ok &= capacity + FIT_SLACK >= amount
        out[ok] = 1
        out[~ok] = 0
        out[unknown] = -1
        return out

    def _capacities(self, dim: str) -> npt.NDArray[np.float64]:
        """Each layout machine's capacity in ``dim`` as the snapshot has it (-inf: not
        in the snapshot, so it fits nothing), kept until the layout changes or the
        machine's entry is made again (:meth:`_forget_could`)."""
        got = self._capacity.get(dim)
        if got is None:
            assert self._snap is not None
            machines = self._snap.machines
            got = self._capacity[dim] = np.array(
                [m.capacity.get(dim) if m is not None else -np.inf
                 for m in map(machines.get, self._layout.index().machines)],
                dtype=np.float64)
        return got

    @staticmethod
    def _could_fit(s: Shape, m: Machine) -> bool:
        return _selects(s, m) and all(amount <= 0 or m.capacity.get(dim) + FIT_SLACK >= amount
                   for dim, amount in s.resources.amounts)

    def _task_group_arcs(self, key: NodeKey, mid: str, gk: GroupKey, movable: int) -> None:
        """A running task with a node of its own: its continuation arc to its machine
        (Quincy's d* less p*: what it reads there, less a discount for the time it has
        run), its own preferences and the cluster aggregator (moving: the new
        machine's cost plus the model's migration cost) and its job's unscheduled
        aggregator (preemption)."""
        jid, index = split_task_id(gk.task)
        e = self.jobs[jid]
        tc = self._task_costs(e, index)
        assert tc is not None
        job = e.job
        transfer = self.model.transfer(job, index, mid, self._layout)
        started = self._runs.start(key, self._now)
        g = Group(gk.shape.resources, gk.precedence, mid, 1, movable, True, gk.task)
        arcs = [Arc(key, ("M", mid), 1, 0, 1 - movable, ArcKind.STAY)]
        migrate = self.model.migrate(g)
        if migrate is not None:
            arcs.append(Arc(key, ("E", gk.shape), movable, tc.cluster + migrate, 0,
                            ArcKind.MIGRATE))
            arcs.extend(self._task_preferences(e, key, tc, movable, migrate, skip=mid))
        preempt = self.model.preempt(g, max(started - job.submitted_at, 0.0))
        if preempt is not None:
            arcs.append(Arc(key, ("U", jid), movable, preempt, 0, ArcKind.PREEMPT))
        slots = self.net.set_arcs(key, arcs)
        self.net.set_supply(key, 1)
        # Its cost is written with every other continuation arc's (_Continuations).
        self._runs.put(key, slots[0], transfer)

    def _shape_arcs(self, s: Shape) -> None:
        if not self.model.uses_racks:
            return
        self._shape_owners.add(s)
        self.net.set_arcs(("E", s), [Arc(("E", s), ("R", s, rack), MAX_CAPACITY, 0, 0,
                                          ArcKind.TO_RACK) for rack in sorted(self._rack_set)])

    def _job_arcs(self, jid: str, now: float, reload: bool, fresh: list[_NewNodes]) -> None:
        """``reload`` False: only the job's waiting tasks changed (nodes of tasks priced
        on their own are then added and dropped, not made again). The job's waiting
        tasks are priced already (:meth:`_price_waiting`); the nodes of those with
        none yet go into ``fresh``, for :meth:`_add_task_nodes`."""
        e = self.jobs.get(jid)
        if e is None:
            return
        for mid in e.prefs:
            self._pref_in.get(mid, set()).discard(jid)
        e.prefs = set()
        job = e.job
        u: NodeKey = ("U", jid)
        # The job's unscheduled aggregator: every unit of the job may end there.
        self.net.set_arcs(u, [Arc(u, SINK, job.task_count, 0, 0, ArcKind.LEAVE_UNSCHEDULED)])
        waited = max(now - job.submitted_at, 0.0)
        want = self._own_of(e, e.waiting)
        self._task_nodes(e, want, waited, reload, fresh)
        k = len(e.waiting) - len(want)  # the tasks that share the job's node
        w: NodeKey = ("W", jid)
        self.net.set_supply(w, k)
        if k == 0:
            self.net.drop(w)
            return
        arcs = [Arc(w, u, k, self.model.unscheduled(job, waited), 0, ArcKind.UNSCHEDULED),
                Arc(w, ("E", e.shape), k, self.model.cluster_cost(job, self._layout), 0,
                    ArcKind.TO_CLUSTER)]
        for p in self.model.preferences(job, self._layout):
            if p.machine:
                me = self.machines.get(p.machine)
                n = (fit_count(me.avail, e.shape, me.machine, self.model.dimensions)
                     if me is not None else 0)
                if n > 0:
                    arcs.append(Arc(w, ("M", p.machine), min(k, n), p.cost, 0,
                                    ArcKind.PREFERENCE))
                if me is not None:
                    e.prefs.add(p.machine)
                    self._pref_in.setdefault(p.machine, set()).add(jid)
            elif p.rack in self._rack_set and self.model.uses_racks:
                arcs.append(Arc(w, ("R", e.shape, p.rack), k, p.cost, 0, ArcKind.PREFERENCE))
        for mid, _ in job.input:
            # Its preferences depend on where its input lies: on each such machine's
            # rack, and on whether the cell has it at all.
            e.prefs.add(mid)
            self._pref_in.setdefault(mid, set()).add(jid)
        self.net.set_arcs(w, arcs)

    def _task_nodes(self, e: JobEntry, want: set[int], waited: float, reload: bool,
                    fresh: list[_NewNodes]) -> None:
        """The nodes of a job's waiting tasks priced on their own (``want``): one per
        task, with supply 1, its own preferences, the cluster aggregator and the job's
        unscheduled aggregator (those it has no node for yet: into ``fresh``)."""
        jid, job = e.job.id, e.job
        for i in sorted(e.task_nodes - want):
            self.net.drop(("W", jid, i))
            self.net.set_supply(("W", jid, i), 0)
        u: NodeKey = ("U", jid)
        cluster: NodeKey = ("E", e.shape)
        batches: dict[int, tuple[TaskPrices, list[int], list[int]]] = {}
        alone: list[tuple[int, TaskCosts]] = []
        new = sorted(want - e.task_nodes)
        got = list(map(e.prices.get, new))
        first = got[0][0] if got and got[0] is not None else None
        if first is not None and None not in got:
            priced = cast(list[tuple[TaskPrices, int]], got)
            if list(map(_PRICES, priced)).count(first) == len(priced):
                # The usual case, a job's arrivals all priced in one table: no loop.
                batches[id(first)] = (first, list(map(_ROW, priced)), new)
        if not batches:
            for i, row in zip(new, got, strict=True):
                if row is None:  # priced one by one (while it ran)
                    tc = e.costs[i]
                    assert tc is not None
                    alone.append((i, tc))
                else:
                    batch = batches.setdefault(id(row[0]), (row[0], [], []))
                    batch[1].append(row[1])
                    batch[2].append(i)
        for i in sorted(want & e.task_nodes):
            tc = self._task_costs(e, i)
            assert tc is not None
            w: NodeKey = ("W", jid, i)
            unscheduled = self.model.task_unscheduled(job, tc, waited)
            if reload:  # the same arcs keep their slots (and last round's flow)
                self.net.set_arcs(w, [
                    Arc(w, u, 1, unscheduled, 0, ArcKind.UNSCHEDULED),
                    Arc(w, cluster, 1, tc.cluster, 0, ArcKind.TO_CLUSTER),
                    *self._task_preferences(e, w, tc, 1, 0)])
            else:
                # Position 0: the unscheduled arc, whose cost grows with the wait.
                self.net.set_cost(w, 0, unscheduled)
        if alone:
            tp = TaskPrices.of(alone)
            batches[id(tp)] = (tp, list(range(len(alone))), [i for i, _ in alone])
        for tp, rows, tasks in batches.values():
            fresh.append(_NewNodes(e, tp, rows, tasks, waited))
        e.task_nodes = want

    def _add_task_nodes(self, fresh: list[_NewNodes]) -> None:
        """New task nodes, written into the network's arrays at once (one
        :meth:`FlowNetwork.add_fans` per :class:`TaskPrices`, whatever the number of
        jobs in it): per task the unscheduled arc (position 0) to its job's
        aggregator, the arc to its shape's cluster aggregator, then its preferences to
        machines its shape could ever fit and to racks of the cell (as
        :meth:`_preference_targets` keeps)."""
        by_prices: dict[int, list[_NewNodes]] = {}
        for part in fresh:
            by_prices.setdefault(id(part.prices), []).append(part)
        for parts in by_prices.values():
            self._add_fans_of(parts)

    def _add_fans_of(self, parts: list[_NewNodes]) -> None:
        tp = parts[0].prices
        heads: list[NodeKey] = []
        shapes: dict[Shape, int] = {}
        for p in parts:
            shapes.setdefault(p.entry.shape, len(shapes))
        order = list(shapes)
        # Heads 0..: the jobs' unscheduled aggregators, then the shapes' cluster ones.
        heads.extend(("U", p.entry.job.id) for p in parts)
        heads.extend(("E", shape) for shape in order)
        sizes = [len(p.rows) for p in parts]
        rows = np.array([r for p in parts for r in p.rows], dtype=np.int64)
        n = len(rows)
        u_head = np.repeat(np.arange(len(parts), dtype=np.int64), sizes)
        e_head = np.repeat(np.array([len(parts) + shapes[p.entry.shape] for p in parts],
                                    dtype=np.int64), sizes)
        unscheduled = np.concatenate([
            self.model.tasks_unscheduled(p.entry.job, tp, p.waited,
                                         np.array(p.rows, dtype=np.int64))
            for p in parts]) if n else np.zeros(0, dtype=np.int64)
        shape_id = np.repeat(np.array([shapes[p.entry.shape] for p in parts],
                                      dtype=np.int64), sizes)
        lens = tp.start[rows + 1] - tp.start[rows]
        before = np.cumsum(lens) - lens
        owner = np.repeat(np.arange(n, dtype=np.int64), lens)
        at = np.arange(len(owner), dtype=np.int64) - np.repeat(before, lens) \
            + np.repeat(tp.start[rows], lens)
        machine, rack, cost = tp.machine[at], tp.rack[at], tp.cost[at]
        head = np.full(len(at), -1, dtype=np.int64)
        # Machines and racks per (shape, machine) and (shape, rack): whether a shape
        # could ever run on a machine, and a shape's rack aggregators, are the shape's.
        to_m = np.flatnonzero(machine >= 0)
        nm = max(len(tp.machine_names), 1)
        pairs, inv = np.unique(shape_id[owner[to_m]] * nm + machine[to_m],
                               return_inverse=True)
        could = np.zeros(len(pairs), dtype=bool)
        cut = np.searchsorted(pairs, np.arange(len(order) + 1, dtype=np.int64) * nm)
        for k, shape in enumerate(order):
            a, b = int(cut[k]), int(cut[k + 1])
            if a < b:
                could[a:b] = self._could_many(shape, tp, pairs[a:b] - k * nm)
        where = np.full(len(pairs), -1, dtype=np.int64)
        where[could] = np.arange(int(could.sum())) + len(heads)
        head[to_m] = where[inv]
        names = tp.machine_names
        heads.extend(map(self._keys_of(names).__getitem__, (pairs[could] % nm).tolist()))
        if self.model.uses_racks:
            to_r = np.flatnonzero(machine < 0)
            nr = max(len(tp.rack_names), 1)
            rpairs, inv = np.unique(shape_id[owner[to_r]] * nr + rack[to_r],
                                    return_inverse=True)
            ok = np.array([tp.rack_names[j % nr] in self._rack_set for j in rpairs.tolist()],
                          dtype=bool)
            where = np.full(len(rpairs), -1, dtype=np.int64)
            where[ok] = np.arange(int(ok.sum())) + len(heads)
            head[to_r] = where[inv]
            heads.extend(("R", order[j // nr], tp.rack_names[j % nr])
                         for j in rpairs[ok].tolist())
        keep = np.flatnonzero(head >= 0)
        owner = owner[keep]
        per = 2 + np.bincount(owner, minlength=n)
        start = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
        total = int(start[-1])
        arc_head = np.empty(total, dtype=np.int64)
        arc_cost = np.empty(total, dtype=np.int64)
        arc_kind = np.empty(total, dtype=np.int8)
        first = start[:-1]
        arc_head[first], arc_cost[first], arc_kind[first] = u_head, unscheduled, \
            ArcKind.UNSCHEDULED
        arc_head[first + 1], arc_cost[first + 1], arc_kind[first + 1] = e_head, \
            tp.cluster[rows], ArcKind.TO_CLUSTER
        pos = (start[owner] + 2 + np.arange(len(owner))
               - np.searchsorted(owner, owner))  # owner ascends: each task's rows in order
        arc_head[pos], arc_cost[pos], arc_kind[pos] = head[keep], cost[keep], \
            ArcKind.PREFERENCE
        owners: list[NodeKey] = [("W", p.entry.job.id, i) for p in parts for i in p.tasks]
        self.net.add_fans(owners, start, heads, arc_head, np.ones(total, dtype=np.int64),
                          arc_cost, arc_kind, supply=1)

    # -- what the extraction needs -----------------------------------------------------------

    def has_waiting(self) -> bool:
        """Whether some job in the network has tasks waiting."""
        return bool(self._waiting_jobs)

    def waiting_of(self, jid: str) -> list[int]:
        e = self.jobs.get(jid)
        return sorted(e.waiting) if e is not None else []

    def sharing_of(self, jid: str) -> list[int]:
        """The waiting tasks of ``jid`` its node ``("W", jid)`` stands for (not those
        with a node of their own)."""
        e = self.jobs.get(jid)
        return sorted(e.waiting - e.task_nodes) if e is not None else []

    def used_on(self, m: Machine) -> Resources | None:
        """What holds ``m`` (``cellstate.cell.machine_used``) as the network counts it,
        if the network was brought to this very record and no allocation on it has
        gang or eviction tags (None otherwise): the same sum as the record's
        ``settled_used`` without reading its allocations again."""
        me = self.machines.get(m.id)
        if me is None or me.machine is not m or me.tagged:
            return None
        return me.used()

    def fit_rows(self, snap: CellSnapshot, mids: Sequence[str]
                 ) -> tuple[dict[str, int], npt.NDArray[np.float64], npt.NDArray[np.float64],
                            npt.NDArray[np.bool_]]:
        """What holds each machine of ``mids`` and the most it may hold, as rows of
        floats over the dimensions named (dimension -> column): :meth:`used_on` of the
        snapshot's record and the capacity plus ``Resources.exceeding``'s slack, less a
        margin that covers the rounding of adding a machine's arrivals up on arrays
        (so a sum within the limit surely passes ``exceeding_with`` added one at a
        time); and whether :meth:`used_on` counts the machine at all (False: gone,
        not up, tags, not the network's record; its row means nothing). Rows are
        kept from one call to the next and worked out again only for machines updated
        since (``MachineEntry.used`` then, once per change rather than once per round
        that places there)."""
        return self._rows.rows(self, snap, mids)

    def group_tasks(self, key: NodeKey) -> list[str]:
        """The task ids a group node ``("G", machine, GroupKey)`` stands for that may
        move now (not moved within ``move_guard``), sorted."""
        me = self.machines.get(str(key[1]))
        if me is None:
            return []
        tids = me.groups.get(key[2], ())  # type: ignore[call-overload]
        return sorted(t for t in tids if self._movable(t))

    def describe(self) -> Mapping[str, Any]:
        return {"nodes": self.net.node_count, "arcs": self.net.arc_count,
                "jobs": len(self.jobs), "machines": len(self.machines),
                "shapes": len(self.shapes),
                "task_nodes": sum(len(e.task_nodes) for e in self.jobs.values())
                + len(self._runs)}


class FitRows:
    """:meth:`GraphManager.fit_rows`' rows, one per machine: made again for the
    machines each update changed (:meth:`refresh`), so a round's extraction finds
    them made."""

    def __init__(self) -> None:
        self.stale: set[str] = set()  # machines updated since their row was made
        self._row: dict[str, int] = {}
        self._record: list[Machine | None] = []  # the snapshot's record a row is of
        self._dims: dict[str, int] = {}
        self._used = np.zeros((0, 0), dtype=np.float64)
        self._limit = np.zeros((0, 0), dtype=np.float64)
        self._counted = np.zeros(0, dtype=bool)  # used_on counts the machine
        self._limits: dict[Resources, list[float]] = {}  # capacity -> its limit row

    def refresh(self, graph: GraphManager, snap: CellSnapshot) -> None:
        """The rows of the machines updated since they were made."""
        if self.stale:
            get = snap.machines.get
            self._make(graph, [(mid, get(mid)) for mid in sorted(self.stale)])

    def rows(self, graph: GraphManager, snap: CellSnapshot, mids: Sequence[str]
             ) -> tuple[dict[str, int], npt.NDArray[np.float64], npt.NDArray[np.float64],
                        npt.NDArray[np.bool_]]:
        row_of, record, stale = self._row, self._record, self.stale
        get = snap.machines.get
        todo = []
        for mid in mids:
            r = row_of.get(mid)
            m = get(mid)
            if r is None or record[r] is not m or mid in stale:
                todo.append((mid, m))
        if todo:
            self._make(graph, todo)
        at = np.fromiter(map(row_of.__getitem__, mids), dtype=np.int64, count=len(mids))
        return self._dims, self._used[at], self._limit[at], self._counted[at]

    def _make(self, graph: GraphManager, todo: list[tuple[str, Machine | None]]) -> None:
        counted: list[tuple[Machine, Resources] | None] = []
        for mid, m in todo:
            self.stale.discard(mid)
            u = graph.used_on(m) if m is not None and m.state is MachineState.UP else None
            if u is not None:
                assert m is not None
                for d, _ in (*u.amounts, *m.capacity.amounts):
                    if d not in self._dims:
                        self._column(d)
                counted.append((m, u))
            else:
                counted.append(None)
        rows = []
        for mid, _ in todo:
            r = self._row.get(mid)
            if r is None:
                r = self._row[mid] = len(self._record)
                self._record.append(None)
            rows.append(r)
        if max(rows) >= len(self._counted):
            grow = max(max(rows) + 1 - len(self._counted), 64, len(self._counted))
            width = len(self._dims)
            self._used = np.concatenate([self._used, np.zeros((grow, width))])
            self._limit = np.concatenate([self._limit, np.zeros((grow, width))])
            self._counted = np.concatenate([self._counted, np.zeros(grow, dtype=bool)])
        cols, width = self._dims, len(self._dims)
        used_rows: list[list[float]] = []
        limit_rows: list[list[float]] = []
        nothing = [0.0] * width
        for (_, m), r, got in zip(todo, rows, counted, strict=True):
            self._record[r] = m
            if got is None:
                used_rows.append(nothing)
                limit_rows.append(nothing)
                continue
            m, u = got
            row = nothing.copy()
            for d, a in u.amounts:
                row[cols[d]] = a
            used_rows.append(row)
            limit = self._limits.get(m.capacity)
            if limit is None or len(limit) != width:
                limit = self._limits[m.capacity] = self._limit_row(m.capacity)
            limit_rows.append(limit)
        at = np.array(rows, dtype=np.int64)
        self._used[at] = np.array(used_rows, dtype=np.float64).reshape(len(rows), width)
        self._limit[at] = np.array(limit_rows, dtype=np.float64).reshape(len(rows), width)
        self._counted[at] = [got is not None for got in counted]

    def _limit_row(self, capacity: Resources) -> list[float]:
        # Dimensions the machine has no capacity in: a capacity of 0 (exceeding's rule).
        row = [FIT_SLACK - _PROOF_MARGIN] * len(self._dims)
        for d, c in capacity.amounts:
            scale = c if c > 1.0 else 1.0
            row[self._dims[d]] = c + FIT_SLACK * scale - _PROOF_MARGIN * scale
        return row

    def _column(self, dim: str) -> None:
        """A dimension no row named before: every row counted holds none of it and
        has no capacity in it (had it either, the dimension would have a column)."""
        self._dims[dim] = len(self._dims)
        n = len(self._counted)
        self._used = np.concatenate([self._used, np.zeros((n, 1))], axis=1)
        self._limit = np.concatenate(
            [self._limit, np.full((n, 1), FIT_SLACK - _PROOF_MARGIN)], axis=1)


def _run_of(key: NodeKey) -> tuple[str, str]:
    """(task, machine) of a running task's own node ``("G", machine, GroupKey)``."""
    gk = key[2]
    assert isinstance(gk, GroupKey)
    return gk.task, str(key[1])


class _Continuations:
    """The continuation arcs of running tasks with nodes of their own, as arrays: their
    slots, the model's cost of running there (``transfer``) and when each started, so
    that the discount for time run (``CostModel.run_discounts``) is worked out for all
    of them at once, every update, not task by task in Python, and written where it
    moved."""

    def __init__(self) -> None:
        # (task, machine) -> when this scheduler first saw it running there
        self.started: dict[tuple[str, str], float] = {}
        self._at: dict[NodeKey, int] = {}
        self._free: list[int] = []
        self._slot = np.zeros(0, dtype=np.int64)
        self._base = np.zeros(0, dtype=np.int64)
        self._start = np.zeros(0, dtype=np.float64)
        self._live = np.zeros(0, dtype=bool)
        # The live entries' slot, base and start, gathered (None: gathered again at the
        # next write): a round in which no task started or ended writes from these.
        self._dense: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                           npt.NDArray[np.float64]] | None = None
        # The time and the gathered entries of the last write: written again at the
        # same time, with no task started or ended since, every cost would be the same.
        self._written: tuple[float, object] | None = None

    def __len__(self) -> int:
        return len(self._at)

    def start(self, key: NodeKey, now: float) -> float:
        return self.started.setdefault(_run_of(key), now)

    def put(self, key: NodeKey, slot: int, base: int) -> None:
        i = self._at.get(key)
        if i is None:
            if not self._free:
                n = len(self._slot)
                grow = max(n, 64)
                self._slot = np.concatenate([self._slot, np.zeros(grow, dtype=np.int64)])
                self._base = np.concatenate([self._base, np.zeros(grow, dtype=np.int64)])
                self._start = np.concatenate([self._start, np.zeros(grow)])
                self._live = np.concatenate([self._live, np.zeros(grow, dtype=bool)])
                self._free.extend(range(n + grow - 1, n - 1, -1))
            i = self._free.pop()
            self._at[key] = i
        self._slot[i], self._base[i], self._start[i] = slot, base, self.started[_run_of(key)]
        self._live[i] = True
        self._dense = None

    def remove(self, key: NodeKey) -> None:
        self.started.pop(_run_of(key), None)
        i = self._at.pop(key, None)
        if i is not None:
            self._live[i] = False
            self._free.append(i)
            self._dense = None

    def prune(self) -> None:
        """Forget start times of tasks no longer running here (after a rebuild)."""
        running = {_run_of(k) for k in self._at}
        for run in [r for r in self.started if r not in running]:
            del self.started[run]

    def write(self, net: FlowNetwork, model: CostModel, now: float) -> None:
        """The continuation arcs' costs at ``now``; only those that changed are
        written (and so stamped as changed: a solver starting from the last round's
        state repairs only those)."""
        if self._dense is None:
            live = np.flatnonzero(self._live)
            self._dense = (self._slot[live], self._base[live], self._start[live])
        if self._written is not None and self._written[0] == now \
                and self._written[1] is self._dense:
            return
        slot, base, start = self._dense
        if len(slot):
            cost = base - model.run_discounts(now - start)
            moved = np.flatnonzero(net.costs(slot) != cost)
            net.write_costs(slot[moved], cost[moved])
        self._written = (now, self._dense)

"""Two-level scheduling (Mesos, Omega §3.3 and §4.2): an allocator offers resources
to one framework at a time; an offer locks what it offers until the framework answers.

Frameworks are real scheduler instances. The allocator keeps, per machine, what is
free and not locked by an outstanding offer. Every ``offer_interval`` seconds, while
some framework waits and something is available, it offers *all* of it to the
waiting framework with the smallest dominant share of the resources it occupies
(DRF), after ``offer_cost`` seconds. The framework decides on its offer only: its
view of the cell holds just the offered machines, each showing as free exactly what
the offer gives (Omega's simulator: "a scheduler only looks at the set of resources
available to it when it begins a scheduling attempt"). When it commits, what it did
not use goes back to the allocator. There are no conflicts: the price of this design
is locked resources and offer delay.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from immutables import Map

from cellstate.cell import CellSnapshot, machine_used
from cellstate.keys import KeyKind
from cellstate.model import (
    Allocation,
    CommitResult,
    Machine,
    MachineState,
    Resources,
    trusted_resources,
)
from schedulers.runtime import Attempt, SchedulerInstance
from simulator.cell import Changes, Listener, SimCell
from simulator.config import TwoLevelSpec
from simulator.drivers import Committed
from simulator.engine import COMMIT, WAKE, Event, EventLoop
from simulator.recorder import Recorder

if TYPE_CHECKING:
    from immutables._protocols import MapMutation

# Enum members as globals on hot paths (why: cellstate/validation.py).
_MACHINE = KeyKind.MACHINE
_UP = MachineState.UP

# An offer's locks are an immutable map: a view keeps the one it was shown, the pool
# merged into them at the answer makes a new one sharing all but a few nodes, and handing
# the locks back to the allocator copies nothing (a dict of thousands of machines would be
# copied, and freed, once per offer).
Locks = Map[str, Resources]

# Above any job's precedence, so no policy tries to preempt the hidden part.
_HIDDEN_PRECEDENCE = 2**31
_NOTHING = Resources()


def _positive(r: Resources) -> Resources:
    return Resources(tuple((d, a) for d, a in r.amounts if a > 1e-9))


def _left(capacity: Resources, used: Resources, *taken: Resources) -> Resources:
    """``_positive(capacity - used - taken[0] - ...)`` without the intermediate vectors
    (the allocator asks it for every machine that changes or that a framework looks
    at): the same float operations in the same order. A dimension an intermediate
    difference drops (within 1e-9 of zero) ends at most 1e-9 either way, as every
    later term is non-negative, so the result is the same; so is a dimension the
    capacity lacks (negative)."""
    c = capacity.amounts
    if len(c) == 2:
        # Nearly every vector here names the same two dimensions (cpu, mem): the same
        # subtractions, in the same order, without the general loop. A term that is
        # empty subtracts nothing (the general path subtracts 0.0: the same floats).
        (d0, x0), (d1, x1) = c
        for t in (used, *taken):
            a = t.amounts
            if len(a) == 2 and a[0][0] == d0 and a[1][0] == d1:
                x0 = x0 - a[0][1]
                x1 = x1 - a[1][1]
            elif a:
                break  # other dimensions: the general path below, from the start
        else:
            if x0 > 1e-9:
                return trusted_resources(((d0, x0), (d1, x1)) if x1 > 1e-9 else ((d0, x0),))
            return trusted_resources(((d1, x1),)) if x1 > 1e-9 else _NOTHING
    # Each term is looked up first at the capacity's position (the vectors the
    # allocator subtracts nearly always name its dimensions in the same order).
    out = []
    terms = (used, *taken)
    for i, (d, x) in enumerate(capacity.amounts):
        for t in terms:
            a = t.amounts
            if i < len(a) and a[i][0] == d:
                x = x - a[i][1]
            else:
                x = x - t.get(d)
        if x > 1e-9:
            out.append((d, x))
    return trusted_resources(tuple(out))


class Moves:
    """The machines that entered or left the key set of the allocator's pool or of an
    offer's locks, in order (a machine may appear more than once). A framework's view
    compares its last offer with the next one over these machines only, not over every
    machine offered; positions count from the first move ever logged."""

    _LIMIT = 100_000  # moves kept; a view further behind compares every machine

    def __init__(self) -> None:
        self.base = 0
        self.items: list[str] = []

    @property
    def end(self) -> int:
        return self.base + len(self.items)

    def since(self, pos: int) -> list[str] | None:
        """The moves from position ``pos`` on; None if they are no longer kept."""
        return self.items[pos - self.base:] if pos >= self.base else None

    def trim(self) -> None:
        if len(self.items) > self._LIMIT:
            self.base += len(self.items)
            self.items = []


class Offer:
    """What one framework was offered, per machine, until it answers.

    ``lineage`` (0: unknown) names the chain of dicts its locks descend from: the pool becomes an
    offer's locks, an answered offer's locks become the pool again, and every change to
    their key sets along the way is in ``moves``. Two offers of the same lineage differ
    only in machines logged between them."""

    def __init__(self, ident: int, framework: str, locks: Locks,
                 lineage: int = 0, moves: Moves | None = None,
                 plain: Mapping[str, tuple[Machine, Resources]] | None = None) -> None:
        self.id = ident
        self.framework = framework
        self.locks = locks
        self.lineage = lineage
        self.moves = moves if moves is not None else Moves()
        # The allocator's ``plain`` counts (see there), read by views of the offer.
        self.plain: Mapping[str, tuple[Machine, Resources]] = plain if plain is not None else {}

    def frozen(self) -> Locks:
        """The locks as they are now, for a view (immutable: later changes make new
        ones)."""
        return self.locks

    def take(self) -> Locks:
        """The locks, for the allocator once the framework has answered; the offer is
        left empty."""
        locks, self.locks = self.locks, Map()
        return locks


# One machine as an offer shows it: (the cell's record, the offer's lock on it, the
# record the framework sees). Records and locks are immutable, so while both are the
# same objects the shown record is too, whatever the view or the offer.
_Shown = tuple[Machine, Resources, Machine]


class OfferedMachines(Mapping[str, Machine]):
    """The machines of an offer, each showing as free just what the offer gives (the
    rest of its free resources is hidden behind a placeholder allocation)."""

    def __init__(self, base: Mapping[str, Machine], offer: Offer,
                 shown: dict[str, _Shown]) -> None:
        self._base = base
        self._offered = offer.frozen()
        self._plain = offer.plain
        self._shown = shown  # kept by the OfferView across views and offers

    def __getitem__(self, mid: str) -> Machine:
        return self._show(mid, self._base[mid], self._offered[mid])

    def _show(self, mid: str, m: Machine, offered: Resources) -> Machine:
        hit = self._shown.get(mid)
        if hit is not None and hit[0] is m and hit[1] is offered:
            return hit[2]
        shown = m
        counted = self._plain.get(mid)
        # What the allocator counted free on this very record, with no other lock on
        # it, is offered whole: nothing to hide, and no need to work it out again.
        hidden = (_NOTHING if counted is not None and counted[0] is m and counted[1] is offered
                  else _left(m.capacity, machine_used(m, {}), offered))
        if hidden:
            allocs = dict(m.allocations)
            allocs["hidden/0"] = Allocation("hidden/0", "hidden", "allocator",
                                            _HIDDEN_PRECEDENCE, hidden)
            # The placeholder carries no gang tag: the record is tagged as ``m`` is.
            shown = m.with_allocations(allocs, m.settled_used + hidden, m.has_tags)
        self._shown[mid] = (m, offered, shown)
        return shown

    def get(self, mid: str, default: Any = None) -> Any:
        # Mapping's own get() goes through a raised KeyError: policies look up machines
        # one at a time, tens of thousands per simulated hour (each map read once).
        offered = self._offered.get(mid)
        m = self._base.get(mid) if offered is not None else None
        return default if m is None or offered is None else self._show(mid, m, offered)

    def __iter__(self) -> Iterator[str]:
        return iter(self._offered)

    def __len__(self) -> int:
        return len(self._offered)

    def __contains__(self, mid: object) -> bool:
        return mid in self._offered


class Allocator:
    def __init__(self, loop: EventLoop, cell: SimCell, spec: TwoLevelSpec,
                 capacity: Resources) -> None:
        self.loop = loop
        self.cell = cell
        self.spec = spec
        self.capacity = capacity
        # Free and not offered, per machine: the next offer's locks, built in place.
        self.available: MapMutation[str, Resources] = Map().mutate()
        self.outstanding: dict[int, Offer] = {}
        self.waiting: dict[str, Framework] = {}
        self.offers_made = 0
        self._tick: Event | None = None
        # While a framework's commit is published: the machines it changed, counted
        # once it answers (release() counts the ones it placed on again anyway).
        self._deferred: set[str] | None = None
        # Per machine, the record and what was free on it when it was last counted with
        # no offer's lock on it and no gang hold: while both are the ones a view shows,
        # the offer gives all that is free there (capacity - used - free is exactly
        # nothing, the same subtractions), so the view hides nothing without computing it.
        self.plain: dict[str, tuple[Machine, Resources]] = {}
        self.moves = Moves()
        self._lineages = itertools.count(1)
        self._pool_lineage = next(self._lineages)  # of ``available``
        self._changed(cell.snapshot(), None)
        cell.on_changes(self._changed)

    def _changed(self, snap: CellSnapshot, changes: Changes | None) -> None:
        if changes is None:
            self._recount(snap, snap.machines)
            return
        mids = [mid for kind, mid in changes if kind is _MACHINE]
        if self._deferred is not None:
            self._deferred.update(mids)
        else:
            self._recount(snap, mids)

    def _recount(self, snap: CellSnapshot, mids: Iterable[str]) -> None:
        """Count again what is available on each of ``mids``, in order (every
        placement and task end lands here, for each machine it changes)."""
        machines, gangs = snap.machines, snap.gangs
        available, plain, moved = self.available, self.plain, self.moves.items
        offers = list(self.outstanding.values())
        for mid in mids:
            m = machines.get(mid)
            if m is None or m.state is not _UP:  # gone, down or draining: nothing to offer
                plain.pop(mid, None)
                if available.pop(mid, None) is not None:
                    moved.append(mid)
                continue
            used = machine_used(m, gangs) if m.has_tags else m.settled_used
            locks = [lock for o in offers if (lock := o.locks.get(mid))] if offers else None
            if locks:
                free = _left(m.capacity, used, *locks)
                plain.pop(mid, None)
            else:
                free = _left(m.capacity, used)
                if m.has_tags:
                    plain.pop(mid, None)
                else:
                    plain[mid] = (m, free)
            if free:
                if mid not in available:
                    moved.append(mid)
                available[mid] = free
            elif available.pop(mid, None) is not None:
                moved.append(mid)

    def dominant_share(self, framework: str) -> float:
        held = self.cell.usage.get(framework, Resources())
        return max((held.get(d) / c for d, c in self.capacity.amounts if c), default=0.0)

    def request(self, fw: Framework) -> None:
        self.waiting[fw.name] = fw
        if self._tick is None:
            at = math.ceil(self.loop.now / self.spec.offer_interval) * self.spec.offer_interval
            self._tick = self.loop.at(max(at, self.loop.now), WAKE, self._round)

    def _round(self) -> None:
        self._tick = None
        if not self.waiting:
            return
        if self.available:
            fw = min(self.waiting.values(), key=lambda f: (self.dominant_share(f.name), f.name))
            del self.waiting[fw.name]
            self.offers_made += 1
            self.moves.trim()
            offer = Offer(self.offers_made, fw.name, self.available.finish(),
                          self._pool_lineage, self.moves, self.plain)
            self.available = Map().mutate()
            self._pool_lineage = next(self._lineages)
            self.outstanding[offer.id] = offer
            self.loop.after(self.spec.offer_cost, COMMIT, lambda: fw.offered(offer))
        if self.waiting:
            self._tick = self.loop.after(self.spec.offer_interval, WAKE, self._round)

    def committing(self) -> None:
        """A framework's commit is about to be published; its answer (release()) ends
        it. Until then the machines that change are counted at the answer, not one
        change at a time (on the machines it placed on, the count would be undone)."""
        self._deferred = set()

    def placed_on(self, results: dict[str, CommitResult]) -> set[str]:
        """The machines a framework's commit placed on. Their locks are not reduced by
        what it placed: the answer (:meth:`release`) drops those locks and counts the
        machines again from the cell, so a reduced lock would never be read."""
        return {c.machine for res in results.values() for c in res.committed}

    def release(self, offer: Offer, touched: set[str] | frozenset[str] = frozenset()) -> None:
        """The framework answered: what it did not use is available again. Machines it
        placed on are counted again (while its commit was published, its offer still
        held what it placed); on the others, what was available grows by the lock."""
        deferred, self._deferred = self._deferred, None
        snap = self.cell.snapshot()
        if deferred:
            # Machines the commit changed but did not place on (none, so far): counted
            # with the offer still outstanding, as they would have been when published
            # (only the machines placed on have changed since).
            self._recount(snap, [mid for mid in deferred if mid not in touched])
        if self.outstanding.pop(offer.id, None) is None:
            return
        # The offer's locks (thousands of machines, shared, not copied) with the few
        # machines freed meanwhile merged in.
        merged = offer.take().mutate()
        moved = self.moves.items
        for mid, have in self.available.finish().items():
            lock = merged.get(mid)
            if lock is None:
                moved.append(mid)
            merged[mid] = have if lock is None else have + lock
        self.available = merged
        self._pool_lineage = offer.lineage
        # Counted in place: a machine placed on nearly always keeps some room, and
        # taking it out to put it back would log two moves that every framework's
        # view then goes over for nothing.
        self._recount(snap, touched)


class OfferView:
    """A framework's snapshot source: the cell as its current offer shows it."""

    def __init__(self, cell: SimCell) -> None:
        self.cell = cell
        self.offer: Offer | None = None
        self._listeners: list[Listener] = []
        self._visible: set[str] | None = None  # None: every machine
        self._lineage = 0  # of the offer last shown
        self._moves: Moves | None = None  # its log of moves
        self._moved_to = 0  # position in that log when shown
        # The last view: (cell snapshot, offer's locks, view), reused while neither
        # changed (show() and the framework's decision both take one).
        self._last: tuple[CellSnapshot, Locks, CellSnapshot] | None = None
        self._shown: dict[str, _Shown] = {}  # every view's records, see OfferedMachines

    def snapshot(self) -> CellSnapshot:
        snap = self.cell.snapshot()
        if self.offer is None:
            return snap
        locks = self.offer.frozen()
        last = self._last
        if last is not None and last[0] is snap and last[1] is locks:
            return last[2]
        # CellSnapshot annotates immutables.Map; readers only use the Mapping interface.
        machines = cast(Any, OfferedMachines(snap.machines, self.offer, self._shown))
        view = CellSnapshot(snap.revision, snap.config, machines, snap.jobs, snap.tasks,
                            snap.gangs, snap.usage, snap.statuses, snap.instances,
                            snap.schedulers, snap.agents)
        self._last = (snap, locks, view)
        return view

    def on_changes(self, listener: Listener) -> None:
        self._listeners.append(listener)
        self.cell.on_changes(listener)

    def show(self, offer: Offer) -> None:
        """Switch to a new offer. Machines that come into view or leave it are reported
        as changed, so the runtime's list of machine ids follows (it stays as it was
        between offers: a framework only decides while it holds one)."""
        self.offer = offer
        visible = self._visible
        moved = (offer.moves.since(self._moved_to)
                 if visible is not None and offer.lineage and offer.lineage == self._lineage
                 and offer.moves is self._moves else None)
        # In no particular order: the runtime only collects them in a set.
        changed: Changes = []
        if visible is not None and moved is not None:
            # Only machines that moved since the last offer can differ (nearly every
            # offer holds the same thousands as the last), each reported once.
            locks = offer.locks
            for mid in moved:
                inside = mid in locks
                if inside != (mid in visible):
                    if inside:
                        visible.add(mid)
                    else:
                        visible.discard(mid)
                    changed.append((_MACHINE, mid))
        else:
            shown = set(offer.locks)
            before = (visible if visible is not None
                      else set(self.cell.snapshot().machines.keys()))
            changed = [(KeyKind.MACHINE, mid) for mid in before ^ shown]
            self._visible = shown
        self._lineage = offer.lineage
        self._moves = offer.moves
        self._moved_to = offer.moves.end
        snap = self.snapshot()
        for listener in self._listeners:
            listener(snap, changed)


class Framework:
    """A scheduler instance that decides only while it holds an offer."""

    def __init__(self, loop: EventLoop, recorder: Recorder, inst: SchedulerInstance,
                 view: OfferView, allocator: Allocator, committed: Committed) -> None:
        self.loop = loop
        self.recorder = recorder
        self.inst = inst
        self.view = view
        self.allocator = allocator
        self.committed = committed
        self.engaged = False  # waiting for or holding an offer
        self._wake_event: Event | None = None

    @property
    def name(self) -> str:
        return self.inst.scheduler

    def poke(self) -> None:
        if self.engaged:
            return
        if self._wake_event is not None:
            self._wake_event.cancel()
            self._wake_event = None
        self.engaged = True
        self.allocator.request(self)

    def offered(self, offer: Offer) -> None:
        self.view.show(offer)
        result = self.inst.decide()
        if isinstance(result, Attempt):
            self.recorder.started(result.jobs, result.started_at)
            self.loop.after(result.cost, COMMIT, lambda: self._commit(result, offer))
            return
        # Nothing due: decline at once and sleep until a retry is due or work arrives.
        self._answer(offer)
        if math.isfinite(result):
            self._wake_event = self.loop.after(result, WAKE, self.poke)

    def _commit(self, attempt: Attempt, offer: Offer) -> None:
        self.allocator.committing()
        results = self.inst.finish(attempt)
        touched = self.allocator.placed_on(results)
        self._answer(offer, touched)
        self.recorder.attempt(self.name, attempt.started_at, attempt.cost, results)
        self.committed(attempt, results)
        self.poke()

    def _answer(self, offer: Offer, touched: set[str] | frozenset[str] = frozenset()) -> None:
        self.allocator.release(offer, touched)
        self.engaged = False

"""Two-level scheduling (Mesos, Omega §3.3 and §4.2): an allocator offers resources
to one framework at a time; an offer locks what it offers until the framework answers.

Frameworks are real scheduler instances. A framework sees the cell with whatever
other frameworks' outstanding offers lock shown as held (a phantom allocation per
locked machine), so it can only place into its own offer and into resources freed
since. The allocator works in rounds every ``offer_interval`` seconds; each round it
offers all free, unlocked resources to the waiting framework with the smallest
dominant share of the resources it occupies (DRF), after ``offer_cost`` seconds.
There are no conflicts: the cost of this design is locked resources and offer delay.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, cast

from cellstate.cell import CellSnapshot, machine_used
from cellstate.model import Allocation, Machine, Resources
from schedulers.runtime import Attempt, SchedulerInstance
from simulator.cell import Listener, SimCell
from simulator.config import TwoLevelSpec
from simulator.drivers import Committed
from simulator.engine import COMMIT, WAKE, Event, EventLoop
from simulator.recorder import Recorder

# Above any job's precedence, so no policy tries to preempt a lock.
_LOCK_PRECEDENCE = 2**31


class Offer:
    """All free resources of every machine not locked by an earlier outstanding offer,
    as of the snapshot the offer was made on. Each machine's share is worked out when
    first asked for (a framework looks at a few hundred machines, not all of them)."""

    def __init__(self, ident: int, framework: str, snap: CellSnapshot,
                 prior: tuple[Offer, ...]) -> None:
        self.id = ident
        self.framework = framework
        self.snap = snap
        self.prior = prior
        self._locks: dict[str, Resources] = {}

    def lock(self, mid: str) -> Resources:
        hit = self._locks.get(mid)
        if hit is None:
            m = self.snap.machines.get(mid)
            hit = Resources()
            if m is not None:
                used = machine_used(m, self.snap.gangs)
                for p in self.prior:
                    used = used + p.lock(mid)
                hit = Resources(tuple((d, c - used.get(d)) for d, c in m.capacity.amounts
                                      if c - used.get(d) > 1e-9))
            self._locks[mid] = hit
        return hit


class LockedMachines(Mapping[str, Machine]):
    """The machines of a snapshot with other frameworks' offers shown as held."""

    def __init__(self, base: Mapping[str, Machine], offers: tuple[Offer, ...]) -> None:
        self._base = base
        self._offers = offers
        self._memo: dict[str, Machine] = {}

    def __getitem__(self, mid: str) -> Machine:
        hit = self._memo.get(mid)
        if hit is not None:
            return hit
        m = self._base[mid]
        allocs = dict(m.allocations)
        held = m.settled_used
        for o in self._offers:
            lock = o.lock(mid)
            if lock:
                allocs[f"offer-{o.id}/0"] = Allocation(f"offer-{o.id}/0", f"offer-{o.id}",
                                                       "allocator", _LOCK_PRECEDENCE, lock)
                held = held + lock
        if len(allocs) != len(m.allocations):
            m = m.with_allocations(allocs, held).with_seq(m.seq)
        self._memo[mid] = m
        return m

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def __contains__(self, mid: object) -> bool:
        return mid in self._base


class Allocator:
    def __init__(self, loop: EventLoop, cell: SimCell, spec: TwoLevelSpec,
                 capacity: Resources) -> None:
        self.loop = loop
        self.cell = cell
        self.spec = spec
        self.capacity = capacity
        self.outstanding: dict[int, Offer] = {}
        self.waiting: dict[str, Framework] = {}
        self.offers_made = 0
        self._tick: Event | None = None

    def request(self, fw: Framework) -> None:
        self.waiting[fw.name] = fw
        if self._tick is None:
            at = math.ceil(self.loop.now / self.spec.offer_interval) * self.spec.offer_interval
            self._tick = self.loop.at(max(at, self.loop.now), WAKE, self._round)

    def dominant_share(self, framework: str) -> float:
        held = self.cell.usage.get(framework, Resources())
        return max((held.get(d) / c for d, c in self.capacity.amounts if c), default=0.0)

    def _round(self) -> None:
        self._tick = None
        if not self.waiting:
            return
        fw = min(self.waiting.values(), key=lambda f: (self.dominant_share(f.name), f.name))
        del self.waiting[fw.name]
        self.offers_made += 1
        offer = Offer(self.offers_made, fw.name, self.cell.snapshot(),
                      tuple(self.outstanding.values()))
        self.outstanding[offer.id] = offer
        self.loop.after(self.spec.offer_cost, COMMIT, lambda: fw.offered(offer))
        if self.waiting:
            self._tick = self.loop.after(self.spec.offer_interval, WAKE, self._round)

    def release(self, offer: Offer) -> None:
        self.outstanding.pop(offer.id, None)

    def locks_against(self, framework: str) -> tuple[Offer, ...]:
        return tuple(o for o in self.outstanding.values() if o.framework != framework)


class OfferView:
    """A framework's snapshot source: the cell minus other frameworks' offers."""

    def __init__(self, cell: SimCell, allocator: Allocator, framework: str) -> None:
        self.cell = cell
        self.allocator = allocator
        self.framework = framework

    def snapshot(self) -> CellSnapshot:
        snap = self.cell.snapshot()
        others = self.allocator.locks_against(self.framework)
        if not others:
            return snap
        # CellSnapshot annotates immutables.Map; readers only use the Mapping interface.
        machines = cast(Any, LockedMachines(snap.machines, others))
        return CellSnapshot(snap.revision, snap.config, machines, snap.jobs, snap.tasks,
                            snap.gangs, snap.usage, snap.statuses, snap.instances,
                            snap.schedulers)

    def on_changes(self, listener: Listener) -> None:
        self.cell.on_changes(listener)


class Framework:
    """A scheduler instance that decides only while it holds an offer."""

    def __init__(self, loop: EventLoop, recorder: Recorder, inst: SchedulerInstance,
                 allocator: Allocator, committed: Committed) -> None:
        self.loop = loop
        self.recorder = recorder
        self.inst = inst
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
        result = self.inst.decide()
        if isinstance(result, Attempt):
            self.recorder.started(result.jobs, result.started_at)
            self.loop.after(result.cost, COMMIT, lambda: self._commit(result, offer))
            return
        # Nothing due: decline at once and sleep until a retry is due or work arrives.
        self.allocator.release(offer)
        self.engaged = False
        if math.isfinite(result):
            self._wake_event = self.loop.after(result, WAKE, self.poke)

    def _commit(self, attempt: Attempt, offer: Offer) -> None:
        results = self.inst.finish(attempt)
        self.allocator.release(offer)
        self.recorder.attempt(self.name, attempt.started_at, attempt.cost, results)
        self.committed(attempt, results)
        self.engaged = False
        self.poke()

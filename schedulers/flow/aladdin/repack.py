"""Repacking (Aladdin+H §2.3, §3.5): moving this scheduler's running tasks so that a
constrained unit the passes could not place fits.

The paper repacks through the flow's negative cycles; here it is an explicit step
after the passes, for the constrained units (and affinity groups) left over. For each,
in the round's pass order, it walks ``walk`` machines in the unit's preference order
and, among those where only resources keep the unit off (its rules allow it there)
and moving at most ``max_moves`` of this scheduler's *movable* tasks away frees
enough room, takes the one needing the fewest moves (then the first in preference
order), so that no task moves that another machine would not have needed moved;
the ``plans`` best such machines are tried for destinations, in that order.
Movable: tasks of free jobs (no rules of their own, no live rule keeps them off
anything: moving them can break nothing), placed and not moved within the flapping
guard. Movers are chosen greedily by how much of the missing room they free, and each
needs a destination its own rules allow on another machine, found in its own
preference order; only if every mover has one are the moves claimed (``moves_from``:
the store releases the old allocation in the same write) and then the unit. The plan
puts the movers' transactions first, so the store sees the room freed before the
unit's claims; if a move loses a race, the unit's claims fail on resources and it is
tried again next round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

from cellstate.cell import alloc_placed
from cellstate.fit import Rule
from cellstate.model import Allocation, Job, Resources
from schedulers.api import CellView
from schedulers.flow.aladdin.cellarrays import CellArrays
from schedulers.flow.aladdin.groups import MachineGroups
from schedulers.flow.aladdin.outcome import Outcome
from schedulers.flow.aladdin.units import Unit
from schedulers.placement import why_not


@attrs.frozen
class RepackOptions:
    max_moves: int = 4  # tasks moved for one unit
    max_units: int = 50  # units repacked per round
    walk: int = 200  # machines looked at per unit, and per mover's destination
    plans: int = 8  # plans (machine and movers) per unit whose destinations are sought


@attrs.frozen
class _Movable:
    """A machine's movable tasks, their demands as vectors, and the sum of those."""

    allocs: list[Allocation]
    vec: dict[str, np.ndarray]
    total: np.ndarray


class Repacker:
    def __init__(self, view: CellView, cell: CellArrays, groups: MachineGroups,
                 movable: Callable[[Allocation], bool], options: RepackOptions,
                 ex: Outcome) -> None:
        self.view = view
        self.cell = cell
        self.groups = groups
        self.movable = movable
        self.opts = options
        self.ex = ex
        # Preference orders by demand, made once for the repacking step (the packing
        # cost as the step began: an order, not a count of room, so it may lag).
        self._orders: dict[Resources, np.ndarray] = {}
        self._pack = cell.pack()
        # Each machine's movable tasks, looked up once per step: a machine's running
        # tasks change within the step only when repacking moves some off it (claims
        # add only claimed tasks, which are never movable), so _commit forgets it.
        self._movable: dict[int, _Movable | None] = {}

    def _order(self, demand: Resources) -> np.ndarray:
        order = self._orders.get(demand)
        if order is None:
            order = self.cell.order(self.groups.costs(demand), self._pack)
            self._orders[demand] = order
        return order

    def run(self, units: Sequence[Unit]) -> list[Unit]:
        """Repack for ``units`` (in order); returns those still not placed."""
        left = []
        failed: set[str] = set()  # jobs a unit of which found no plan this step
        for n, unit in enumerate(units):
            # Another unit of a job whose unit found no plan would look at the same
            # machines with the same rules: it is not tried again this step.
            if (n >= self.opts.max_units or unit.job.id in failed
                    or not self._repack(unit)):
                left.append(unit)
                failed.add(unit.job.id)
        return left

    def _repack(self, unit: Unit) -> bool:
        job = unit.job
        need = self.cell.vector(unit.demand)
        order = self._order(unit.demand)
        order = order[self.cell.up[order] & (self.cell.cap[order] + 1e-9 >= need).all(axis=1)]
        # The machines where moving tasks would make room, each with the movers it
        # would take; the fewest movers first (then preference order), so that no task
        # moves that another machine did not need moved.
        options: list[tuple[int, int, int, list[Allocation]]] = []
        for rank, i in enumerate(order[:self.opts.walk].tolist()):
            # The cheap tests first; each only skips the machine, so their order does
            # not change which machines are options.
            lacking = np.maximum(need - self.cell.free[i], 0.0)
            if not (lacking > 1e-9).any():
                continue  # room enough: not a repacking case (the passes saw it differently)
            movable = self._movable_on(i)
            if movable is None or ((movable.total + 1e-9) < lacking).any():
                continue  # moving every movable task would not make room
            m = self.view.machine(self.cell.mids[i])
            if m is None:
                continue
            miss = why_not(self.view, job, m, founding=unit.founding)
            if miss is not None and miss.rule is not Rule.RESOURCES:
                continue
            chosen = self._movers(i, lacking)
            if chosen is not None:
                options.append((len(chosen), rank, i, chosen))
                if len(chosen) == 1:
                    break  # none needs fewer
        ranked = sorted(options, key=lambda o: (o[0], o[1]))[:self.opts.plans]
        for _, _, i, chosen in ranked:
            plan = self._destinations(i, chosen)
            if plan is not None:
                return self._commit(unit, i, need, plan)
        return False

    def _commit(self, unit: Unit, i: int, need: np.ndarray,
                plan: list[tuple[Allocation, int]]) -> bool:
        """Claim the moves off machine ``i`` and then the unit on it."""
        job = unit.job
        mid = self.cell.mids[i]
        self._movable.pop(i, None)  # its movers are claimed now
        for a, dest in plan:
            mover = self.view.jobs[a.job]
            index = int(a.task.rpartition("/")[2])
            self.ex.claims.append(self.view.claim(mover, index, self.cell.mids[dest],
                                                  moves_from=mid))
            self.cell.take(dest, a.resources)
            self.cell.give(i, a.resources)
            self.ex.moved.append((a.task, mid))
            self.ex.migrated += 1
        m = self.view.machine(mid)
        assert m is not None
        if why_not(self.view, job, m, founding=unit.founding) is not None or not (
                self.cell.free[i] + 1e-9 >= need).all():
            return False  # cannot happen unless the fit rules disagree with the arrays
        for index in unit.indices:
            self.ex.claims.append(self.view.claim(job, index, mid))
        self.cell.take(i, unit.demand)
        self.ex.placed += len(unit.indices)
        return True

    def _movable_on(self, i: int) -> _Movable | None:
        """Machine ``i``'s movable tasks (None if it has none)."""
        if i in self._movable:
            return self._movable[i]
        m = self.view.machine(self.cell.mids[i])
        if m is None:
            return None
        allocs = [a for a in m.allocations.values()
                  if alloc_placed(a, self.view.gangs) and not self.view.claimed(a.task)
                  and self.movable(a)]
        out = None
        if allocs:
            vec = {a.task: self.cell.vector(a.resources) for a in allocs}
            out = _Movable(allocs, vec, sum(vec.values(), np.zeros(len(self.cell.dims))))
        self._movable[i] = out
        return out

    def _movers(self, i: int, lacking: np.ndarray) -> list[Allocation] | None:
        """Tasks to move off machine ``i`` to free ``lacking``; None if no set of at
        most ``max_moves`` does."""
        movable = self._movable_on(i)
        if movable is None or ((movable.total + 1e-9) < lacking).any():
            return None
        scale = np.where(self.cell.cap[i] > 0, self.cell.cap[i], 1.0)
        vec = movable.vec
        weight = lacking / scale
        candidates = sorted(movable.allocs, key=lambda a: (
            -float((np.minimum(vec[a.task], lacking) / scale) @ weight), a.task))
        chosen: list[Allocation] = []
        freed = np.zeros(len(self.cell.dims))
        for a in candidates:
            if ((freed + 1e-9) >= lacking).all() or len(chosen) >= self.opts.max_moves:
                break
            chosen.append(a)
            freed += vec[a.task]
        if ((freed + 1e-9) < lacking).any():
            return None
        return chosen

    def _destinations(self, i: int, chosen: Sequence[Allocation]
                      ) -> list[tuple[Allocation, int]] | None:
        """A machine for each mover off machine ``i``; None if one has none."""
        out: list[tuple[Allocation, int]] = []
        room: dict[int, np.ndarray] = {}
        for a in chosen:
            dest = self._destination(a, i, room)
            if dest is None:
                return None
            out.append((a, dest))
            room[dest] = room.get(dest, np.zeros(len(self.cell.dims))) + self.cell.vector(
                a.resources)
        return out

    def _destination(self, a: Allocation, away: int, room: dict[int, np.ndarray]
                     ) -> int | None:
        job: Job = self.view.jobs[a.job]
        need = self.cell.vector(a.resources)
        order = self._order(a.resources)
        free = self.cell.free[order]
        ok = self.cell.up[order] & (free + 1e-9 >= need).all(axis=1) & (order != away)
        for j in order[ok][:self.opts.walk].tolist():
            if j in room and not (self.cell.free[j] - room[j] + 1e-9 >= need).all():
                continue
            dest = self.view.machine(self.cell.mids[j])
            if dest is not None and why_not(self.view, job, dest) is None:
                return int(j)
        return None


def movable_by(scheduler: str, view: CellView, free_job: Callable[[Job], bool],
               guarded: Callable[[str], bool]) -> Callable[[Allocation], bool]:
    """Which running allocations repacking may move: this scheduler's, of free jobs,
    not staged by a gang and not under the flapping guard."""
    free: dict[str, bool] = {}  # job -> free_job, asked once per job (a round's view)

    def movable(a: Allocation) -> bool:
        if a.scheduler != scheduler or a.gang or a.evicted_by or guarded(a.task):
            return False
        ok = free.get(a.job)
        if ok is None:
            job = view.jobs.get(a.job)
            ok = free[a.job] = job is not None and free_job(job)
        return ok

    return movable

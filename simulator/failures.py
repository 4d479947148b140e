"""Machine failures in the simulator (``SimConfig.failures``).

What fails together is a *unit*: a machine, or every machine of a rack or failure
domain. Each unit fails after an exponential time of mean ``mtbf`` (so the cell's
failures arrive at ``units / mtbf`` per second, each on a unit picked uniformly), and
the failures a trace lists happen at their times. A failure takes the unit's machines
that are up down through the store's own decision (``cellstate.decisions.take_down``:
their running tasks are lost); after the repair time they are up again, empty. What a
lost task means for the run (its scheduler woken, its work counted as lost) is the
caller's, through ``on_down``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from cellstate.model import Machine, MachineState
from simulator.cell import SimCell
from simulator.config import FailureSpec
from simulator.engine import END, EventLoop

_DOWN = MachineState.DOWN


class Failures:
    def __init__(self, spec: FailureSpec, loop: EventLoop, cell: SimCell,
                 machine_ids: Sequence[str], rng: random.Random, horizon: float,
                 on_down: Callable[[list[Machine]], None]) -> None:
        self.spec = spec
        self.loop = loop
        self.cell = cell
        self.rng = rng
        self.horizon = horizon
        self.on_down = on_down
        # In the cell's own order, not the snapshot's: a map's order follows string
        # hashes, which differ from process to process (and so would the unit picked).
        machines = cell.snapshot().machines
        units: dict[str, list[str]] = {}
        for mid in machine_ids:
            key = mid if spec.scope == "machine" else getattr(machines[mid], spec.scope)
            units.setdefault(key, []).append(mid)
        self.units = list(units.values())
        self._unit_of = {mid: members for members in self.units for mid in members}

    def start(self) -> None:
        for when, mid in self.spec.at:
            self.loop.at(when, END, self._failing(self._unit_of[mid]))
        if self.spec.mtbf > 0:
            self._next()

    def _next(self) -> None:
        at = self.loop.now + self.rng.expovariate(len(self.units) / self.spec.mtbf)
        if at > self.horizon:
            return
        unit = self.units[self.rng.randrange(len(self.units))]
        fail = self._failing(unit)

        def fail_and_go_on() -> None:
            fail()
            self._next()

        self.loop.at(at, END, fail_and_go_on)

    def _failing(self, unit: list[str]) -> Callable[[], None]:
        return lambda: self.fail(unit)

    def fail(self, unit: Sequence[str]) -> None:
        """The machines of ``unit`` that are up go down, until repaired together."""
        snap = self.cell.snapshot()
        down = [m for mid in unit
                if (m := snap.machines.get(mid)) is not None and m.state is not _DOWN]
        if not down:
            return
        for m in down:
            self.cell.update_machine(m.id, state=_DOWN)
        self.on_down(down)
        ids = [m.id for m in down]
        self.loop.after(max(self.spec.repair.sample(self.rng), 0.0), END,
                        lambda: self._repair(ids))

    def _repair(self, machine_ids: list[str]) -> None:
        for mid in machine_ids:
            m = self.cell.snapshot().machines.get(mid)
            if m is not None and m.state is _DOWN:
                self.cell.update_machine(mid, state=MachineState.UP)

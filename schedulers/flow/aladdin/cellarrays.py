"""The cell's machines as arrays for one Aladdin round (``machinearrays.MachineArrays``),
with each machine's group and the packing cost inside a group."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from cellstate.model import Resources
from schedulers.api import CellView
from schedulers.flow.aladdin.groups import MachineGroups
from schedulers.machinearrays import MAX_FIT, Ints, MachineArrays

__all__ = ["MAX_FIT", "CellArrays"]


class CellArrays(MachineArrays):
    def __init__(self, view: CellView, groups: MachineGroups,
                 demands: Iterable[Resources], packing: bool = True) -> None:
        super().__init__(view, demands)
        self.packing = packing
        self.group = np.zeros(len(self.mids), dtype=np.int64)
        self.assign(groups)
        n = len(self.mids)
        cpu = self.cap[:, self.dims.index("cpu")] if "cpu" in self.dims else np.ones(n)
        biggest = float(cpu.max()) if n else 1.0
        # Bigger machines first (fewer machines for the same tasks), then a fixed order.
        self._size = np.floor(400 * (1 - cpu / (biggest or 1.0))).astype(np.int64)
        self._order = np.floor(99 * np.arange(n) / max(n, 1)).astype(np.int64)

    def assign(self, groups: MachineGroups) -> None:
        """Take each machine's group from ``groups`` (by machine where it groups
        machines by what they have left, else by capacity)."""
        for i, mid in enumerate(self.mids):
            g = groups.by_machine.get(mid) if groups.by_machine else None
            self.group[i] = groups.of.get(self.capacities[i], 0) if g is None else g

    def pack(self) -> Ints:
        """The cost of a machine inside its group, below one preference unit (1000):
        fuller machines first (packing, Eq. 1's fewest machines), then bigger ones,
        then a fixed order. Not the paper's (its other arcs cost 1 alike): 0 for every
        machine unless the round packs (the cost model's ``pack`` option)."""
        if not self.packing:
            return np.zeros(len(self.mids), dtype=np.int64)
        used = self.used_share()
        return np.floor(500 * (1 - used)).astype(np.int64) + self._size + self._order

    def order(self, group_costs: Sequence[int], pack: Ints | None = None) -> Ints:
        """Machine indexes by preference: group cost, then packing cost."""
        p = self.pack() if pack is None else pack
        g = np.asarray(group_costs, dtype=np.int64)[self.group]
        return np.lexsort((np.arange(len(self.mids)), p, g)).astype(np.int64)

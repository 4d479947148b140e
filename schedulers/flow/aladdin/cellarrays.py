"""The cell's machines as arrays for one round: capacity and free room per dimension,
state, group, and the packing cost inside a group, kept up to date as the round's
own claims land (so each pass sees the room the passes before it left)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from cellstate.model import MachineState, Resources
from schedulers.api import CellView
from schedulers.flow.aladdin.groups import MachineGroups

#: Most units of one demand counted as fitting one machine.
MAX_FIT = 100_000
Ints = npt.NDArray[np.int64]


class CellArrays:
    def __init__(self, view: CellView, groups: MachineGroups,
                 demands: Iterable[Resources]) -> None:
        snap = view.snap
        self.mids = sorted(snap.machines)
        self.index = {mid: i for i, mid in enumerate(self.mids)}
        dims: set[str] = set()
        for m in snap.machines.values():
            dims.update(d for d, _ in m.capacity.amounts)
        for r in demands:
            dims.update(d for d, _ in r.amounts)
        self.dims = tuple(sorted(dims))
        n, k = len(self.mids), len(self.dims)
        self.cap = np.zeros((n, k))
        self.free = np.zeros((n, k))
        self.up = np.zeros(n, dtype=bool)
        self.group = np.zeros(n, dtype=np.int64)
        for i, mid in enumerate(self.mids):
            m = snap.machines[mid]
            self.cap[i] = self.vector(m.capacity)
            self.free[i] = self.cap[i] - self.vector(view.used(mid))
            self.up[i] = m.state is MachineState.UP
            self.group[i] = groups.of.get(m.capacity, 0)
        cpu = self.cap[:, self.dims.index("cpu")] if "cpu" in self.dims else np.ones(n)
        biggest = float(cpu.max()) if n else 1.0
        # Bigger machines first (fewer machines for the same tasks), then a fixed order.
        self._size = np.floor(400 * (1 - cpu / (biggest or 1.0))).astype(np.int64)
        self._order = np.floor(99 * np.arange(n) / max(n, 1)).astype(np.int64)

    def vector(self, r: Resources) -> npt.NDArray[np.float64]:
        return np.array([r.get(d) for d in self.dims])

    def fit(self, demand: Resources) -> Ints:
        """How many units of ``demand`` fit in each machine's free room, in every
        dimension (0 on a machine that is not up)."""
        need = self.vector(demand)
        mask = need > 0
        if not mask.any():
            out = np.full(len(self.mids), MAX_FIT, dtype=np.int64)
        else:
            ratio = self.free[:, mask] / need[mask] + 1e-9
            out = np.clip(np.floor(ratio.min(axis=1)), 0, MAX_FIT).astype(np.int64)
        out[~self.up] = 0
        return out

    def fits_one(self, i: int, need: npt.NDArray[np.float64]) -> bool:
        return bool(self.up[i] and (self.free[i] + 1e-9 >= need).all())

    def pack(self) -> Ints:
        """The cost of a machine inside its group, below one preference unit (1000):
        fuller machines first (packing, Eq. 1's fewest machines), then bigger ones,
        then a fixed order."""
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(self.cap > 0, 1 - self.free / np.where(self.cap > 0, self.cap, 1),
                             0.0)
        used = np.clip(share.max(axis=1) if share.size else np.zeros(len(self.mids)), 0, 1)
        return np.floor(500 * (1 - used)).astype(np.int64) + self._size + self._order

    def order(self, group_costs: Sequence[int], pack: Ints | None = None) -> Ints:
        """Machine indexes by preference: group cost, then packing cost."""
        p = self.pack() if pack is None else pack
        g = np.asarray(group_costs, dtype=np.int64)[self.group]
        return np.lexsort((np.arange(len(self.mids)), p, g)).astype(np.int64)

    def take(self, i: int, demand: Resources) -> None:
        self.free[i] -= self.vector(demand)

    def give(self, i: int, demand: Resources) -> None:
        self.free[i] += self.vector(demand)

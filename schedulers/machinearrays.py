"""The view's machines as arrays for one decision: capacity and free room per
dimension and whether each is up, kept up to date as the decision's own claims land
(so each step sees the room the steps before it left). The packing baselines
(``packing.py``), Medea (``medea.py``) and Aladdin+H's rounds
(``flow/aladdin/cellarrays.py``) share it."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from cellstate.model import MachineState, Resources
from schedulers.api import CellView

#: Most units of one demand counted as fitting one machine.
MAX_FIT = 100_000
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class MachineArrays:
    def __init__(self, view: CellView, demands: Iterable[Resources]) -> None:
        snap = view.snap
        self.mids = sorted(snap.machines)
        self.index = {mid: i for i, mid in enumerate(self.mids)}
        dims: set[str] = set()
        for m in snap.machines.values():
            dims.update(d for d, _ in m.capacity.amounts)
        for r in demands:
            dims.update(d for d, _ in r.amounts)
        self.dims = tuple(sorted(dims))
        # Demands as vectors, made once each (read-only: callers share them).
        self._vectors: dict[Resources, Floats] = {}
        n, k = len(self.mids), len(self.dims)
        self.cap = np.zeros((n, k))
        self.free = np.zeros((n, k))
        self.up = np.zeros(n, dtype=bool)
        self.capacities: list[Resources] = []
        for i, mid in enumerate(self.mids):
            m = snap.machines[mid]
            self.capacities.append(m.capacity)
            self.cap[i] = self.vector(m.capacity)
            used = view.used(mid)  # one per machine: not worth keeping as a vector
            self.free[i] = self.cap[i] - np.array([used.get(d) for d in self.dims])
            self.up[i] = m.state is MachineState.UP

    def vector(self, r: Resources) -> Floats:
        v = self._vectors.get(r)
        if v is None:
            v = self._vectors[r] = np.array([r.get(d) for d in self.dims])
            v.flags.writeable = False
        return v

    def fitting(self, need: Floats) -> Ints:
        """The machines (indexes) that are up and have room for ``need`` now."""
        ok = self.up & (self.free + 1e-9 >= need).all(axis=1)
        return np.flatnonzero(ok).astype(np.int64)

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

    def fits_one(self, i: int, need: Floats) -> bool:
        return bool(self.up[i] and (self.free[i] + 1e-9 >= need).all())

    def used_share(self) -> Floats:
        """Each machine's fullest dimension, as a share of its capacity (0 to 1)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(self.cap > 0, 1 - self.free / np.where(self.cap > 0, self.cap, 1),
                             0.0)
        if not share.size:
            return np.zeros(len(self.mids))
        return np.asarray(np.clip(share.max(axis=1), 0, 1), dtype=np.float64)

    def take(self, i: int, demand: Resources) -> None:
        self.free[i] -= self.vector(demand)

    def give(self, i: int, demand: Resources) -> None:
        self.free[i] += self.vector(demand)

"""Machine groups (Aladdin+H §3.2) and the preference cost of a task for each (§3.3).

**Features.** A machine (or a task) is described by its resource *characteristics*:
for every dimension other than cpu that the cell's machines have, the log2 of its
amount per cpu (for a cpu/mem cell: log2 of RAM per core, the paper's RAM-to-CPU
ratio). On a log scale twice and half a ratio are equally far apart, and the unit a
cell counts memory in (GiB, MB) only shifts every point alike. Each feature is taken
relative to the machines' median (so the unit drops out) and clamped to +-10, so that
a task without a dimension some machines have (no GPU) lies far from those machines
but still at a finite distance.

**Clustering.** K-means (Eq. 6) over the machines' features, each distinct capacity
one point weighted by how many machines have it (12,000 machines of 23 types are 23
points). It starts from a deterministic farthest-point seeding (the heaviest point,
then repeatedly the point with the largest weighted squared distance to the nearest
centre) and runs Lloyd's iterations until no point changes group, so the same cell
always gives the same groups. ``k`` is the cost model's ``groups`` option (the paper
found 4 best, Fig. 11b), at most the number of distinct points; ``groups = 0`` picks
the smallest k whose within-group error is at most ``ELBOW`` of one group's.

**Preference cost.** A task's distance to each group is the Euclidean distance of
its features to the group's centre (Eq. 7); ranked ascending, the group at rank x
costs 100^(x-1) (Eq. 8), in units of ``UNIT`` so that packing costs inside a group
(below one unit) never outweigh the group order. Ranks past ``MAX_RANK`` cost as
``MAX_RANK`` does, which keeps every cost within what the solvers take
(``network.MAX_COST``) for any k.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from cellstate.model import Machine, Resources

#: The log2 of a ratio is clamped to +-this.
CLAMP = 10.0
#: A preference rank step costs this much; packing costs stay below it.
UNIT = 1000
#: Ranks beyond this cost as this one does (100^4 * UNIT = 1e11 < MAX_COST).
MAX_RANK = 5
#: ``groups = 0``: the smallest k whose error is at most this share of k = 1's.
ELBOW = 0.1
#: Most groups ``groups = 0`` picks.
AUTO_MAX = 8

Floats = npt.NDArray[np.float64]


def feature_dims(machines: Iterable[Machine]) -> tuple[str, ...]:
    """The dimensions other than cpu that some machine has, sorted."""
    dims: set[str] = set()
    for m in machines:
        dims.update(d for d, _ in m.capacity.amounts)
    dims.discard("cpu")
    return tuple(sorted(dims))


def features(res: Resources, dims: Sequence[str], offset: Floats | None = None) -> Floats:
    """log2(amount per cpu) of each dimension in ``dims``, less ``offset`` (the
    machines' median), clamped (see the module docstring)."""
    out = _raw(res, dims)
    if offset is not None:
        out = out - offset
    return np.clip(out, -CLAMP, CLAMP)


def _raw(res: Resources, dims: Sequence[str]) -> Floats:
    cpu = res.get("cpu")
    out = np.empty(len(dims))
    for i, d in enumerate(dims):
        a = res.get(d)
        if cpu <= 0:
            out[i] = math.inf if a > 0 else 0.0
        elif a <= 0:
            out[i] = -math.inf
        else:
            out[i] = math.log2(a / cpu)
    return out


def _median_offset(caps: Sequence[Resources], counts: Sequence[int],
                   dims: Sequence[str]) -> Floats:
    raw = np.array([_raw(c, dims) for c in caps]).reshape(len(caps), len(dims))
    weights = np.asarray(counts)
    out = np.zeros(len(dims))
    for k in range(len(dims)):
        order = np.argsort(raw[:, k], kind="stable")
        cum = np.cumsum(weights[order])
        out[k] = raw[order[int(np.searchsorted(cum, cum[-1] / 2))], k]
    return np.where(np.isfinite(out), out, 0.0)


def kmeans(points: Floats, weights: Floats, k: int) -> tuple[Floats, npt.NDArray[np.int64],
                                                               float]:
    """Weighted K-means: (centres, the group of each point, the within-group error)."""
    n = len(points)
    k = max(1, min(k, n))
    centres = [points[int(np.argmax(weights))]]
    while len(centres) < k:
        d2 = _nearest(points, np.array(centres))[1]
        centres.append(points[int(np.argmax(weights * d2))])
    c = np.array(centres, dtype=np.float64)
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(100):
        new, _d = _nearest(points, c)
        if np.array_equal(new, labels):
            break
        labels = new
        for g in range(len(c)):
            mine = labels == g
            if mine.any():
                c[g] = np.average(points[mine], axis=0, weights=weights[mine])
    error = float((weights * _nearest(points, c)[1]).sum())
    return c, labels, error


def _nearest(points: Floats, centres: Floats) -> tuple[npt.NDArray[np.int64], Floats]:
    d2 = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
    return d2.argmin(axis=1).astype(np.int64), d2.min(axis=1)


@attrs.frozen
class MachineGroups:
    """The groups of a cell's machines: ``of`` maps a capacity to its group."""

    dims: tuple[str, ...]
    centres: Floats = attrs.field(eq=False)
    of: dict[Resources, int] = attrs.field(eq=False)
    error: float
    offset: Floats = attrs.field(eq=False)
    #: Groups of what machines have left (:func:`group_by_room`), by machine id; empty:
    #: machines are grouped by capacity (``of``).
    by_machine: Mapping[str, int] = attrs.field(eq=False, factory=dict)
    #: The clustering's weight (machines clustered): ``error / weight`` is the spread.
    weight: float = 0.0

    @property
    def k(self) -> int:
        return len(self.centres)

    def ranks(self, demand: Resources) -> list[int]:
        """The rank (1 = nearest, Eq. 7) of each group for a task needing ``demand``;
        ties go to the lower group number."""
        f = features(demand, self.dims, self.offset)
        dist = np.sqrt(((self.centres - f) ** 2).sum(axis=1))
        order = np.lexsort((np.arange(self.k), np.round(dist, 9)))
        ranks = [0] * self.k
        for r, g in enumerate(order.tolist()):
            ranks[g] = r + 1
        return ranks

    def costs(self, demand: Resources) -> list[int]:
        """Eq. 8's cost of each group for ``demand``: UNIT * 100^(rank-1)."""
        return [rank_cost(r) for r in self.ranks(demand)]


def rank_cost(rank: int) -> int:
    return int(UNIT * 100 ** (min(rank, MAX_RANK) - 1))


def group_machines(capacities: Iterable[Resources], k: int,
                   dims: Sequence[str] | None = None) -> MachineGroups:
    """Cluster machines by the features of their capacities (one point per distinct
    capacity, weighted by its count). ``k = 0``: choose k by the elbow rule."""
    counts: dict[Resources, int] = {}
    for cap in capacities:
        counts[cap] = counts.get(cap, 0) + 1
    if dims is None:
        names: set[str] = set()
        for cap in counts:
            names.update(d for d, _ in cap.amounts)
        names.discard("cpu")
        dims = tuple(sorted(names))
    caps = sorted(counts, key=lambda r: r.amounts)
    if not caps:
        return MachineGroups(tuple(dims), np.zeros((1, len(dims))), {}, 0.0,
                             np.zeros(len(dims)))
    offset = _median_offset(caps, [counts[c] for c in caps], dims)
    points = np.array([features(c, dims, offset) for c in caps]).reshape(len(caps),
                                                                         len(dims))
    weights = np.array([counts[c] for c in caps], dtype=np.float64)
    if k <= 0:
        k = choose_k(points, weights)
    centres, labels, error = kmeans(points, weights, k)
    centres, renumber = _numbered(centres, len(dims))
    return MachineGroups(tuple(dims), centres,
                         {c: renumber[int(g)] for c, g in zip(caps, labels, strict=True)},
                         error, offset, weight=float(weights.sum()))


def _numbered(centres: Floats, ndims: int) -> tuple[Floats, dict[int, int]]:
    """Number the groups by their centres (smallest ratio first), so that the numbering
    does not depend on the seeding."""
    order = np.lexsort(centres.T[::-1]) if ndims else np.arange(len(centres))
    return centres[order], {int(g): i for i, g in enumerate(order.tolist())}


#: Room features are rounded to this many decimals, so machines left alike are one
#: point of the clustering.
ROOM_DECIMALS = 3


def room_features(cpu: Floats, amounts: Floats) -> Floats:
    """log2(amount per cpu) of each column of ``amounts`` (machines by dimension),
    unclamped; rows with no cpu or none of a dimension come out infinite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log2(amounts / cpu[:, None]), dtype=np.float64)


def group_by_room(mids: Sequence[str], dims: Sequence[str], cpu_free: Floats,
                  room: Floats, cpu_cap: Floats, cap: Floats, k: int) -> MachineGroups:
    """Cluster machines by what they have left (§3.3: a placement changes a machine's
    characteristics, so its group follows): the features of each machine's free room
    (``cpu_free``, and ``room`` in ``dims``) instead of its capacity. Machines with no
    room left in some dimension have no ratio; they join the group nearest to their
    capacity's features (they take nothing until tasks leave them). ``k <= 0``: the
    elbow rule."""
    n = len(mids)
    ok = (cpu_free > 1e-9) & (room > 1e-9).all(axis=1) if n else np.zeros(0, dtype=bool)
    if not ok.any():
        ok = (cpu_cap > 1e-9) & (cap > 1e-9).all(axis=1)
        cpu_free, room = cpu_cap, cap
    raw = np.round(room_features(cpu_free[ok], room[ok]), ROOM_DECIMALS).reshape(
        int(ok.sum()), len(dims))
    if not len(raw):
        return MachineGroups(tuple(dims), np.zeros((1, len(dims))), {}, 0.0,
                             np.zeros(len(dims)), {mid: 0 for mid in mids}, 0.0)
    pts, inverse, counts = np.unique(raw, axis=0, return_inverse=True, return_counts=True)
    weights = counts.astype(np.float64)
    offset = np.zeros(len(dims))
    for c in range(len(dims)):
        order = np.argsort(pts[:, c], kind="stable")
        cum = np.cumsum(weights[order])
        offset[c] = pts[order[int(np.searchsorted(cum, cum[-1] / 2))], c]
    points = np.clip(pts - offset, -CLAMP, CLAMP)
    if k <= 0:
        k = choose_k(points, weights)
    centres, labels, error = kmeans(points, weights, k)
    centres, renumber = _numbered(centres, len(dims))
    groups = np.zeros(n, dtype=np.int64)
    groups[ok] = [renumber[int(g)] for g in labels[inverse.reshape(-1)]]
    rest = ~ok
    if rest.any():
        feats = np.clip(np.nan_to_num(room_features(cpu_cap[rest], cap[rest]), nan=0.0,
                                      posinf=CLAMP, neginf=-CLAMP) - offset, -CLAMP, CLAMP)
        groups[rest] = _nearest(feats.reshape(int(rest.sum()), len(dims)), centres)[0]
    return MachineGroups(tuple(dims), centres, {}, error, offset,
                         dict(zip(mids, groups.tolist(), strict=True)), float(weights.sum()))


def room_spread(groups: MachineGroups, mids: Sequence[str], cpu_free: Floats,
                room: Floats) -> float:
    """The mean squared distance of the machines with room left to the centre of their
    group, in the features of what they have left now: how far the groups have drifted
    from the cell since they were made (what :func:`group_by_room` minimizes)."""
    ok = (cpu_free > 1e-9) & (room > 1e-9).all(axis=1) if len(mids) else np.zeros(0, bool)
    if not ok.any():
        return 0.0
    feats = np.clip(np.round(room_features(cpu_free[ok], room[ok]), ROOM_DECIMALS)
                    - groups.offset, -CLAMP, CLAMP)
    g = np.array([groups.by_machine.get(mid, 0) for mid, keep in zip(mids, ok, strict=True)
                  if keep], dtype=np.int64)
    return float(((feats - groups.centres[g]) ** 2).sum(axis=1).mean())


def choose_k(points: Floats, weights: Floats) -> int:
    """The smallest k (up to AUTO_MAX) whose error is at most ELBOW of k = 1's."""
    base = kmeans(points, weights, 1)[2]
    for k in range(1, min(AUTO_MAX, len(points)) + 1):
        if kmeans(points, weights, k)[2] <= ELBOW * base + 1e-12:
            return k
    return min(AUTO_MAX, len(points))

"""The flow network: nodes with supplies, arcs with a lower bound, a capacity and a cost.

Stored as parallel numpy arrays with free lists, so that the graph manager can change
a few arcs per round in place and the solver gets the whole network as arrays without
a per-arc Python loop. Nodes and arcs are named by keys (tuples such as
``("M", "m17")``); slots are reused, so an index means nothing across changes, and
two networks are compared by :meth:`FlowNetwork.canonical`, which speaks only keys.

Every arc belongs to an *owner* (a job, a machine, a group of running tasks), and an
owner's arcs are replaced all at once (:meth:`set_arcs`): the graph manager never
edits one arc of an owner and leaves the others stale. Where only an owner's numbers
change (capacities, costs, lower bounds; not which nodes its arcs join), they may be
written in place for many arcs at once from arrays (:meth:`write`): the network keeps
only each owner's structure, so nothing it holds goes stale when numbers change.

Every change is stamped with a version number that rises with each change: a slot
with the version of the last change to the arc it holds (made, dropped, new numbers),
a node index with the version at which it was given to its key. A solver that keeps
state by slot and index from solve to solve (``FirmamentSolver``) reads the slots and
nodes newer than its last solve from them, and so its set-up costs what changed, not
the whole network.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

NodeKey = tuple[Hashable, ...]
Owner = tuple[Hashable, ...]

#: Costs and capacities stay far below what the solvers can take (OR-Tools reports
#: BAD_COST_RANGE near 2^52; LEMON's cost scaling goes wrong near 2^48).
MAX_COST = 2**40
MAX_CAPACITY = 2**40


class Arc(NamedTuple):
    """One arc as a cost model describes it (the graph manager adds the ends)."""

    tail: NodeKey
    head: NodeKey
    capacity: int
    cost: int
    lower: int = 0
    kind: int = 0  # the graph manager's arc kind, kept for extraction


class Arrays(NamedTuple):
    """The live network as the solver takes it: node indexes are dense up to
    ``nodes``; ``arcs`` maps each array position back to the network's arc slot."""

    nodes: int
    supply: npt.NDArray[np.int64]
    tail: npt.NDArray[np.int64]
    head: npt.NDArray[np.int64]
    lower: npt.NDArray[np.int64]
    capacity: npt.NDArray[np.int64]
    cost: npt.NDArray[np.int64]
    kind: npt.NDArray[np.int8]
    arcs: npt.NDArray[np.int64]
    #: With ``arcs`` the identity (every slot at its own index), the network's change
    #: stamps (module doc): per slot, the version of its last change; per node, the
    #: version at which its index was given to its key; the network's version now and
    #: the network itself (stamps of two networks do not compare). None: not given.
    arc_version: npt.NDArray[np.int64] | None = None
    node_born: npt.NDArray[np.int64] | None = None
    version: int = 0
    source: object = None


class NetworkError(ValueError):
    pass


class FlowNetwork:
    def __init__(self) -> None:
        self._node_index: dict[NodeKey, int] = {}
        self._node_keys: list[NodeKey | None] = []
        self._node_refs: list[int] = []  # arcs touching the node, plus 1 while it has supply
        self._free_nodes: list[int] = []
        self._supply = np.zeros(64, dtype=np.int64)
        self._born = np.zeros(64, dtype=np.int64)  # per node index: version given
        self._version = 0  # rises with every change (module doc)
        n = 256
        self._tail = np.zeros(n, dtype=np.int64)
        self._head = np.zeros(n, dtype=np.int64)
        self._lower = np.zeros(n, dtype=np.int64)
        self._cap = np.zeros(n, dtype=np.int64)
        self._cost = np.zeros(n, dtype=np.int64)
        self._kind = np.zeros(n, dtype=np.int8)
        self._live = np.zeros(n, dtype=bool)
        self._changed = np.zeros(n, dtype=np.int64)  # per slot: version of its last change
        self._free_arcs: list[int] = list(range(n - 1, -1, -1))
        self._top = 0  # one past the highest slot ever used (free slots go lowest first)
        self._arcs = 0  # live arcs
        self._slot_ids = np.zeros(0, dtype=np.int64)  # 0, 1, 2, ...: arrays(compact=False)
        self._owned: dict[Owner, list[int]] = {}
        # Per owner, the (tail, head, kind) of its arcs in order: what decides whether
        # new arcs can take the old ones' slots.
        self._structure: dict[Owner, tuple[tuple[NodeKey, NodeKey, int], ...]] = {}
        self._supplies: dict[NodeKey, int] = {}
        self.total_supply = 0  # sum of every supply

    # -- nodes ---------------------------------------------------------------------

    def _ref(self, key: NodeKey) -> int:
        i = self._node_index.get(key)
        if i is None:
            if self._free_nodes:
                i = self._free_nodes.pop()
                self._node_keys[i] = key
                self._node_refs[i] = 0
            else:
                i = len(self._node_keys)
                self._node_keys.append(key)
                self._node_refs.append(0)
                if i >= len(self._supply):
                    self._supply = np.concatenate([self._supply, np.zeros_like(self._supply)])
                    self._born = np.concatenate([self._born, np.zeros_like(self._born)])
            self._node_index[key] = i
            self._supply[i] = 0
            self._version += 1
            self._born[i] = self._version
        self._node_refs[i] += 1
        return i

    def _new_nodes(self, keys: Sequence[NodeKey], refs: list[int]) -> list[int]:
        """Indexes for ``keys``, none of them a node yet, each with ``refs`` references:
        the indexes and stamps :meth:`_ref` gives them one after another, in bulk."""
        k = len(keys)
        free = self._free_nodes
        r = min(k, len(free))
        got = free[len(free) - r:]
        got.reverse()  # _ref pops from the end
        del free[len(free) - r:]
        node_keys, node_refs = self._node_keys, self._node_refs
        for i, key, c in zip(got, keys[:r], refs[:r], strict=True):
            node_keys[i] = key
            node_refs[i] = c
        base = len(node_keys)
        got.extend(range(base, base + k - r))
        node_keys.extend(keys[r:])
        node_refs.extend(refs[r:])
        while len(self._supply) < len(node_keys):
            self._supply = np.concatenate([self._supply, np.zeros_like(self._supply)])
            self._born = np.concatenate([self._born, np.zeros_like(self._born)])
        at = np.array(got, dtype=np.int64)
        self._supply[at] = 0
        self._born[at] = np.arange(self._version + 1, self._version + k + 1, dtype=np.int64)
        self._version += k
        self._node_index.update(zip(keys, got, strict=True))
        return got

    def _unref(self, i: int) -> None:
        self._node_refs[i] -= 1
        if self._node_refs[i] == 0:
            key = self._node_keys[i]
            assert key is not None
            del self._node_index[key]
            self._node_keys[i] = None
            self._free_nodes.append(i)

    def set_supply(self, key: NodeKey, supply: int) -> None:
        """Units that enter the network at ``key`` (negative: leave it)."""
        old = self._supplies.get(key, 0)
        if supply == old:
            return
        self.total_supply += supply - old
        if old == 0:
            i = self._ref(key)
        else:
            i = self._node_index[key]
        self._supply[i] = supply
        if supply == 0:
            del self._supplies[key]
            self._unref(i)
        else:
            self._supplies[key] = supply

    def supply(self, key: NodeKey) -> int:
        return self._supplies.get(key, 0)

    def has_node(self, key: NodeKey) -> bool:
        return key in self._node_index

    def node_key(self, index: int) -> NodeKey:
        key = self._node_keys[index]
        if key is None:
            raise NetworkError(f"no node at index {index}")
        return key

    def node_index(self, key: NodeKey) -> int:
        return self._node_index[key]

    # -- arcs ------------------------------------------------------------------------

    def set_arcs(self, owner: Owner, arcs: Iterable[Arc]) -> list[int]:
        """Replace every arc of ``owner`` by ``arcs``; returns their slots, in order.
        Arcs joining the same nodes as the owner's present ones, in the same order and
        of the same kinds, keep their slots and take the new numbers."""
        wanted = tuple(arcs)
        for a in wanted:
            # The check of _check, inline: this runs for every arc of every task node.
            if not (0 <= a.lower <= a.capacity <= MAX_CAPACITY
                    and -MAX_COST <= a.cost <= MAX_COST):
                self._check(owner, a)
        structure = tuple([(a.tail, a.head, a.kind) for a in wanted])
        if self._structure_of(owner) == structure:
            owned = self._owned[owner]
            lower, cap, cost = self._lower, self._cap, self._cost
            for s, a in zip(owned, wanted, strict=True):
                lower[s], cap[s], cost[s] = a.lower, a.capacity, a.cost
            self._stamp(owned)
            return list(owned)
        self.drop(owner)
        if not wanted:
            return []
        free = self._free_arcs
        while len(free) < len(wanted):
            self._grow()
        slots = [free.pop() for _ in wanted]
        self._top = max(self._top, max(slots) + 1)
        self._arcs += len(slots)
        ref = self._ref
        tail, head, lower, cap, cost, kind, live = (
            self._tail, self._head, self._lower, self._cap, self._cost, self._kind, self._live)
        for s, a in zip(slots, wanted, strict=True):
            tail[s] = ref(a.tail)
            head[s] = ref(a.head)
            lower[s] = a.lower
            cap[s] = a.capacity
            cost[s] = a.cost
            kind[s] = a.kind
            live[s] = True
        self._stamp(slots)
        self._owned[owner] = slots
        self._structure[owner] = structure
        return slots

    def add_fans(self, owners: Sequence[Owner], start: npt.NDArray[np.int64],
                 heads: Sequence[NodeKey], head: npt.NDArray[np.int64],
                 capacity: npt.NDArray[np.int64], cost: npt.NDArray[np.int64],
                 kind: npt.NDArray[np.int8], supply: int = 0) -> None:
        """:meth:`set_arcs` for many owners that have no arcs yet, each owning arcs
        that leave the node of its own key (a round's new task nodes), from arrays:
        owner k's arcs are ``start[k]:start[k + 1]`` of the arc arrays, the head of
        arc a is ``heads[head[a]]``; lower bounds 0. Slots are taken as
        :meth:`set_arcs` takes them, owner after owner. ``supply``: each owner's node
        gets it (:meth:`set_supply`; it has none yet)."""
        ends = start.tolist()
        total = ends[-1] if ends else 0
        owned = self._owned
        if not owned.keys().isdisjoint(owners) or (
                supply and not self._supplies.keys().isdisjoint(owners)):
            dup = next(o for o in owners if o in owned or (supply and o in self._supplies))
            raise NetworkError(f"{dup} has arcs or a supply already")
        bad = np.flatnonzero((capacity < 0) | (capacity > MAX_CAPACITY)
                             | (cost < -MAX_COST) | (cost > MAX_COST))
        if len(bad):
            a = int(bad[0])
            k = int(np.searchsorted(start, a, side="right")) - 1
            self._check(owners[k], Arc(owners[k], heads[int(head[a])], int(capacity[a]),
                                       int(cost[a]), 0, int(kind[a])))
        if not total:
            for owner in owners:
                self.set_supply(owner, supply)
            return
        free, ref, refs = self._free_arcs, self._ref, self._node_refs
        while len(free) < total:
            self._grow()
        taken = free[len(free) - total:]
        taken.reverse()  # as many pops, one owner after another
        del free[len(free) - total:]
        nodes: list[int] = []
        bare: list[Owner] = []  # no arcs: its supply the slow way
        supplies = self._supplies
        counts_of = np.diff(start).tolist()
        if all(counts_of) and self._node_index.keys().isdisjoint(owners):
            # The usual case (a round's new task nodes, each with arcs, none a node
            # yet): their indexes given in bulk, as _ref would give them one by one.
            plus = 1 if supply else 0
            nodes = self._new_nodes(owners, [c + plus for c in counts_of])
            owned.update(zip(owners, [taken[a:b] for a, b in pairwise(ends)], strict=True))
            if supply:
                supplies.update(dict.fromkeys(owners, supply))
        else:
            for k, owner in enumerate(owners):
                a, b = ends[k], ends[k + 1]
                if a == b:
                    bare.append(owner)
                    nodes.append(-1)
                    continue
                t = ref(owner)
                refs[t] += b - a - 1
                nodes.append(t)
                owned[owner] = taken[a:b]
                # Its structure is read back from the arrays if it is ever set again.
                if supply:
                    refs[t] += 1
                    supplies[owner] = supply
        tails = np.repeat(np.array(nodes, dtype=np.int64), np.diff(start))
        if supply:
            with_arcs = [t for t in nodes if t >= 0]
            self._supply[with_arcs] = supply
            self.total_supply += supply * len(with_arcs)
            for owner in bare:
                self.set_supply(owner, supply)
        counts = np.bincount(head, minlength=len(heads)).tolist()
        # Heads are aggregators and machines that exist: a lookup, not _ref's call.
        index = list(map(self._node_index.get, heads))
        for k, (i, c) in enumerate(zip(index, counts, strict=True)):
            if i is None:
                if not c:
                    index[k] = 0
                    continue
                i = index[k] = ref(heads[k])
                c -= 1
            refs[i] += c
        at = np.array(taken, dtype=np.int64)
        self._top = max(self._top, int(at.max()) + 1)
        self._arcs += total
        self._tail[at] = tails
        self._head[at] = np.array(index, dtype=np.int64)[head]
        self._lower[at] = 0
        self._cap[at] = capacity
        self._cost[at] = cost
        self._kind[at] = kind
        self._live[at] = True
        self._stamp(at)

    def _structure_of(self, owner: Owner) -> tuple[tuple[NodeKey, NodeKey, int], ...] | None:
        st = self._structure.get(owner)
        if st is None:
            slots = self._owned.get(owner)
            if slots:
                keys, tail, head, kind = self._node_keys, self._tail, self._head, self._kind
                st = tuple([(keys[tail[s]], keys[head[s]], int(kind[s]))
                            for s in slots])
        return st

    def write(self, slots: npt.NDArray[np.int64], capacity: npt.NDArray[np.int64],
              cost: npt.NDArray[np.int64], lower: npt.NDArray[np.int64] | None = None
              ) -> None:
        """New numbers for many live arcs at once (their ends and kinds stay): the
        graph manager's update of many machines in one go. ``lower`` None: 0."""
        if not len(slots):
            return
        if not self._live[slots].all():
            dead = int(slots[np.flatnonzero(~self._live[slots])[0]])
            raise NetworkError(f"no arc at slot {dead}")
        low = np.zeros_like(capacity) if lower is None else lower
        bad = np.flatnonzero((low < 0) | (low > capacity) | (capacity > MAX_CAPACITY)
                             | (cost < -MAX_COST) | (cost > MAX_COST))
        if len(bad):
            i = int(bad[0])
            a = self.arc(int(slots[i]))
            self._check(("slot", int(slots[i])), a._replace(
                capacity=int(capacity[i]), cost=int(cost[i]), lower=int(low[i])))
        self._cap[slots] = capacity
        self._cost[slots] = cost
        self._lower[slots] = low
        self._stamp(slots)

    def write_costs(self, slots: npt.NDArray[np.int64], cost: npt.NDArray[np.int64]) -> None:
        """New costs for many live arcs at once (all else stays): costs that move with
        time alone, such as a running task's continuation discount."""
        if not len(slots):
            return
        # Reductions first (a round writes 135,000 continuation costs): the position
        # of the first bad one is looked for only when there is one.
        if cost.min() < -MAX_COST or cost.max() > MAX_COST or not self._live[slots].all():
            bad = np.flatnonzero((cost < -MAX_COST) | (cost > MAX_COST) | ~self._live[slots])
            i = int(bad[0])
            raise NetworkError(f"arc at slot {int(slots[i])}: no live arc, or its cost "
                               f"{int(cost[i])} is outside +-{MAX_COST}")
        self._cost[slots] = cost
        self._stamp(slots)

    def costs(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The costs of the arcs at ``slots`` (a copy)."""
        return self._cost[slots]

    @staticmethod
    def _check(owner: Owner, a: Arc) -> None:
        if not 0 <= a.lower <= a.capacity <= MAX_CAPACITY:
            raise NetworkError(f"arc {a.tail}->{a.head} of {owner}: need 0 <= lower "
                               f"({a.lower}) <= capacity ({a.capacity}) <= {MAX_CAPACITY}")
        if not -MAX_COST <= a.cost <= MAX_COST:
            raise NetworkError(f"arc {a.tail}->{a.head} of {owner}: cost {a.cost} is "
                               f"outside +-{MAX_COST}")

    def drop(self, owner: Owner) -> None:
        self._structure.pop(owner, None)
        owned = self._owned.pop(owner, [])  # a list: () would index every slot
        self._stamp(owned)
        for s in owned:
            self._live[s] = False
            # A dead slot carries nothing (arrays(compact=False) hands it on).
            self._cap[s] = self._lower[s] = 0
            self._arcs -= 1
            self._unref(int(self._tail[s]))
            self._unref(int(self._head[s]))
            self._free_arcs.append(s)

    def slots_of(self, owner: Owner) -> Sequence[int] | None:
        """The slots of ``owner``'s arcs (not a copy: read, do not keep)."""
        return self._owned.get(owner)

    def arcs_of(self, owner: Owner) -> list[int]:
        return list(self._owned.get(owner, ()))

    def owners(self) -> list[Owner]:
        return list(self._owned)

    def arc(self, slot: int) -> Arc:
        return Arc(self.node_key(int(self._tail[slot])), self.node_key(int(self._head[slot])),
                   int(self._cap[slot]), int(self._cost[slot]), int(self._lower[slot]),
                   int(self._kind[slot]))

    def set_cost(self, owner: Owner, position: int, cost: int) -> None:
        """Change the cost of ``owner``'s arc at ``position`` (in the order given to
        :meth:`set_arcs`) in place: for costs that move with time alone."""
        slots = self._owned.get(owner)
        if slots is None or not 0 <= position < len(slots):
            raise NetworkError(f"{owner} has no arc at position {position}")
        if not -MAX_COST <= cost <= MAX_COST:
            raise NetworkError(f"cost {cost} is outside +-{MAX_COST}")
        self._cost[slots[position]] = cost
        self._stamp(slots[position])

    def _stamp(self, slots: Sequence[int] | npt.NDArray[np.int64] | int) -> None:
        """One change to the arcs at ``slots``: its version on each (module doc)."""
        self._version += 1
        self._changed[slots] = self._version

    def _grow(self) -> None:
        n = len(self._tail)
        for name in ("_tail", "_head", "_lower", "_cap", "_cost", "_kind", "_live",
                     "_changed"):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        self._free_arcs.extend(range(2 * n - 1, n - 1, -1))

    # -- whole network -------------------------------------------------------------------

    @property
    def arc_count(self) -> int:
        return self._arcs

    @property
    def node_count(self) -> int:
        return len(self._node_index)

    def arrays(self, compact: bool = True) -> Arrays:
        """The live arcs that can carry flow (an arc of capacity 0 cannot). ``compact``
        False: every slot up to the highest used, each at its own position, dead ones
        and those of capacity 0 included (they carry nothing): no gathering pass over
        the arcs, and a solver that keeps state per slot finds it at the same place
        (``Solver.slot_arrays``)."""
        n = len(self._node_keys)
        if not compact:
            # Views, not copies (a copy of a million arcs costs more than the warm
            # solve): valid until the network next changes.
            top = self._top
            return Arrays(n, self._supply[:n].copy(), self._tail[:top], self._head[:top],
                          self._lower[:top], self._cap[:top], self._cost[:top],
                          self._kind[:top], self._identity(top), self._changed[:top],
                          self._born[:n], self._version, self)
        slots = np.flatnonzero(self._live & (self._cap > 0))
        return Arrays(n, self._supply[:n].copy(), self._tail[slots], self._head[slots],
                      self._lower[slots], self._cap[slots], self._cost[slots],
                      self._kind[slots], slots)

    def _identity(self, top: int) -> npt.NDArray[np.int64]:
        if len(self._slot_ids) < top:
            self._slot_ids = np.arange(len(self._tail), dtype=np.int64)
        return self._slot_ids[:top]

    def canonical(self) -> tuple[list[tuple[str, int]],
                                 list[tuple[str, str, int, int, int, int]]]:
        """The network as sorted keys and numbers, independent of slot order: two
        networks are the same network exactly when these are equal. Arcs of capacity
        0 carry nothing and are left out."""
        supplies = sorted((repr(k), v) for k, v in self._supplies.items())
        arcs = sorted(
            (repr(a.tail), repr(a.head), a.capacity, a.cost, a.lower, a.kind)
            for slots in self._owned.values() for a in map(self.arc, slots)
            if a.capacity > 0)
        return supplies, arcs

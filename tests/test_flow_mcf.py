"""The Firmament solver (schedulers/flow/mcf) against OR-Tools from scratch: random
networks changed round after round and solved warm by every algorithm, and hand-made
cases (infeasible, stale state, a FlowNetwork with reused slots)."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedulers.flow.mcf import ALGORITHMS, FirmamentSolver
from schedulers.flow.network import Arc, Arrays, FlowNetwork
from schedulers.flow.solvers import NetworkxSolver, OrToolsSolver, Solution, SolveError

I64 = npt.NDArray[np.int64]


def check_flow(net: Arrays, sol: Solution) -> None:
    """Bounds, balance at every node, and the cost the flow really has."""
    f = sol.flow
    assert f.shape == net.tail.shape
    assert (f >= net.lower).all() and (f <= net.capacity).all()
    bal = net.supply[:net.nodes].copy()
    np.subtract.at(bal, net.tail, f)
    np.add.at(bal, net.head, f)
    assert not bal.any(), f"unbalanced nodes {np.flatnonzero(bal)}"
    assert sol.cost == sum(int(a) * int(b) for a, b in zip(f, net.cost, strict=True))


class RandomNet:
    """A small network with slots reused as FlowNetwork reuses them: every source
    has an expensive arc to a sink so that it stays feasible whatever else changes."""

    def __init__(self, rng: np.random.Generator, nodes: int) -> None:
        self.rng = rng
        self.n = nodes
        self.supply = np.zeros(nodes, dtype=np.int64)
        self.arcs: dict[int, list[int]] = {}  # slot: [tail, head, lower, cap, cost]
        self.free: list[int] = []
        self.top = 0
        self.sinks = [nodes - 1, nodes - 2]
        for _ in range(3 * nodes):
            self.add_random()
        for v in range(nodes - 2):
            self.add(v, self.sinks[v % 2], 0, 50, 10_000)
        self.new_supplies()

    def add(self, t: int, h: int, low: int, cap: int, cost: int) -> None:
        slot = self.free.pop() if self.free else self.top
        self.top = max(self.top, slot + 1)
        self.arcs[slot] = [t, h, low, cap, cost]

    def add_random(self) -> None:
        r = self.rng
        cap = int(r.integers(0, 8))  # 0: left out of Arrays, as FlowNetwork does
        low = int(r.integers(0, 2)) if cap and r.random() < 0.15 else 0
        t, h = (int(v) for v in r.integers(0, self.n - 2, 2))
        self.add(t, h, low, cap, int(r.integers(-30, 60)))

    def new_supplies(self) -> None:
        self.supply[:] = 0
        for v in range(self.n - 2):
            self.supply[v] = int(self.rng.integers(0, 4))
        total = int(self.supply.sum())
        self.supply[self.sinks[0]] = -(total // 2)
        self.supply[self.sinks[1]] = -(total - total // 2)

    def change(self) -> None:
        r = self.rng
        kind = int(r.integers(0, 5))
        slots = [s for s, a in self.arcs.items() if a[4] != 10_000]
        if kind == 0 and slots:  # remove some arcs; their slots go to new arcs
            for s in r.choice(slots, size=min(len(slots), 3), replace=False):
                del self.arcs[int(s)]
                self.free.append(int(s))
            for _ in range(int(r.integers(0, 4))):
                self.add_random()
        elif kind == 1 and slots:  # costs change in place
            for s in r.choice(slots, size=min(len(slots), 4), replace=False):
                self.arcs[int(s)][4] = int(r.integers(-30, 60))
        elif kind == 2 and slots:  # capacities and lower bounds change in place
            for s in r.choice(slots, size=min(len(slots), 4), replace=False):
                a = self.arcs[int(s)]
                a[3] = int(r.integers(0, 8))
                a[2] = min(a[2], a[3])
        elif kind == 3:
            self.new_supplies()
        else:
            for _ in range(3):
                self.add_random()

    def arrays(self, every_slot: bool = False) -> Arrays:
        """The arcs that can carry flow; ``every_slot``: every slot up to the highest
        at its own index, free and capacity-0 ones included, as
        ``FlowNetwork.arrays(compact=False)`` gives them."""
        if every_slot:
            rows = np.array([self.arcs.get(s, [0, 0, 0, 0, 0]) for s in range(self.top)],
                            dtype=np.int64).reshape(-1, 5)
            return Arrays(self.n, self.supply.copy(), rows[:, 0].copy(), rows[:, 1].copy(),
                          rows[:, 2].copy(), rows[:, 3].copy(), rows[:, 4].copy(),
                          np.zeros(self.top, dtype=np.int8),
                          np.arange(self.top, dtype=np.int64))
        slots = np.array(sorted(s for s, a in self.arcs.items() if a[3] > 0), dtype=np.int64)
        rows = np.array([self.arcs[int(s)] for s in slots], dtype=np.int64).reshape(-1, 5)
        return Arrays(self.n, self.supply.copy(), rows[:, 0].copy(), rows[:, 1].copy(),
                      rows[:, 2].copy(), rows[:, 3].copy(), rows[:, 4].copy(),
                      np.zeros(len(slots), dtype=np.int8), slots)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), nodes=st.integers(4, 14), rounds=st.integers(1, 8))
def test_warm_solves_match_ortools(seed: int, nodes: int, rounds: int) -> None:
    rng = np.random.default_rng(seed)
    net = RandomNet(rng, nodes)
    solvers = {a: FirmamentSolver(a) for a in ALGORITHMS}
    for _ in range(rounds + 1):
        arrays = net.arrays()
        try:
            want = OrToolsSolver().solve(arrays).cost
        except SolveError:  # a lower bound nothing can carry away: ours must say so
            for s in solvers.values():
                with pytest.raises(SolveError):
                    s.solve(arrays)
            net.change()
            continue
        for a, s in solvers.items():
            got = s.solve(arrays)
            check_flow(arrays, got)
            assert got.cost == want, (a, s.last)
        net.change()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), nodes=st.integers(4, 14), rounds=st.integers(2, 8))
def test_a_star_built_from_the_last_one_lists_every_half_arc_once(
        seed: int, nodes: int, rounds: int) -> None:
    """Given every slot at its own index, a warm solve builds its forward star from
    the previous round's: each node lists exactly its half-arcs, out-arcs first, and
    the answer is still optimal."""
    rng = np.random.default_rng(seed)
    net = RandomNet(rng, nodes)
    solver = FirmamentSolver("auto")
    solved = False  # the previous round was solved: its star is kept
    for r in range(rounds):
        arrays = net.arrays(every_slot=True)
        try:
            want = OrToolsSolver().solve(net.arrays()).cost
        except SolveError:
            with pytest.raises(SolveError):
                solver.solve(arrays)
            net.change()
            solved = False
            continue
        got = solver.solve(arrays)
        check_flow(arrays, got)
        assert got.cost == want
        assert solver.last is not None and solver.last.kept_star == solved
        solved = True
        star = solver._star
        assert star is not None
        n, m = arrays.nodes, len(arrays.tail)
        want_lists = forward_star(n, arrays.tail, arrays.head)
        for v in range(n):
            listed = star.adj[star.start[v]:star.start[v + 1]].tolist()
            assert sorted(listed) == sorted(want_lists[v]), (r, v)
            odd = [h & 1 for h in listed]
            assert odd == sorted(odd), (r, v)  # out-arcs (even) before in-arcs
        assert star.m == m
        net.change()


def test_algorithms_agree_on_a_big_random_network() -> None:
    rng = np.random.default_rng(7)
    net = RandomNet(rng, 300)
    solvers = {a: FirmamentSolver(a) for a in ALGORITHMS}
    for _ in range(6):
        arrays = net.arrays()
        try:
            want = OrToolsSolver().solve(arrays).cost
        except SolveError:
            net.change()
            continue
        for s in solvers.values():
            got = s.solve(arrays)
            check_flow(arrays, got)
            assert got.cost == want
        for _ in range(10):
            net.change()


def arrays_of(n: int, supply: list[int], arcs: list[tuple[int, int, int, int, int]]) -> Arrays:
    a = np.array(arcs, dtype=np.int64).reshape(-1, 5)
    return Arrays(n, np.array(supply, dtype=np.int64), a[:, 0].copy(), a[:, 1].copy(),
                  a[:, 2].copy(), a[:, 3].copy(), a[:, 4].copy(),
                  np.zeros(len(a), dtype=np.int8), np.arange(len(a), dtype=np.int64))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_infeasible_network_raises(algorithm: Any) -> None:
    # 5 units at node 0, but only 3 can reach the sink.
    net = arrays_of(3, [5, 0, -5], [(0, 1, 0, 3, 1), (1, 2, 0, 9, 1)])
    with pytest.raises(SolveError, match="infeasible"):
        FirmamentSolver(algorithm).solve(net)
    # A lower bound that cannot be carried away.
    net = arrays_of(3, [0, 0, 0], [(0, 1, 2, 3, 1), (1, 2, 0, 1, 1)])
    with pytest.raises(SolveError):
        FirmamentSolver(algorithm).solve(net)


def test_supplies_must_sum_to_zero() -> None:
    with pytest.raises(SolveError, match="sum"):
        FirmamentSolver().solve(arrays_of(2, [1, 0], [(0, 1, 0, 1, 1)]))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_stale_state_from_another_network_still_gives_the_optimum(algorithm: Any) -> None:
    s = FirmamentSolver(algorithm)
    rng = np.random.default_rng(3)
    other = RandomNet(rng, 40).arrays()
    s.solve(other)
    # Scramble the kept prices and flows as badly as possible.
    assert s._pi is not None
    s._pi[:] = rng.integers(-10**6, 10**6, len(s._pi))
    s._flow_of[:] = rng.integers(0, 100, len(s._flow_of))
    net = RandomNet(np.random.default_rng(4), 40).arrays()
    got = s.solve(net)
    check_flow(net, got)
    assert got.cost == OrToolsSolver().solve(net).cost
    assert s.last is not None and s.last.warm


def test_returning_the_previous_flow_would_be_caught() -> None:
    """The checks above are not vacuous: a round's change makes last round's flow
    wrong (unbalanced), and a cheaper arc makes it more expensive than the optimum."""
    net = arrays_of(3, [2, 0, -2], [(0, 2, 0, 5, 10), (0, 1, 0, 5, 1), (1, 2, 0, 5, 1)])
    first = FirmamentSolver().solve(net)
    changed = arrays_of(3, [3, 0, -3], [(0, 2, 0, 5, 1), (0, 1, 0, 5, 1), (1, 2, 0, 5, 1)])
    with pytest.raises(AssertionError):
        check_flow(changed, first)
    s = FirmamentSolver()
    s.solve(net)
    cheaper = arrays_of(3, [2, 0, -2], [(0, 2, 0, 5, 1), (0, 1, 0, 5, 1), (1, 2, 0, 5, 1)])
    got = s.solve(cheaper)
    assert got.cost == 2 and first.cost == 4 and not np.array_equal(got.flow, first.flow)


def test_huge_costs_refused_by_cost_scaling_but_solved_by_auto() -> None:
    n = 40_000
    net = arrays_of(n, [1] + [0] * (n - 2) + [-1], [(0, n - 1, 0, 1, 2**40)])
    with pytest.raises(SolveError, match="overflow"):
        FirmamentSolver("cost-scaling").solve(net)
    assert FirmamentSolver("auto").solve(net).cost == 2**40


def test_flow_network_resolved_warm_after_changes() -> None:
    fn = FlowNetwork()
    sink = ("S",)
    machines = [("M", i) for i in range(4)]
    for i, m in enumerate(machines):
        fn.set_arcs(("machine", i), [Arc(m, sink, 2, 0)])
    def add_task(t: int, prefs: list[int], wait: int) -> None:
        fn.set_supply(("T", t), 1)
        arcs = [Arc(("T", t), ("U",), 1, wait)]
        arcs += [Arc(("T", t), machines[p], 1, 10 * (k + 1)) for k, p in enumerate(prefs)]
        fn.set_arcs(("task", t), arcs)
    fn.set_arcs(("U",), [Arc(("U",), sink, 100, 0)])
    for t in range(8):
        add_task(t, [t % 4, (t + 1) % 4], 50)
    total = 8
    fn.set_supply(sink, -total)
    solvers = {a: FirmamentSolver(a) for a in ALGORITHMS}
    oracle = NetworkxSolver()

    def solve_all() -> None:
        net = fn.arrays()
        want = oracle.solve(net).cost
        for s in solvers.values():
            got = s.solve(net)
            check_flow(net, got)
            assert got.cost == want

    solve_all()
    for rnd in range(5):
        for t in (rnd, rnd + 3):  # tasks end: their slots and node indexes are freed
            if fn.has_node(("T", t)):
                fn.drop(("task", t))
                fn.set_supply(("T", t), 0)
                total -= 1
        for t in range(100 + 3 * rnd, 103 + 3 * rnd):  # new tasks take them
            add_task(t, [t % 4, (t + 2) % 4], 30 + rnd)
            total += 1
        fn.set_supply(sink, -total)
        # A machine's capacity and cost change in place (same slot).
        fn.set_arcs(("machine", rnd % 4), [Arc(machines[rnd % 4], sink, 1 + rnd % 3, rnd)])
        solve_all()
    assert all(s.last is not None and s.last.warm and s.last.reused_arcs > 0
               for s in solvers.values())


def test_cold_when_warm_disabled_and_after_reset() -> None:
    net = RandomNet(np.random.default_rng(11), 30).arrays()
    s = FirmamentSolver(warm=False)
    s.solve(net)
    s.solve(net)
    assert s.last is not None and not s.last.warm
    w = FirmamentSolver()
    w.solve(net)
    w.solve(net)
    assert w.last is not None and w.last.warm and w.last.repaired == 0
    w.reset()
    w.solve(net)
    assert w.last is not None and not w.last.warm


# -- the kernels the warm solve is made of ----------------------------------------------


def forward_star(n: int, tail: I64, head: I64) -> list[list[int]]:
    """Each node's half-arcs as the kernels list them: out-arcs (2a) in arc order,
    then in-arcs (2a + 1) in arc order."""
    lists: list[list[int]] = [[] for _ in range(n)]
    for a, t in enumerate(tail.tolist()):
        lists[t].append(2 * a)
    for a, h in enumerate(head.tolist()):
        lists[h].append(2 * a + 1)
    return lists


def _star(n: int, tail: I64, head: I64) -> tuple[I64, I64]:
    """``forward_star`` as the kernels' ``start`` and ``adj`` arrays."""
    start, adj = np.zeros(n + 1, dtype=np.int64), np.zeros(2 * len(tail), dtype=np.int64)
    for v, lst in enumerate(forward_star(n, tail, head)):
        start[v + 1] = start[v] + len(lst)
        adj[start[v]:start[v + 1]] = lst
    return start, adj

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), nodes=st.integers(4, 14), warm=st.booleans())
def test_prepare_builds_the_start_the_solvers_expect(seed: int, nodes: int, warm: bool) -> None:
    """The fused set-up: excesses match the flow, reused arcs keep their clipped old
    flow, the forward star is the plain one, and the repaired start is reduced-cost
    optimal under the prices it returns."""
    from schedulers.flow.mcf import kernels as K

    rng = np.random.default_rng(seed)
    net = RandomNet(rng, nodes)
    old = net.arrays()
    net.change()
    new = net.arrays()
    n, m = new.nodes, len(new.tail)
    size = int(max(old.arcs.max(), new.arcs.max())) + 1
    ends = np.full(size, -1, dtype=np.int64)
    flows = np.zeros(size, dtype=np.int64)
    ends[old.arcs] = (old.tail << 31) | old.head
    flows[old.arcs] = rng.integers(0, 9, len(old.arcs))
    pi = rng.integers(-50, 50, n).astype(np.int64)
    x, cap, e = (np.empty(k, dtype=np.int64) for k in (m, m, n))
    start, adj = np.empty(n + 1, dtype=np.int64), np.empty(2 * m, dtype=np.int32)
    de, fpos, bpos, best = (np.empty(n, dtype=np.int64) for _ in range(4))
    bad, reused, _, _, cmax, smax, _ = K.prepare(
        n, new.supply, new.tail, new.head, new.lower, new.capacity, new.cost, new.arcs,
        ends, flows, n, warm, True, True, pi, x, cap, e, start, adj,
        np.empty(n, dtype=np.bool_), de, fpos, bpos, best, np.empty(m, dtype=np.int64),
        False, 0, 0, start[:0], adj[:0], np.empty(m, dtype=np.bool_),
        np.empty(m, dtype=np.int64))
    assert bad == -1 and cmax == int(np.abs(new.cost).max()) and smax == int(new.arcs.max())
    assert (cap == new.capacity - new.lower).all() and (x >= 0).all() and (x <= cap).all()
    flow = x + new.lower
    bal = new.supply[:n].copy()
    np.subtract.at(bal, new.tail, flow)
    np.add.at(bal, new.head, flow)
    assert (bal == e).all()
    rc = new.cost - pi[new.tail] + pi[new.head]
    assert (x[rc < 0] == cap[rc < 0]).all() and (x[rc > 0] == 0).all()
    same = ends[new.arcs] == (new.tail << 31) | new.head
    assert reused == (int(same.sum()) if warm else 0)
    keep = same & (rc == 0) if warm else np.zeros(m, dtype=bool)
    clipped = np.clip(flows[new.arcs], new.lower, new.capacity) - new.lower
    assert (x[keep] == clipped[keep]).all()
    want = forward_star(n, new.tail, new.head)
    assert [adj[start[v]:start[v + 1]].tolist() for v in range(n)] == want


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), nodes=st.integers(4, 14), eps=st.integers(1, 40))
def test_global_update_keeps_eps_optimality_and_opens_a_path(seed: int, nodes: int,
                                                             eps: int) -> None:
    """After a global price update an ε-optimal pseudoflow stays ε-optimal and every
    excess has a path of admissible half-arcs (reduced cost < 0) to a deficit."""
    from schedulers.flow.mcf import kernels as K

    rng = np.random.default_rng(seed)
    net = RandomNet(rng, nodes).arrays()
    n, m = net.nodes, len(net.tail)
    tail, head, cost = net.tail, net.head, net.cost
    cap = net.capacity - net.lower
    p = rng.integers(-200, 200, n).astype(np.int64)
    x = rng.integers(0, cap + 1).astype(np.int64)
    e = net.supply[:n].copy()
    np.subtract.at(e, tail, net.lower)
    np.add.at(e, head, net.lower)
    K.make_optimal(tail, head, cap, cost, x, e, p)  # 0-optimal, so ε-optimal
    # e as the kernels keep it: the make_optimal moves plus the flow x itself.
    e = net.supply[:n].copy()
    np.subtract.at(e, tail, x + net.lower)
    np.add.at(e, head, x + net.lower)
    start, adj = _star(n, tail, head)
    dist, state = (np.empty(n, dtype=np.int64) for _ in range(2))
    width = int(rng.integers(1, n + 2))  # Dijkstra's window of buckets
    entries = int(rng.integers(n + 1, 3 * n + 2))  # few: buckets rebuilt when out
    ops = K.global_update(n, start, adj, tail, head, cap, cost, x, e, p, 1, eps, 2**60,
                          dist, state, np.empty(width, dtype=np.int64), entries)
    if ops < 0:  # an excess with no residual path to a deficit: OR-Tools agrees
        with pytest.raises(SolveError):
            OrToolsSolver().solve(net)
        return
    rc = cost - p[tail] + p[head]
    assert (rc[x < cap] >= -eps).all() and (rc[x > 0] <= eps).all()
    if not (e > 0).any():
        return
    # Admissible half-arcs, searched backwards from the deficits.
    reach = e < 0
    changed = True
    while changed:
        changed = False
        for a in range(m):
            t, h = int(tail[a]), int(head[a])
            if x[a] < cap[a] and rc[a] < 0 and reach[h] and not reach[t]:
                reach[t] = changed = True
            if x[a] > 0 and rc[a] > 0 and reach[t] and not reach[h]:
                reach[h] = changed = True
    assert reach[e > 0].all()


class FullCell:
    """A small Quincy cell with more tasks than slots: each task may wait (its job's
    unscheduled aggregator), go through X to any machine, or to a preferred one;
    running tasks keep a continuation arc to their machine. Tasks end and arrive
    round after round, slots and node indexes reused as FlowNetwork reuses them."""

    def __init__(self, rng: np.random.Generator, machines: int, slots: int,
                 x_cost: int = 25) -> None:
        self.rng = rng
        self.machines, self.slots = machines, slots
        self.x_cost = x_cost
        self.sink, self.x, self.u = 0, 1, 2  # one unscheduled aggregator
        self.first = 3 + machines  # task nodes from here
        self.tasks: dict[int, tuple[int, int, int]] = {}  # node: (wait, pref, machine)
        self.free_nodes: list[int] = []
        self.top = self.first

    def arrive(self, count: int) -> None:
        for _ in range(count):
            v = self.free_nodes.pop() if self.free_nodes else self.top
            self.top = max(self.top, v + 1)
            pref = int(self.rng.integers(0, self.machines))
            self.tasks[v] = (int(self.rng.integers(20, 60)), pref, -1)

    def advance(self, flow: npt.NDArray[np.int64], net: Arrays) -> None:
        """Placements become running tasks; a few end; waiting tasks wait longer."""
        placed = {int(t): int(h) - 3 for t, h, f in zip(net.tail, net.head, flow, strict=True)
                  if f and t >= self.first and 3 <= h < self.first}
        via_x = [int(t) for t, h, f in zip(net.tail, net.head, flow, strict=True)
                 if f and t >= self.first and h == self.x]
        into = [int(t) - 3 for t, h, f in zip(net.tail, net.head, flow, strict=True)
                for _ in range(int(f)) if t == self.x and 3 <= h < self.first]
        placed.update(zip(via_x, into, strict=False))
        for v, (wait, pref, _) in list(self.tasks.items()):
            self.tasks[v] = (wait + 5, pref, placed.get(v, -1))
        for v in list(self.tasks):
            if self.rng.random() < 0.1:
                del self.tasks[v]
                self.free_nodes.append(v)

    def arrays(self) -> Arrays:
        n = self.top
        supply = np.zeros(n, dtype=np.int64)
        arcs: list[tuple[int, int, int, int]] = [(self.u, self.sink, len(self.tasks), 0)]
        arcs.append((self.x, self.sink, 0, 0))  # capacity 0: left out below
        for i in range(self.machines):
            arcs.append((self.x, 3 + i, self.slots, 10))
            arcs.append((3 + i, self.sink, self.slots, 0))
        for v, (wait, pref, machine) in sorted(self.tasks.items()):
            supply[v] = 1
            arcs.append((v, self.u, 1, wait))
            arcs.append((v, self.x, 1, self.x_cost))
            arcs.append((v, 3 + pref, 1, 5))
            if machine >= 0:
                arcs.append((v, 3 + machine, 1, 0))
        supply[self.sink] = -len(self.tasks)
        rows = np.array([a for a in arcs if a[2] > 0], dtype=np.int64)
        slots = np.arange(len(rows), dtype=np.int64)
        return Arrays(n, supply, rows[:, 0].copy(), rows[:, 1].copy(),
                      np.zeros(len(rows), dtype=np.int64), rows[:, 2].copy(),
                      rows[:, 3].copy(), np.zeros(len(rows), dtype=np.int8), slots)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_full_cell_resolved_warm_matches_ortools_and_is_deterministic(seed: int) -> None:
    """More tasks than slots (Fig. 8): new tasks must wait or push running ones out.
    Every algorithm, warm round after round, matches OR-Tools; two "auto" solvers fed
    the same rounds return the same flows by the same path."""
    cell = FullCell(np.random.default_rng(seed), machines=12, slots=4)
    cell.arrive(60)
    solvers = {a: FirmamentSolver(a) for a in ALGORITHMS}
    twin = FirmamentSolver("auto")
    paths = []
    for _ in range(6):
        net = cell.arrays()
        want = OrToolsSolver().solve(net)
        out = {}
        for a, s in solvers.items():
            out[a] = got = s.solve(net)
            check_flow(net, got)
            assert got.cost == want.cost, (a, s.last)
        again = twin.solve(net)
        first, second = solvers["auto"].last, twin.last
        assert first is not None and second is not None
        assert np.array_equal(again.flow, out["auto"].flow)
        assert attrs.evolve(first, seconds=0.0, relax_cpu=0.0, cost_scaling_cpu=0.0) == \
            attrs.evolve(second, seconds=0.0, relax_cpu=0.0, cost_scaling_cpu=0.0)
        paths.append(second.fallback)
        cell.advance(want.flow, net)
        cell.arrive(15)
    assert all(s.last is not None and s.last.warm for s in solvers.values())
    assert any(paths), "relaxation never handed over: the case is not exercised"


def test_auto_hands_a_warm_round_over_past_its_warm_budget() -> None:
    """``warm_budget`` bounds relaxation on warm starts only: with none, every warm
    round with work is finished by cost scaling (same optimum), while the cold round
    keeps ``relax_budget``."""
    cell = FullCell(np.random.default_rng(4), machines=12, slots=4)
    cell.arrive(30)
    stingy = FirmamentSolver("auto", warm_budget=0.0, reverse_budget=0.0)
    handed = []
    for r in range(3):
        net = cell.arrays()
        want = OrToolsSolver().solve(net)
        got = stingy.solve(net)
        check_flow(net, got)
        assert got.cost == want.cost
        assert stingy.last is not None
        assert stingy.last.fallback == (r > 0 and stingy.last.repaired > 0), stingy.last
        handed.append(stingy.last.fallback)
        cell.advance(want.flow, net)
        cell.arrive(15)
    assert handed == [False, True, True]


@pytest.mark.parametrize(("seed", "x_cost"), [(5, 25), (6, 25), (7, 70)])
def test_wide_aggregators_resolved_warm_match_ortools(seed: int, x_cost: int) -> None:
    """X and U with more half-arcs than ``kernels._WIDE``, so scans skip their in-arcs
    while none carries flow (kernels: in-arcs without flow), and count them as flow
    comes and goes: through X when it is cheap (25), never when waiting is cheaper
    (70). Every algorithm matches OR-Tools round after round, and relaxation hands
    over to cost scaling in some (the relabels and the price refine see them too)."""
    from schedulers.flow.mcf import kernels as K

    cell = FullCell(np.random.default_rng(seed), machines=40, slots=4, x_cost=x_cost)
    cell.arrive(300)
    solvers = {a: FirmamentSolver(a) for a in ALGORITHMS}
    # Every warm round handed over to cost scaling (no paths from the deficits first).
    stingy = FirmamentSolver("auto", warm_budget=0.0, reverse_budget=0.0)
    for _ in range(5):
        net = cell.arrays()
        assert min(int((net.head == v).sum()) for v in (cell.x, cell.u)) > K._WIDE
        want = OrToolsSolver().solve(net)
        for a, s in [*solvers.items(), ("stingy", stingy)]:
            got = s.solve(net)
            check_flow(net, got)
            assert got.cost == want.cost, (a, s.last)
        cell.advance(want.flow, net)
        cell.arrive(int(cell.rng.integers(20, 80)))
    assert stingy.last is not None and stingy.last.fallback


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31), nodes=st.integers(4, 14), up=st.booleans())
def test_price_refine_makes_any_prices_exact_for_an_optimal_flow(seed: int, nodes: int,
                                                                 up: bool) -> None:
    """``exact_prices`` from random prices (cost scaling's are ε-optimal, these are
    worse) for an optimal flow: both of its directions (``up_limit`` 0 skips raising)
    end with every residual half-arc of reduced cost >= 0."""
    from schedulers.flow.mcf import kernels as K

    rng = np.random.default_rng(seed)
    net = RandomNet(rng, nodes).arrays()
    try:
        flow = OrToolsSolver().solve(net).flow
    except SolveError:
        return
    n = net.nodes
    tail, head, cost = net.tail, net.head, net.cost
    cap = net.capacity - net.lower
    x = flow - net.lower
    start, adj = _star(n, tail, head)
    pi = rng.integers(-100, 100, n).astype(np.int64)
    assert K.exact_prices(n, start, adj, tail, head, cap, cost, x, pi, 50 * (n + 1),
                          n + 1 if up else 0)
    rc = cost - pi[tail] + pi[head]
    assert (rc[x < cap] >= 0).all() and (rc[x > 0] <= 0).all()


def test_relaxation_drops_a_tree_that_passes_its_budget() -> None:
    """The budget binds inside a tree too: the one unit of a long chain of balanced
    arcs needs a tree of ~9,000 arc scans, so with no budget relaxation drops it
    unchanged (the kernel: BUDGET, flow and prices as they were) and cost scaling
    routes the unit (the solver: handed over with no augmentation or rise). So does a
    tree that alone passes half of max_big big trees' scans, whatever the budget left."""
    from schedulers.flow.mcf import kernels as K

    length = 3000
    tail = np.arange(length, dtype=np.int64)
    head = tail + 1
    m, n = length, length + 1
    supply = np.zeros(n, dtype=np.int64)
    supply[0], supply[length] = 1, -1
    net = Arrays(n, supply, tail, head, np.zeros(m, dtype=np.int64),
                 np.ones(m, dtype=np.int64), np.zeros(m, dtype=np.int64),
                 np.zeros(m, dtype=np.int8), np.arange(m, dtype=np.int64))
    start, adj = _star(n, tail, head)
    for budget, status in ((0, K.BUDGET), (10 * (n + m), K.DONE)):
        x, e, pi = np.zeros(m, dtype=np.int64), supply.copy(), np.zeros(n, dtype=np.int64)
        stats = np.zeros(K.NSTATS, dtype=np.int64)
        got = K.relax(n, start, adj, tail, head, net.capacity, net.cost, x, e, pi, budget,
                      np.zeros(1, dtype=np.int64), stats, 2**62, 2**62,
                      np.empty(9 * n, dtype=np.int64))
        assert got == status
        assert x.sum() == (0 if status == K.BUDGET else m)
        assert not pi.any() and stats[K.ST_RISE] == 0
    # A budget to spare, but one tree as dear as half of max_big big ones: dropped.
    for big, max_big, status in ((1000, 8, K.BUDGET), (1000, 32, K.DONE),
                                 (2**62, 4, K.DONE)):
        x, e, pi = np.zeros(m, dtype=np.int64), supply.copy(), np.zeros(n, dtype=np.int64)
        stats = np.zeros(K.NSTATS, dtype=np.int64)
        got = K.relax(n, start, adj, tail, head, net.capacity, net.cost, x, e, pi,
                      10 * (n + m), np.zeros(1, dtype=np.int64), stats, big, max_big,
                      np.empty(9 * n, dtype=np.int64))
        assert got == status, (big, max_big)
        assert x.sum() == (0 if status == K.BUDGET else m)
        assert stats[K.ST_OPS] < (big * max_big // 2 + 2 * K._CHECK if status == K.BUDGET
                                  else 10 * (n + m))
    solver = FirmamentSolver("auto", relax_budget=0.0, reverse_budget=0.0)
    sol = solver.solve(net)
    check_flow(net, sol)
    assert sol.cost == 0 and sol.flow.sum() == m
    last = solver.last
    assert last is not None and last.fallback
    assert last.augmentations == 0 and last.price_rises == 0
    # With paths from the deficits allowed the chain's length, they route the unit.
    solver = FirmamentSolver("auto", relax_budget=0.0, reverse_budget=2.0)
    sol = solver.solve(net)
    check_flow(net, sol)
    assert sol.cost == 0 and solver.last is not None
    assert not solver.last.fallback and solver.last.reverse_paths == 1


@pytest.mark.parametrize("seed", [8, 9])
def test_global_update_prices_are_the_distances_with_few_bucket_entries(seed: int) -> None:
    """The update's prices are p + min(dist, D) ε (dist: each node's distance to a
    deficit over residual half-arcs of length floor(rc / ε) + 1, D: the farthest
    excess), checked against a plain Dijkstra, with n + 1 bucket entries (they run
    out and the buckets are rebuilt several times on this cell) and with plenty."""
    import heapq

    from schedulers.flow.mcf import kernels as K

    cell = FullCell(np.random.default_rng(seed), machines=40, slots=4)
    cell.arrive(300)
    net = cell.arrays()
    n, m = net.nodes, len(net.tail)
    tail, head, cap, cost = net.tail, net.head, net.capacity, net.cost
    start, adj = _star(n, tail, head)
    rng = np.random.default_rng(seed)
    x = np.zeros(m, dtype=np.int64)
    e = net.supply[:n].copy()
    p0 = rng.integers(-50, 50, n).astype(np.int64)
    eps = 3
    into: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # v: (u, length u -> v)
    for a in range(m):
        t, h = int(tail[a]), int(head[a])
        if x[a] < cap[a]:
            into[h].append((t, max(0, (int(cost[a]) - int(p0[t]) + int(p0[h])) // eps + 1)))
        if x[a] > 0:
            into[t].append((h, max(0, (-int(cost[a]) - int(p0[h]) + int(p0[t])) // eps + 1)))
    dist = [2**62] * n
    heap = [(0, v) for v in range(n) if e[v] < 0]
    for _, v in heap:
        dist[v] = 0
    while heap:
        d, v = heapq.heappop(heap)
        if d == dist[v]:
            for u, ln in into[v]:
                if d + ln < dist[u]:
                    dist[u] = d + ln
                    heapq.heappush(heap, (d + ln, u))
    top = max(dist[v] for v in range(n) if e[v] > 0)
    want = p0 + np.minimum(np.array(dist, dtype=np.int64), top) * eps
    for entries in (n + 1, 3 * n + 1):
        p = p0.copy()
        ops = K.global_update(n, start, adj, tail, head, cap, cost, x, e.copy(), p, 1, eps,
                              2**60, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64),
                              np.empty(n + 1, dtype=np.int64), entries)
        assert ops > 0
        assert np.array_equal(p, want)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**31), nodes=st.integers(4, 14), budget=st.integers(0, 60))
def test_reverse_paths_route_any_reduced_cost_optimal_start(seed: int, nodes: int,
                                                            budget: int) -> None:
    """From random prices made reduced-cost optimal (every arc of negative reduced cost
    saturated), paths from the deficits with no budget route every excess to the
    optimum OR-Tools finds, prices exact; with a small budget they stop (BUDGET) in a
    consistent state: excesses that are the flow's, prices still exact."""
    from schedulers.flow.mcf import kernels as K

    rng = np.random.default_rng(seed)
    net = RandomNet(rng, nodes).arrays()
    try:
        want = OrToolsSolver().solve(net).cost
    except SolveError:
        return
    n = net.nodes
    tail, head, cost = net.tail, net.head, net.cost
    cap = net.capacity - net.lower
    start, adj = _star(n, tail, head)
    pi0 = rng.integers(-40, 40, n).astype(np.int64)
    for limit in (2**62, budget):
        x = np.zeros(len(tail), dtype=np.int64)
        e = net.supply[:n].copy()
        np.subtract.at(e, tail, net.lower)
        np.add.at(e, head, net.lower)
        pi = pi0.copy()
        K.make_optimal(tail, head, cap, cost, x, e, pi)
        stats = np.zeros(K.NSTATS, dtype=np.int64)
        status = K.reverse_paths(n, start, adj, tail, head, cap, cost, x, e, pi, limit,
                                 stats, np.empty(7 * n, dtype=np.int64))
        rc = cost - pi[tail] + pi[head]
        assert (rc[x < cap] >= 0).all() and (rc[x > 0] <= 0).all()
        assert ((x >= 0) & (x <= cap)).all()
        bal = net.supply[:n].copy()
        np.subtract.at(bal, tail, x + net.lower)
        np.add.at(bal, head, x + net.lower)
        assert np.array_equal(bal, e)
        if limit == 2**62:
            assert status == K.DONE and not e.any()
            assert int(((x + net.lower) * cost).sum()) == want
        else:
            assert status in (K.DONE, K.BUDGET)
            assert status == K.BUDGET or not e.any()


def test_reverse_paths_stop_at_the_first_scan_of_a_plateau() -> None:
    """The case they are for (a large job on a full cell): the deficit sits one price
    step from a hub whose in-arcs all have reduced cost 0 (the sink, with every full
    machine behind it), and the excess reaches one of those in-neighbours at reduced
    cost 0. The path is found while the hub is scanned: the hub's 2,000 in-neighbours,
    each with 20 more behind it, are labelled but never scanned (40,000 half-arcs a
    search to the end of the plateau would look at)."""
    from schedulers.flow.mcf import kernels as K

    hubs, fan = 2000, 20
    deficit, hub, excess = 0, 1, 2
    arcs = [(hub, deficit, 1, 1)]  # one price step (cost 1) from the hub to the deficit
    first = 3
    for i in range(hubs):
        arcs.append((first + i, hub, 1, 0))
    nxt = first + hubs
    for i in range(hubs):
        for _ in range(fan):
            arcs.append((nxt, first + i, 1, 0))
            nxt += 1
    arcs.append((excess, first + hubs // 2, 1, 0))  # neither the first nor the last
    n = nxt
    rows = np.array(arcs, dtype=np.int64)
    tail, head, cap, cost = (rows[:, i].copy() for i in range(4))
    start, adj = _star(n, tail, head)
    x = np.zeros(len(tail), dtype=np.int64)
    e = np.zeros(n, dtype=np.int64)
    e[excess], e[deficit] = 1, -1
    pi = np.zeros(n, dtype=np.int64)
    stats = np.zeros(K.NSTATS, dtype=np.int64)
    status = K.reverse_paths(n, start, adj, tail, head, cap, cost, x, e, pi, 2**62, stats,
                             np.empty(7 * n, dtype=np.int64))
    assert status == K.DONE and not e.any() and stats[K.ST_PATHS] == 1
    assert int((x * cost).sum()) == 1 and x[0] == 1 and x[-1] == 1
    assert stats[K.ST_OPS] < 2 * hubs + 100, stats[K.ST_OPS]
    rc = cost - pi[tail] + pi[head]
    assert (rc[x < cap] >= 0).all() and (rc[x > 0] <= 0).all()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_auto_finishes_relaxation_by_paths_from_the_deficits(seed: int) -> None:
    """A relaxation that hands over at once (no warm budget: one tree) leaves the rest to the
    paths from the deficits, which (with a budget for a search per unit on this small
    cell) finish the rounds without cost scaling; every round matches OR-Tools, and a
    twin solver fed the same rounds returns the same flow."""
    cell = FullCell(np.random.default_rng(seed), machines=12, slots=4)
    cell.arrive(60)
    kw: dict[str, Any] = {"warm_budget": 0.0, "reverse_budget": 200.0, "reverse_units": 1000}
    solver, twin = FirmamentSolver("auto", **kw), FirmamentSolver("auto", **kw)
    finished = []
    for _ in range(6):
        net = cell.arrays()
        want = OrToolsSolver().solve(net)
        got = solver.solve(net)
        check_flow(net, got)
        assert got.cost == want.cost, solver.last
        assert np.array_equal(twin.solve(net).flow, got.flow)
        assert solver.last is not None
        finished.append(solver.last.reverse_paths > 0 and not solver.last.fallback)
        cell.advance(want.flow, net)
        cell.arrive(15)
    assert finished[0] is False and all(finished[1:]), finished  # the cold round: relax

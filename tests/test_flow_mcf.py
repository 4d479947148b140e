"""The Firmament solver (schedulers/flow/mcf) against OR-Tools from scratch: random
networks changed round after round and solved warm by every algorithm, and hand-made
cases (infeasible, stale state, a FlowNetwork with reused slots)."""

from __future__ import annotations

from typing import Any

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

    def arrays(self) -> Arrays:
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

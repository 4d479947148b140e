"""The flow solvers: OR-Tools finds the exact oracle's optimum (networkx's network
simplex) on the networks every cost model builds from small random cells, and both
return feasible flows; lower bounds and infeasible networks are handled."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from schedulers.flow.choice import SOLVERS
from schedulers.flow.costs import make_cost_model
from schedulers.flow.graph import ArcKind, GraphManager
from schedulers.flow.network import Arc, FlowNetwork
from schedulers.flow.solvers import NetworkxSolver, OrToolsSolver, SolveError
from tests.flow_support import FLOW, NOW, check_feasible, random_cell

SEEDS = range(40)


@pytest.mark.parametrize("policy", ["trivial", "load-spread", "quincy", "network"])
def test_ortools_optimum_equals_the_oracles_for_every_cost_model(policy: str) -> None:
    moving: Counter[int] = Counter()  # arc kinds that carried flow, over all cells
    for seed in SEEDS:
        rng = random.Random(seed)
        snap = random_cell(seed, net=policy == "network").read_snapshot()
        gm = GraphManager(make_cost_model(policy), FLOW,
                          preempt_below=rng.choice([None, 2, 4]))
        gm.rebuild(snap, NOW + rng.uniform(0, 500))
        net = gm.net.arrays()
        assert net.supply.sum() == 0
        fast = OrToolsSolver().solve(net)
        exact = NetworkxSolver().solve(net)
        assert fast.cost == exact.cost, f"seed {seed}: {fast.cost} != oracle {exact.cost}"
        check_feasible(net, fast.flow, fast.cost)
        check_feasible(net, exact.flow, exact.cost)
        moving.update(int(k) for k in net.kind[fast.flow > 0])
    # The cells are not trivial: tasks were placed and left unscheduled, and where the
    # model re-offers running tasks, some moved or were preempted.
    assert moving[ArcKind.INTO_MACHINE] and moving[ArcKind.UNSCHEDULED] and moving[ArcKind.STAY]
    if policy == "quincy":
        assert moving[ArcKind.PREFERENCE]
    if policy != "trivial":
        assert moving[ArcKind.MIGRATE] + moving[ArcKind.PREEMPT] > 0


def _hand_network(lower: int) -> FlowNetwork:
    """Two units from s to t over a cheap arc (a, cost 1, capacity 1) and a dear one
    (b, cost 5, capacity 2, lower bound ``lower``)."""
    net = FlowNetwork()
    net.set_supply(("s",), 2)
    net.set_supply(("t",), -2)
    net.set_arcs(("a",), [Arc(("s",), ("a",), 1, 1), Arc(("a",), ("t",), 1, 0)])
    net.set_arcs(("b",), [Arc(("s",), ("b",), 2, 5, lower), Arc(("b",), ("t",), 2, 0)])
    return net


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize(("lower", "cost"), [(0, 6), (1, 6), (2, 10)])
def test_lower_bounds_are_kept_and_costed(solver: str, lower: int, cost: int) -> None:
    arrays = _hand_network(lower).arrays()
    sol = SOLVERS[solver]().solve(arrays)
    assert sol.cost == cost
    check_feasible(arrays, sol.flow, cost)
    into_b = int(sol.flow[np.flatnonzero(arrays.lower == lower)][0]) if lower else None
    assert into_b is None or into_b >= lower


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_an_infeasible_network_raises_solve_error(solver: str) -> None:
    net = _hand_network(0)
    net.set_supply(("s",), 5)  # more than the arcs can carry
    net.set_supply(("t",), -5)
    with pytest.raises(SolveError):
        SOLVERS[solver]().solve(net.arrays())


def test_the_ahead_of_time_compile_solves_with_every_algorithm_and_they_agree(
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the Docker image runs at build time (schedulers.flow.mcf.compile)."""
    from schedulers.flow.mcf import compile as aot

    aot.main()
    assert "solver kernels compiled and cached" in capsys.readouterr().out


@pytest.mark.parametrize("seed", range(5))
def test_add_fans_gives_the_slots_indexes_and_stamps_set_arcs_gives(seed: int) -> None:
    """A round's task nodes added at once (``FlowNetwork.add_fans``, into heads that
    exist) make the network, node indexes, slots and change stamps that ``set_arcs``
    and ``set_supply`` make owner after owner, also where freed node indexes and slots
    are reused."""
    rng = random.Random(seed)
    nets = [FlowNetwork(), FlowNetwork()]
    machines = [("M", f"m{i}") for i in range(6)]
    heads = [("U", "j"), *machines]
    for fn in nets:  # the heads exist (aggregators and machines), as add_fans asks
        for h in heads:
            fn.set_arcs(h, [Arc(h, ("S",), 9, 0, 0, ArcKind.TO_SINK)])
    history = [(("T", f"old{t}"), rng.sample(machines, 2)) for t in range(rng.randint(2, 8))]
    gone = {o for o, _ in history if rng.random() < 0.5} | {history[0][0], history[1][0]}
    for fn in nets:  # the same history: nodes made, then some dropped
        for owner, held in history:
            fn.set_arcs(owner, [Arc(owner, h, 1, 3, 0, ArcKind.PREFERENCE) for h in held])
            fn.set_supply(owner, 1)
        for owner in sorted(gone):
            fn.drop(owner)
            fn.set_supply(owner, 0)
    owners = [("T", f"new{t}") for t in range(rng.randint(1, 7))]
    versions = [fn.arrays(compact=False).version for fn in nets]
    fans = [[(rng.randrange(len(heads)), rng.randint(0, 5)) for _ in range(rng.randint(1, 4))]
            for _ in owners]
    start = np.array([0, *np.cumsum([len(f) for f in fans])], dtype=np.int64)
    flat = [a for f in fans for a in f]
    nets[0].add_fans(owners, start, heads, np.array([h for h, _ in flat], dtype=np.int64),
                     np.ones(len(flat), dtype=np.int64),
                     np.array([c for _, c in flat], dtype=np.int64),
                     np.full(len(flat), ArcKind.PREFERENCE, dtype=np.int8), supply=1)
    for owner, fan in zip(owners, fans, strict=True):
        nets[1].set_arcs(owner, [Arc(owner, heads[h], 1, c, 0, ArcKind.PREFERENCE)
                                 for h, c in fan])
        nets[1].set_supply(owner, 1)
    a, b = (fn.arrays(compact=False) for fn in nets)
    for field in ("supply", "tail", "head", "capacity", "cost", "kind"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert a.nodes == b.nodes
    # Stamps: the same slots changed, the same nodes born, since before the adding
    # (add_fans stamps them with one version, set_arcs with one per owner).
    assert a.arc_version is not None and b.arc_version is not None
    assert a.node_born is not None and b.node_born is not None
    assert np.array_equal(a.arc_version > versions[0], b.arc_version > versions[1])
    assert np.array_equal(a.node_born > versions[0], b.node_born > versions[1])
    assert [nets[0].node_index(o) for o in owners] == [nets[1].node_index(o) for o in owners]
    assert nets[0].canonical() == nets[1].canonical()

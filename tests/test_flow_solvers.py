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

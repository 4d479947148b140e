"""Min-cost-flow solvers behind one interface.

A solver takes the network as arrays (``FlowNetwork.arrays``) and returns the flow on
each arc. Lower bounds are handled here, once, for every solver: an arc's lower bound
is sent as supply from its head and demand at its tail and added back to the flow.

* ``firmament`` (``schedulers/flow/mcf``): Firmament's relaxation and cost scaling
  of our own, in numba, each round starting from the last round's flow and prices.
* :class:`OrToolsSolver`: OR-Tools' ``SimpleMinCostFlow`` (cost scaling), built
  from the arrays each round; it has no warm start: the cold reference.
* :class:`NetworkxSolver`: networkx's network simplex, exact and slow: the oracle the
  tests check the others against on small networks.

Every network the graph manager builds is feasible: each unit of supply has an arc to
its job's unscheduled aggregator, which reaches the sink with enough capacity. A
solver that finds no optimum raises :class:`SolveError` naming the status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from schedulers.flow.network import Arrays


class SolveError(RuntimeError):
    pass


class Solution(NamedTuple):
    flow: npt.NDArray[np.int64]  # per arc of the arrays, lower bound included
    cost: int


class Solver(Protocol):
    name: ClassVar[str]
    #: Takes ``FlowNetwork.arrays(compact=False)``: slots in place, dead ones included.
    slot_arrays: ClassVar[bool]

    def solve(self, net: Arrays) -> Solution: ...


def _shifted(net: Arrays) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    """Supplies and capacities with the lower bounds taken out, and their cost."""
    supply = net.supply.copy()
    if net.lower.any():
        np.subtract.at(supply, net.tail, net.lower)
        np.add.at(supply, net.head, net.lower)
    return supply, net.capacity - net.lower, int((net.lower * net.cost).sum())


class OrToolsSolver:
    name: ClassVar[str] = "ortools"
    slot_arrays: ClassVar[bool] = False

    def __init__(self) -> None:
        # Said when the solver is chosen, not at its first round.
        try:
            import ortools.graph.python.min_cost_flow  # noqa: F401
        except ImportError:
            raise SolveError("solver ortools: OR-Tools is not installed (it is an extra: "
                             "pip install 'omega-cell[ortools]'); the default solver, "
                             "firmament, needs nothing more") from None

    def solve(self, net: Arrays) -> Solution:
        from ortools.graph.python import min_cost_flow

        supply, cap, fixed = _shifted(net)
        mcf = min_cost_flow.SimpleMinCostFlow()
        if len(net.tail):
            mcf.add_arcs_with_capacity_and_unit_cost(net.tail, net.head, cap, net.cost)
        # OR-Tools sizes its graph by the largest node an arc names; a node with supply
        # and no arc would be out of range (the graph manager never makes one).
        used = np.flatnonzero(supply)
        if len(used):
            mcf.set_nodes_supplies(used, supply[used])
        status = mcf.solve()
        if status != mcf.OPTIMAL:
            raise SolveError(f"OR-Tools min-cost flow: status {status!r}")
        flow = np.asarray(mcf.flows(np.arange(len(net.tail))), dtype=np.int64) + net.lower
        return Solution(flow, int(mcf.optimal_cost()) + fixed)


class NetworkxSolver:
    """Exact (network simplex over a multigraph) and slow: for tests."""

    name: ClassVar[str] = "networkx"
    slot_arrays: ClassVar[bool] = False

    def solve(self, net: Arrays) -> Solution:
        import networkx as nx

        supply, cap, fixed = _shifted(net)
        g = nx.MultiDiGraph()
        for i in range(net.nodes):
            # networkx's demand is the negative of a supply.
            g.add_node(i, demand=-int(supply[i]))
        keys = [g.add_edge(int(t), int(h), capacity=int(c), weight=int(w))
                for t, h, c, w in zip(net.tail, net.head, cap, net.cost, strict=True)]
        try:
            cost, flows = nx.network_simplex(g)
        except nx.NetworkXUnfeasible as e:
            raise SolveError(f"networkx: {e}") from e
        flow = np.array([flows[int(t)][int(h)][k]
                         for t, h, k in zip(net.tail, net.head, keys, strict=True)],
                        dtype=np.int64) + net.lower
        return Solution(flow, int(cost) + fixed)


SOLVERS: dict[str, Callable[[], Solver]] = {
    OrToolsSolver.name: OrToolsSolver,
    NetworkxSolver.name: NetworkxSolver,
}
"""The solvers of this module; ``schedulers.flow.choice.SOLVERS`` adds ours."""

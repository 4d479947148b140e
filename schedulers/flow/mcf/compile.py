"""Compile the solver's kernels into numba's on-disk cache ahead of time:
``python -m schedulers.flow.mcf.compile`` (the Docker image does it at build time, so a
flow scheduler's first round loads them instead of compiling). It solves a small
network with every algorithm, cold and warm, checks each answer against the one all
of them must share, and prints how long it took."""

from __future__ import annotations

import time

import numpy as np

from schedulers.flow.mcf.solver import ALGORITHMS, FirmamentSolver
from schedulers.flow.network import Arrays
from schedulers.flow.solvers import SolveError


def _network(extra: int) -> Arrays:
    """Two tasks (one a unit more each time), two machines of one slot, an unscheduled
    way out: a network on which every kernel runs."""
    tail = np.array([0, 0, 1, 1, 0, 1, 2, 3, 4], dtype=np.int64)
    head = np.array([2, 3, 2, 3, 4, 4, 5, 5, 5], dtype=np.int64)
    cap = np.array([1, 1, 1, 1, 2, 2 + extra, 1, 1, 3 + extra], dtype=np.int64)
    cost = np.array([1, 5, 2, 1, 10, 10, 0, 0, 0], dtype=np.int64)
    supply = np.array([1, 1 + extra, 0, 0, 0, -2 - extra], dtype=np.int64)
    m = len(tail)
    return Arrays(6, supply, tail, head, np.zeros(m, dtype=np.int64), cap, cost,
                  np.zeros(m, dtype=np.int8), np.arange(m, dtype=np.int64))


def warm() -> float:
    """Load (or compile) every kernel now, so that a timed run does not pay for it;
    returns the seconds it took."""
    t0 = time.perf_counter()
    costs = set()
    # The last: relaxation out of budget at once, the rest routed from the deficits.
    solvers = [FirmamentSolver(a) for a in ALGORITHMS]
    solvers.append(FirmamentSolver("auto", relax_budget=0.0, warm_budget=0.0))
    for solver in solvers:
        for extra in (0, 1):  # cold, then warm from the first answer
            costs.add((extra, solver.solve(_network(extra)).cost))
    if len(costs) != 2:
        # Not SystemExit: a simulation or a scheduler calls this, not only main().
        raise SolveError(f"the solver's algorithms disagree: {sorted(costs)}")
    return time.perf_counter() - t0


def main() -> None:
    try:
        seconds = warm()
    except SolveError as e:
        raise SystemExit(str(e)) from None
    print(f"solver kernels compiled and cached in {seconds:.1f} s")


if __name__ == "__main__":
    main()

"""Firmament's min-cost-flow solvers (relaxation, cost scaling, raced or chosen per
round), in numba, warm-started from the previous round: see :mod:`.solver`."""

from schedulers.flow.mcf.solver import ALGORITHMS, FirmamentSolver, SolveStats

__all__ = ["ALGORITHMS", "FirmamentSolver", "SolveStats"]

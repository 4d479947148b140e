"""Which solver the flow scheduler uses: every solver by name, the default, and a
solver's stateless twin for networks unrelated to one another.

Apart from ``solvers.py`` (the interface, OR-Tools and networkx) because our own solver
(``schedulers/flow/mcf``) is built on that interface.
"""

from __future__ import annotations

from collections.abc import Callable

from schedulers.flow.mcf import FirmamentSolver
from schedulers.flow.solvers import SOLVERS as BASE_SOLVERS, Solver

SOLVERS: dict[str, Callable[[], Solver]] = {FirmamentSolver.name: FirmamentSolver,
                                            **BASE_SOLVERS}

#: The flow scheduler's solver unless told otherwise.
DEFAULT_SOLVER = FirmamentSolver.name


def cold(solver: Solver) -> Solver:
    """A solver for networks that have nothing to do with one another (each of
    Aladdin's passes builds its own): no state kept from one to the next."""
    if isinstance(solver, FirmamentSolver):
        return FirmamentSolver(solver.algorithm, warm=False)
    return solver

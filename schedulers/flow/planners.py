"""Round planners: policies of the flow scheduler that plan whole rounds on networks
of their own, where a cost model (``costs.py``) only prices the arcs of the graph
manager's network. Aladdin+H is one: it counts room in every dimension exactly, one
min-cost flow per demand, and moves tasks by repacking (``schedulers/flow/aladdin/``).

The flow scheduler's ``policy`` option names a planner or a cost model (a name is
one or the other); a planner's options are the ``costs`` table, as a cost model's are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cellstate.model import Claim

if TYPE_CHECKING:
    from schedulers.api import Context
    from schedulers.flow.solvers import Solver


class PlannerError(ValueError):
    pass


class RoundOutcome(Protocol):
    """What a planned round decided, as the flow scheduler's policy reads it (the flow
    core's ``extract.Extraction`` has these fields too)."""

    @property
    def claims(self) -> Sequence[Claim]: ...
    @property
    def unscheduled(self) -> Mapping[str, int]: ...
    @property
    def why(self) -> Mapping[str, str]: ...
    @property
    def placed(self) -> int: ...
    @property
    def migrated(self) -> int: ...
    @property
    def preempted(self) -> int: ...
    @property
    def repaired(self) -> int: ...
    @property
    def spilled(self) -> int: ...
    @property
    def stale(self) -> int: ...


class RoundFigures(Protocol):
    """What a planned round took (seconds) and how big its networks were."""

    @property
    def update(self) -> float: ...
    @property
    def solve(self) -> float: ...
    @property
    def extract(self) -> float: ...
    @property
    def nodes(self) -> int: ...
    @property
    def arcs(self) -> int: ...
    @property
    def regrouped(self) -> bool: ...


class RoundPlanner(Protocol):
    """Plans the flow scheduler's rounds itself, on networks of its own."""

    def plan(self, ctx: Context, solver: Solver) -> tuple[RoundOutcome, RoundFigures]: ...

    def idle(self, ctx: Context) -> bool:
        """Whether a rescheduling round now would find nothing to do."""
        ...

    def note_changes(self, ctx: Context) -> None:
        """Take note of the changes ``ctx`` hands over when no round follows (a
        round's own :meth:`plan` notes them itself)."""
        ...


def _aladdin(options: Mapping[str, Any], move_guard: float) -> RoundPlanner:
    # Imported when asked for: the planner's numpy-heavy modules are of no use to the
    # cost models.
    from schedulers.flow.aladdin.options import planner_options
    from schedulers.flow.aladdin.planner import AladdinPlanner

    try:
        return AladdinPlanner(planner_options(options, move_guard))
    except ValueError as e:
        raise PlannerError(str(e)) from None


#: Planners by the name the flow scheduler's ``policy`` option gives: a factory of
#: (the ``costs`` table, the flow scheduler's ``move_guard``).
PLANNERS: dict[str, Callable[[Mapping[str, Any], float], RoundPlanner]] = {
    "aladdin": _aladdin,
}


def make_planner(name: str, options: Mapping[str, Any], move_guard: float) -> RoundPlanner:
    found = PLANNERS.get(name)
    if found is None:
        raise PlannerError(f"no planner named {name!r} (known: {', '.join(sorted(PLANNERS))})")
    return found(options, move_guard)

"""The ``aladdin`` cost model: Aladdin+H's options, and the round planner it brings.

Unlike the other cost models, which price the arcs of the flow core's network, this
one plans its rounds itself (``CostModel.planner``): its network (task classes, then
machine groups, then machines, one pass per demand) is built per round
(``planner.py``). Its options, all numbers (the ``costs`` table of the flow
scheduler's options, or ``--option costs.groups=8``):

* ``groups`` (4): K, the number of machine groups; 0 chooses it by the elbow rule;
* ``srf`` (0): 1 places the smallest demands first (the paper's SRF), 0 the largest;
* ``repack`` (1): 0 turns repacking off; ``max_moves`` (4) tasks moved per unit,
  ``repack_units`` (50) units repacked per round;
* ``candidates`` (4): machines past those covering a constrained job's units;
  ``walk`` (2000): machines looked at per constrained job; ``spill`` (16): machines
  tried for an arrival the fit rules refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from schedulers.flow.costs import CostModel, CostModelError

if TYPE_CHECKING:
    from schedulers.flow.aladdin.planner import AladdinPlanner


class AladdinCostModel(CostModel):
    """Aladdin+H (seed 002): K-means machine groups with preference cost 100^(x-1),
    multi-dimensional capacities, affinity groups and anti-affinity blacklists,
    repacking. Its rounds are planned by ``schedulers/flow/aladdin/planner.py``."""

    name = "aladdin"
    defaults: ClassVar[Mapping[str, float]] = {
        "groups": 4, "srf": 0, "repack": 1, "max_moves": 4, "repack_units": 50,
        "candidates": 4, "walk": 2000, "spill": 16,
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        for key in ("srf", "repack"):
            if self.options[key] not in (0, 1):
                raise CostModelError(f"cost model {self.name}: option {key} must be 0 or 1, "
                                     f"got {options[key]!r}")
        for key in ("groups", "max_moves", "repack_units", "candidates", "walk", "spill"):
            if self.options[key] != int(self.options[key]):
                raise CostModelError(f"cost model {self.name}: option {key} must be a whole "
                                     f"number, got {options[key]!r}")
        for key in ("walk", "spill"):
            if self.options[key] < 1:
                raise CostModelError(f"cost model {self.name}: option {key} must be at "
                                     f"least 1, got {options[key]!r}")

    def planner(self, move_guard: float) -> AladdinPlanner:
        # Imported here: the planner imports the flow core, which imports this package's
        # cost models (COST_MODELS registers this class).
        from schedulers.flow.aladdin.passes import PassOptions
        from schedulers.flow.aladdin.planner import AladdinPlanner, PlannerOptions
        from schedulers.flow.aladdin.repack import RepackOptions

        o = {k: int(v) for k, v in self.options.items()}
        return AladdinPlanner(PlannerOptions(
            groups=o["groups"], srf=bool(o["srf"]), repack=bool(o["repack"]),
            move_guard=move_guard,
            passes=PassOptions(o["candidates"], o["walk"], o["spill"]),
            repacking=RepackOptions(o["max_moves"], o["repack_units"])))

"""The ``aladdin`` planner's options (the flow scheduler's ``costs`` table, or
``--option costs.groups=8``), all numbers, checked here:

* ``groups`` (4): K, the number of machine groups; 0 chooses it by the elbow rule;
* ``srf`` (0): 1 places the smallest demands first (the paper's SRF), 0 the largest;
* ``repack`` (1): 0 turns repacking off; ``max_moves`` (4) tasks moved per unit,
  ``repack_units`` (50) units repacked per round;
* ``candidates`` (4): machines past those covering a constrained job's units;
  ``walk`` (2000): machines looked at per constrained job; ``spill`` (16): machines
  tried for an arrival the fit rules refused;
* ``pack`` (1): the packing cost inside a group (fuller, then bigger machines
  first); 0: every machine of a group costs the same, as the paper's "default cost
  of all other edges";
* ``regroup_every`` (0): group the machines by what they have left and again after
  this many placements; ``regroup_spread`` (0): ... or once their spread about the
  groups' centres (mean squared distance, log2 units) passes this; both 0: groups by
  capacity, made again only when the machine mix changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from schedulers.flow.aladdin.passes import PassOptions
from schedulers.flow.aladdin.planner import PlannerOptions
from schedulers.flow.aladdin.repack import RepackOptions


class PlannerError(ValueError):
    """An option the planner cannot take (the flow scheduler names the option)."""


DEFAULTS: Mapping[str, float] = {
    "groups": 4, "srf": 0, "repack": 1, "max_moves": 4, "repack_units": 50,
    "candidates": 4, "walk": 2000, "spill": 16, "pack": 1, "regroup_every": 0,
    "regroup_spread": 0,
}
_SWITCHES = ("srf", "repack", "pack")
_WHOLE = ("groups", "max_moves", "repack_units", "candidates", "walk", "spill",
          "regroup_every")


def planner_options(options: Mapping[str, Any], move_guard: float) -> PlannerOptions:
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise PlannerError(f"planner aladdin: unknown option(s) {', '.join(unknown)} "
                           f"(known: {', '.join(sorted(DEFAULTS))})")
    o = dict(DEFAULTS)
    for key, value in options.items():
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not 0 <= value <= 1e9):
            raise PlannerError(f"planner aladdin: option {key} must be a number from 0 to "
                               f"1e9, got {value!r}")
        o[key] = float(value)
    for key in _SWITCHES:
        if o[key] not in (0, 1):
            raise PlannerError(f"planner aladdin: option {key} must be 0 or 1, "
                               f"got {options[key]!r}")
    for key in _WHOLE:
        if o[key] != int(o[key]):
            raise PlannerError(f"planner aladdin: option {key} must be a whole number, "
                               f"got {options[key]!r}")
    for key in ("walk", "spill"):
        if o[key] < 1:
            raise PlannerError(f"planner aladdin: option {key} must be at least 1, "
                               f"got {options[key]!r}")
    n = {k: int(o[k]) for k in _WHOLE}
    return PlannerOptions(
        groups=n["groups"], srf=bool(o["srf"]), repack=bool(o["repack"]),
        packing=bool(o["pack"]), regroup_every=n["regroup_every"],
        regroup_spread=o["regroup_spread"], move_guard=move_guard,
        passes=PassOptions(n["candidates"], n["walk"], n["spill"]),
        repacking=RepackOptions(n["max_moves"], n["repack_units"]))

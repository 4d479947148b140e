"""Aladdin+H (seed 002): heterogeneity-aware placement of long-running tasks, as the
``aladdin`` policy of the flow scheduler (``omega scheduler flow --policy aladdin``).

Modules, one job each: ``groups`` (K-means machine groups, the preference cost of
Eq. 7-8), ``units`` (what waits, in whole tasks or whole affinity groups; free and
constrained jobs), ``cellarrays`` (machines as arrays for one round), ``passes`` (one
min-cost flow per demand and its claims), ``repack`` (moving this scheduler's tasks
so a constrained one fits), ``outcome`` (what a round decided), ``planner`` (the
round) and ``options`` (its options, checked). The flow scheduler finds it as a
planner (``schedulers/flow/planners.py``), not a cost model: it prices no arcs of the
graph manager's network. docs/architecture.md, "Aladdin+H", has the design.
"""

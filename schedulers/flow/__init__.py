"""The flow-based scheduler: Firmament's min-cost-flow scheduling on the shared cell.

Layers, each a module with one job: ``network`` (the graph as arrays), ``costs`` (cost
models: what arcs cost, never the graph), ``graph`` (the graph manager: the network
kept in step with the cell from its change sets), ``solvers`` (min-cost-flow solvers
behind one interface), ``extract`` (flow to claims, with the repair step) and
``policy`` (rounds, as a policy of the scheduler runtime).
"""

from schedulers.flow.policy import FlowPolicy

__all__ = ["FlowPolicy"]

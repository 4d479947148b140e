"""Cost models: what each kind of arc of the flow network costs.

A cost model only *describes* arcs: given a job, a machine or a group of running
tasks, it answers with costs (and, for the machine-to-sink arcs, capacities). It never
sees or touches the network; the graph manager (``schedulers/flow/graph.py``) decides
which arcs exist (an arc to a machine only where the task fits in every dimension) and
asks the model what they cost. So a new policy is one small class; docs/plugins.md has
a section on writing one.

The network, with the arc kinds a model prices (``W``: a job's waiting tasks, one node
with supply k; ``G``: a job's running tasks on one machine; ``E``: the aggregator of
every task of one shape; ``R``: a rack under an aggregator; ``M``: a machine; ``U``:
the job's unscheduled aggregator; ``S``: the sink)::

    W --to_cluster--> E --machine_arc--> M --sink_tiers--> S
    W --preferences--> M or R (locality)       E -> R -> M when the model uses racks
    W --unscheduled--> U ------------------------------------> S
    G --stay--> its machine;  G --migrate--> E;  G --preempt--> U

All costs are whole numbers (solvers work in integers), kept well below
``network.MAX_COST``.

A model may also price the arcs into many machines at once
(:meth:`CostModel.machine_costs`, on numpy arrays): the graph manager then updates the
thousands of machines a round changes on arrays, not one by one in Python. The
per-machine methods stay the reference: the batch method must give exactly what
:meth:`CostModel.machine_arc` and :meth:`CostModel.reclaim` give machine by machine
(``tests/test_flow_costs.py`` checks every built-in model). Each batch method answers
None (price machine by machine) when the model's per-machine methods are not the ones
it was written for, so a subclass that overrides only a per-machine method stays
right.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import attrs
import numpy as np
import numpy.typing as npt

from cellstate.model import Claim, Job, Machine, Resources

if TYPE_CHECKING:
    from schedulers.api import Context
    from schedulers.flow.aladdin.planner import AladdinPlanner
    from schedulers.flow.solvers import Solver

#: Wait-time costs stop growing after this many seconds, so that costs stay bounded.
MAX_WAIT = 86_400.0


class Preference(NamedTuple):
    """A direct arc from a job's waiting tasks to a machine (``rack`` empty) or a rack."""

    machine: str
    rack: str
    cost: int


@attrs.frozen
class MachineLoad:
    """A machine as a cost model sees it. ``slots``: how many tasks of the smallest
    shape the flow scheduler could run there; ``others``: the share of the machine the
    tasks outside the network hold (0..1, the largest over its dimensions)."""

    machine: Machine
    slots: int
    others: float
    used: Resources  # everything held there, the network's own tasks included


class MachineBatch:
    """Many machines as :meth:`CostModel.machine_costs` sees them: row ``i`` is the
    machine :meth:`loads` gives at ``i``. ``slots`` and ``others`` are the
    :class:`MachineLoad` fields as arrays; :meth:`capacity` and :meth:`used` give one
    resource dimension of every machine. ``free`` gives, per machine, what no
    allocation holds in each dimension (asked for only when a model needs it)."""

    def __init__(self, machines: Sequence[Machine], slots: npt.NDArray[np.int64],
                 others: npt.NDArray[np.float64],
                 free: Callable[[], Sequence[Mapping[str, float]]]) -> None:
        self.machines = machines
        self.slots = slots
        self.others = others
        self._free = free

    def __len__(self) -> int:
        return len(self.machines)

    def capacity(self, dim: str) -> npt.NDArray[np.float64]:
        return np.array([m.capacity.get(dim) for m in self.machines], dtype=np.float64)

    def used(self, dim: str) -> npt.NDArray[np.float64]:
        """``MachineLoad.used`` in ``dim``: capacity less what is free, with the float
        residue of releasing everything taken back to 0 as ``Resources`` does."""
        out = np.array([m.capacity.get(dim) - f.get(dim, 0.0)
                        for m, f in zip(self.machines, self._free(), strict=True)],
                       dtype=np.float64)
        out[np.abs(out) <= 1e-9] = 0.0
        return out

    def loads(self) -> list[MachineLoad]:
        """The machines one by one, as the per-machine methods take them."""
        return [MachineLoad(m, int(n), float(o),
                            m.capacity - Resources(tuple(sorted(f.items()))))
                for m, n, o, f in zip(self.machines, self.slots.tolist(),
                                      self.others.tolist(), self._free(), strict=True)]


#: What :meth:`CostModel.machine_costs` answers: the cost of each machine's arcs in
#: (``machine_arc``) and the extra cost of arrivals that reclaim room (``reclaim``;
#: None where the model has none), one row per machine.
MachineCosts = tuple[npt.NDArray[np.int64], "npt.NDArray[np.int64] | None"]


@attrs.frozen
class Group:
    """Running tasks on one machine offered to the network again, all of one shape and
    precedence (so the network has one node per machine and kind of task, not one
    per task)."""

    resources: Resources
    precedence: int
    machine: str
    count: int
    movable: int  # not moved too recently (the flapping guard)
    own: bool  # the flow scheduler's own tasks; False: another's, preemptible only


class CostModelError(ValueError):
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
    """A cost model whose network is not the graph manager's plans the flow
    scheduler's rounds itself (:meth:`CostModel.planner`): Aladdin+H's passes."""

    def plan(self, ctx: Context, solver: Solver) -> tuple[RoundOutcome, RoundFigures]: ...

    def idle(self, ctx: Context) -> bool:
        """Whether a rescheduling round now would find nothing to do."""
        ...

    def note_changes(self, ctx: Context) -> None:
        """Take note of the changes ``ctx`` hands over when no round follows (a
        round's own :meth:`plan` notes them itself)."""
        ...


class CostModel:
    """Base of cost models; the defaults price the trivial model: every placement
    costs nothing and leaving a task unscheduled costs a little, so that any fit is
    taken; running tasks stay where they are."""

    name: ClassVar[str] = ""
    #: Whether shape aggregators reach machines through rack aggregators.
    uses_racks: ClassVar[bool] = False
    #: Options this model takes, with their defaults (checked by :meth:`__init__`).
    defaults: ClassVar[Mapping[str, float]] = {}
    #: Whether :meth:`sink_tiers` reads ``MachineLoad.used`` (else only ``slots`` and
    #: ``others``, so the graph manager remakes the tiers only when those change).
    tiers_use_usage: ClassVar[bool] = False
    #: Whether :meth:`stay`, :meth:`migrate` or :meth:`preempt` read a group's
    #: ``count`` or ``movable`` (else their costs are asked once per group and kept).
    group_costs_use_counts: ClassVar[bool] = False
    #: The resource dimensions the network counts room in (None: every dimension a
    #: task asks for). A Firmament-style single-resource model names one; the
    #: extraction's repair step still applies the store's rules in every dimension.
    dimensions: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "none"
            raise CostModelError(f"cost model {self.name}: unknown option(s) "
                                 f"{', '.join(unknown)} (known: {known})")
        self.options: dict[str, float] = dict(self.defaults)
        for key, value in options.items():
            try:
                if isinstance(value, bool):
                    raise TypeError("a truth value is not a number")
                number = float(value)
            except (TypeError, ValueError):
                raise CostModelError(f"cost model {self.name}: option {key} must be a "
                                     f"number, got {value!r}") from None
            if not 0 <= number <= 1e9:
                raise CostModelError(f"cost model {self.name}: option {key} must be from 0 "
                                     f"to 1e9, got {value!r}")
            self.options[key] = number

    def planner(self, move_guard: float) -> RoundPlanner | None:
        """A planner of whole rounds, for a model whose network is its own (None: the
        graph manager keeps the network and this model prices its arcs)."""
        return None

    def unscheduled(self, job: Job, waited: float) -> int:
        return 100 + 10 * job.precedence

    def to_cluster(self, job: Job) -> int:
        return 0

    def preferences(self, job: Job, racks: Mapping[str, str]) -> Sequence[Preference]:
        """Direct arcs for a job's waiting tasks; ``racks`` maps machine to rack."""
        return ()

    def machine_arc(self, load: MachineLoad) -> int:
        """Cost of the arc from a shape (or rack) aggregator into a machine."""
        return 0

    def reclaim(self, load: MachineLoad) -> int | None:
        """Extra cost of an arrival that needs room the network's running tasks hold on
        the machine (some must migrate or be preempted); None: no such arrivals."""
        return None

    def machine_costs(self, batch: MachineBatch) -> MachineCosts | None:
        """:meth:`machine_arc` and :meth:`reclaim` for many machines at once, as
        arrays (the reclaim array None where :meth:`reclaim` answers None for every
        machine); None: price them one by one. Optional; it must answer None when the
        model's per-machine methods are not the ones it was written for."""
        if not _own_methods(self, CostModel, "machine_arc", "reclaim"):
            return None
        return np.zeros(len(batch), dtype=np.int64), None

    def sink_tiers(self, load: MachineLoad) -> Sequence[tuple[int, int]]:
        """(capacity, cost) of the parallel arcs from a machine to the sink, whose
        capacities add up to ``load.slots``; costs that rise tier by tier make the
        cost of a machine convex in its load."""
        return ((load.slots, 0),)

    def stay(self, group: Group) -> int:
        return 0

    def preempt(self, group: Group, waited: float) -> int | None:
        """Cost of taking running tasks off their machine; None: never."""
        return None

    def migrate(self, group: Group) -> int | None:
        """Cost of moving running tasks elsewhere (through the shape aggregator);
        None: never."""
        return None


def _own_methods(model: CostModel, cls: type, *names: str) -> bool:
    """Whether ``model``'s methods ``names`` are those of ``cls`` (not overridden
    below it): a batch method written for ``cls`` prices only what ``cls`` prices."""
    return all(getattr(type(model), n) is getattr(cls, n) for n in names)


def _tiers(slots: int, others: float, scale: float, max_tiers: int = 16
           ) -> list[tuple[int, int]]:
    """Tiers whose cost is the machine's load (0..1, times ``scale``) once the tier is
    full: a convex cost, so that the solver spreads tasks."""
    if slots <= 0:
        return []
    n = min(slots, max_tiers)
    out = []
    done = 0
    for i in range(n):
        cap = (slots - done) // (n - i)
        done += cap
        load = others + (1.0 - others) * done / slots
        out.append((cap, round(scale * load)))
    return out


class _MovesTasks(CostModel):
    """Running tasks of this scheduler may move (``migrate_cost``) and running tasks may
    be preempted (``preempt_cost`` plus their precedence's worth), and arrivals may
    count on the room they would leave: what load-spreading and Quincy share."""

    def reclaim(self, load: MachineLoad) -> int | None:
        return 0

    def machine_costs(self, batch: MachineBatch) -> MachineCosts | None:
        if not _own_methods(self, _MovesTasks, "machine_arc", "reclaim"):
            return None
        zeros = np.zeros(len(batch), dtype=np.int64)
        return zeros, zeros

    def preempt(self, group: Group, waited: float) -> int | None:
        o = self.options
        return round(o["preempt_cost"] + o["precedence_cost"] * group.precedence)

    def migrate(self, group: Group) -> int | None:
        # Running tasks are grouped by shape, not job: a move pays a flat cost, and the
        # solver moves a task only where that buys more than it costs.
        return round(self.options["migrate_cost"]) if group.own else None


class TrivialCostModel(CostModel):
    """Firmament's trivial model: place anywhere it fits, never move. A test fixture."""

    name = "trivial"


class LoadSpreadingCostModel(_MovesTasks):
    """Spread tasks: a machine costs more the fuller it is (Firmament's load-spreading
    policy, with a convex rather than linear cost so one round spreads too). Running
    tasks move when the spread improves by more than ``migrate_cost`` (in thousandths
    of a machine's load) and are preempted only for tasks of higher precedence."""

    name = "load-spread"
    defaults: ClassVar[Mapping[str, float]] = {
        "unscheduled_cost": 2000, "wait_cost": 1, "precedence_cost": 1000,
        "migrate_cost": 250, "preempt_cost": 2500, "tiers": 4,
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if self.options["tiers"] < 1:
            # No tier would leave machines no arc to the sink: nothing would be placed.
            raise CostModelError(f"cost model {self.name}: option tiers must be at least 1, "
                                 f"got {options['tiers']!r}")

    def unscheduled(self, job: Job, waited: float) -> int:
        o = self.options
        return round(o["unscheduled_cost"] + o["wait_cost"] * min(waited, MAX_WAIT)
                     + o["precedence_cost"] * job.precedence)

    def sink_tiers(self, load: MachineLoad) -> Sequence[tuple[int, int]]:
        return _tiers(load.slots, load.others, 1000, int(self.options["tiers"]))


class QuincyCostModel(_MovesTasks):
    """Quincy (Isard et al., SOSP 2009, as Firmament has it): the cost of a placement is
    the data its task would read over the network, dearer across racks than within
    one; tasks get preference arcs to the machines and racks that hold at least
    ``machine_threshold`` / ``rack_threshold`` of their job's input, and reach every
    other machine through the cluster aggregator at the worst-case cost. Leaving a task
    unscheduled costs more the longer it has waited; a running task is preempted only
    when that beats its ``preempt_cost``, and migrates when the data it would save is
    worth more than ``migrate_cost``."""

    name = "quincy"
    uses_racks = True
    defaults: ClassVar[Mapping[str, float]] = {
        "rack_cost": 1, "core_cost": 4, "data_scale": 100,
        "machine_threshold": 0.1, "rack_threshold": 0.25, "max_preferences": 8,
        "unscheduled_cost": 1000, "wait_cost": 2, "precedence_cost": 1000,
        "migrate_cost": 500, "preempt_cost": 3000,
    }

    def _per_task(self, job: Job) -> float:
        return self.options["data_scale"] / max(job.task_count, 1)

    def _total(self, job: Job) -> float:
        return sum(a for _, a in job.input)

    def to_cluster(self, job: Job) -> int:
        # The worst case: every byte crosses the core.
        return round(self.options["core_cost"] * self._total(job) * self._per_task(job))

    def preferences(self, job: Job, racks: Mapping[str, str]) -> Sequence[Preference]:
        total = self._total(job)
        if total <= 0:
            return ()
        o, scale = self.options, self._per_task(job)
        on_rack: dict[str, float] = {}
        for mid, amount in job.input:
            rack = racks.get(mid)
            if rack is not None:
                on_rack[rack] = on_rack.get(rack, 0.0) + amount
        out: list[Preference] = []
        for mid, amount in sorted(job.input, key=lambda x: (-x[1], x[0])):
            rack = racks.get(mid)
            if rack is None or amount < o["machine_threshold"] * total:
                continue
            local_rack = on_rack[rack]
            cost = o["rack_cost"] * (local_rack - amount) + o["core_cost"] * (total - local_rack)
            out.append(Preference(mid, "", round(cost * scale)))
            if len(out) >= o["max_preferences"]:
                break
        for rack, amount in sorted(on_rack.items(), key=lambda x: (-x[1], x[0])):
            if rack and amount >= o["rack_threshold"] * total:
                # Within the rack, the worst machine holds none of it.
                cost = o["rack_cost"] * amount + o["core_cost"] * (total - amount)
                out.append(Preference("", rack, round(cost * scale)))
        return out

    def unscheduled(self, job: Job, waited: float) -> int:
        o = self.options
        return (self.to_cluster(job) + round(o["unscheduled_cost"]
                + o["wait_cost"] * min(waited, MAX_WAIT) + o["precedence_cost"] * job.precedence))

    def sink_tiers(self, load: MachineLoad) -> Sequence[tuple[int, int]]:
        return ((load.slots, 0),) if load.slots > 0 else ()


class NetworkAwareCostModel(LoadSpreadingCostModel):
    """Firmament's network-aware policy: network bandwidth is a machine resource (the
    dimension ``resource``, default ``net``) that tasks declare like cpu; a task only
    gets an arc to a machine with enough bandwidth left (the graph manager's fit rule),
    and a machine costs more the more of its bandwidth is taken."""

    name = "network"
    defaults: ClassVar[Mapping[str, float]] = {
        **LoadSpreadingCostModel.defaults, "bandwidth_weight": 1000,
    }

    def __init__(self, resource: str = "net", **options: Any) -> None:
        if not isinstance(resource, str) or not resource:
            raise CostModelError("cost model network: option resource must name a "
                                 f"resource dimension, got {resource!r}")
        super().__init__(**options)
        self.resource = resource

    def machine_arc(self, load: MachineLoad) -> int:
        cap = load.machine.capacity.get(self.resource)
        if cap <= 0:
            return round(self.options["bandwidth_weight"])
        used = load.used.get(self.resource)
        return round(self.options["bandwidth_weight"] * min(used / cap, 1.0))

    def machine_costs(self, batch: MachineBatch) -> MachineCosts | None:
        if not _own_methods(self, NetworkAwareCostModel, "machine_arc", "reclaim"):
            return None
        weight = self.options["bandwidth_weight"]
        cap = batch.capacity(self.resource)
        share = np.minimum(batch.used(self.resource) / np.where(cap > 0, cap, 1.0), 1.0)
        # np.round rounds halves to even, as round() does.
        into = np.where(cap > 0, np.round(weight * share), round(weight)).astype(np.int64)
        return into, np.zeros(len(batch), dtype=np.int64)


class AladdinCostModel(CostModel):
    """Aladdin+H (seed 002): K-means machine groups with preference cost 100^(x-1),
    multi-dimensional capacities, affinity groups and anti-affinity blacklists,
    repacking. Unlike the models above it plans its rounds itself (its network is
    built per round, one pass per demand: ``schedulers/flow/aladdin/planner.py``).
    Options, all numbers (the flow scheduler's ``costs`` table, or
    ``--option costs.groups=8``):

    * ``groups`` (4): K, the number of machine groups; 0 chooses it by the elbow rule;
    * ``srf`` (0): 1 places the smallest demands first (the paper's SRF), 0 the largest;
    * ``repack`` (1): 0 turns repacking off; ``max_moves`` (4) tasks moved per unit,
      ``repack_units`` (50) units repacked per round;
    * ``candidates`` (4): machines past those covering a constrained job's units;
      ``walk`` (2000): machines looked at per constrained job; ``spill`` (16): machines
      tried for an arrival the fit rules refused."""

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
        # Imported when asked for: the planner's numpy-heavy modules are of no use to
        # the other models.
        from schedulers.flow.aladdin.passes import PassOptions
        from schedulers.flow.aladdin.planner import AladdinPlanner, PlannerOptions
        from schedulers.flow.aladdin.repack import RepackOptions

        o = {k: int(v) for k, v in self.options.items()}
        return AladdinPlanner(PlannerOptions(
            groups=o["groups"], srf=bool(o["srf"]), repack=bool(o["repack"]),
            move_guard=move_guard,
            passes=PassOptions(o["candidates"], o["walk"], o["spill"]),
            repacking=RepackOptions(o["max_moves"], o["repack_units"])))


class TrivialCpuCostModel(TrivialCostModel):
    """Firmament's trivial model counting room in cpu only (Aladdin+H's baseline
    "TRIVIAL_CPU": Firmament manages one resource)."""

    name = "trivial-cpu"
    dimensions = ("cpu",)


class TrivialRamCostModel(TrivialCostModel):
    """Firmament's trivial model counting room in memory only ("TRIVIAL_RAM")."""

    name = "trivial-ram"
    dimensions = ("mem",)


class LoadSpreadingCpuCostModel(LoadSpreadingCostModel):
    """Load-spreading (Firmament's Octopus) counting room in cpu only ("OCTOPUS_CPU")."""

    name = "load-spread-cpu"
    dimensions = ("cpu",)


class LoadSpreadingRamCostModel(LoadSpreadingCostModel):
    """Load-spreading counting room in memory only ("OCTOPUS_RAM")."""

    name = "load-spread-ram"
    dimensions = ("mem",)


COST_MODELS: dict[str, type[CostModel]] = {
    m.name: m for m in (TrivialCostModel, LoadSpreadingCostModel, QuincyCostModel,
                        NetworkAwareCostModel, TrivialCpuCostModel, TrivialRamCostModel,
                        LoadSpreadingCpuCostModel, LoadSpreadingRamCostModel,
                        AladdinCostModel)
}

#: Entry-point group where other packages declare cost models
#: (``name = "package.module:CostModelClass"``), as policies are declared.
ENTRY_POINT_GROUP = "omega.flow_cost_models"


def cost_models() -> dict[str, type[CostModel] | metadata.EntryPoint]:
    """Every cost model by name: the built-in ones and those installed packages
    declare. A name declared twice is refused, as the policy registry does."""
    out: dict[str, type[CostModel] | metadata.EntryPoint] = dict(COST_MODELS)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in out:
            raise CostModelError(f"cost model {ep.name!r} is declared twice (again by "
                                 f"{ep.value})")
        out[ep.name] = ep
    return out


def make_cost_model(name: str, **options: Any) -> CostModel:
    known = cost_models()
    found = known.get(name)
    if found is None:
        raise CostModelError(f"no cost model named {name!r} (known: "
                             f"{', '.join(sorted(known))})")
    cls = found.load() if isinstance(found, metadata.EntryPoint) else found
    if not (isinstance(cls, type) and issubclass(cls, CostModel)):
        raise CostModelError(f"cost model {name!r} ({found}) is not a CostModel class")
    return cls(**options)


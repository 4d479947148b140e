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

from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple

import attrs
import numpy as np
import numpy.typing as npt

from cellstate.model import Block, Job, Machine, Resources

#: Wait-time costs stop growing after this many seconds, so that costs stay bounded.
MAX_WAIT = 86_400.0


class Racks(dict[str, str]):
    """The cell's racks as cost models see them: machine -> rack, and how many
    machines each rack has (a rack's worst machine may hold none of a task's input
    only if the rack has a machine that holds none)."""

    def __init__(self, rack_of: Mapping[str, str] | None = None) -> None:
        super().__init__(rack_of or {})
        self.sizes: dict[str, int] = {}
        for rack in self.values():
            self.sizes[rack] = self.sizes.get(rack, 0) + 1
        self._index: RackIndex | None = None

    def index(self) -> RackIndex:
        """The layout numbered for array pricing (made once per layout: a Racks is
        not changed after it is made)."""
        if self._index is None:
            names = sorted(self)
            racks = sorted(self.sizes)
            rpos = {r: i for i, r in enumerate(racks)}
            self._index = RackIndex(
                names, {m: i for i, m in enumerate(names)},
                np.array([rpos[self[m]] for m in names], dtype=np.int64), racks,
                np.array([self.sizes[r] for r in racks], dtype=np.int64))
        return self._index


class RackIndex(NamedTuple):
    """A layout's machines and racks numbered in name order (so that an index is also
    the name's rank, the order ties are broken in): each machine's rack and each
    rack's size as arrays."""

    machines: list[str]
    position: dict[str, int]
    rack_of: npt.NDArray[np.int64]
    racks: list[str]
    rack_sizes: npt.NDArray[np.int64]


class TaskCosts(NamedTuple):
    """A task's own arcs (a node of its own, Quincy's per-task locality): direct arcs
    to the machines and racks it prefers, and the cost of the arc to the cluster
    aggregator (its shape's ``E`` node), from which it may run on any machine."""

    preferences: Sequence[Preference]
    cluster: int


@attrs.define(eq=False)
class TaskPrices:
    """Many tasks priced at once (:meth:`CostModel.task_prices`, of one job; or
    :meth:`CostModel.jobs_task_prices`, of several): the tasks priced on their own
    (``tasks``, their indexes in their jobs, in order; the others share their job's node),
    and for task ``k`` of them its cluster arc ``cluster[k]`` and its preferences at
    ``start[k]:start[k + 1]`` of the preference arrays: each a machine (an index into
    ``machine_names``) or a rack (into ``rack_names``; the other index -1), with its
    cost. What :meth:`CostModel.task_costs` gives each task, as arrays, so that the
    graph manager adds a round's new task nodes without a Python object per arc."""

    tasks: list[int]
    cluster: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    machine: npt.NDArray[np.int64]
    rack: npt.NDArray[np.int64]
    cost: npt.NDArray[np.int64]
    machine_names: Sequence[str]
    rack_names: Sequence[str]

    # Every task's TaskCosts, made at the first ask (a task's own arcs while it runs
    # are made from them; most tasks of a batch start, so one pass makes them all).
    _made: list[TaskCosts] | None = attrs.field(default=None, init=False, repr=False)

    def costs(self, k: int) -> TaskCosts:
        """Task ``k``'s prices as :meth:`CostModel.task_costs` gives them."""
        if self._made is None:
            names, racks = self.machine_names, self.rack_names
            prefs = [Preference(names[m], "", c) if m >= 0 else Preference("", racks[r], c)
                     for m, r, c in zip(self.machine.tolist(), self.rack.tolist(),
                                        self.cost.tolist(), strict=True)]
            start = self.start.tolist()
            self._made = [TaskCosts(tuple(prefs[a:b]), c) for a, b, c in
                          zip(start, start[1:], self.cluster.tolist(), strict=False)]
        return self._made[k]

    @staticmethod
    def of(priced: Sequence[tuple[int, TaskCosts]]) -> TaskPrices:
        """Packs tasks priced one by one."""
        machines: dict[str, int] = {}
        racks: dict[str, int] = {}
        start = [0]
        mi: list[int] = []
        ri: list[int] = []
        cost: list[int] = []
        for _, tc in priced:
            for p in tc.preferences:
                if p.machine:
                    mi.append(machines.setdefault(p.machine, len(machines)))
                    ri.append(-1)
                else:
                    mi.append(-1)
                    ri.append(racks.setdefault(p.rack, len(racks)))
                cost.append(p.cost)
            start.append(len(cost))
        return TaskPrices(
            [i for i, _ in priced], np.array([tc.cluster for _, tc in priced], dtype=np.int64),
            np.array(start, dtype=np.int64), np.array(mi, dtype=np.int64),
            np.array(ri, dtype=np.int64), np.array(cost, dtype=np.int64),
            list(machines), list(racks))


class JobPrices(NamedTuple):
    """A job's tasks priced on their own (``tasks``) in a :class:`TaskPrices` that
    may hold other jobs' too: task ``tasks[k]`` is its row ``first + k``."""

    prices: TaskPrices
    first: int
    tasks: list[int]


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
    # What the tasks outside the network hold there (given to sink_tiers; empty in
    # MachineBatch.loads, which prices the arcs into machines)
    outside: Resources = attrs.field(factory=Resources)


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
    per task), or one task with a node of its own (``task``: where the cost model
    priced it on its own, :meth:`CostModel.task_costs`)."""

    resources: Resources
    precedence: int
    machine: str
    count: int
    movable: int  # not moved too recently (the flapping guard)
    own: bool  # the flow scheduler's own tasks; False: another's, preemptible only
    task: str = ""  # the task of a node of its own


class CostModelError(ValueError):
    pass


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

    def unscheduled(self, job: Job, waited: float) -> int:
        return 100 + 10 * job.precedence

    def to_cluster(self, job: Job) -> int:
        return 0

    def cluster_cost(self, job: Job, racks: Racks) -> int:
        """The arc from a job's shared node of waiting tasks to the cluster aggregator,
        knowing the cell's racks; the default is :meth:`to_cluster`."""
        return self.to_cluster(job)

    def task_costs(self, job: Job, index: int, racks: Racks) -> TaskCosts | None:
        """A task's own arcs where it differs from its job's other tasks (Quincy: its
        own input blocks); None: it is like them, and shares their node (an
        equivalence class). A task priced here is also a node of its own while it
        runs (its continuation arc, :meth:`transfer` and :meth:`run_discounts`)."""
        return None

    def task_prices(self, job: Job, indices: Sequence[int], racks: Racks) -> TaskPrices:
        """:meth:`task_costs` of many tasks of a job at once, as arrays; by default
        asked task by task. A model that overrides it must give exactly what
        :meth:`task_costs` gives (``tests/test_flow_quincy.py`` checks Quincy's)."""
        priced = [(i, tc) for i in indices
                  if (tc := self.task_costs(job, i, racks)) is not None]
        return TaskPrices.of(priced)

    def jobs_task_prices(self, asked: Sequence[tuple[Job, Sequence[int]]], racks: Racks
                         ) -> list[JobPrices]:
        """:meth:`task_prices` of many jobs (a round's arrivals) at once, one
        :class:`JobPrices` per job asked; by default job by job. A model may price them
        all in one :class:`TaskPrices` (Quincy does: one pass of array operations
        instead of one per job)."""
        out = []
        for job, indices in asked:
            tp = self.task_prices(job, indices, racks)
            out.append(JobPrices(tp, 0, tp.tasks))
        return out

    def task_unscheduled(self, job: Job, costs: TaskCosts, waited: float) -> int:
        """Cost of leaving a task with its own node waiting (``waited`` seconds so
        far)."""
        return self.unscheduled(job, waited)

    def tasks_unscheduled(self, job: Job, prices: TaskPrices, waited: float,
                          rows: npt.NDArray[np.int64] | None = None
                          ) -> npt.NDArray[np.int64]:
        """:meth:`task_unscheduled` for the tasks of ``prices`` at ``rows`` (None:
        every one), as an array. Only ``job``'s rows are asked for: a table priced for
        many jobs at once (:meth:`jobs_task_prices`) holds the others' too."""
        at = range(len(prices.tasks)) if rows is None else rows.tolist()
        return np.array([self.task_unscheduled(job, prices.costs(k), waited) for k in at],
                        dtype=np.int64)

    def transfer(self, job: Job, index: int, machine: str, racks: Racks) -> int:
        """Cost of a task with its own node running on ``machine`` (Quincy's d*: the
        data it reads from elsewhere): its continuation arc, less
        :meth:`run_discounts`."""
        return 0

    def run_discounts(self, ran: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """What running for ``ran`` seconds takes off each task's continuation arc
        (Quincy's p*), for many tasks at once: a task that has run long is dearer to
        move or preempt."""
        return np.zeros(len(ran), dtype=np.int64)

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
        """Cost of taking running tasks off their machine; None: never. ``waited``:
        how long a task with a node of its own waited before it started (Quincy
        charges a preemption as the unscheduled cost of that wait); 0 for a group of
        tasks of several jobs."""
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
    """Quincy (Isard et al., SOSP 2009) as Firmament prices it: the cost of running a
    task on a machine is the data it would read over the network, ``rack_cost`` a GB
    within its rack and ``core_cost`` across racks (times ``data_scale``). A task gets
    preference arcs to the machines and racks holding at least ``machine_threshold``
    / ``rack_threshold`` of its input, priced at that machine's cost and at the
    rack's worst machine's; the arc to the cluster aggregator costs the cluster's worst
    machine's (all of it across racks as soon as a rack holds none of the input).
    Leaving a task unscheduled costs ``wait_cost`` a second waited, on top of its
    cluster arc's cost (so a placement anywhere beats waiting); preempting a running
    task costs its unscheduled cost at the time it started, plus ``preempt_cost``.

    A task with its own input blocks (``Job.task_input``) is a node of its own, with
    its own preferences; while it runs its continuation arc costs what it reads there
    less ``run_discount`` a second it has run (Firmament's d* - p*), and moving it
    costs the new machine's cost plus ``migrate_cost``. Other tasks read their job's
    input evenly (``Job.input``, every copy counted where it is) and share a node."""

    name = "quincy"
    uses_racks = True
    defaults: ClassVar[Mapping[str, float]] = {
        "rack_cost": 1, "core_cost": 4, "data_scale": 100,
        "machine_threshold": 0.1, "rack_threshold": 0.25, "max_preferences": 8,
        "unscheduled_cost": 1000, "wait_cost": 2, "precedence_cost": 1000,
        "migrate_cost": 500, "preempt_cost": 3000, "run_discount": 1,
    }

    def _job_data(self, job: Job, racks: Racks) -> _Data:
        """A task's share of its job's input: the whole input seen at the scale of one
        task."""
        return _Data.of(job.input, racks, self.options["data_scale"] / max(job.task_count, 1))

    def _task_data(self, job: Job, index: int, racks: Racks) -> _Data | None:
        if index >= len(job.task_input):
            return None
        blocks = job.task_input[index]
        return _Data.of_blocks(blocks, racks, self.options["data_scale"])

    def _cost(self, data: _Data, on_machine: float, on_rack: float) -> int:
        return self._price(data.scale, data.total, on_machine, on_rack)

    def _price(self, scale: float, total: float, on_machine: float, on_rack: float) -> int:
        """Quincy's transfer cost: what is read from elsewhere in the rack, and across
        racks."""
        o = self.options
        return round(scale * (o["rack_cost"] * (on_rack - on_machine)
                              + o["core_cost"] * (total - on_rack)))

    def _task_prices(self, data: _Data, racks: Racks) -> tuple[list[Preference], int]:
        """Preferences and the cluster arc of a task (or of a job's shared node), each
        rack's worst machine priced once (both need it). (``_price`` written out: this
        runs for every task that arrives.)"""
        o = self.options
        rack_cost, core_cost = o["rack_cost"], o["core_cost"]
        scale, total = data.scale, data.total
        on_machine, on_rack = data.on_machine, data.on_rack
        worst: dict[str, int] = {}
        for rack, here in on_rack.items():
            holders = data.holders.get(rack, ())
            across = core_cost * (total - here)
            w = -MAX_COST_GUARD
            for m in holders:
                w = max(w, round(scale * (rack_cost * (here - on_machine[m]) + across)))
            if len(holders) < racks.sizes.get(rack, 0):  # a machine holding none
                w = max(w, round(scale * (rack_cost * (here - 0.0) + across)))
            worst[rack] = w
        if len(on_rack) < len(racks.sizes) or not worst:
            cluster = self._cost(data, 0.0, 0.0)
        else:
            cluster = max(worst.values())
        out: list[Preference] = []
        if total > 0:
            at_least = o["machine_threshold"] * total
            most = o["max_preferences"]
            for mid, amount in sorted(on_machine.items(), key=_by_amount):
                if amount < at_least or len(out) >= most:
                    break
                here = on_rack[racks[mid]]
                out.append(Preference(mid, "", round(
                    scale * (rack_cost * (here - amount) + core_cost * (total - here)))))
            at_least = o["rack_threshold"] * total
            for rack, amount in sorted(on_rack.items(), key=_by_amount):
                if amount < at_least:
                    break
                out.append(Preference("", rack, worst[rack]))
        return out, cluster

    def to_cluster(self, job: Job) -> int:
        # Without the cell's racks: the worst case, every byte across the core (the
        # graph manager prices the arc with cluster_cost(), which sees them).
        data = _Data.of(job.input, Racks(), self.options["data_scale"] / max(job.task_count, 1))
        return self._cost(data, 0.0, 0.0)

    def preferences(self, job: Job, racks: Mapping[str, str]) -> Sequence[Preference]:
        r = racks if isinstance(racks, Racks) else Racks(racks)
        return self._task_prices(self._job_data(job, r), r)[0]

    def cluster_cost(self, job: Job, racks: Racks) -> int:
        """The job's shared node's arc to the cluster aggregator (its worst machine)."""
        return self._task_prices(self._job_data(job, racks), racks)[1]

    def task_costs(self, job: Job, index: int, racks: Racks) -> TaskCosts | None:
        data = self._task_data(job, index, racks)
        if data is None:
            return None
        preferences, cluster = self._task_prices(data, racks)
        return TaskCosts(tuple(preferences), cluster)

    def task_prices(self, job: Job, indices: Sequence[int], racks: Racks) -> TaskPrices:
        """:meth:`task_costs` of a job's tasks on arrays: the tasks' input blocks
        flattened into one row per copy on a machine of the cell, then the data on each
        (task, machine) and (task, rack) summed in block order (so the sums are the
        floats :meth:`_Data.of_blocks` makes), each rack's worst machine and the
        thresholds applied per row, and the preferences ordered as
        :meth:`_task_prices` orders them (most data first, then by name)."""
        if not self._arrays_price():
            return super().task_prices(job, indices, racks)
        return self.jobs_task_prices([(job, indices)], racks)[0].prices

    def _arrays_price(self) -> bool:
        """Whether this model prices tasks as Quincy's own methods do (a subclass that
        changes one of them is asked task by task)."""
        return _own_methods(self, QuincyCostModel, "task_costs", "_task_data",
                            "_task_prices", "_price", "_cost")

    def jobs_task_prices(self, asked: Sequence[tuple[Job, Sequence[int]]], racks: Racks
                         ) -> list[JobPrices]:
        """Every job's tasks in one :class:`TaskPrices`: a task's prices depend on
        its own blocks and the options only, so many jobs' rows go through the array
        operations together (a round's 15 jobs of 100 tasks: one pass, not 15)."""
        if not self._arrays_price():
            return super().jobs_task_prices(asked, racks)
        ix = racks.index()
        tasks: list[int] = []
        inputs: list[tuple[Block, ...]] = []
        out: list[tuple[int, list[int]]] = []
        for job, indices in asked:
            given = job.task_input
            n = len(given)
            own = [i for i in indices if i < n]
            out.append((len(tasks), own))
            tasks.extend(own)
            inputs.extend(map(given.__getitem__, own))
        task, block, machine, size, totals = _copies(inputs, ix.position)
        tp = _price_rows(self.options, tasks, totals, task, block, machine, size, ix)
        return [JobPrices(tp, first, own) for first, own in out]

    def tasks_unscheduled(self, job: Job, prices: TaskPrices, waited: float,
                          rows: npt.NDArray[np.int64] | None = None
                          ) -> npt.NDArray[np.int64]:
        if not _own_methods(self, QuincyCostModel, "task_unscheduled", "_waiting"):
            return super().tasks_unscheduled(job, prices, waited, rows)
        cluster = prices.cluster if rows is None else prices.cluster[rows]
        return cluster + self._waiting(waited, job.precedence)

    def transfer(self, job: Job, index: int, machine: str, racks: Racks) -> int:
        if index >= len(job.task_input):
            data = self._job_data(job, racks)
            rack = racks.get(machine)
            return self._cost(data, data.on_machine.get(machine, 0.0),
                              data.on_rack.get(rack, 0.0) if rack is not None else 0.0)
        # Straight from the blocks (no _Data): every task that starts asks this once.
        rack = racks.get(machine)
        total = here = in_rack = 0.0
        for b in job.task_input[index]:
            total += b.size
            if machine in b.on:
                here += b.size
                in_rack += b.size
            elif rack is not None and any(racks.get(m) == rack for m in b.on):
                in_rack += b.size
        return self._price(self.options["data_scale"], total, here, in_rack)

    def run_discounts(self, ran: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        return np.floor(self.options["run_discount"] * np.clip(ran, 0.0, MAX_WAIT)
                        ).astype(np.int64)

    def _waiting(self, waited: float, precedence: int) -> int:
        o = self.options
        return round(o["unscheduled_cost"] + o["wait_cost"] * min(waited, MAX_WAIT)
                     + o["precedence_cost"] * precedence)

    def unscheduled(self, job: Job, waited: float) -> int:
        return self.to_cluster(job) + self._waiting(waited, job.precedence)

    def task_unscheduled(self, job: Job, costs: TaskCosts, waited: float) -> int:
        return costs.cluster + self._waiting(waited, job.precedence)

    def preempt(self, group: Group, waited: float) -> int | None:
        o = self.options
        return round(o["preempt_cost"] + o["precedence_cost"] * group.precedence
                     + o["wait_cost"] * min(waited, MAX_WAIT))

    def sink_tiers(self, load: MachineLoad) -> Sequence[tuple[int, int]]:
        return ((load.slots, 0),) if load.slots > 0 else ()


#: Below any cost a model gives (network.MAX_COST is 2^40).
MAX_COST_GUARD = 2**50


def _by_amount(item: tuple[str, float]) -> tuple[float, str]:
    """Most data first, then by name."""
    return -item[1], item[0]


class _Data(NamedTuple):
    """Where a task's input lies: its total, the data on each machine and rack that
    holds some (a block counted once per machine and once per rack, whatever its
    copies there), the machines of each rack that hold some, and the cost scale. (A
    tuple: one is made for every task that arrives, and a frozen attrs class costs a
    call per field.)"""

    total: float
    on_machine: dict[str, float]
    on_rack: dict[str, float]
    holders: dict[str, list[str]]
    scale: float

    @staticmethod
    def of(amounts: Iterable[tuple[str, float]], racks: Racks, scale: float) -> _Data:
        on_machine: dict[str, float] = {}
        on_rack: dict[str, float] = {}
        holders: dict[str, list[str]] = {}
        total = 0.0
        for mid, amount in amounts:
            total += amount
            rack = racks.get(mid)
            if rack is None:
                continue  # not in the cell: read from elsewhere
            if mid not in on_machine:
                holders.setdefault(rack, []).append(mid)
            on_machine[mid] = on_machine.get(mid, 0.0) + amount
            on_rack[rack] = on_rack.get(rack, 0.0) + amount
        return _Data(total, on_machine, on_rack, holders, scale)

    @staticmethod
    def of_blocks(blocks: Sequence[Block], racks: Racks, scale: float) -> _Data:
        on_machine: dict[str, float] = {}
        on_rack: dict[str, float] = {}
        holders: dict[str, list[str]] = {}
        total = 0.0
        for b in blocks:
            total += b.size
            seen_racks: set[str] = set()
            for mid in b.on:
                rack = racks.get(mid)
                if rack is None:
                    continue
                if mid not in on_machine:
                    holders.setdefault(rack, []).append(mid)
                on_machine[mid] = on_machine.get(mid, 0.0) + b.size
                if rack not in seen_racks:
                    seen_racks.add(rack)
                    on_rack[rack] = on_rack.get(rack, 0.0) + b.size
        return _Data(total, on_machine, on_rack, holders, scale)


def _copies(inputs: Sequence[Sequence[Block]], position: Mapping[str, int]
            ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
                       npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The rows :func:`_price_rows` takes, for tasks whose input blocks are ``inputs``
    (task ``k``'s at ``inputs[k]``): one row per copy of a block on a machine of the
    cell (``position``: machine -> index; a copy elsewhere is read from elsewhere), in
    block order and, within a block, in the order of its copies, giving the task,
    the block (numbered across every task), the machine and the block's size; and
    each task's total input, summed block by block from 0.0 as a Python loop would
    (``np.bincount`` adds its weights in order). Python touches each block and copy
    once, in C-level maps: a round's 3,000 tasks, not 9,000 appends to four lists."""
    blocks = list(chain.from_iterable(inputs))
    on = list(map(_ON, blocks))
    names = list(chain.from_iterable(on))
    where = np.fromiter(map(position.get, names, repeat(-1)), dtype=np.int64,
                        count=len(names))
    sizes = np.fromiter(map(_SIZE, blocks), dtype=np.float64, count=len(blocks))
    block_task = np.repeat(np.arange(len(inputs), dtype=np.int64),
                           np.fromiter(map(len, inputs), dtype=np.int64, count=len(inputs)))
    # (astype: with no block at all, bincount answers int64 zeros)
    totals = np.bincount(block_task, weights=sizes, minlength=len(inputs)).astype(np.float64)
    copy_block = np.repeat(np.arange(len(blocks), dtype=np.int64),
                           np.fromiter(map(len, on), dtype=np.int64, count=len(on)))
    keep = np.flatnonzero(where >= 0)
    block = copy_block[keep]
    return block_task[block], block, where[keep], sizes[block], totals


_ON = attrgetter("on")
_SIZE = attrgetter("size")


def _by_task_then_most(task: npt.NDArray[np.int64], amount: npt.NDArray[Any]
                       ) -> npt.NDArray[np.int64]:
    """The order by task, then most data first, then as given, of rows given in
    (task, name) order: ``np.lexsort((name, -amount, task))`` as two stable sorts
    (a three-key lexsort of a round's 9,000 rows cost a millisecond)."""
    most = np.argsort(-amount, kind="stable")
    return most[np.argsort(task[most], kind="stable")]


def _price_rows(o: Mapping[str, float], tasks: list[int], total: npt.NDArray[np.float64],
                task: npt.NDArray[np.int64], block: npt.NDArray[np.int64],
                machine: npt.NDArray[np.int64], size: npt.NDArray[np.float64],
                ix: RackIndex) -> TaskPrices:
    """Quincy's :meth:`QuincyCostModel._task_prices` for many tasks: one row per copy
    of a block on a machine of the cell (``task``: the task's position in ``tasks``).
    Every cost is the same float expression as there, rounded half to even as
    ``round`` rounds."""
    rack_cost, core_cost, scale = o["rack_cost"], o["core_cost"], o["data_scale"]
    n, nm, nr = len(tasks), len(ix.machines), len(ix.racks)
    rack = ix.rack_of[machine]
    # Data per (task, machine): bincount adds the weights in row order, as the dict did.
    tm, at_tm = np.unique(task * nm + machine, return_inverse=True)
    on_machine = np.bincount(at_tm, weights=size, minlength=len(tm))
    # Data per (task, rack): a block counted once per rack whatever its copies there.
    _, first = np.unique(block * nr + rack, return_index=True)
    first.sort()
    tr, at_tr = np.unique(task[first] * nr + rack[first], return_inverse=True)
    on_rack = np.bincount(at_tr, weights=size[first], minlength=len(tr))
    tr_task, tr_rack = tr // nr, tr % nr
    tm_task, tm_machine = tm // nm, tm % nm
    tm_rack = ix.rack_of[tm_machine]
    tm_at = np.searchsorted(tr, tm_task * nr + tm_rack)  # each holder's (task, rack)
    here = on_rack[tm_at]
    across = core_cost * (total[tm_task] - here)
    # Each rack's worst machine: its holders', and one holding none if the rack has one.
    worst = np.full(len(tr), -np.inf)
    np.maximum.at(worst, tm_at, np.rint(scale * (rack_cost * (here - on_machine) + across)))
    holders = np.bincount(tm_at, minlength=len(tr))
    rack_across = core_cost * (total[tr_task] - on_rack)
    empty = np.rint(scale * (rack_cost * (on_rack - 0.0) + rack_across))
    partly = holders < ix.rack_sizes[tr_rack]
    worst[partly] = np.maximum(worst[partly], empty[partly])
    # The cluster arc: every byte across the core unless every rack holds some.
    cluster = np.rint(scale * (rack_cost * (0.0 - 0.0) + core_cost * (total - 0.0)))
    racks_of = np.bincount(tr_task, minlength=n)
    everywhere = np.flatnonzero((racks_of >= len(ix.racks)) & (racks_of > 0))
    if len(everywhere):
        most = np.full(n, -np.inf)
        np.maximum.at(most, tr_task, worst)
        cluster[everywhere] = most[everywhere]
    # Preferences: machines past the threshold (at most max_preferences, most data
    # first, then by name), then racks past theirs.
    live = total > 0
    pick_m = live[tm_task] & (on_machine >= o["machine_threshold"] * total[tm_task])
    pm = np.flatnonzero(pick_m)
    pm = pm[_by_task_then_most(tm_task[pm], on_machine[pm])]
    rank = np.arange(len(pm)) - np.searchsorted(tm_task[pm], tm_task[pm])
    pm = pm[rank < o["max_preferences"]]
    m_cost = np.rint(scale * (rack_cost * (here[pm] - on_machine[pm])
                              + core_cost * (total[tm_task[pm]] - here[pm])))
    pick_r = live[tr_task] & (on_rack >= o["rack_threshold"] * total[tr_task])
    pr = np.flatnonzero(pick_r)
    pr = pr[_by_task_then_most(tr_task[pr], on_rack[pr])]
    owner = np.concatenate([tm_task[pm], tr_task[pr]])
    # By task, machines before racks, each in its order: a stable sort by task alone
    # (each part ascends by task, the machines' part first).
    order = np.argsort(owner, kind="stable")
    none = np.full(len(pr), -1, dtype=np.int64)
    return TaskPrices(
        tasks, cluster.astype(np.int64),
        np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))]).astype(np.int64),
        np.concatenate([tm_machine[pm], none])[order],
        np.concatenate([np.full(len(pm), -1, dtype=np.int64), tr_rack[pr]])[order],
        np.concatenate([m_cost, worst[pr]]).astype(np.int64)[order],
        ix.machines, ix.racks)


class NetworkAwareCostModel(LoadSpreadingCostModel):
    """Firmament's network-aware policy: network bandwidth is a machine resource (the
    dimension ``resource``, default ``net``) that tasks declare like cpu; a task only
    gets an arc to a machine with enough bandwidth left (the graph manager's fit rule),
    and a machine costs more the more of its bandwidth is taken: by the tasks already
    there (the arc into it), and by each further task placed there in the same round
    (the machine's arcs to the sink, in ``tiers`` steps that each add their share of
    the bandwidth left, ``bandwidth_weight`` for all of it: convex, as Firmament's
    one arc per further task). Load is spread as load-spreading spreads it, too."""

    name = "network"
    defaults: ClassVar[Mapping[str, float]] = {
        **LoadSpreadingCostModel.defaults, "bandwidth_weight": 1000,
    }
    tiers_use_usage = True

    def __init__(self, resource: str = "net", **options: Any) -> None:
        if not isinstance(resource, str) or not resource:
            raise CostModelError("cost model network: option resource must name a "
                                 f"resource dimension, got {resource!r}")
        super().__init__(**options)
        self.resource = resource

    def sink_tiers(self, load: MachineLoad) -> Sequence[tuple[int, int]]:
        spread = _tiers(load.slots, load.others, 1000, int(self.options["tiers"]))
        cap = load.machine.capacity.get(self.resource)
        taken = min(load.outside.get(self.resource) / cap, 1.0) if cap > 0 else 1.0
        bandwidth = _tiers(load.slots, taken, self.options["bandwidth_weight"],
                           int(self.options["tiers"]))
        return [(n, a + b) for (n, a), (_, b) in zip(spread, bandwidth, strict=True)]

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
                        LoadSpreadingCpuCostModel, LoadSpreadingRamCostModel)
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


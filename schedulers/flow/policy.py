"""The flow-based scheduler (Firmament, seed 003 §3-§7) as a policy of the runtime.

Each round: the graph manager brings the network up to date from what changed in the
cell, a min-cost-flow solver solves it, and the extraction turns the flow into claims
(placements, migrations of this scheduler's running tasks, preemptions). The runtime
commits them as transactions like any other scheduler's, so the store validates them
against everyone else's; a claim that lost a race is simply gone from the next round's
network or placed again by it.

Rounds run when jobs are due (new work) and every ``interval`` seconds for
rescheduling; a rescheduling round with nothing changed since the last one solves
nothing and commits nothing. A task moved or preempted by this scheduler is not moved
again for ``move_guard`` seconds, so costs that see-saw cannot start a migration storm.

Options (constructor keywords or the scheduler's ``[options]`` table):

* ``policy``: the cost model, ``quincy`` (default), ``load-spread``, ``network``,
  ``trivial`` (and their single-resource forms ``trivial-cpu``, ``load-spread-ram``,
  ...) or ``aladdin`` (``schedulers/flow/costs.py``, ``schedulers/flow/aladdin/``),
  one an installed package declares in the ``omega.flow_cost_models`` entry-point
  group, or a ``CostModel`` instance; cost models price the arcs of the graph
  manager's network. Or a *planner* (``planners.py``: ``aladdin``, Aladdin+H), which
  plans whole rounds on networks of its own;
* ``solver``: ``firmament`` (our relaxation and cost scaling, warm-started round to
  round: ``schedulers/flow/mcf``), ``ortools`` (OR-Tools from scratch every round)
  or ``networkx`` (exact and slow: tests); ``choice.DEFAULT_SOLVER`` by default;
* ``interval`` (1.0 s), ``move_guard`` (60 s);
* ``preempt_below``: also offer other schedulers' running tasks of a precedence below
  this to be preempted (by tasks of a higher precedence only); default: never;
* ``costs``: a table of the cost model's (or planner's) own options (e.g.
  ``migrate_cost``; ``groups`` for ``aladdin``).

Between rounds the runtime hands the policy the cell's changes (:meth:`FlowPolicy.absorb`,
where ``RuntimeConfig.absorb_when_idle``: a scheduler process), and the network takes
them in then, so that a round updates only what arrived since.

What the rounds did is kept in ``rounds`` and summed up by :meth:`FlowPolicy.report`
(``omega status`` shows it): the last round, medians over the last ``RECENT`` rounds
and totals since the start.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from cellstate.codec import MAX_PRECEDENCE
from cellstate.model import Job
from schedulers.api import Context, Plan, Policy, Unplaced
from schedulers.flow.choice import DEFAULT_SOLVER, SOLVERS, cold
from schedulers.flow.costs import CostModel, CostModelError, make_cost_model
from schedulers.flow.extract import extract
from schedulers.flow.graph import GraphManager
from schedulers.flow.mcf import FirmamentSolver
from schedulers.flow.planners import (
    PLANNERS,
    PlannerError,
    RoundOutcome,
    RoundPlanner,
    make_planner,
)
from schedulers.flow.solvers import SolveError, Solver
from schedulers.options import OptionError, Options
from schedulers.placement import impossible

OPTIONS = ("policy", "solver", "interval", "move_guard", "preempt_below", "costs")
#: Rounds the medians of :meth:`FlowPolicy.report` are taken over.
RECENT = 100


class FlowOptionError(OptionError):
    """A flow scheduler option is unknown or has a value it cannot use."""


@attrs.frozen
class Round:
    """What one round did and what each of its parts took (seconds)."""

    at: float
    update: float
    solve: float
    extract: float
    nodes: int
    arcs: int
    placed: int
    migrated: int
    preempted: int
    unscheduled: int
    repaired: int
    stale: int
    full_build: bool
    spilled: int = 0
    algorithm: str = ""  # what solved it, where the solver says ("relax", ...)


class FlowPolicy(Policy):
    name = "flow"
    propose_interval: float | None = 1.0
    absorbs_changes: bool = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._configured = False
        self._configure(options)
        self.rounds: deque[Round] = deque(maxlen=1000)
        # The clock a round's parts are timed with (a simulator injects CPU time).
        self.timer: Callable[[], float] = time.perf_counter
        self._graph: GraphManager | None = None
        self._totals: dict[str, int] = dict.fromkeys(_TOTALS, 0)
        self._report: Mapping[str, float | int] = {}
        # The network took in changes (absorb) that no round has solved for yet.
        self._unsolved = False
        self._absorb_seconds = 0.0  # spent in absorb since the start

    def warm_up(self) -> None:
        """Load the solver's compiled kernels now, not in the first round: the
        simulator charges a round's measured time as its decision time, and a
        process's first solve would carry the loading (a compile where numba's cache
        lacks the kernels), which in a short run can be longer than the run."""
        if isinstance(self.solver, FirmamentSolver) or isinstance(self._pass_solver,
                                                                  FirmamentSolver):
            from schedulers.flow.mcf.compile import warm

            warm()

    def _configure(self, options: Mapping[str, Any]) -> None:
        o = Options(options, "flow scheduler", OPTIONS, FlowOptionError)
        policy = options.get("policy", "quincy")
        costs = o.table("costs")
        self.move_guard = o.number("move_guard", 60.0, 0.0, 86_400.0)
        # A cost model prices the graph manager's arcs; a planner plans whole rounds
        # on networks of its own (planners.py). A name is one or the other.
        self.model: CostModel | None = None
        self.planner: RoundPlanner | None = None
        if isinstance(policy, CostModel):
            self.model = policy  # a model made by the caller (tests, the simulator)
        elif not isinstance(policy, str):
            raise FlowOptionError(f"flow scheduler: option policy must name a cost model "
                                  f"or a planner, got {policy!r}")
        elif policy in PLANNERS:
            try:
                self.planner = make_planner(policy, dict(costs), self.move_guard)
            except PlannerError as e:
                raise FlowOptionError(f"flow scheduler: option policy: {e}") from None
        else:
            try:
                self.model = make_cost_model(policy, **dict(costs))
            except CostModelError as e:
                raise FlowOptionError(f"flow scheduler: option policy: {e} (planners: "
                                      f"{', '.join(sorted(PLANNERS))})") from None
        self.policy_name = policy if isinstance(policy, str) else policy.name
        solver = options.get("solver", DEFAULT_SOLVER)
        if not isinstance(solver, str) or solver not in SOLVERS:
            raise FlowOptionError(f"flow scheduler: option solver must be one of "
                                  f"{', '.join(sorted(SOLVERS))}, got {solver!r}")
        try:
            self.solver: Solver = SOLVERS[str(solver)]()
        except SolveError as e:
            raise FlowOptionError(f"flow scheduler: option solver: {e}") from None
        # A planner's passes are networks of their own: nothing to start from.
        self._pass_solver = cold(self.solver)
        self.interval = o.number("interval", 1.0, 0.0, 3600.0)
        self.propose_interval = self.interval
        # Unset: never preempt others' tasks (no default precedence would mean that).
        self.preempt_below: int | None = (
            None if options.get("preempt_below") is None
            else o.integer("preempt_below", 0, 0, MAX_PRECEDENCE + 1))
        # A planner regroups the cell each round: it has no network to keep up to date.
        self.absorbs_changes = self.planner is None

    def _setup(self, ctx: Context) -> None:
        if not self._configured and ctx.options:
            # Options from the scheduler's config file (Context.options) complete
            # those given to the constructor.
            # (and are checked as strictly).
            self._configure({**ctx.options, **self.options})
        self._configured = True

    def graph(self, ctx: Context) -> GraphManager:
        if self._graph is None:
            self._setup(ctx)
            assert self.model is not None  # a planner's rounds build no graph
            self._graph = GraphManager(self.model, ctx.scheduler, ctx.instance,
                                       move_guard=self.move_guard,
                                       preempt_below=self.preempt_below)
        return self._graph

    # -- the runtime's hooks -------------------------------------------------------------

    def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        return self._round(ctx, jobs)

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        return self._round(ctx, [job])

    def absorb(self, ctx: Context) -> bool:
        """Take the changes into the network between rounds (Firmament applies cluster
        events as they come): the next round's update has only what arrived since.
        The round still brings time-dependent costs and guards to its own time."""
        self._setup(ctx)
        if self.planner is not None:
            return False  # its rounds regroup the cell themselves
        t0 = self.timer()
        self.graph(ctx).update(ctx.view.snap, ctx.changes, ctx.now)
        self._absorb_seconds += self.timer() - t0
        self._totals["absorbs"] += 1
        self._unsolved = True
        return True

    def propose(self, ctx: Context) -> Plan:
        self._setup(ctx)
        if self.planner is not None:
            if ctx.view.inflight:
                # Claims not in the snapshot yet: no round now. The changes handed over
                # go to no later round, so the planner notes which jobs they name.
                self.planner.note_changes(ctx)
                return Plan()
            if self.planner.idle(ctx):
                return Plan()  # nothing changed, nothing waits
            return self._round(ctx, [])
        graph = self.graph(ctx)
        if (graph.built and ctx.changes is not None and not ctx.changes and not self._unsolved
                and not graph.due(ctx.now) and not graph.has_waiting()):
            return Plan()  # nothing changed and nothing waits: nothing to decide
        if ctx.view.inflight:
            # The network cannot see claims committed since the snapshot (the view can,
            # on machines, but the network counts room from the snapshot): rescheduling
            # now would plan on room already taken. The replica catches up in moments.
            # What changed up to this snapshot is handed to no later round: the network
            # takes it now (and the next round has that much less to update).
            graph.update(ctx.view.snap, ctx.changes, ctx.now)
            self._unsolved = True
            return Plan()
        return self._round(ctx, [])

    # -- a round ---------------------------------------------------------------------------

    def _round(self, ctx: Context, due: Sequence[Job]) -> Plan:
        self._setup(ctx)
        if self.planner is not None:
            return self._planned_round(ctx, due, self.planner)
        graph = self.graph(ctx)
        t0 = self.timer()
        full = graph.update(ctx.view.snap, ctx.changes, ctx.now).full
        t1 = self.timer()
        net = graph.net.arrays(compact=not getattr(self.solver, "slot_arrays", False))
        solution = self.solver.solve(net)
        t2 = self.timer()
        stats = getattr(self.solver, "last", None)
        algorithm = str(getattr(stats, "algorithm", ""))
        latest = ctx.latest() if ctx.latest is not None else None
        ex = extract(graph, net, solution.flow, ctx.view, latest)
        graph.note_moved(ex.moved, ctx.now)
        for jid, mid in ex.turned_back:
            graph.block(jid, mid, ctx.now)
        t3 = self.timer()
        self._unsolved = False
        self._record(Round(ctx.now, t1 - t0, t2 - t1, t3 - t2, net.nodes, graph.net.arc_count,
                           ex.placed, ex.migrated, ex.preempted,
                           sum(ex.unscheduled.values()), ex.repaired, ex.stale, full,
                           ex.spilled, algorithm))
        return Plan(tuple(ex.claims), tuple(self._unplaced(ctx, due, ex)))

    def _planned_round(self, ctx: Context, due: Sequence[Job], planner: RoundPlanner) -> Plan:
        ex, fig = planner.plan(ctx, self._pass_solver)
        self._record(Round(ctx.now, fig.update, fig.solve, fig.extract, fig.nodes, fig.arcs,
                           ex.placed, ex.migrated, ex.preempted,
                           sum(ex.unscheduled.values()), ex.repaired, ex.stale, fig.regrouped,
                           ex.spilled))
        return Plan(tuple(ex.claims), tuple(self._unplaced(ctx, due, ex)))

    # -- metrics ---------------------------------------------------------------------------

    def report(self) -> Mapping[str, float | int]:
        """The last round (``last_*``: its parts in milliseconds, the network's size,
        the claims it made), medians over the last ``RECENT`` rounds (``median_*``)
        and totals since the start (``rounds``, ``placed``, ``moved``, ``preempted``,
        ``repaired``, ``stale``, ``full_builds``; ``absorbs`` and ``absorb_ms``: the
        updates made between rounds, :meth:`absorb`). Claims made, not claims committed:
        the runtime's own metrics count what the store accepted."""
        return self._report

    def _record(self, r: Round) -> None:
        self.rounds.append(r)
        t = self._totals
        t["rounds"] += 1
        t["placed"] += r.placed
        t["moved"] += r.migrated
        t["preempted"] += r.preempted
        t["repaired"] += r.repaired
        t["stale"] += r.stale
        t["spilled"] += r.spilled
        t["full_builds"] += r.full_build
        if r.algorithm:
            # Rounds each of the solver's algorithms solved (Firmament's race).
            key = f"solved_by_{r.algorithm.replace('-', '_')}"
            t[key] = t.get(key, 0) + 1
        recent = list(itertools.islice(reversed(self.rounds), RECENT))
        # A new mapping each time: report() is read from the metrics thread.
        self._report = {
            **t,
            "last_update_ms": 1000 * r.update, "last_solve_ms": 1000 * r.solve,
            "last_extract_ms": 1000 * r.extract, "last_nodes": r.nodes, "last_arcs": r.arcs,
            "last_placed": r.placed, "last_moved": r.migrated, "last_preempted": r.preempted,
            "last_unscheduled": r.unscheduled,
            "median_update_ms": 1000 * statistics.median(x.update for x in recent),
            "median_solve_ms": 1000 * statistics.median(x.solve for x in recent),
            "median_extract_ms": 1000 * statistics.median(x.extract for x in recent),
            "absorb_ms": 1000 * self._absorb_seconds,
        }

    def _unplaced(self, ctx: Context, due: Sequence[Job], ex: RoundOutcome
                  ) -> list[Unplaced]:
        out = []
        for job in due:
            n = ex.unscheduled.get(job.id, 0)
            if not n:
                continue
            why = impossible(ctx.view, job)
            if why is not None:
                out.append(Unplaced(job.id, why, n, permanent=True))
                continue
            reason = ex.why.get(job.id) or (
                f"the {self.policy_name} policy left {n} task(s) unscheduled this round "
                "(no machine has room, or waiting costs less than any placement)")
            out.append(Unplaced(job.id, reason, n))
        return out


_TOTALS = ("rounds", "placed", "moved", "preempted", "repaired", "stale", "spilled",
           "full_builds", "absorbs")

"""Medea (Garefalakis et al., EuroSys 2018) as a baseline for Aladdin+H (seed 002
§4.2): long-running applications placed by an integer linear program, solved batch by
batch with OR-Tools' CP-SAT under a time limit per batch, as Medea's ILP is.

**The program** (one per batch: the waiting jobs in submission order, at most
``batch`` tasks):

* ``n[j, m]``, a whole number: the tasks of job ``j`` on candidate machine ``m``, at
  most as many as fit its free room and its tasks-per-machine rule allows;
* capacity: on each machine and in every dimension, the batch's tasks fit the room
  left (counted in thousandths, room rounded down and demands up);
* an affinity group (``placement.founds_group``) on one machine or none, whole; a gang
  all or nothing;
* anti-affinity between jobs of the batch, both ways as the store checks it: two jobs
  one of whose rule matches the other's labels share no machine;
* the rules against tasks already running, and machine selectors, keep a machine out
  of a job's candidates (``placement.why_not``), as Medea's tag constraints do;
* objective: Medea's weighted sum of tasks placed and machines used, with weights
  such that one more task placed outweighs any number of machines newly used
  (``(candidates + 1) * placed - w_machines * opened``; with Medea's own normalized
  weights of 1 and 1, a batch of more tasks than candidate machines leaves tasks
  waiting rather than use one more machine). Constraint violations, Medea's third
  term, are not allowed here (the store refuses them), so they are hard constraints
  rather than a cost.

**Candidates.** A program over every machine for every job is too large to solve in
a batch's time (Medea too considers a subset of nodes); each job gets the machines its
rules allow that have room for one of its tasks, the tightest first (least room left
in the dimension the task needs most, as a share of the machine: best fit), until
they hold its tasks ``cover`` times over, plus ``extra`` more.

**Periodic batches** (``window``, seconds; 0 by default). Medea runs its ILP for
long-running applications periodically, on what arrived since. With
``window`` set, a job is not placed when it arrives: the runtime's decision for it
only says it waits, and every ``window`` seconds (``propose``) one run of programs
takes every job of this instance still waiting, in submission order, in batches of
``batch`` tasks. Jobs wait for their turn without counting as failed attempts
(``requeue_interval``). With 0, each decision's due jobs are solved at once, as
before.

Options: ``batch`` (200 tasks), ``time_limit`` (1.0 s per batch, also the
deterministic-time limit, so a batch solved before either limit is the same every
run), ``cover`` (2), ``extra`` (8), ``w_machines`` (1; 0 to 1, 0: machines used
cost nothing), ``window`` (0). CP-SAT runs
one worker (the machine is shared) and needs OR-Tools (the ``ortools`` extra).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from cellstate.cell import holding
from cellstate.fit import Rule
from cellstate.model import Claim, Job, Resources, selector_matches_labels
from schedulers.api import CellView, Context, Plan, Policy, Unplaced
from schedulers.machinearrays import Floats, MachineArrays
from schedulers.placement import founds_group, waiting, why_not
from schedulers.runtime import owner_of

#: Room and demands are counted in these parts of a unit.
SCALE = 1000


@attrs.frozen
class MedeaOptions:
    batch: int = 200
    time_limit: float = 1.0
    cover: float = 2.0
    extra: int = 8
    w_machines: float = 1.0
    window: float = 0.0


_LIMITS: dict[str, tuple[float, float, bool]] = {  # option -> (lowest, highest, whole)
    "batch": (1, 100_000, True), "time_limit": (0.001, 3600, False),
    "cover": (1, 100, False), "extra": (0, 10_000, True),
    "w_machines": (0, 1, False), "window": (0, 86_400, False),
}


def medea_options(options: dict[str, Any]) -> MedeaOptions:
    """The options, checked: each error names the option and what it takes."""
    unknown = sorted(set(options) - set(_LIMITS))
    if unknown:
        raise ValueError(f"medea policy: unknown option(s) {', '.join(unknown)} (known: "
                         f"{', '.join(sorted(_LIMITS))})")
    out: dict[str, Any] = {}
    for key, value in options.items():
        lo, hi, whole = _LIMITS[key]
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not lo <= value <= hi
                or (whole and value != int(value))):
            kind = "a whole number" if whole else "a number"
            raise ValueError(f"medea policy: option {key} must be {kind} from {lo:g} to "
                             f"{hi:g}, got {value!r}")
        out[key] = int(value) if whole else float(value)
    return MedeaOptions(**out)


@attrs.define
class _Entry:
    """A job of the batch: its units (one task each, or one whole affinity group)."""

    job: Job
    pending: list[int]
    unit: Resources  # what one unit needs on its machine
    size: int  # tasks per unit
    units: int
    whole: bool  # a gang: every unit or none
    candidates: list[tuple[int, int]] = attrs.field(factory=list)  # (machine, most units)


class MedeaPolicy(Policy):
    name: ClassVar[str] = "medea"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.opts = medea_options(dict(options))
        try:
            from ortools.sat.python import cp_model
        except ImportError as e:  # the ortools extra is not installed
            raise ValueError(f"medea policy: needs OR-Tools (pip install "
                             f"'omega-cell[ortools]'): {e}") from None
        self._cp = cp_model
        #: Batches solved, the seconds their solves took, and how each ended.
        self.batches = 0
        self.solve_seconds = 0.0
        self.statuses: dict[str, int] = {}
        if self.opts.window > 0:
            self.propose_interval = self.opts.window
            self.requeue_interval = self.opts.window

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        return self.schedule_jobs(ctx, [job])

    def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        if self.opts.window > 0:
            # Placed by the next periodic run (propose); until then the job waits.
            why = f"medea: waits for the next periodic batch (every {self.opts.window:g} s)"
            return Plan((), tuple(Unplaced(j.id, why, len(p))
                                  for j in jobs if (p := ctx.view.pending_tasks(j))))
        return self._run(ctx, jobs)

    def propose(self, ctx: Context) -> Plan:
        """The periodic run: every job of this instance still waiting."""
        if self.opts.window <= 0:
            return Plan()
        snap = ctx.view.snap
        members = tuple(snap.live_instances(ctx.scheduler)) or (ctx.instance,)
        mine = [j for j in snap.jobs.values()
                if j.scheduler == ctx.scheduler and j.id not in snap.statuses
                and owner_of(j.id, members) == ctx.instance]
        mine.sort(key=lambda j: (j.submitted_at, j.id))
        return self._run(ctx, mine)

    def _run(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        view = ctx.view
        cells = MachineArrays(view, [j.task_resources for j in jobs])
        claims: list[Claim] = []
        unplaced: list[Unplaced] = []
        batch: list[_Entry] = []
        tasks = 0
        for job, pending in waiting(view, jobs, unplaced):
            if batch and tasks + len(pending) > self.opts.batch:
                self._solve(view, cells, batch, claims, unplaced)
                batch, tasks = [], 0
            batch.append(_entry(view, job, pending))
            tasks += len(pending)
        if batch:
            self._solve(view, cells, batch, claims, unplaced)
        return Plan(tuple(claims), tuple(unplaced))

    # -- one batch -----------------------------------------------------------------------

    def _solve(self, view: CellView, cells: MachineArrays, batch: list[_Entry],
               claims: list[Claim], unplaced: list[Unplaced]) -> None:
        for e in batch:
            e.candidates = self._candidates(view, cells, e)
        cp = self._cp
        model = cp.CpModel()
        n: dict[tuple[int, int], Any] = {}  # (entry, machine) -> units there
        on: dict[tuple[int, int], Any] = {}  # (entry, machine) -> some there
        per_machine: dict[int, list[tuple[int, Any]]] = {}
        placed_terms = []
        for x, e in enumerate(batch):
            total = []
            for i, most in e.candidates:
                var = model.new_int_var(0, most, f"n{x}_{i}")
                n[x, i] = var
                total.append(var)
                per_machine.setdefault(i, []).append((x, var))
            if not total:
                continue
            s = sum(total)
            if e.whole:
                all_in = model.new_bool_var(f"all{x}")
                model.add(s == e.units * all_in)
            else:
                model.add(s <= e.units)
            placed_terms.append(s * e.size)
        dims = len(cells.dims)
        opened = []
        for i, users in per_machine.items():
            room = np.floor(cells.free[i] * SCALE + 1e-6)
            for d in range(dims):
                need = [(math.ceil(cells.vector(batch[x].unit)[d] * SCALE - 1e-6), var)
                        for x, var in users]
                need = [(c, var) for c, var in need if c > 0]
                if need:
                    model.add(sum(c * var for c, var in need) <= int(max(room[d], 0)))
            if not (cells.free[i] + 1e-9 >= cells.cap[i]).all():
                continue  # in use already: using it costs nothing more
            used = model.new_bool_var(f"open{i}")
            for _, var in users:
                model.add(var == 0).only_enforce_if(used.Not())
            opened.append(used)
        # Anti-affinity between the batch's jobs, both ways.
        for x, a in enumerate(batch):
            sel = a.job.constraints.anti_affinity
            if not sel:
                continue
            for y, b in enumerate(batch):
                if y == x or not selector_matches_labels(sel, b.job.labels):
                    continue
                shared = {i for i, _ in a.candidates} & {i for i, _ in b.candidates}
                for i in sorted(shared):
                    model.add_bool_or([self._some(model, on, n, x, i).Not(),
                                       self._some(model, on, n, y, i).Not()])
        place = 1000 * (len(opened) + 1)
        model.maximize(place * sum(placed_terms)
                       - round(1000 * self.opts.w_machines) * sum(opened))
        solver = cp.CpSolver()
        solver.parameters.max_time_in_seconds = self.opts.time_limit
        solver.parameters.max_deterministic_time = self.opts.time_limit
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 1
        t0 = time.perf_counter()
        status = solver.solve(model)
        self.solve_seconds += time.perf_counter() - t0
        self.batches += 1
        name = solver.status_name(status)
        self.statuses[name] = self.statuses.get(name, 0) + 1
        ok = status in (cp.OPTIMAL, cp.FEASIBLE)
        for x, e in enumerate(batch):
            got = 0
            if ok:
                for i, _ in e.candidates:
                    for _ in range(int(solver.value(n[x, i]))):
                        got += self._claim(view, cells, e, got, i, claims)
            left = len(e.pending) - got * e.size
            if left:
                why = ("medea: no solution within the batch's time limit" if not ok else
                       f"medea: {left} task(s) left out of the batch's program (no "
                       "candidate machine had room, or its objective did not place them)")
                unplaced.append(Unplaced(e.job.id, why, left))

    @staticmethod
    def _some(model: Any, on: dict[tuple[int, int], Any], n: dict[tuple[int, int], Any],
              x: int, i: int) -> Any:
        """A truth value: entry ``x`` has some units on machine ``i``."""
        if (x, i) not in on:
            b = model.new_bool_var(f"on{x}_{i}")
            model.add(n[x, i] >= 1).only_enforce_if(b)
            model.add(n[x, i] == 0).only_enforce_if(b.Not())
            on[x, i] = b
        return on[x, i]

    def _claim(self, view: CellView, cells: MachineArrays, e: _Entry, done: int, i: int,
               claims: list[Claim]) -> int:
        """Claim the ``done``-th unit of ``e`` on machine ``i``: 1 if claimed."""
        indices = e.pending[done * e.size:(done + 1) * e.size]
        for index in indices:
            claims.append(view.claim(e.job, index, cells.mids[i]))
        cells.take(i, e.unit)
        return 1

    def _candidates(self, view: CellView, cells: MachineArrays, e: _Entry
                    ) -> list[tuple[int, int]]:
        """(machine, most units) for the machines the job's rules allow, best fit first,
        until they hold its units ``cover`` times over, then ``extra`` more."""
        need = cells.vector(e.unit)
        fitting = cells.fitting(need)
        if not len(fitting):
            return []
        cap = cells.cap[fitting]
        scale = np.where(cap > 0, cap, 1.0)
        main = int(np.argmax(need / np.maximum(cells.cap.mean(axis=0), 1e-9)))
        left = (cells.free[fitting, main] - need[main]) / scale[:, main]
        order = fitting[np.lexsort((fitting, left))]
        limit = e.job.constraints.max_per_machine
        founding = e.size > 1
        out: list[tuple[int, int]] = []
        covered = extra = 0
        want = self.opts.cover * e.units
        for i in order.tolist():
            if covered >= want and extra >= self.opts.extra:
                break
            m = view.machine(cells.mids[i])
            if m is None:
                continue
            miss = why_not(view, e.job, m, founding=founding)
            if miss is not None and miss.rule is not Rule.RESOURCES:
                continue
            most = _units_in(cells.free[i], need)
            if limit:
                own = sum(1 for a in holding(m, view.gangs) if a.job == e.job.id)
                most = min(most, limit - own)
            most = min(most, e.units)
            if most <= 0:
                continue
            out.append((i, most))
            if covered >= want:
                extra += 1
            covered += most
        return out


def _entry(view: CellView, job: Job, pending: list[int]) -> _Entry:
    if founds_group(view, job):
        r = job.task_resources
        whole = Resources(tuple((d, a * len(pending)) for d, a in r.amounts))
        return _Entry(job, pending, whole, len(pending), 1, True)
    return _Entry(job, pending, job.task_resources, 1, len(pending), job.gang)


def _units_in(free: Floats, need: Floats) -> int:
    mask = need > 0
    if not mask.any():
        return 1 << 20
    return max(0, int(np.floor((free[mask] / need[mask] + 1e-9).min())))

"""The scheduler plugin interface.

A policy is a small class. It reads the cell only through a :class:`Context` (a
read-only view of a snapshot with the scheduler's own not-yet-visible claims laid over
it) and writes only by returning a :class:`Plan`; the runtime owns queueing, commit,
retry, backoff, give-up and metrics (``schedulers/runtime.py``).

A policy implements the hooks it needs; the runtime calls whichever it has:

* :meth:`Policy.schedule_job` -- one job at a time (batch, service).
* :meth:`Policy.schedule_jobs` -- every due job of its queue at once, free to preempt or
  resize (a flow scheduler that re-solves the whole workload each round). If a policy
  overrides it, the runtime calls it instead of ``schedule_job``.
* :meth:`Policy.propose` -- every ``propose_interval`` seconds, with no new job (an
  elastic MapReduce scheduler that grows running jobs; a fair-share rebalancer).
* :meth:`Policy.report` -- numbers of the policy's own (a flow scheduler's solve
  times), merged into the metrics the instance reports (``omega status`` shows them).

Expected outcomes are values: a plan says which tasks it could not place and why
(``Unplaced``), and whether that will never change (``permanent``: e.g. a task larger
than every machine), so "why is my job pending?" always has an answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from cellstate.cell import CellSnapshot, alloc_placed, machine_used, task_view
from cellstate.fit import FitReport, machine_up, resources
from cellstate.keys import KeyKind
from cellstate.model import (
    PLACEABLE,
    Allocation,
    Claim,
    Fallback,
    GangRecord,
    Job,
    Machine,
    Resources,
    task_id,
    task_precedence,
    trusted_allocation,
    trusted_claim,
)


@attrs.frozen
class Unplaced:
    """Tasks of a job the policy could not place, and why.

    ``fit`` is how many machines each fit rule excluded when the policy last looked
    (``cellstate.fit.FitTally``); put its text in ``reason`` too, which is what the
    runtime records on a job it gives up on."""

    job: str
    reason: str
    tasks: int = 1
    permanent: bool = False  # no state of the cell would let them fit: abandon now
    fit: FitReport | None = None
    # The reason's name in pending reports (``omega why``); "" for ``fit`` when there
    # is a tally, else ``policy``. The runtime names its own: ``limit``.
    code: str = ""


@attrs.frozen
class Plan:
    """What a policy wants: claims (which may evict), job resizes, and what it could not
    place. Claims are committed in order, as one transaction per job."""

    claims: tuple[Claim, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    resize: Mapping[str, int] = attrs.field(factory=dict)  # job -> new task count

    @property
    def empty(self) -> bool:
        return not self.claims and not self.resize


class CellView:
    """A snapshot plus the scheduler's own claims that the snapshot does not show yet:
    those it committed since (until its replica catches up) and those made earlier in
    the current decision. Read-only for policies except through :meth:`claim`."""

    def __init__(self, snap: CellSnapshot, scheduler: str,
                 pending: Sequence[tuple[Claim, Job]] = (),
                 machine_ids: Sequence[str] | None = None) -> None:
        self.snap = snap
        self.scheduler = scheduler
        self._machine_ids = machine_ids
        self._extra: dict[str, dict[str, Allocation]] = {}
        self._overlays: dict[str, Machine] = {}  # one record per machine and claim
        self._gone: dict[str, set[str]] = {}
        self._placed: set[str] = set()
        self._claims: list[Claim] = []
        for claim, job in pending:
            self._add(claim, job)
        self.inflight = len(pending)  # own committed claims the snapshot does not show

    # -- reads ----------------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self.snap.revision

    @property
    def gangs(self) -> Mapping[str, GangRecord]:
        return self.snap.gangs

    @property
    def jobs(self) -> Mapping[str, Job]:
        return self.snap.jobs

    def machine_ids(self) -> list[str]:
        """Every machine id (a new list the caller may reorder)."""
        if self._machine_ids is not None:
            return list(self._machine_ids)
        return list(self.snap.machines.keys())

    def machine_id_list(self) -> Sequence[str]:
        """Every machine id, as :meth:`machine_ids` lists them, without the copy (a
        list of every machine, per decision): the caller must not change it."""
        if self._machine_ids is not None:
            return self._machine_ids
        return list(self.snap.machines.keys())

    def machines(self) -> Iterator[Machine]:
        for mid, m in self.snap.machines.items():
            yield m if mid not in self._extra and mid not in self._gone else self._overlaid(m)

    def machine(self, mid: str) -> Machine | None:
        m = self.snap.machines.get(mid)
        if m is None or (mid not in self._extra and mid not in self._gone):
            return m
        return self._overlaid(m)

    def _overlaid(self, m: Machine) -> Machine:
        # Kept until the next claim on the machine, so its settled usage is summed
        # once, not at every look.
        done = self._overlays.get(m.id)
        if done is not None:
            return done
        gone = self._gone.get(m.id, ())
        allocs = {t: a for t, a in m.allocations.items() if t not in gone}
        allocs.update(self._extra.get(m.id, {}))
        done = self._overlays[m.id] = m.with_allocations(allocs)
        return done

    def used(self, mid: str) -> Resources:
        m = self.machine(mid)
        return machine_used(m, self.snap.gangs) if m is not None else Resources()

    def free(self, mid: str) -> Resources:
        m = self.machine(mid)
        if m is None:
            return Resources()
        used = machine_used(m, self.snap.gangs)
        return Resources(tuple((n, a - used.get(n)) for n, a in m.capacity.amounts
                               if a - used.get(n) > 1e-9))

    def fits(self, mid: str, need: Resources, freed: Resources | None = None) -> bool:
        """Whether ``need`` fits on machine ``mid`` now (once ``freed`` is freed), and
        it is up: the store's resource rule only (``schedulers.placement.can_host``
        checks every rule)."""
        m = self.machine(mid)
        if m is None or machine_up(m) is not None:
            return False
        used = machine_used(m, self.snap.gangs)
        return resources(need, m, used, freed or Resources()) is None

    def pending_tasks(self, job: Job) -> list[int]:
        """Indexes of the job's tasks that may be claimed now, as far as this view
        knows (not placed, not claimed earlier in this decision)."""
        out = []
        tasks = self.snap.tasks
        for i in range(job.task_count):
            t = task_id(job.id, i)
            if t in self._placed:
                continue
            if t not in tasks:
                out.append(i)  # never placed: pending (what task_view says, sooner)
                continue
            v = task_view(self.snap, t)
            if v.state in PLACEABLE and not v.reserved_by:
                out.append(i)
        return out

    def claimed(self, task: str) -> bool:
        """Whether the scheduler's own claims have placed the task where the snapshot
        cannot show it yet: committed since it was taken, or earlier in this decision.
        A policy that keeps its own record of waiting tasks (a flow network updated
        from snapshots) must not claim such a task again."""
        return task in self._placed

    def placed_tasks(self, job: str) -> list[tuple[str, str]]:
        """(task id, machine) of the job's tasks that run or were claimed."""
        out = []
        for m in self.machines():
            for a in m.allocations.values():
                if a.job == job and (a.task in self._placed or alloc_placed(a, self.snap.gangs)):
                    out.append((a.task, m.id))
        return out

    # -- the decision's own claims -----------------------------------------------------

    def claim(self, job: Job, index: int, mid: str, evict: Sequence[str] = (),
              fallbacks: Sequence[str] = (), moves_from: str = "") -> Claim:
        """Record a claim in this decision (so later choices see it on ``mid``) and
        return it. ``fallbacks``: other machines the store may take, in order, if
        ``mid`` no longer fits when it commits (at most ``MAX_FALLBACKS``).
        ``moves_from``: the machine the task runs on now, which it leaves."""
        m = self.snap.machines[mid]
        alts = (tuple(Fallback(f, self.snap.machines[f].seq) for f in fallbacks)
                if fallbacks else ())
        c = trusted_claim(job.id, index, mid, m.seq, tuple(evict), alts, moves_from)
        self._add(c, job)
        self._claims.append(c)
        return c

    def claim_many(self, jobs: Sequence[Job], indexes: Sequence[int],
                   machines: Sequence[Machine]) -> list[Claim]:
        """:meth:`claim` of task ``indexes[k]`` of ``jobs[k]`` on ``machines[k]``, for
        each k in order, none evicting, moving or with fallbacks: the same claims and
        the same view after (a flow round places thousands of tasks). ``machines`` are
        the snapshot's records (``snap.machines``), as the caller looked them up."""
        sched, overlays, extras, placed = (self.scheduler, self._overlays, self._extra,
                                           self._placed)
        out = []
        last: Machine | None = None
        mid, seq = "", 0
        extra: dict[str, Allocation] = {}
        for job, index, m in zip(jobs, indexes, machines, strict=True):
            if m is not last:
                last, mid, seq = m, m.id, m.seq
                overlays.pop(mid, None)
                extra = extras.setdefault(mid, {})
            jid = job.id
            c = trusted_claim(jid, index, mid, seq, (), (), "")
            tid = c.task
            extra[tid] = trusted_allocation(tid, jid, sched, task_precedence(job, index),
                                            job.task_resources)
            placed.add(tid)
            out.append(c)
        self._claims.extend(out)
        return out

    def overlaid(self, mid: str) -> bool:
        """Whether the view shows machine ``mid`` other than the snapshot does: claims
        of this scheduler's (committed since, or earlier in the decision) on it."""
        return mid in self._extra or mid in self._gone

    @property
    def claims(self) -> tuple[Claim, ...]:
        return tuple(self._claims)

    def mark(self) -> int:
        """A point to :meth:`rollback` to: a policy that tries a gang claim by claim
        takes back the claims of one that did not fit whole."""
        return len(self._claims)

    def rollback(self, mark: int) -> None:
        """Forget the claims made since ``mark``, as if they had never been made."""
        while len(self._claims) > mark:
            c = self._claims.pop()
            self._overlays.pop(c.machine, None)
            self._extra[c.machine].pop(c.task, None)
            self._placed.discard(c.task)
            for victim in c.evict:
                self._gone[c.machine].discard(victim)
            if c.moves_from:
                self._overlays.pop(c.moves_from, None)
                self._gone[c.moves_from].discard(c.task)

    def _add(self, c: Claim, job: Job) -> None:
        self._overlays.pop(c.machine, None)
        self._extra.setdefault(c.machine, {})[c.task] = trusted_allocation(
            c.task, job.id, self.scheduler, task_precedence(job, c.index), job.task_resources)
        self._placed.add(c.task)
        for victim in c.evict:
            self._gone.setdefault(c.machine, set()).add(victim)
        if c.moves_from:
            self._gone.setdefault(c.moves_from, set()).add(c.task)


@attrs.frozen
class Context:
    """What a policy may use: the view, the time, its own random stream, its options.

    ``changes``: the (kind, id) of every record that changed since this instance's
    previous decision, or None when the policy must assume anything changed (the first
    decision, a reload of the replica). A policy that keeps state of its own across
    decisions (a flow network) updates it from these instead of rescanning the cell.
    ``latest``: reads the newest snapshot, for a policy whose decision takes long
    enough that the cell may have moved on meanwhile (it drops what became stale)."""

    view: CellView
    now: float
    rng: random.Random
    scheduler: str
    instance: str
    options: Mapping[str, Any] = attrs.field(factory=dict)
    changes: frozenset[tuple[KeyKind, str]] | None = None
    latest: Callable[[], CellSnapshot] | None = None


class Policy:
    """Base class of scheduling policies. ``name`` is what jobs name as their scheduler
    by default and what the registry finds it by."""

    name: ClassVar[str] = ""
    #: Seconds between calls of :meth:`propose`; None: never. A policy may set its
    #: own from its options.
    propose_interval: float | None = None
    #: A policy that keeps its waiting jobs in an order of its own (fair share) sets
    #: this: a job it could not place is due again after this many seconds, so every
    #: decision sees the whole queue, and waiting for its turn is not failing: the
    #: runtime gives up on such a job only for a permanent reason.
    requeue_interval: float | None = None
    #: A policy that keeps state built from the cell (a flow network) sets this to be
    #: handed the cell's changes between its decisions (:meth:`absorb`), where the
    #: runtime is configured to (``RuntimeConfig.absorb_when_idle``). Read when the
    #: instance is made; a policy may set its own from its options.
    absorbs_changes: bool = False
    #: A policy that never reads ``Context.changes`` may set this False: its instance
    #: then keeps no list of them (every change of the cell is handed to every
    #: instance) and its decisions get None there. A policy absorbing changes gets
    #: them whatever this says.
    reads_changes: bool = True
    #: A policy that divides its scheduler's resource limit itself (fair share within
    #: a quota, making room by preemption) sets this. Otherwise the runtime keeps
    #: plans within the limit and holds back the jobs it cannot take now
    #: (schedulers/limits.py).
    handles_limits: bool = False

    def __init__(self, **options: Any) -> None:
        self.options = dict(options)

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        """Place what can be placed of one job."""
        raise NotImplementedError

    def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        """Place many jobs in one decision; by default one after another."""
        claims: list[Claim] = []
        unplaced: list[Unplaced] = []
        for job in jobs:
            plan = self.schedule_job(ctx, job)
            claims.extend(plan.claims)
            unplaced.extend(plan.unplaced)
        return Plan(tuple(claims), tuple(unplaced))

    def propose(self, ctx: Context) -> Plan:
        """A proposal made without a new job (called every ``propose_interval`` s)."""
        return Plan()

    def absorb(self, ctx: Context) -> bool:
        """Called while no decision is due, with the changes this policy was not told of
        yet (``ctx.changes``, never empty): bring state kept across decisions up to date
        now, so that the next decision has less to do. Returns whether the changes were
        taken in: if so they are not handed to the next decision again. The default
        takes nothing."""
        return False

    def warm_up(self) -> None:
        """Called once before the first decision (a scheduler process, a simulation):
        load or build now what the first decision would otherwise pay for (compiled
        kernels, tables), so that no decision carries it. The default does nothing."""

    def report(self) -> Mapping[str, float | int]:
        """The policy's own metrics, by name (numbers only; a few dozen at most): the
        runtime reports them under ``policy`` beside its own every few seconds.

        Called from another thread than the decisions: return a mapping the policy
        no longer changes (build a new one after each decision) rather than one it
        updates in place."""
        return {}

    @classmethod
    def batches_jobs(cls) -> bool:
        """Whether this policy decides for all due jobs at once."""
        return cls.schedule_jobs is not Policy.schedule_jobs

    @classmethod
    def places_jobs(cls) -> bool:
        return cls.schedule_job is not Policy.schedule_job or cls.batches_jobs()


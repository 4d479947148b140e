"""An Aladdin+H round: machine groups, then one flow pass per demand, then repacking.

1. **Groups.** The machines are clustered (``groups.py``) when the round first sees
   the cell and again whenever its machine mix (the multiset of capacities) changes.
   With ``regroup_every`` or ``regroup_spread`` set, the groups *follow the cell*
   (§3.3): machines are clustered by what they have left, not by capacity, and again
   once ``regroup_every`` tasks have been placed since (counted between passes, so a
   large round regroups as it fills the cell) or once the spread of the machines about
   their groups' centres (``groups.room_spread``) passes ``regroup_spread``.
2. **Work.** The waiting units of the jobs this instance owns (``units.py``); which
   jobs may wait is kept from the change sets, so a quiet round does not rescan every
   job of the cell.
3. **Passes.** Units are grouped by demand and the groups placed one after another,
   largest demand first (the paper's LRF; ``srf = 1``: smallest first), each pass a
   min-cost flow over the room the passes before it left (``passes.py``).
4. **Repacking** of the constrained units still waiting (``repack.py``).

Nothing of the network is kept between rounds: each pass's network is built from the
view in a few numpy operations (task classes and groups are few; a constrained job
has a few candidate arcs), which is what lets every pass count room exactly in every
dimension. The flow core's incremental graph manager is not used by this policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import numpy as np
import numpy.typing as npt

from cellstate.keys import KeyKind
from cellstate.model import Claim, Job, Resources, split_task_id
from schedulers.api import Context
from schedulers.flow.aladdin.cellarrays import CellArrays
from schedulers.flow.aladdin.groups import (
    MachineGroups,
    group_by_room,
    group_machines,
    room_spread,
)
from schedulers.flow.aladdin.outcome import Outcome
from schedulers.flow.aladdin.passes import Pass, PassOptions
from schedulers.flow.aladdin.repack import Repacker, RepackOptions, movable_by
from schedulers.flow.aladdin.units import RuleIndex, Unit, Work, constrained, work_of
from schedulers.flow.solvers import Solver
from schedulers.runtime import owner_of


@attrs.frozen
class Figures:
    """What a round took (seconds) and how big its networks were."""

    update: float
    solve: float
    extract: float
    nodes: int
    arcs: int
    passes: int
    regrouped: bool


@attrs.frozen
class PlannerOptions:
    groups: int = 4  # K; 0: chosen by the elbow rule
    srf: bool = False  # smallest demand first (default: largest first, LRF)
    repack: bool = True
    packing: bool = True  # the packing cost inside a group (cellarrays.CellArrays.pack)
    regroup_every: int = 0  # regroup on what is left after this many placements; 0: never
    regroup_spread: float = 0.0  # ... or once the groups' spread passes this; 0: never
    move_guard: float = 60.0
    passes: PassOptions = attrs.field(factory=PassOptions)
    repacking: RepackOptions = attrs.field(factory=RepackOptions)


class AladdinPlanner:
    def __init__(self, options: PlannerOptions) -> None:
        self.options = options
        self.groups: MachineGroups | None = None
        self._mix: dict[Resources, int] | None = None
        self._maybe_waiting: set[str] | None = None  # None: every job may wait
        self._moved_at: dict[str, float] = {}
        self._reverse = RuleIndex(())
        self._placed_since = 0  # tasks placed since the groups were last made
        self._last_round: float | None = None  # when the last round ran
        #: Groups made from what machines have left, and the seconds that took.
        self.regroups = 0
        self.regroup_seconds = 0.0

    @property
    def follows(self) -> bool:
        """Whether the groups follow what machines have left."""
        return self.options.regroup_every > 0 or self.options.regroup_spread > 0

    # -- what waits ------------------------------------------------------------------------

    def note_changes(self, ctx: Context) -> None:
        if ctx.changes is None or self._maybe_waiting is None:
            self._maybe_waiting = None
            return
        for kind, ident in ctx.changes:
            if kind is KeyKind.JOB or kind is KeyKind.STATUS:
                self._maybe_waiting.add(ident)
            elif kind is KeyKind.TASK:
                self._maybe_waiting.add(split_task_id(ident)[0])

    def works(self, ctx: Context) -> list[Work]:
        snap = ctx.view.snap
        members = tuple(snap.live_instances(ctx.scheduler)) or (ctx.instance,)
        ids = snap.jobs.keys() if self._maybe_waiting is None else self._maybe_waiting
        reverse = RuleIndex(j for j in snap.jobs.values() if j.id not in snap.statuses)
        out = []
        waiting: set[str] = set()
        for jid in sorted(ids):
            job = snap.jobs.get(jid)
            if (job is None or job.scheduler != ctx.scheduler or jid in snap.statuses
                    or owner_of(jid, members) != ctx.instance):
                continue
            w = work_of(ctx.view, job, reverse)
            if w is not None:
                out.append(w)
                waiting.add(jid)
        self._maybe_waiting = waiting
        self._reverse = reverse
        return out

    def idle(self, ctx: Context) -> bool:
        """Whether a round now would find nothing to do: nothing changed since the last
        round, and either nothing it saw still waits or it would decide the same again
        (a round is a function of the cell, so only a task's flapping guard running out
        since, which lets repacking move it, can change what a round decides)."""
        if ctx.changes is None or ctx.changes or self._maybe_waiting is None:
            return False
        if not self._maybe_waiting:
            return True
        guard = self.options.move_guard
        return self._last_round is not None and not any(
            self._last_round < at + guard <= ctx.now for at in self._moved_at.values())

    # -- the round -------------------------------------------------------------------------

    def plan(self, ctx: Context, solver: Solver) -> tuple[Outcome, Figures]:
        t0 = time.perf_counter()
        self.note_changes(ctx)
        self._last_round = ctx.now
        view = ctx.view
        regrouped = self._regroup(ctx)
        assert self.groups is not None
        works = self.works(ctx)
        ex = Outcome()
        by_demand: dict[Resources, list[Work]] = {}
        for w in works:
            by_demand.setdefault(w.demand, []).append(w)
        cell = CellArrays(view, self.groups, by_demand, self.options.packing)
        if self.follows and (regrouped or not self.groups.by_machine):
            self._regroup_room(cell)
        t1 = time.perf_counter()
        solve = 0.0
        nodes = arcs = 0
        left: list[Unit] = []
        for demand in self._order(by_demand, cell):
            if self.follows and self._drifted(cell):
                regrouped = self._regroup_room(cell) or regrouped
            before = ex.placed
            res = Pass(view, cell, self.groups, by_demand[demand], self.options.passes,
                       ex).run(solver)
            self._placed_since += ex.placed - before
            solve += res.solve
            nodes += res.nodes
            arcs += res.arcs
            left.extend(res.left)
        if self.options.repack and left:
            free_jobs = {w.job.id for w in works if not w.constrained}
            reverse = self._reverse

            def free_job(job: Job) -> bool:
                return job.id in free_jobs or not (constrained(job)
                                                   or reverse.matches(job.labels))

            movable = movable_by(ctx.scheduler, view, free_job, self._guarded(ctx.now))
            hard = [u for u in left if u.job.id not in free_jobs]
            rest = [u for u in left if u.job.id in free_jobs]
            still = Repacker(view, cell, self.groups, movable, self.options.repacking,
                             ex).run(hard)
            left = still + rest
            for tid, _ in ex.moved:
                self._moved_at[tid] = ctx.now
        for u in left:
            ex.unscheduled[u.job.id] = ex.unscheduled.get(u.job.id, 0) + len(u.indices)
        ex.claims = _moves_first(ex)
        t2 = time.perf_counter()
        return ex, Figures(t1 - t0, solve, t2 - t1 - solve, nodes, arcs, len(by_demand),
                           regrouped)

    def _order(self, by_demand: dict[Resources, list[Work]], cell: CellArrays
               ) -> list[Resources]:
        """Demands largest first (LRF) or smallest first (SRF), by their dominant share
        of the cell's average machine."""
        mean = cell.cap.mean(axis=0) if len(cell.mids) else None

        def size(r: Resources) -> float:
            if mean is None:
                return 0.0
            v = cell.vector(r)
            return float(max((v[k] / mean[k] for k in range(len(v)) if mean[k] > 0),
                             default=0.0))

        sign = 1 if self.options.srf else -1
        return sorted(by_demand, key=lambda r: (sign * size(r), r.amounts))

    def _regroup(self, ctx: Context) -> bool:
        mix: dict[Resources, int] = {}
        for m in ctx.view.snap.machines.values():
            mix[m.capacity] = mix.get(m.capacity, 0) + 1
        if mix == self._mix and self.groups is not None:
            return False
        self._mix = mix
        self.groups = group_machines([c for c, n in mix.items() for _ in range(n)],
                                     self.options.groups)
        return True

    def _room(self, cell: CellArrays) -> tuple[npt.NDArray[np.float64],
                                               npt.NDArray[np.float64]]:
        assert self.groups is not None
        cols = [cell.dims.index(d) for d in self.groups.dims]
        return cell.free[:, cell.dims.index("cpu")], cell.free[:, cols]

    def _drifted(self, cell: CellArrays) -> bool:
        """Whether the rule says the groups no longer describe the cell."""
        o = self.options
        if o.regroup_every > 0 and self._placed_since >= o.regroup_every:
            return True
        if o.regroup_spread > 0 and self.groups is not None and "cpu" in cell.dims:
            return room_spread(self.groups, cell.mids, *self._room(cell)) > o.regroup_spread
        return False

    def _regroup_room(self, cell: CellArrays) -> bool:
        """Cluster the machines by what they have left and give the cell's arrays the
        new groups."""
        assert self.groups is not None
        if "cpu" not in cell.dims:
            return False
        t0 = time.perf_counter()
        cpu_free, room = self._room(cell)
        cols = [cell.dims.index(d) for d in self.groups.dims]
        self.groups = group_by_room(cell.mids, self.groups.dims, cpu_free, room,
                                    cell.cap[:, cell.dims.index("cpu")], cell.cap[:, cols],
                                    self.options.groups)
        cell.assign(self.groups)
        self._placed_since = 0
        self.regroups += 1
        self.regroup_seconds += time.perf_counter() - t0
        return True

    def _guarded(self, now: float) -> Callable[[str], bool]:
        guard = self.options.move_guard
        moved = self._moved_at
        for tid in [t for t, at in moved.items() if now - at >= guard]:
            del moved[tid]

        def guarded(tid: str) -> bool:
            return tid in moved

        return guarded


def _moves_first(ex: Outcome) -> list[Claim]:
    """The runtime commits one transaction per job, in the order of the jobs' first
    claims: the jobs whose tasks repacking moves go first, so the store frees the room
    before the claims that count on it."""
    movers = {c.job for c in ex.claims if c.moves_from}
    if not movers:
        return ex.claims
    return [c for c in ex.claims if c.job in movers] + [c for c in ex.claims
                                                         if c.job not in movers]

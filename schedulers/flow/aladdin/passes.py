"""One pass of an Aladdin round: the flow network for the units of one demand, solved,
and its flow turned into claims.

The network (Aladdin+H Fig. 4, 9)::

    W(free job) --0--> E(task class) --100^(x-1)--> A(group) --pack--> M --0--> S
    C(constrained job or affinity group) --100^(x-1) + pack--> M (its candidates)
    W, C --unscheduled--> S

A free job's units enter its task class; the class reaches each machine group at the
group's preference cost (``groups.py``, Eq. 8) and each machine of a group at its
packing cost (fuller, then bigger machines first). A constrained job's units reach
only *candidate* machines, found by walking the machines in the same preference order
and keeping those its rules allow (``placement.why_not``: anti-affinity both ways,
affinity, tasks per machine, selector; the blacklist of §3.4), each with the capacity
its rules leave; candidates other constrained jobs of the pass have already covered
are skipped, so the jobs' candidate sets overlap little. Leaving a unit unscheduled
costs more than any placement, so the flow places as many units as it can (Eq. 1).

**Multi-dimensional capacity.** Every unit of a pass has the same demand, so a
machine's arc to the sink carries how many such units fit in its free room in every
dimension: no flow the solver returns exceeds any dimension of any machine, and a unit
(a task, or a whole affinity group) is never split across machines. Passes run one
demand after another on the room the previous ones left (``planner.py``).

**Outcome.** Constrained units first (they have fewer places to go), then free
ones, handed out first in, first out from the class. Each becomes claims checked
against the view with the store's fit rules, which also sees this pass's earlier
claims; an arrival the rules refuse (two constrained jobs of the pass that keep each
other off one machine) is *spilled* to the next machines in preference order. A gang
is claimed whole or not at all.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import attrs
import numpy as np

from cellstate import fit
from cellstate.cell import holding
from cellstate.fit import Misfit, Rule
from cellstate.model import Machine, Selector, selector_matches_labels
from schedulers.api import CellView
from schedulers.flow.aladdin.cellarrays import CellArrays
from schedulers.flow.aladdin.groups import MachineGroups
from schedulers.flow.aladdin.outcome import Outcome
from schedulers.flow.aladdin.units import Unit, Work
from schedulers.flow.network import MAX_CAPACITY, Arrays
from schedulers.flow.solvers import Solver
from schedulers.placement import why_not

#: Leaving a unit unscheduled costs this (more than any placement), more with its
#: job's precedence so that the higher ones win when room is short.
UNSCHEDULED = 10**11


@attrs.frozen
class PassOptions:
    extra_candidates: int = 4  # candidates past those that cover a job's units
    walk: int = 2000  # machines looked at per constrained job
    spill: int = 16  # machines tried for an arrival the fit rules refused


@attrs.define
class PassResult:
    left: list[Unit] = attrs.field(factory=list)  # units not placed
    nodes: int = 0
    arcs: int = 0
    solve: float = 0.0


def unscheduled_cost(work: Work) -> int:
    return UNSCHEDULED * (2 + min(max(work.job.precedence, 0), 8))


class Pass:
    def __init__(self, view: CellView, cell: CellArrays, groups: MachineGroups,
                 works: Sequence[Work], options: PassOptions, ex: Outcome) -> None:
        self.view = view
        self.cell = cell
        self.works = list(works)
        self.opts = options
        self.ex = ex
        self.demand = works[0].demand
        self.need = cell.vector(self.demand)
        self.gcost = np.asarray(groups.costs(self.demand), dtype=np.int64)
        self.k = len(self.gcost)
        self.fit = cell.fit(self.demand)
        self.pack = cell.pack()
        order = cell.order(self.gcost.tolist(), self.pack)
        self.order = order[self.fit[order] > 0]
        self._order = self.order.tolist()
        self._near: dict[Selector, set[int]] = {}

    # -- the network ---------------------------------------------------------------------

    def run(self, solver: Solver) -> PassResult:
        free = [w for w in self.works if not w.constrained]
        cons = [w for w in self.works if w.constrained]
        cands = self._candidates(cons)
        n = len(self.cell.mids)
        # Nodes: S, E, A_g, one per job (free then constrained), one per machine.
        s, e = 0, 1
        a0 = 2
        j0 = a0 + self.k
        m0 = j0 + len(free) + len(cons)
        tails: list[int] = []
        heads: list[int] = []
        caps: list[int] = []
        costs: list[int] = []
        supply = np.zeros(m0 + n, dtype=np.int64)
        for x, w in enumerate([*free, *cons]):
            supply[j0 + x] = len(w.units)
            tails.append(j0 + x)
            heads.append(s)
            caps.append(len(w.units))
            costs.append(unscheduled_cost(w))
        first_class = len(tails)
        for x, w in enumerate(free):
            tails.append(j0 + x)
            heads.append(e)
            caps.append(len(w.units))
            costs.append(0)
        free_units = sum(len(w.units) for w in free)
        if free_units:
            for g in range(self.k):
                tails.append(e)
                heads.append(a0 + g)
                caps.append(free_units)
                costs.append(int(self.gcost[g]))
        first_cand = len(tails)
        cand_arcs: list[tuple[int, int]] = []  # (constrained job, machine) per arc
        for x, found in enumerate(cands):
            for i, c in found:
                tails.append(j0 + len(free) + x)
                heads.append(m0 + i)
                caps.append(c)
                costs.append(int(self.gcost[self.cell.group[i]] + self.pack[i]))
                cand_arcs.append((x, i))
        # Every machine a free unit fits on, through its group's vertex.
        into = (np.flatnonzero(self.fit > 0) if free_units
                else np.zeros(0, dtype=np.int64))
        used = np.union1d(into, np.array([i for _, i in cand_arcs], dtype=np.int64))
        supply[s] = -int(supply.sum())
        t = np.concatenate([np.array(tails, dtype=np.int64), a0 + self.cell.group[into],
                            m0 + used])
        h = np.concatenate([np.array(heads, dtype=np.int64), m0 + into,
                            np.full(len(used), s, dtype=np.int64)])
        cap = np.concatenate([np.array(caps, dtype=np.int64),
                              np.minimum(self.fit[into], MAX_CAPACITY),
                              np.minimum(self.fit[used], MAX_CAPACITY)])
        cost = np.concatenate([np.array(costs, dtype=np.int64), self.pack[into],
                               np.zeros(len(used), dtype=np.int64)])
        net = Arrays(m0 + n, supply, t, h, np.zeros(len(t), dtype=np.int64), cap, cost,
                     np.zeros(len(t), dtype=np.int8), np.arange(len(t), dtype=np.int64))
        started = time.perf_counter()
        flow = solver.solve(net).flow
        solved = time.perf_counter() - started
        res = PassResult(nodes=m0 + n, arcs=len(t), solve=solved)
        # Constrained units first: their arcs are the few places they may go.
        arrivals: list[list[int]] = [[] for _ in cons]
        for k, (x, i) in enumerate(cand_arcs):
            arrivals[x].extend([i] * int(flow[first_cand + k]))
        for x, w in enumerate(cons):
            self._claim_work(w, arrivals[x], res)
        # Free units, first in first out from the class.
        queue: deque[list[int]] = deque()
        for x, w in enumerate(free):
            f = int(flow[first_class + x])
            if f:
                queue.append([x, f])
            if f < len(w.units):
                res.left.extend(w.units[f:])
        base = len(tails)
        cursor = [0] * len(free)
        for k, i in enumerate(into.tolist()):
            f = int(flow[base + k])
            while f:
                x, left = queue[0]
                take = min(left, f)
                w = free[x]
                for unit in w.units[cursor[x]:cursor[x] + take]:
                    self._place(unit, i, res)
                cursor[x] += take
                f -= take
                if take == left:
                    queue.popleft()
                else:
                    queue[0][1] = left - take
        return res

    def _candidates(self, cons: Sequence[Work]) -> list[list[tuple[int, int]]]:
        """Per constrained job: (machine, capacity) of the machines its rules allow, in
        preference order, enough to cover its units plus a few."""
        tentative = self.fit.copy()
        out = []
        for w in cons:
            unit = w.units[0]
            need = len(w.units)
            found: list[tuple[int, int]] = []
            covered = extra = looked = 0
            limit = w.job.constraints.max_per_machine
            order = self._order
            if w.job.constraints.affinity and not unit.founding:
                # Only machines already running a task its affinity matches qualify:
                # look at those alone, wherever they are in the preference order.
                near = self._affine(w.job.constraints.affinity)
                order = [i for i in order if i in near]
            for i in order:
                if looked >= self.opts.walk or extra >= self.opts.extra_candidates:
                    break
                if tentative[i] <= 0 and covered < need:
                    continue
                looked += 1
                m = self.view.machine(self.cell.mids[i])
                if m is None or self._refuses(unit, m) is not None:
                    continue
                room = int(min(self.fit[i], need))
                if limit:
                    room = min(room, limit - self._own_tasks(m, w.job.id))
                if room <= 0:
                    continue
                found.append((i, room))
                if covered < need:
                    take = min(room, need - covered, int(max(tentative[i], 0)))
                    tentative[i] -= take
                    covered += take
                else:
                    extra += 1
            out.append(found)
        return out

    def _affine(self, sel: Selector) -> set[int]:
        """The machines (indexes) running a task of a job ``sel`` matches, in the view
        (this round's claims included; asked before this pass claims anything, so kept
        per selector for the pass)."""
        known = self._near.get(sel)
        if known is not None:
            return known
        out: set[int] = set()
        jobs = self.view.jobs
        for m in self.view.machines():
            for a in holding(m, self.view.gangs):
                j = jobs.get(a.job)
                if j is not None and selector_matches_labels(sel, j.labels):
                    out.add(self.cell.index[m.id])
                    break
        self._near[sel] = out
        return out

    # -- claims ------------------------------------------------------------------------------

    def _refuses(self, unit: Unit, m: Machine) -> Misfit | None:
        """The fit rule that keeps ``unit`` off ``m`` now (its whole demand for a group)."""
        miss = why_not(self.view, unit.job, m, founding=unit.founding)
        if miss is None and len(unit.indices) > 1:
            miss = fit.resources(unit.demand, m, self.view.used(m.id))
        return miss

    def _claim_work(self, w: Work, arrivals: list[int], res: PassResult) -> None:
        if not w.all_or_nothing:
            for unit, i in zip(w.units, arrivals, strict=False):
                self._place(unit, i, res)
            res.left.extend(w.units[len(arrivals):])
            return
        # A gang: every unit or none. Choose all machines first (the view cannot take
        # claims back), counting the gang's own choices against each machine.
        chosen: list[int] = []
        taken: dict[int, int] = {}
        for k, unit in enumerate(w.units):
            first = arrivals[k] if k < len(arrivals) else None
            pick = self._choose(unit, first, taken)
            if pick is None:
                res.left.extend(w.units)
                self.ex.why.setdefault(w.job.id, f"gang: {len(w.units) - k} of its "
                                       f"{len(w.units)} tasks found no machine this round")
                return
            chosen.append(pick)
            taken[pick] = taken.get(pick, 0) + 1
        for unit, i in zip(w.units, chosen, strict=True):
            self._claim(unit, i)

    def _choose(self, unit: Unit, first: int | None, taken: dict[int, int]) -> int | None:
        """A machine for one unit of a gang, given the gang's own choices so far."""
        tries = [first] if first is not None else []
        for i in tries + self._roomy(self.opts.spill * 4):
            n = taken.get(i, 0)
            if not self.cell.fits_one(i, self.need * (n + 1)):
                continue
            m = self.view.machine(self.cell.mids[i])
            if m is None or self._refuses(unit, m) is not None:
                continue
            limit = unit.job.constraints.max_per_machine
            if limit and self._own_tasks(m, unit.job.id) + n >= limit:
                continue
            return i
        return None

    def _roomy(self, n: int, but: int = -1) -> list[int]:
        """The first ``n`` machines in preference order that have room for one unit
        now (``but`` left out)."""
        free = self.cell.free[self.order]
        ok = (free + 1e-9 >= self.need).all(axis=1)
        out = self.order[ok][:n + 1].tolist()
        return [i for i in out if i != but][:n]

    def _own_tasks(self, m: Machine, jid: str) -> int:
        return sum(1 for a in holding(m, self.view.gangs) if a.job == jid)

    def _place(self, unit: Unit, i: int, res: PassResult) -> bool:
        m = self.view.machine(self.cell.mids[i])
        miss = None if m is None else self._refuses(unit, m)
        if miss is None and self.cell.fits_one(i, self.need):
            self._claim(unit, i)
            return True
        self.ex.repaired += 1
        for j in self._roomy(self.opts.spill, but=i):
            other = self.view.machine(self.cell.mids[j])
            if other is not None and self._refuses(unit, other) is None:
                self._claim(unit, j)
                self.ex.spilled += 1
                return True
        res.left.append(unit)
        if miss is not None and miss.rule is not Rule.RESOURCES:
            self.ex.why.setdefault(unit.job.id, f"{miss.label} on {self.cell.mids[i]!r} once "
                                   "this round's other placements are counted")
        return False

    def _claim(self, unit: Unit, i: int) -> None:
        mid = self.cell.mids[i]
        for index in unit.indices:
            self.ex.claims.append(self.view.claim(unit.job, index, mid))
        self.cell.take(i, unit.demand)
        self.ex.placed += len(unit.indices)


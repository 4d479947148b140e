"""The service scheduler: careful placement for long-running jobs (Omega §2.1, §6).

For each pending task, in order:

1. the machines that may host it (up, selector, affinity, anti-affinity, tasks per
   machine, resources);
2. the best of them by spreading: fewest of the job's tasks in the machine's failure
   domain, then in its rack, then by the ``score`` option: ``spread`` (most free
   resources after placing) or ``pack`` (least free, to keep whole machines empty);
3. if none may host it, room on loan: the fewest opportunistic tasks (a MapReduce
   job's extra workers, ``schedulers.placement.Reclaimer``) whose leaving makes room,
   taken back even with ``preempt`` off, as they hold idle resources on loan;
4. else preemption: on each machine where it would fit once some lower-precedence
   tasks leave, the smallest set of victims (fewest tasks, then the lowest
   precedences), and the machine whose set is cheapest.

Slow decisions are fine here: instances of this scheduler run beside the batch
scheduler's, and never block them (no head-of-line blocking between schedulers).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from cellstate import fit
from cellstate.cell import alloc_placed
from cellstate.fit import FitReport, FitTally
from cellstate.model import Allocation, Job, Machine, Resources
from schedulers.api import CellView, Context, Plan, Policy, Unplaced
from schedulers.placement import Reclaimer, can_host, founds_group, impossible, why_not

# Exact search for the fewest victims up to this many; beyond, greedy by precedence.
_EXACT_VICTIMS = 3


class ServicePolicy(Policy):
    name = "service"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # Bad values fail at start-up (a config file's options reach the constructor).
        score = options.get("score", "spread")
        if score not in ("spread", "pack"):
            raise ValueError(f"service policy: option score must be spread or pack, got "
                             f"{score!r}")
        if not isinstance(options.get("preempt", True), bool):
            raise ValueError("service policy: option preempt must be true or false, got "
                             f"{options['preempt']!r}")

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        view = ctx.view
        pending = view.pending_tasks(job)
        if not pending:
            return Plan()
        why = impossible(view, job)
        if why is not None:
            return Plan(unplaced=(Unplaced(job.id, why, len(pending), permanent=True),))
        pack = str(self.options.get("score", ctx.options.get("score", "spread"))) == "pack"
        preempt = bool(self.options.get("preempt", True))
        claims = []
        left = 0
        nowhere: FitReport | None = None  # the tally for the last task that fit nowhere
        reclaimer = Reclaimer(view)
        # An affinity group's first claim founds it (where the whole group fits); the
        # others must join it.
        group = founds_group(view, job)
        for index in pending:
            m, report = self._best_machine(view, job, pack, group)
            group = False
            if m is not None:
                claims.append(view.claim(job, index, m.id))
                continue
            # Room on loan (a MapReduce job's extra workers) goes before anything else.
            victims = reclaimer.find(job, index)
            if victims is None and preempt:
                victims = self._cheapest_preemption(view, job)
            if victims is None:
                left += 1
                nowhere = report
                continue
            mid, evict = victims
            claims.append(view.claim(job, index, mid, evict))
        unplaced: tuple[Unplaced, ...] = ()
        if left:
            even = ", even by preempting lower-precedence tasks" if preempt else ""
            unplaced = (Unplaced(job.id, f"{left} task(s) fit nowhere{even}: {nowhere}", left,
                                 fit=nowhere),)
        return Plan(tuple(claims), unplaced)

    def _best_machine(self, view: CellView, job: Job, pack: bool,
                      group: bool = False) -> tuple[Machine | None, FitReport]:
        """The best machine for one more task, and the tally of why the others may not
        take it. ``group``: the task founds its job's affinity group, so the machine
        must have room for every task of it."""
        whole = Resources(tuple((d, a * job.task_count)
                                for d, a in job.task_resources.amounts))
        per_domain: dict[str, int] = {}
        per_rack: dict[str, int] = {}
        machines = {m.id: m for m in view.machines()}
        for _, mid in view.placed_tasks(job.id):
            m = machines.get(mid)
            if m is not None:
                per_domain[m.failure_domain] = per_domain.get(m.failure_domain, 0) + 1
                per_rack[m.rack] = per_rack.get(m.rack, 0) + 1
        best: tuple[tuple[float, ...], Machine] | None = None
        tally = FitTally()
        for m in machines.values():
            miss = why_not(view, job, m, founding=group)
            if miss is None and group and not view.fits(m.id, whole):
                miss = fit.resources(whole, m, view.used(m.id))
            tally.add(miss)
            if miss is not None:
                continue
            free = view.free(m.id)
            room = sum(free.get(d) / c for d, c in m.capacity.amounts if c)
            key = (per_domain.get(m.failure_domain, 0), per_rack.get(m.rack, 0),
                   room if pack else -room, 0.0)
            # Ties go to the smaller machine id, not to the map's order (which follows
            # string hashes, so varies between processes).
            if best is None or (key, m.id) < (best[0], best[1].id):
                best = (key, m)
        return (best[1] if best else None), tally.report()

    def _cheapest_preemption(self, view: CellView, job: Job) -> tuple[str, list[str]] | None:
        best: tuple[tuple[int, int, int], str, list[str]] | None = None
        for m in view.machines():
            # Rules no eviction can change: skip the machine before searching victims.
            if (fit.machine_up(m) or fit.selector(job, m)
                    or fit.resources(job.task_resources, m, Resources())):
                continue
            eligible = [a for a in m.allocations.values()
                        if a.precedence < job.precedence and alloc_placed(a, view.gangs)
                        and not a.evicted_by]
            chosen = self._fewest_victims(view, job, m, eligible)
            if chosen is None:
                continue
            cost = (len(chosen), max(a.precedence for a in chosen),
                    sum(a.precedence for a in chosen))
            if best is None or (cost, m.id) < (best[0], best[1]):
                best = (cost, m.id, [a.task for a in chosen])
        return (best[1], best[2]) if best else None

    def _fewest_victims(self, view: CellView, job: Job, m: Machine,
                        eligible: Sequence[Allocation]) -> list[Allocation] | None:
        def works(victims: Sequence[Allocation]) -> bool:
            return can_host(view, job, m, victims)

        ordered = sorted(eligible, key=lambda a: (a.precedence, a.task))
        for k in range(1, min(_EXACT_VICTIMS, len(ordered)) + 1):
            options = [list(c) for c in itertools.combinations(ordered, k) if works(c)]
            if options:
                return min(options, key=lambda v: (max(a.precedence for a in v),
                                                   sum(a.precedence for a in v)))
        greedy: list[Allocation] = []
        for a in ordered:
            greedy.append(a)
            if works(greedy):
                return greedy
        return None

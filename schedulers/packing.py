"""Packing baselines for the Aladdin+H comparison (seed 002 §4.2), as policies of the
runtime: first fit, and Tetris-like alignment packing.

* ``firstfit``: each task (in submission order) on the first machine, by id, that
  takes it.
* ``tetris``: the tasks with the largest demand first (dominant share of the cell's
  average machine), each on the machine with the best *alignment*, Tetris' score
  (Grandl et al., SIGCOMM 2014): the dot product of the task's demand and the
  machine's free room, both as shares of the machine's capacity, over the dimensions.

Both see every dimension and the store's fit rules, so what they propose fits. The
paper's baselines do not know affinity or anti-affinity: the option ``blind`` (0)
makes the first ``blind`` proposals of each task ignore those rules (and the tasks
per machine), as the paper's Tetris_i reschedules a task whose placement broke a rule
up to i times; the store refuses such claims (constraint_violated), which is what
the comparison counts as a violation, and later proposals respect the rules. An
affinity group a policy knows of (not blind) is placed as one unit on one machine,
as every policy of this platform may (``placement.founds_group``).

Decisions are vectorized over the machines (numpy), so a decision for thousands of
tasks on 12,000 machines takes seconds, not minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from cellstate.cell import holding
from cellstate.fit import Rule
from cellstate.model import Job
from schedulers.api import CellView, Context, Plan, Policy, Unplaced
from schedulers.machinearrays import Floats, Ints, MachineArrays
from schedulers.placement import founds_group, waiting, why_not


class PackingPolicy(Policy):
    """Places each waiting task (or affinity group) on the best machine that takes it
    by :meth:`rank`; gangs all or nothing."""

    name: ClassVar[str] = ""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        unknown = sorted(set(options) - {"blind"})
        if unknown:
            raise ValueError(f"{self.name} policy: unknown option(s) {', '.join(unknown)} "
                             "(known: blind)")
        blind = options.get("blind", 0)
        if isinstance(blind, bool) or not isinstance(blind, int) or blind < 0:
            raise ValueError(f"{self.name} policy: option blind must be a whole number "
                             f"from 0, got {blind!r}")
        self.blind = blind
        self._proposed: dict[str, int] = {}  # task -> proposals made (blind ones count)

    def rank(self, cells: MachineArrays, need: Floats, fitting: Ints) -> Ints:
        """``fitting`` (machine indexes) in the order this policy prefers them."""
        return fitting

    def order(self, cells: MachineArrays, jobs: Sequence[Job]) -> list[Job]:
        return list(jobs)

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        return self.schedule_jobs(ctx, [job])

    def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        view = ctx.view
        cells = MachineArrays(view, [j.task_resources for j in jobs])
        claims = []
        unplaced: list[Unplaced] = []
        for job, pending in waiting(view, self.order(cells, jobs), unplaced):
            made = self._place(view, cells, job, pending)
            claims.extend(made)
            left = len(pending) - len(made)
            if left:
                unplaced.append(Unplaced(job.id, f"{self.name}: {left} task(s) found no "
                                         "machine that takes them", left))
        return Plan(tuple(claims), tuple(unplaced))

    def _place(self, view: CellView, cells: MachineArrays, job: Job,
               pending: list[int]) -> list[Any]:
        blind = all(self._proposed.get(f"{job.id}/{i}", 0) < self.blind for i in pending)
        for i in pending:
            key = f"{job.id}/{i}"
            self._proposed[key] = self._proposed.get(key, 0) + 1
        need = cells.vector(job.task_resources)
        if not blind and founds_group(view, job):
            units = [(tuple(pending), need * len(pending), True)]
        else:
            units = [((i,), need, False) for i in pending]
        chosen: list[tuple[tuple[int, ...], int, Floats]] = []
        mine: dict[int, int] = {}
        for indices, demand, founding in units:
            pick = self._choose(view, cells, job, demand, founding, blind, mine)
            if pick is None:
                if job.gang:
                    for _, j, d in chosen:
                        cells.free[j] += d
                    return []
                continue
            cells.free[pick] -= demand
            mine[pick] = mine.get(pick, 0) + len(indices)
            chosen.append((indices, pick, demand))
        out = []
        for indices, i, _ in chosen:
            for index in indices:
                out.append(view.claim(job, index, cells.mids[i]))
        return out

    def _choose(self, view: CellView, cells: MachineArrays, job: Job, demand: Floats,
                founding: bool, blind: bool, mine: dict[int, int]) -> int | None:
        limit = job.constraints.max_per_machine
        for i in self.rank(cells, demand, cells.fitting(demand)).tolist():
            if blind:
                return int(i)
            m = view.machine(cells.mids[i])
            if m is None:
                continue
            miss = why_not(view, job, m, founding=founding and not mine)
            if miss is not None and miss.rule is not Rule.RESOURCES:
                continue
            if limit and sum(1 for a in holding(m, view.gangs)
                             if a.job == job.id) + mine.get(i, 0) >= limit:
                continue
            return int(i)
        return None


class FirstFitPolicy(PackingPolicy):
    name = "firstfit"


class TetrisPolicy(PackingPolicy):
    name = "tetris"

    def order(self, cells: MachineArrays, jobs: Sequence[Job]) -> list[Job]:
        mean = cells.cap.mean(axis=0) if len(cells.mids) else np.ones(len(cells.dims))
        scale = np.where(mean > 0, mean, 1.0)

        def size(j: Job) -> float:
            v = cells.vector(j.task_resources) / scale
            return float(v.max()) if len(v) else 0.0

        return sorted(jobs, key=lambda j: (-size(j), j.submitted_at, j.id))

    def rank(self, cells: MachineArrays, need: Floats, fitting: Ints) -> Ints:
        cap = cells.cap[fitting]
        share = np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1.0), 0.0)
        score = ((need * share) * (cells.free[fitting] * share)).sum(axis=1)
        return fitting[np.lexsort((fitting, -score))]

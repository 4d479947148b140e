"""Placement helpers shared by policies: whether a machine can take a task of a job.

They apply the store's own fit rules (``cellstate/fit.py``, the code validation runs)
to the policy's view, so a policy proposes claims the store will accept unless someone
else got there first. The store stays the judge."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from cellstate import fit
from cellstate.cell import alloc_placed, task_view
from cellstate.fit import FitReport, FitTally, Misfit
from cellstate.model import (
    OPPORTUNISTIC_PRECEDENCE,
    Allocation,
    Job,
    Machine,
    Resources,
    TaskState,
    task_id,
    task_precedence,
)
from schedulers.api import CellView, Unplaced


def why_not(view: CellView, job: Job, m: Machine,
            victims: Sequence[Allocation] = (), founding: bool = False,
            used: Resources | None = None, calm: bool = False) -> Misfit | None:
    """The first fit rule that keeps one more task of ``job`` off ``m`` now, once
    ``victims`` (allocations on ``m``) leave; None if it may go there. ``founding``:
    the claim is the first of a plan claiming every task of an affinity group
    (:func:`founds_group`), which meets the group's affinity anywhere. ``used``: what
    holds ``m`` as the view shows it, where the policy keeps that count itself
    (``fit.misfit``). ``calm``: no job in the view has an anti-affinity rule
    (:func:`calm`)."""
    return fit.misfit(job, m, view.gangs, view.jobs, victims, founding=founding, used=used,
                      calm=calm)


def calm(view: CellView) -> bool:
    """Whether no job in the view has an anti-affinity rule, so that no neighbour can
    keep a task off a machine (a policy placing many tasks asks once, then passes it to
    :func:`why_not`)."""
    return not any(j.constraints.anti_affinity for j in view.jobs.values())


def can_host(view: CellView, job: Job, m: Machine,
             victims: Sequence[Allocation] = (), founding: bool = False) -> bool:
    """Whether one more task of ``job`` may go on ``m`` now (once ``victims`` leave):
    machine up, selector, tasks per machine, affinity, anti-affinity, resources."""
    return why_not(view, job, m, victims, founding) is None


def founds_group(view: CellView, job: Job) -> bool:
    """Whether ``job`` is an affinity group (``cellstate.fit.self_affine``) none of
    whose tasks runs or is claimed in this view: a plan that claims all of them in one
    transaction founds the group with its first claim, which the store accepts on any
    machine; the others must join it."""
    return fit.self_affine(job) and len(view.pending_tasks(job)) == job.task_count


def hosts(view: CellView, job: Job) -> tuple[list[Machine], FitReport]:
    """Every machine that may take one more task of ``job`` now, and the tally of why
    the others may not (its text is what an Unplaced reason should say)."""
    tally = FitTally()
    out = []
    for m in view.machines():
        miss = why_not(view, job, m)
        tally.add(miss)
        if miss is None:
            out.append(m)
    return out, tally.report()


def waiting(view: CellView, jobs: Iterable[Job], unplaced: list[Unplaced]
            ) -> Iterator[tuple[Job, list[int]]]:
    """Each of ``jobs`` with tasks waiting that some state of the cell could place, with
    those tasks; a job none could (:func:`impossible`) goes to ``unplaced``, for good."""
    for job in jobs:
        pending = view.pending_tasks(job)
        if not pending:
            continue
        why = impossible(view, job)
        if why is not None:
            unplaced.append(Unplaced(job.id, why, len(pending), permanent=True))
            continue
        yield job, pending


def impossible(view: CellView, job: Job) -> str | None:
    """Why no state of this cell could ever place a task of ``job`` (None if it could):
    no machine matches its selector, or none is big enough even when empty."""
    machines = list(view.snap.machines.values())
    if not machines:
        return "the cell has no machines"
    matching = [m for m in machines if fit.selector(job, m) is None]
    if not matching:
        return "no machine in the cell matches the job's machine selector"
    if not any(fit.resources(job.task_resources, m, Resources()) is None for m in matching):
        biggest: dict[str, float] = {}
        for m in matching:
            for name, amount in m.capacity.amounts:
                biggest[name] = max(biggest.get(name, 0.0), amount)
        short = job.task_resources.exceeding(Resources(tuple(sorted(biggest.items()))))
        if short is None:
            return "no machine has all the resources a task needs at once"
        return (f"each task needs {job.task_resources.get(short):g} {short}; the largest "
                f"machine has {biggest.get(short, 0.0):g}")
    return None


class Reclaimer:
    """Finds room held on loan: a machine where one more task of a job fits once some
    opportunistic tasks (a MapReduce job's extra workers, which run at
    ``OPPORTUNISTIC_PRECEDENCE`` on idle resources) leave, and the fewest of them that
    make room. Any task of a job may evict them (the store checks precedence), and a
    policy that needs room takes them before anything else.

    One per decision: the machines holding opportunistic tasks are listed at the first
    look, and each look sees the decision's own claims (and evictions) so far."""

    def __init__(self, view: CellView) -> None:
        self.view = view
        self._loaned: list[str] | None = None

    def find(self, job: Job, index: int) -> tuple[str, list[str]] | None:
        """(machine, victims) for task ``index`` of ``job``, or None if no machine has
        enough room on loan (or the task is itself opportunistic)."""
        if task_precedence(job, index) <= OPPORTUNISTIC_PRECEDENCE:
            return None
        if self._loaned is None:
            self._loaned = loaned_machines(self.view)
        best: tuple[str, list[str]] | None = None
        emptied = False
        for i, mid in enumerate(self._loaned):
            m = self.view.machine(mid)
            loaned = self._on_loan(m) if m is not None else []
            if m is None or not loaned:
                # Taken back earlier in this decision: not worth a look again.
                self._loaned[i] = ""
                emptied = True
                continue
            if fit.machine_up(m) or fit.selector(job, m) or fit.resources(
                    job.task_resources, m, Resources()):
                continue  # no eviction can change these
            victims = self._victims(job, m, loaned)
            if victims is not None and (best is None or len(victims) < len(best[1])):
                best = (mid, [a.task for a in victims])
                if len(victims) == 1:
                    break  # none can do with fewer
        if emptied:
            self._loaned = [mid for mid in self._loaned if mid]
        return best

    def _on_loan(self, m: Machine) -> list[Allocation]:
        """The opportunistic tasks running on ``m``, largest first."""
        gangs = self.view.gangs
        return sorted((a for a in m.allocations.values()
                       if a.precedence <= OPPORTUNISTIC_PRECEDENCE and not a.evicted_by
                       and alloc_placed(a, gangs)),
                      key=lambda a: (-sum(a.resources.as_dict().values()), a.task))

    def _victims(self, job: Job, m: Machine, loaned: list[Allocation]
                 ) -> list[Allocation] | None:
        """The fewest of ``loaned`` (on ``m``) whose leaving lets the task in, largest
        first; None if all of them leaving is not enough."""
        chosen: list[Allocation] = []
        for a in loaned:
            chosen.append(a)
            if can_host(self.view, job, m, chosen):
                return chosen
        return None


def loaned_machines(view: CellView) -> list[str]:
    """The machines running opportunistic tasks, in a fixed order: found through the
    MapReduce jobs that have extra workers (far fewer than machines), not a scan of
    the cell."""
    snap = view.snap
    out: set[str] = set()
    for job in view.jobs.values():
        mr = job.mapreduce
        if mr is None or job.task_count <= mr.workers:
            continue
        for i in range(mr.workers, job.task_count):
            v = task_view(snap, task_id(job.id, i))
            if v.state is TaskState.RUNNING and v.machine:
                out.add(v.machine)
    return sorted(out)

"""Placement helpers shared by policies: whether a machine can take a task of a job.

They apply the store's own fit rules (``cellstate/fit.py``, the code validation runs)
to the policy's view, so a policy proposes claims the store will accept unless someone
else got there first. The store stays the judge."""

from __future__ import annotations

from collections.abc import Sequence

from cellstate import fit
from cellstate.fit import FitReport, FitTally, Misfit
from cellstate.model import Allocation, Job, Machine, Resources
from schedulers.api import CellView


def why_not(view: CellView, job: Job, m: Machine,
            victims: Sequence[Allocation] = (), founding: bool = False) -> Misfit | None:
    """The first fit rule that keeps one more task of ``job`` off ``m`` now, once
    ``victims`` (allocations on ``m``) leave; None if it may go there. ``founding``:
    the claim is the first of a plan claiming every task of an affinity group
    (:func:`founds_group`), which meets the group's affinity anywhere."""
    return fit.misfit(job, m, view.gangs, view.jobs, victims, founding=founding)


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

"""A resource-limited scheduler's plans kept within its limit (Omega §3.4).

The store refuses every claim that would take a scheduler past its limits
(``cellstate/validation.py``). A policy that does not know its scheduler's limits
(every one but the fair policy, which divides its quota itself) would otherwise
propose such claims over and over, each refused as a conflict, until the runtime gave
up on the job. With these, the runtime:

* holds back a job that its limits cannot take now (:func:`admission.limit_blocker`):
  it waits, not counted as an attempt, until the scheduler's usage or the cell's
  limits change, and a job they can never take is abandoned at once with the reason;
* drops, before committing, the claims of a plan past the room left (:func:`trim`),
  reporting their tasks as unplaced for the limit, not sending them to be refused.

Claims that evict or move tasks go as proposed: what they free is the store's to
count. The store stays the judge; this only keeps a scheduler from asking for what
it is sure to be refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cellstate.admission import held_by
from cellstate.cell import CellSnapshot
from cellstate.fit import quota
from cellstate.model import Claim, Job, Resources, SchedulerLimits, sum_resources
from schedulers.api import Plan, Unplaced


def binding(limits: SchedulerLimits | None) -> bool:
    """Whether ``limits`` limit anything (a scheduler may be listed with none)."""
    return limits is not None and (limits.max_precedence is not None
                                   or limits.max_resources is not None)


def in_flight(claims: Iterable[tuple[Claim, Job]]) -> Resources:
    """What claims committed but not yet seen in the snapshot take."""
    return sum_resources(job.task_resources for _, job in claims)


def trim(snap: CellSnapshot, scheduler: str, plan: Plan, jobs: Mapping[str, Job],
         pending: Resources) -> Plan:
    """``plan`` without the claims that would take ``scheduler`` past its resource
    limit, in the plan's order (a gang's claims stay or go together); the dropped
    tasks are added to ``unplaced``. The plan itself when nothing is dropped."""
    limits = snap.config.limits_for(scheduler)
    if limits is None or limits.max_resources is None or not plan.claims:
        return plan
    cap = limits.max_resources
    used = held_by(snap, scheduler) + pending
    by_job: dict[str, list[int]] = {}  # job -> positions of its claims in the plan
    for i, c in enumerate(plan.claims):
        by_job.setdefault(c.job, []).append(i)
    drop: set[int] = set()
    dropped: dict[str, int] = {}  # job -> tasks dropped
    for jid, positions in by_job.items():
        job = jobs.get(jid)
        if job is None:
            continue  # the commit skips it anyway
        need = job.task_resources
        counted = [i for i in positions
                   if not plan.claims[i].evict and not plan.claims[i].moves_from]
        if job.gang:
            whole = sum_resources(need for _ in counted)
            if quota(used, whole, cap) is None:
                used = used + whole
            else:
                drop.update(positions)
                dropped[jid] = len(positions)
            continue
        for i in counted:
            if quota(used, need, cap) is None:
                used = used + need
            else:
                drop.add(i)
                dropped[jid] = dropped.get(jid, 0) + 1
    if not drop:
        return plan
    unplaced = [Unplaced(jid, f"scheduler {scheduler!r} is at its resource limit of "
                              f"{cap}: {n} task(s) wait for its own tasks to end",
                         tasks=n, code="limit") for jid, n in dropped.items()]
    return Plan(tuple(c for i, c in enumerate(plan.claims) if i not in drop),
                (*plan.unplaced, *unplaced), plan.resize)

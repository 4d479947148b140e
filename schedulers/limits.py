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
    by_job: dict[str, list[Claim]] = {}
    for c in plan.claims:
        by_job.setdefault(c.job, []).append(c)
    kept: set[str] = set()  # jobs whose claims stay
    dropped: dict[str, int] = {}
    for jid, claims in by_job.items():
        job = jobs.get(jid)
        if job is None:
            kept.add(jid)  # the commit skips it anyway
            continue
        counted = [c for c in claims if not c.evict and not c.moves_from]
        need = sum_resources(job.task_resources for _ in counted)
        if job.gang:
            if (used + need).exceeding_limit(cap) is None:
                used = used + need
                kept.add(jid)
            else:
                dropped[jid] = len(claims)
            continue
        kept.add(jid)
        for _ in counted:
            if (used + job.task_resources).exceeding_limit(cap) is not None:
                dropped[jid] = dropped.get(jid, 0) + 1
            else:
                used = used + job.task_resources
    if not dropped:
        return plan
    out: list[Claim] = []
    budget = dict(dropped)  # non-gang: how many of each job's counted claims to drop
    for c in reversed(plan.claims):
        jid = c.job
        job = jobs.get(jid)
        if jid not in kept:
            continue
        if job is not None and not job.gang and budget.get(jid) and not (
                c.evict or c.moves_from):
            budget[jid] -= 1  # the last of a job's claims go first
            continue
        out.append(c)
    out.reverse()
    unplaced = [Unplaced(jid, f"scheduler {scheduler!r} is at its resource limit of "
                              f"{cap}: {n} task(s) wait for its own tasks to end",
                         tasks=n, code="limit") for jid, n in dropped.items()]
    return Plan(tuple(out), (*plan.unplaced, *unplaced), plan.resize)

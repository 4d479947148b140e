"""What keeps a job from running that the cell itself can tell, without a scheduler.

Pure functions of a snapshot and a job, used twice:

* :func:`refusal` at submission: what can never run is refused at once, instead of
  waiting pending until its scheduler gives up (a precedence above the scheduler's
  limit, a task larger than every machine, a gang larger than the whole cell or than
  the scheduler's resource limit, a
  scheduler no cell member has heard of while others have run here);
* :func:`blockers` for ``omega why``: the same reasons and those that may pass
  (the scheduler's resource limit nearly used up, no live instance of the
  scheduler), computed whenever asked, so they are current whatever the schedulers
  last recorded.

The store's validation (``cellstate/validation.py``) stays the judge of every claim;
these only explain, and refuse what that judge could never accept.
"""

from __future__ import annotations

import math

import attrs

from cellstate import codec, fit
from cellstate.cell import CellSnapshot, scheduler_usage
from cellstate.errors import StoreError
from cellstate.model import Job, Resources, UsageRecord, required_tasks


class UnschedulableError(StoreError):
    """A job refused at submission because it can never run (:func:`refusal`)."""


@attrs.frozen
class Blocker:
    """One reason the cell gives for a job not running.

    ``code``: ``no_scheduler``, ``no_instance``, ``precedence_limit``, ``quota``,
    ``task_too_large``, ``gang_too_large``, ``no_machines``; ``permanent``: no
    change of the cell's load would let it run (submission refuses such a job)."""

    code: str
    text: str
    permanent: bool = False

    def to_doc(self) -> dict[str, object]:
        return {"code": self.code, "text": self.text, "permanent": self.permanent}


def refusal(snap: CellSnapshot, job: Job, scheduler_known: bool | None = None) -> str | None:
    """Why ``job`` can never run in this cell as it is configured, or None. A
    scheduler name no scheduler has run under is refused only once some scheduler has
    run here (an empty cell may be submitted to before its schedulers start);
    ``scheduler_known`` overrides what ``snap`` says of the job's scheduler (a
    snapshot may be a moment behind a scheduler's first registration)."""
    for b in blockers(snap, job):
        if b.permanent:
            return b.text
    known = job.scheduler in snap.schedulers if scheduler_known is None else scheduler_known
    if snap.schedulers and not known:
        return _unknown_scheduler(snap, job)
    return None


def blockers(snap: CellSnapshot, job: Job) -> list[Blocker]:
    """Every reason the cell gives now for ``job`` not running (empty: none; the
    scheduler's own records say why it placed nothing)."""
    out: list[Blocker] = []
    scheduler = _scheduler_blocker(snap, job)
    if scheduler is not None:
        out.append(scheduler)
    limit = limit_blocker(snap, job)
    if limit is not None:
        out.append(limit)
    size = _task_blocker(snap, job) or _gang_blocker(snap, job)
    if size is not None:
        out.append(size)
    return out


def limit_blocker(snap: CellSnapshot, job: Job, pending: Resources | None = None,
                  ) -> Blocker | None:
    """What the scheduler's own limits (Omega §3.4) say against ``job`` now, or None:
    a precedence above its limit, or a task (a gang: all its tasks) that its resource
    limit cannot take, now or ever. ``pending``: what the scheduler has taken that
    ``snap`` does not show yet (its commits in flight)."""
    limits = snap.config.limits_for(job.scheduler)
    if limits is None:
        return None
    if limits.max_precedence is not None and job.precedence > limits.max_precedence:
        return Blocker(
            "precedence_limit",
            f"precedence {job.precedence} is above scheduler {job.scheduler!r}'s limit of "
            f"{limits.max_precedence}: the store refuses every claim of this job", True)
    if limits.max_resources is not None:
        return _quota_blocker(snap, job, limits.max_resources, pending)
    return None


def _unknown_scheduler(snap: CellSnapshot, job: Job) -> str:
    known = ", ".join(sorted(snap.schedulers)) or "none"
    return (f"no scheduler named {job.scheduler!r} has run in this cell (known: {known}); "
            "start one, or name a known scheduler")


def _scheduler_blocker(snap: CellSnapshot, job: Job) -> Blocker | None:
    if job.scheduler not in snap.schedulers:
        return Blocker("no_scheduler", _unknown_scheduler(snap, job))
    if not snap.live_instances(job.scheduler):
        return Blocker("no_instance", f"scheduler {job.scheduler!r} has no live instance "
                                      "(its instances stopped or lost their lease)")
    return None


def _quota_blocker(snap: CellSnapshot, job: Job, limit: Resources,
                   pending: Resources | None = None) -> Blocker | None:
    need = job.task_resources
    whole = _times(need, required_tasks(job)) if job.gang else need
    what = f"all {required_tasks(job)} tasks of the gang" if job.gang else "one task"
    verb = "need" if job.gang else "needs"
    never = fit.quota(Resources(), whole, limit, job.scheduler)
    if never is not None:
        dim = never.dimension
        return Blocker("quota", f"{what} {verb} {whole.get(dim):g} {dim}, above scheduler "
                                f"{job.scheduler!r}'s limit of {limit.get(dim):g}", True)
    held = held_by(snap, job.scheduler)
    if pending:
        held = held + pending
    now = fit.quota(held, whole, limit, job.scheduler)
    if now is None:
        return None
    dim = now.dimension
    return Blocker("quota", f"scheduler {job.scheduler!r} holds {held.get(dim):g} of its "
                            f"limit of {limit.get(dim):g} {dim}; {what} {verb} "
                            f"{whole.get(dim):g} more")


def held_by(snap: CellSnapshot, scheduler: str) -> Resources:
    """What ``scheduler`` holds now: the store's counter where it keeps one (limited
    schedulers; a counter of an earlier configuration, which nothing updates any more,
    does not count), else summed from the machines."""
    record = snap.usage.get(scheduler)
    if isinstance(record, UsageRecord) and record.base_revision == snap.config.revision:
        return record.used
    return scheduler_usage(snap, scheduler)


def limits_report(snap: CellSnapshot) -> dict[str, dict[str, object]]:
    """Each scheduler with limits (the cell's config): ``max_precedence`` and
    ``max_resources`` (None: no such limit), a fair scheduler's users' ``shares`` and
    ``quotas``, and, under a resource limit, ``used``: what
    it holds now (the store's counter, O(1)), so that an operator sees a quota filling
    up before a job waits on it (``omega status``)."""
    out: dict[str, dict[str, object]] = {}
    for name, limits in sorted(snap.config.limits.items()):
        cap = limits.max_resources
        out[name] = {**codec.limits_to_doc(limits),
                     "used": held_by(snap, name).as_dict() if cap is not None else None}
    return out


def _gang_blocker(snap: CellSnapshot, job: Job) -> Blocker | None:
    if not snap.machines:
        return Blocker("no_machines", "the cell has no machines (no agent registered any)")
    if not job.gang:
        return None
    need, wanted = job.task_resources, required_tasks(job)
    slots = sum(_slots(m.capacity, need) for m in snap.machines.values())
    if slots >= wanted:
        return None
    return Blocker("gang_too_large",
                   f"the gang needs {wanted} tasks at once; the whole cell "
                   f"({len(snap.machines)} machines, empty) holds at most {slots} of them",
                   True)


def _task_blocker(snap: CellSnapshot, job: Job) -> Blocker | None:
    """A task larger than every machine of the cell (down ones too: they may come
    back) can never be placed, however idle the cell."""
    if not snap.machines:
        return None
    need = job.task_resources
    if any(_slots(m.capacity, need) > 0 for m in snap.machines.values()):
        return None
    # Name the dimension that shuts out the most machines, with the largest amount of it.
    short: dict[str, int] = {}
    for m in snap.machines.values():
        for dim, amount in need.amounts:
            if amount > m.capacity.get(dim) + 1e-9:
                short[dim] = short.get(dim, 0) + 1
    dim = max(sorted(short), key=lambda d: short[d])
    largest = max(m.capacity.get(dim) for m in snap.machines.values())
    return Blocker("task_too_large",
                   f"one task needs {need.get(dim):g} {dim}; the largest machine of the cell "
                   f"has {largest:g} ({len(snap.machines)} machines), so no machine can "
                   "ever hold it", True)


def _slots(capacity: Resources, need: Resources) -> int:
    """How many tasks of ``need`` an empty machine of ``capacity`` holds."""
    counts = [math.floor(capacity.get(dim) / amount + 1e-9)
              for dim, amount in need.amounts if amount > 0]
    return min(counts) if counts else 1 << 30


def _times(r: Resources, n: int) -> Resources:
    return Resources(tuple((dim, amount * n) for dim, amount in r.amounts))

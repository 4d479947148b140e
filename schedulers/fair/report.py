"""The share view (``omega shares``): for each user of a fair scheduler, what they
hold, their weight and weighted dominant share, and what their next waiting task
would do now: fit in free room, preempt (and whom), or wait, with the CRS that decides
it. Computed from a snapshot with the scheduler's own code and rules (shares and
quotas from the cell's config, the safe threshold, the minimum run time judged by the
start times the cell records), so it says what the scheduler decides, except for the
caps on preemptions per round and per minute, which live in the running instance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from cellstate.cell import CellSnapshot
from cellstate.model import Job, task_id, task_precedence
from schedulers.api import CellView
from schedulers.fair.policy import FairConfig
from schedulers.fair.shares import CellShares, OrderKey, read_shares, start_times, task_order
from schedulers.fair.victims import RoundMemo, choose, eligible, threshold_of
from schedulers.placement import can_host


@attrs.frozen
class UserShare:
    user: str
    weight: float
    running: Mapping[str, float]  # resources held
    tasks: int  # tasks running
    share: float  # weighted dominant share (the CRS of the user's last running task)
    waiting: int  # tasks waiting
    next_task: str = ""  # the user's next waiting task, in their own order
    next_crs: float | None = None  # the CRS it would have
    verdict: str = ""  # fits | preempts | waits ("" when nothing waits)
    detail: str = ""

    def doc(self) -> dict[str, Any]:
        return attrs.asdict(self)


def share_table(snap: CellSnapshot, scheduler: str, config: FairConfig,
                now: float | None = None) -> list[UserShare]:
    """``now``: the time the minimum run time is judged at (None: not judged)."""
    view = CellView(snap, scheduler)
    waiting: dict[str, list[tuple[OrderKey, Job, int]]] = {}
    for job in snap.jobs.values():
        if job.scheduler != scheduler or job.id in snap.statuses:
            continue
        for i in view.pending_tasks(job):
            waiting.setdefault(job.owner, []).append((task_order(job, i), job, i))
    started = start_times(view, lambda _task: now if now is not None else 0.0)
    shares = read_shares(view, scheduler, config.weights, config.default_weight,
                         started=started, waiting=waiting, mode=config.dru_mode)
    book = shares.book
    old_enough = ((lambda _t: True) if now is None
                  else (lambda t: now - started(t) >= config.min_runtime))
    rows = []
    for user in sorted(set(book.users()) | set(waiting)):
        held = book.running(user)
        row = UserShare(user, book.weight(user), held.as_dict(),
                        sum(1 for _ in book.crs_of_all(user)), round(book.share(user), 6),
                        len(waiting.get(user, ())))
        if user in waiting:
            key, job, index = min(waiting[user], key=lambda w: w[0])
            crs = book.crs_waiting(user, key, job.task_resources)
            verdict, detail = _verdict(view, shares, job, index, crs, config, old_enough)
            row = attrs.evolve(row, next_task=task_id(job.id, index), next_crs=round(crs, 6),
                               verdict=verdict, detail=detail)
        rows.append(row)
    return rows


def _verdict(view: CellView, shares: CellShares, job: Job, index: int, crs: float,
             config: FairConfig, old_enough: Callable[[str], bool]) -> tuple[str, str]:
    past_quota = shares.over_user_quota(job.owner, job.task_resources)
    if (past_quota is None and not shares.over_quota(job.task_resources)
            and any(can_host(view, job, m) for m in view.machines())):
        return "fits", "a machine has room for it now"
    if not config.preempt:
        return "waits", past_quota or "no machine has room now (no preemption)"
    threshold = threshold_of(crs, config.delta)
    precedence = task_precedence(job, index)
    memo = RoundMemo(view, shares, old_enough, config.safe_threshold)
    by_machine, kept = eligible(view, shares, precedence, threshold, old_enough, memo,
                                only=job.owner if past_quota is not None else None)
    found = choose(view, job, by_machine, budget=10**9) if by_machine else None
    if found is None:
        filters = kept.text(precedence, config.safe_threshold, config.min_runtime)
        return "waits", ((f"{past_quota}; " if past_quota else "")
                         + f"no machine frees room by preempting only tasks with CRS above "
                         f"{threshold:.3f} (CRS + delta {config.delta:g})"
                         + (f"; {filters}" if filters else ""))
    victims = ", ".join(f"{v.task} (CRS {v.crs:.3f})" for v in found.victims)
    return "preempts", f"on {found.machine}: {victims}"

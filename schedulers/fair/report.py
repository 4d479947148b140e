"""The share view (``omega shares``): for each user of a fair scheduler, what they
hold, their weight and weighted dominant share, and what their next waiting task
would do now: fit in free room, preempt (and whom), or wait, with the CRS that decides
it. Computed from a snapshot with the scheduler's own code, so it says what the
scheduler decides, except for the storm guards, which live in the running instance
(the minimum run time and the caps may delay a preemption this view calls possible).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from cellstate.cell import CellSnapshot
from cellstate.model import Job, task_id, task_precedence
from schedulers.api import CellView
from schedulers.fair.shares import CellShares, OrderKey, read_shares, task_order
from schedulers.fair.victims import choose, eligible, threshold_of
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


def share_table(snap: CellSnapshot, scheduler: str, weights: Mapping[str, float],
                delta: float, default_weight: float = 1.0) -> list[UserShare]:
    view = CellView(snap, scheduler)
    shares = read_shares(view, scheduler, weights, default_weight)
    book = shares.book
    waiting: dict[str, list[tuple[OrderKey, Job, int]]] = {}
    for job in snap.jobs.values():
        if job.scheduler != scheduler or job.id in snap.statuses:
            continue
        for i in view.pending_tasks(job):
            waiting.setdefault(job.owner, []).append((task_order(job, i), job, i))
    rows = []
    for user in sorted(set(book.users()) | set(waiting)):
        held = book.running(user)
        row = UserShare(user, book.weight(user), held.as_dict(),
                        sum(1 for _ in book.crs_of_all(user)), round(book.share(user), 6),
                        len(waiting.get(user, ())))
        if user in waiting:
            key, job, index = min(waiting[user], key=lambda w: w[0])
            crs = book.crs_waiting(user, key, job.task_resources)
            verdict, detail = _verdict(view, shares, job, index, crs, delta)
            row = attrs.evolve(row, next_task=task_id(job.id, index), next_crs=round(crs, 6),
                               verdict=verdict, detail=detail)
        rows.append(row)
    return rows


def _verdict(view: CellView, shares: CellShares, job: Job, index: int, crs: float,
             delta: float) -> tuple[str, str]:
    if not shares.over_quota(job.task_resources) and any(can_host(view, job, m)
                                                         for m in view.machines()):
        return "fits", "a machine has room for it now"
    threshold = threshold_of(crs, delta)
    precedence = task_precedence(job, index)
    by_machine, _, higher = eligible(view, shares, precedence, threshold, lambda _t: True)
    found = choose(view, job, by_machine, budget=10**9) if by_machine else None
    if found is None:
        kept = (f"; {higher} task(s) above it have a higher precedence than its "
                f"({precedence}), which fair preemption never takes" if higher else "")
        return "waits", (f"no machine frees room by preempting only tasks with CRS above "
                         f"{threshold:.3f} (CRS + delta {delta:g}){kept}")
    victims = ", ".join(f"{v.task} (CRS {v.crs:.3f})" for v in found.victims)
    return "preempts", f"on {found.machine}: {victims}"

"""Why a job is still pending, as one scheduler instance saw it on its last attempt.

After every attempt that leaves a job with tasks to place, the runtime hands the
attempt to a :class:`PendingBook` (if it was given one), which keeps the newest
report per job: the fit tally over the machines the policy looked at ("0/300
machines fit: 180 insufficient cpu, 120 selector mismatch"), the policy's other
reasons, and the claims the store turned down, counted by reason with the machines
they were lost on (another scheduler got there first, the scheduler's limit). A
scheduler process sends the book's changes to the cellstate service every fraction
of a second (``ReportPending``), which keeps them outside the cell's keys, attached
to the instance's lease: replicas never read them, and they go with the instance.
``omega why JOB`` shows them beside what the cell itself says
(``cellstate.admission.blockers``).

The simulator runs instances without a book: none of this costs it anything.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable

import orjson

from cellstate.cell import CellSnapshot
from cellstate.model import CommitResult, Job
from schedulers.api import Unplaced

#: Machines named per lost-commit reason: enough to see a pattern, a bounded report.
MACHINES_SHOWN = 8


def pending_report(job: Job, unplaced: Iterable[Unplaced], result: CommitResult | None,
                   attempts: int, at: float) -> dict[str, object]:
    """The report of one attempt at ``job``: ``reasons``, each with a ``code`` (``fit``
    for a tally over machines, ``policy`` for another reason of the policy's, ``limit``
    for tasks the scheduler's resource limit holds back (schedulers/limits.py), or the
    store's rejection reason such as ``limit_exceeded`` or ``sequence_changed``), a
    ``text`` for people and, by kind, ``tasks``, ``machines``, ``fit``,
    ``excluded`` (label -> machines) or ``count`` and ``machines`` (ids)."""
    reasons: list[dict[str, object]] = []
    for u in unplaced:
        if u.job != job.id:
            continue
        code = u.code or ("fit" if u.fit is not None else "policy")
        doc: dict[str, object] = {"code": code,
                                  "text": u.reason, "tasks": u.tasks}
        if u.fit is not None:
            doc.update(machines=u.fit.machines, fit=u.fit.fit, excluded=dict(u.fit.excluded))
        reasons.append(doc)
    if result is not None and result.rejected:
        reasons.extend(_lost(result))
    return {"job": job.id, "at": at, "attempts": attempts,
            "placed": len(result.committed) if result is not None else 0,
            "reasons": reasons}


def _lost(result: CommitResult) -> list[dict[str, object]]:
    by_reason: dict[str, list[str]] = {}
    detail: dict[str, str] = {}
    for r in result.rejected:
        by_reason.setdefault(r.reason.value, []).append(r.claim.machine)
        detail.setdefault(r.reason.value, r.detail)
    out: list[dict[str, object]] = []
    for reason, machines in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        shown = [m for m, _ in Counter(machines).most_common(MACHINES_SHOWN)]
        out.append({"code": reason, "count": len(machines), "machines": shown,
                    "text": f"{len(machines)} claim(s) lost at commit ({reason}), e.g. "
                            f"{detail[reason]}"})
    return out


class PendingBook:
    """The newest pending report per job of one instance, and what changed since the
    last :meth:`take` (thread-safe: the scheduling loop records, a reporter takes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed: dict[str, bytes] = {}
        self._sent: set[str] = set()

    def record(self, job: Job, unplaced: Iterable[Unplaced], result: CommitResult | None,
               attempts: int, at: float) -> None:
        doc = orjson.dumps(pending_report(job, unplaced, result, attempts, at))
        with self._lock:
            self._changed[job.id] = doc

    def take(self, snap: CellSnapshot, still_pending: Callable[[CellSnapshot, str], bool],
             ) -> tuple[dict[str, bytes], list[str]]:
        """(reports to write, job ids whose report to delete): the reports recorded
        since the last call, and the sent ones of jobs that no longer wait for this
        instance (``still_pending(snap, job_id) -> bool``)."""
        with self._lock:
            changed, self._changed = self._changed, {}
        gone = [j for j in self._sent if j not in changed and not still_pending(snap, j)]
        puts = {j: d for j, d in changed.items() if still_pending(snap, j)}
        gone.extend(j for j in changed if j not in puts and j in self._sent)
        return puts, sorted(set(gone))

    def sent(self, puts: Iterable[str], deletes: Iterable[str]) -> None:
        """Mark a :meth:`take`'s changes as written."""
        with self._lock:
            self._sent.update(puts)
            self._sent.difference_update(deletes)

    def restore(self, puts: dict[str, bytes]) -> None:
        """Put back reports that could not be sent (newer ones recorded since win)."""
        with self._lock:
            for j, doc in puts.items():
                self._changed.setdefault(j, doc)

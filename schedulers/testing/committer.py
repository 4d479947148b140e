"""A committer for tests: the real store underneath, rejections on demand, a record of
every transaction.

It implements the runtime's ``Committer`` protocol (``schedulers/runtime.py``) over a
real :class:`~cellstate.store.CellStore`, so what it lets through is validated and
applied exactly as in production. A test tells it to reject -- the next N commits, or
claims on chosen machines, with the :class:`~cellstate.model.Reason` of its choice --
to drive a policy and the runtime down their retry and give-up paths without having
to stage a real race. Rejected claims are never written. Every transaction it saw is
kept in :attr:`RecordingCommitter.log` with its result, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from cellstate.model import (
    Claim,
    CommitResult,
    InstanceRecord,
    JobStatus,
    Reason,
    Rejection,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore
from cellstate.validation import TransactionError, check_batch, check_shape


@attrs.frozen
class Recorded:
    """One transaction the committer saw and what became of it.

    ``result`` is None when the transaction was malformed (``error`` says why: the
    store raised ``TransactionError``). ``injected`` are the rejections the committer
    made itself; the rest of ``result.rejected`` came from the store."""

    transaction: Transaction
    result: CommitResult | None
    injected: tuple[Rejection, ...] = ()
    error: str = ""


@attrs.define
class _Rule:
    machines: frozenset[str] | None  # None: every claim
    reason: Reason
    detail: str
    remaining: int | None  # transactions it still applies to; None: until cleared

    def hits(self, claim: Claim) -> bool:
        return self.machines is None or claim.machine in self.machines


class RecordingCommitter:
    """Commits through ``store``; rejects what the test asked it to; records it all."""

    def __init__(self, store: CellStore) -> None:
        self.store = store
        self.log: list[Recorded] = []
        self._rules: list[_Rule] = []

    # -- what to reject ------------------------------------------------------------------

    def reject_next(self, count: int = 1, reason: Reason = Reason.SEQUENCE_CHANGED,
                    detail: str = "") -> None:
        """Reject every claim of the next ``count`` transactions."""
        self._add_rule(None, reason, detail, _positive(count, "count"))

    def reject_machines(self, machines: Iterable[str], reason: Reason = Reason.MACHINE_DOWN,
                        detail: str = "", times: int | None = None) -> None:
        """Reject claims on ``machines``; other claims of the same transaction commit
        (incremental) or are aborted with it (gang), as the store would do. Applies to
        the next ``times`` transactions that touch those machines, or until
        :meth:`accept_all` when ``times`` is None."""
        chosen = frozenset(machines)
        if not chosen:
            raise ValueError("reject_machines: name at least one machine")
        self._add_rule(chosen, reason, detail, None if times is None
                       else _positive(times, "times"))

    def accept_all(self) -> None:
        """Forget every rejection still pending."""
        self._rules.clear()

    def _add_rule(self, machines: frozenset[str] | None, reason: Reason, detail: str,
                  remaining: int | None) -> None:
        if not isinstance(reason, Reason):
            raise TypeError(f"reason must be a cellstate.model.Reason, not {reason!r}")
        what = "every claim" if machines is None else "claims on " + ", ".join(sorted(machines))
        self._rules.append(_Rule(machines, reason,
                                 detail or f"rejected by the test committer ({what})",
                                 remaining))

    # -- what it saw ---------------------------------------------------------------------

    @property
    def transactions(self) -> list[Transaction]:
        return [r.transaction for r in self.log]

    @property
    def results(self) -> list[CommitResult]:
        return [r.result for r in self.log if r.result is not None]

    # -- Committer ----------------------------------------------------------------------

    def commit(self, txn: Transaction) -> CommitResult:
        try:
            check_shape(txn)  # a malformed transaction is refused before any rule applies
        except TransactionError as e:
            self.log.append(Recorded(txn, None, error=str(e)))
            raise
        injected = self._injected(txn)
        if not injected:
            result = self.store.commit(txn)
        else:
            result = self._commit_rest(txn, injected)
        self.log.append(Recorded(txn, result, injected))
        return result

    def commit_many(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """A plan's transactions, each committed (and recorded) on its own, in order;
        a malformed one is refused before any is applied, as the store does."""
        check_batch(txns)
        return [self.commit(t) for t in txns]

    def _injected(self, txn: Transaction) -> tuple[Rejection, ...]:
        """The rejections the rules make of ``txn`` (consuming one use of each rule
        that applied); an earlier rule wins for a claim two rules hit."""
        out: dict[str, Rejection] = {}
        for rule in self._rules:
            hit = [c for c in txn.claims if rule.hits(c) and c.task not in out]
            if not hit:
                continue
            for c in hit:
                out[c.task] = Rejection(c, rule.reason, rule.detail)
            if rule.remaining is not None:
                rule.remaining -= 1
        self._rules = [r for r in self._rules if r.remaining is None or r.remaining > 0]
        return tuple(out[c.task] for c in txn.claims if c.task in out)

    def _commit_rest(self, txn: Transaction, injected: tuple[Rejection, ...]) -> CommitResult:
        hit = {r.claim.task for r in injected}
        rest = tuple(c for c in txn.claims if c.task not in hit)
        if txn.mode is TxnMode.GANG:
            first = injected[0]
            aborted = tuple(Rejection(c, Reason.GANG_ABORTED,
                                      f"gang aborted: {len(injected)} claim(s) failed, first "
                                      f"{first.claim.task}: {first.detail}") for c in rest)
            return self._merged(txn, (), (*injected, *aborted), self.store.view.revision)
        if not rest:
            return self._merged(txn, (), injected, self.store.view.revision)
        res = self.store.commit(attrs.evolve(txn, claims=rest))
        return attrs.evolve(self._merged(txn, res.committed, (*injected, *res.rejected),
                                         res.revision),
                            evicted=res.evicted, attempts=res.attempts)

    @staticmethod
    def _merged(txn: Transaction, committed: tuple[Claim, ...],
                rejected: Iterable[Rejection], revision: int) -> CommitResult:
        # Reported in the transaction's order, as the store reports.
        order = {c.task: i for i, c in enumerate(txn.claims)}
        return CommitResult(committed, tuple(sorted(rejected, key=lambda r: order[r.claim.task])),
                            revision)

    def register_instance(self, record: InstanceRecord, ttl: int) -> int:
        return self.store.register_instance(record, ttl)

    def deregister_instance(self, scheduler: str, instance: str, lease: int) -> None:
        self.store.deregister_instance(scheduler, instance, lease)

    def keep_alive(self, lease: int) -> None:
        self.store.keep_alive(lease)

    def resize_job(self, job_id: str, task_count: int) -> int:
        return self.store.resize_job(job_id, task_count)

    def set_job_status(self, status: JobStatus) -> int:
        return self.store.set_job_status(status)


def _positive(n: int, what: str) -> int:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{what} must be a positive whole number, not {n!r}")
    return n

"""Gangs too large for one etcd transaction: staged holds under a leased gang record
whose flip is the single commit point, settling, and recovery (docs/architecture.md,
"Gangs larger than one etcd txn")."""


from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence

import attrs

from cellstate import decisions, fit
from cellstate.cell import CellSnapshot
from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    NotFoundError as NotFoundError,
    StoreError as StoreError,
)
from cellstate.kv.base import (
    KV,
    LeaseNotFoundError,
)
from cellstate.model import (
    Claim,
    CommitResult,
    GangRecord,
    GangState,
    Reason,
    Rejection,
    Resources,
    Transaction,
    fallbacks_taken,
)
from cellstate.store.base import (
    _RESERVED_OPS,
    _Write,
)
from cellstate.store.claims import ClaimCommits, _accumulate, _Outcome, _too_big
from cellstate.validation import (
    Decision,
    founding_claims,
    validate,
)

log = logging.getLogger(__name__)

_NOTHING = Resources()


class LargeGangs(ClaimCommits):
    """The staged protocol for large gangs, and ``recover``."""

    def _commit_staged_gang(self, txn: Transaction, groups: list[list[Claim]]) -> CommitResult:
        """All-or-nothing commit of a gang too large for one etcd transaction.

        Stage every placement as a hold tagged with a new gang id whose record (leased,
        state preparing) must exist for the holds to count; then flip the record to
        committed in one etcd transaction: that is the commit point. A committer that
        dies before it lets the lease lapse, which deletes the record and voids every
        hold; after it, anyone can finish the clean-up (``recover``)."""
        self._ensure_loaded(txn.claims, [txn.scheduler])
        whole = validate(self.view, txn, shape_checked=True, at=self._now())
        founders = founding_claims(self.view, txn)
        if whole.rejected:
            return CommitResult((), whole.rejected, self.view.revision, (), 1)
        gid = uuid.uuid4().hex
        gkey = self.keys.gang(gid)
        lease = self.kv.lease_grant(self.options.gang_lease_ttl)
        stop = threading.Event()
        keeper = threading.Thread(
            target=_keep_alive, args=(self.kv, lease, self.options.gang_lease_ttl, stop),
            name=f"gang-{gid[:8]}-lease", daemon=True,
        )
        keeper.start()
        attempts = 1
        try:
            record = GangRecord(gid, txn.scheduler, GangState.PREPARING, len(txn.claims))
            res = self._write_once(_Write({gkey: 0}, {gkey: record}, {gkey: lease}))
            gang_rev = res.revision
            attempts += 1
            added: dict[str, Resources] = {}
            removed: dict[str, Resources] = {}
            evicted: list[str] = []
            applied: dict[str, Claim] = {}  # task -> its claim as staged (machine taken)
            seen = _Outcome(gang_rev)  # coarse detection forgives the gang's own writes
            staged_machines: set[str] = set()
            staged_tasks: set[str] = set()
            queue = list(groups)
            while queue:
                group = queue.pop(0)
                sub = attrs.evolve(txn, claims=tuple(group))
                for _ in range(self.options.max_attempts):
                    attempts += 1
                    self._ensure_loaded(group, [txn.scheduler])
                    if gid not in self.view.gangs:
                        return self._gang_lost(txn, attempts)
                    decision = validate(self.view, sub, staging_gang=gid,
                                        seq_rewrites=seen.rewrites, shape_checked=True,
                                        gang_coverage=False, founders=founders,
                                        at=self._now())
                    if decision.rejected:
                        self._abort_gang(gid, staged_machines, staged_tasks)
                        return self._gang_failed(txn, decision.rejected, attempts)
                    p = self._prepare(self._stage_write(decision, gkey, gang_rev))
                    if not self._fits(p):
                        if len(group) == 1:
                            self._abort_gang(gid, staged_machines, staged_tasks)
                            return self._gang_failed(txn, [_too_big(group[0])], attempts)
                        half = len(group) // 2
                        queue[:0] = [group[:half], group[half:]]
                        break
                    if self._write_decision(p, [(0, group)], [decision], [seen]).succeeded:
                        applied.update(decision.accepted_by_task)
                        staged_machines.update(decision.machines)
                        staged_tasks.update(decision.tasks)
                        _accumulate(added, decision.added)
                        _accumulate(removed, decision.removed)
                        evicted.extend(decision.evicted)
                        break
                else:
                    self._abort_gang(gid, staged_machines, staged_tasks)
                    return self._gang_failed(
                        txn,
                        [Rejection(group[0], Reason.SEQUENCE_CHANGED,
                                   "staging gave up: the machines keep changing")],
                        attempts,
                    )
            flipped = self._flip_gang(txn, gid, gang_rev, added, removed)
            attempts += 1
            if isinstance(flipped, Rejection):
                self._abort_gang(gid, staged_machines, staged_tasks)
                return self._gang_failed(txn, [flipped], attempts)
            if flipped is None:
                return self._gang_lost(txn, attempts)
        finally:
            stop.set()
            keeper.join()
            with contextlib.suppress(LeaseNotFoundError):
                self.kv.lease_revoke(lease)
        revision = flipped
        try:
            self.finalize_gang(gid, staged_machines, staged_tasks)
        except StoreError as e:  # the gang is committed; recover() finishes the clean-up
            log.warning("gang %s committed; clean-up deferred: %s", gid, e)
        committed = tuple(applied[c.task] for c in txn.claims)
        return CommitResult(committed, (), revision, tuple(evicted), attempts,
                            fallbacks_taken(txn.claims, committed))

    def _stage_write(self, decision: Decision, gkey: bytes, gang_rev: int) -> _Write:
        """Staging writes holds and marks only; usage counters move at the commit point."""
        w = self._decision_write(attrs.evolve(decision, added={}, removed={}))
        return _Write({**w.guards, gkey: gang_rev}, w.records)

    def _flip_gang(
        self,
        txn: Transaction,
        gid: str,
        gang_rev: int,
        added: Mapping[str, Resources],
        removed: Mapping[str, Resources],
    ) -> int | Rejection | None:
        """The commit point. Returns the revision, a rejection (limit), or None when
        the gang's record is gone (its lease lapsed)."""
        gkey = self.keys.gang(gid)
        jobs = sorted({c.job for c in txn.claims})
        for _ in range(self.options.max_attempts):
            self._fetch([self.keys.config, *map(self.keys.status, jobs)])
            self._ensure_usage([*added, *removed])
            if gid not in self.view.gangs:
                return None
            guards: dict[bytes, int] = {gkey: gang_rev, self.keys.config: self.view.config.revision}
            # A kill that lands while the gang stages must win: the commit point reads
            # the jobs' statuses too (staged holds of an aborted gang are void).
            for jid in jobs:
                status = self.view.statuses.get(jid)
                if status is not None:
                    first = next(c for c in txn.claims if c.job == jid)
                    return Rejection(first, Reason.JOB_ENDED,
                                     f"job {jid!r} was {status.state.value}: {status.reason}")
                guards[self.keys.status(jid)] = 0
            usage = self._usage_records(added, removed)
            for key, u in usage.items():
                guards[key] = self.view.guard_revision(key)
                lim = self.view.config.limits_for(u.scheduler)
                assert lim is not None and lim.max_resources is not None
                if u.scheduler in added:
                    # The counter already holds the whole gang: nothing more to add.
                    miss = fit.quota(u.used, _NOTHING, lim.max_resources, u.scheduler)
                    if miss is not None:
                        dim = miss.dimension
                        return Rejection(
                            txn.claims[0], miss.reason,
                            f"scheduler {u.scheduler!r} would hold {u.used.get(dim):g} {dim}, "
                            f"past its limit of {lim.max_resources.get(dim):g}", dim,
                        )
            record = GangRecord(
                gid, txn.scheduler, GangState.COMMITTED, len(txn.claims),
                {s: r for s, r in added.items()},
            )
            res = self._try_write(_Write(guards, {gkey: record, **usage}))
            if res.succeeded:
                return res.revision
        raise ContentionError(f"gang {gid}: the commit point kept failing its guards")

    def _gang_failed(
        self, txn: Transaction, failures: Sequence[Rejection], attempts: int
    ) -> CommitResult:
        failed = {r.claim.task for r in failures}
        first = failures[0]
        rest = [
            Rejection(c, Reason.GANG_ABORTED,
                      f"gang aborted: {first.claim.task}: {first.detail}")
            for c in txn.claims if c.task not in failed
        ]
        return CommitResult((), (*failures, *rest), self.view.revision, (), attempts)

    def _gang_lost(self, txn: Transaction, attempts: int) -> CommitResult:
        return CommitResult(
            (),
            tuple(Rejection(c, Reason.GANG_ABORTED, "gang aborted: its lease lapsed before the "
                            "commit point") for c in txn.claims),
            self.view.revision, (), attempts,
        )

    def _abort_gang(
        self, gid: str, machines: set[str] | None = None, tasks: set[str] | None = None
    ) -> None:
        """Delete a preparing gang's record (so its holds are void) and clear them."""
        gkey = self.keys.gang(gid)
        self._fetch([gkey])
        rec = self.view.gangs.get(gid)
        if rec is not None and rec.state is GangState.PREPARING:
            res = self._try_write(_Write({gkey: rec.revision}, {gkey: None}))
            if not res.succeeded:
                self._fetch([gkey])
        try:
            self._clean_gang_marks(gid, machines, tasks)
        except StoreError as e:
            log.warning("gang %s aborted; clean-up deferred: %s", gid, e)

    def finalize_gang(
        self, gid: str, machines: set[str] | None = None, tasks: set[str] | None = None
    ) -> None:
        """Turn a committed gang's holds into plain allocations, carry out its evictions,
        then delete its record. Idempotent; safe to run from any process. ``machines``
        and ``tasks`` say where the gang staged records, if known (else the whole cell
        is read to find them)."""
        with self._lock:
            gkey = self.keys.gang(gid)
            self._fetch([gkey])
            rec = self.view.gangs.get(gid)
            if rec is None:
                return
            if rec.state is not GangState.COMMITTED:
                raise StoreError(f"gang {gid} is {rec.state.value}, not committed")
            self._clean_gang_marks(gid, machines, tasks)
            self._retry(
                f"deleting gang {gid}",
                lambda: _Write({gkey: self.view.guard_revision(gkey)}, {gkey: None}),
            )

    def _clean_gang_marks(
        self, gid: str, machine_hint: set[str] | None = None, task_hint: set[str] | None = None
    ) -> None:
        """Rewrite every record tagged with gang ``gid``: settle them if it committed,
        drop them if it aborted."""
        k = self.keys
        if machine_hint is None or task_hint is None:
            self.load()
        else:
            self._fetch([k.gang(gid), *map(k.machine, machine_hint), *map(k.task_key, task_hint)])
        committed = (g := self.view.gangs.get(gid)) is not None and g.state is GangState.COMMITTED
        machines = [m.id for m in self.view.machines.values()
                    if (machine_hint is None or m.id in machine_hint)
                    and any(gid in (a.gang, a.evicted_by) for a in m.allocations.values())]
        tasks = [t.id for t in self.view.tasks.values()
                 if (task_hint is None or t.id in task_hint) and t.gang == gid]
        budget = self.kv.max_txn_ops - _RESERVED_OPS
        # A record settled costs up to two ops (an evicted victim's allocation and its
        # task record), and its machine one: so many fit one write of a single machine.
        per_machine = max(1, (budget - 1) // 2)
        left = self._marks(gid, machines)
        while left:
            self._write_in_batches(
                f"settling gang {gid}", machines, max(1, budget // 2),
                lambda b: self._settle_machines(gid, b, committed, per_machine))
            before, left = left, self._marks(gid, machines)
            if left >= before:
                raise StoreError(f"settling gang {gid}: {left} records stay marked")
            machines = [mid for mid in machines if (m := self.view.machines.get(mid))
                        and any(gid in (a.gang, a.evicted_by) for a in m.allocations.values())]
        self._write_in_batches(f"settling gang {gid}", tasks, budget,
                               lambda b: self._settle_tasks(gid, b, committed))

    def _marks(self, gid: str, machines: Sequence[str]) -> int:
        """Records on ``machines`` still marked with gang ``gid`` (its holds, its victims)."""
        return sum(1 for mid in machines if (m := self.view.machines.get(mid))
                   for a in m.allocations.values() if gid in (a.gang, a.evicted_by))

    def _write_in_batches(
        self, what: str, items: Sequence[str], step: int,
        make_write: Callable[[Sequence[str]], _Write],
    ) -> None:
        """Write ``make_write(batch)`` for consecutive batches of ``items``, halving a
        batch whose write would not fit one backend transaction, retrying guard
        failures (``make_write`` reads the refreshed view each time)."""
        queue = [items[i : i + step] for i in range(0, len(items), step)]
        while queue:
            batch = queue.pop(0)
            for _ in range(self.options.max_attempts):
                p = self._prepare(make_write(batch))
                if not self._fits(p) and len(batch) > 1:
                    queue[:0] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
                    break
                if self._try_write(p).succeeded:
                    break
            else:
                raise ContentionError(f"{what}: gave up after {self.options.max_attempts} "
                                      "attempts; the records it needs keep changing")

    def _settle_machines(self, gid: str, mids: Sequence[str], committed: bool,
                         limit: int | None = None) -> _Write:
        return self._write_for(
            decisions.settle_gang_machines(self.view, gid, mids, committed, limit,
                                           self._now()))

    def _settle_tasks(self, gid: str, tids: Sequence[str], committed: bool) -> _Write:
        return self._write_for(decisions.settle_gang_tasks(self.view, gid, tids, committed))

    @staticmethod
    def needs_recovery(snap: CellSnapshot) -> bool:
        """Whether :meth:`recover` has anything to do in ``snap`` (a replica's copy): a
        committed gang, or a gang mark whose gang record is gone. A server starting on
        a cell without (the usual case) skips recover's full read of the cell."""
        if any(g.state is GangState.COMMITTED for g in snap.gangs.values()):
            return True
        return any(tag and tag not in snap.gangs
                   for m in snap.machines.values() for a in m.allocations.values()
                   for tag in (a.gang, a.evicted_by)) or any(
            t.gang and t.gang not in snap.gangs for t in snap.tasks.values())

    def recover(self) -> list[str]:
        """Finish what crashed committers left: settle committed gangs, clear the holds
        of aborted ones. Returns the ids of the gangs it touched."""
        with self._lock:
            self.load()
            touched = []
            for gid, g in list(self.view.gangs.items()):
                if g.state is GangState.COMMITTED:
                    self.finalize_gang(gid)
                    touched.append(gid)
            orphans = {
                tag
                for m in self.view.machines.values()
                for a in m.allocations.values()
                for tag in (a.gang, a.evicted_by)
                if tag and tag not in self.view.gangs
            } | {t.gang for t in self.view.tasks.values() if t.gang and t.gang not in
                 self.view.gangs}
            for gid in sorted(orphans):
                self._clean_gang_marks(gid)
                touched.append(gid)
            return touched

    # -- jobs, machines, releases, config ------------------------------------------------


def _keep_alive(kv: KV, lease: int, ttl: int, stop: threading.Event) -> None:
    while not stop.wait(max(ttl / 3, 0.2)):
        try:
            kv.lease_keepalive(lease)
        except Exception as e:  # the commit point will notice the lapsed lease
            log.warning("gang lease %x: keep-alive failed: %s", lease, e)
            return

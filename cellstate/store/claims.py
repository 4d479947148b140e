"""Committing claims: transactions and plans of several jobs, split over etcd's
limits, one guarded etcd transaction per group (or one nested transaction per machine
under contention)."""


from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    NotFoundError as NotFoundError,
    StoreError as StoreError,
)
from cellstate.kv.base import (
    Compare,
    Get,
    Op,
    TxnOp,
    TxnResult,
)
from cellstate.model import (
    Claim,
    CommitResult,
    Machine,
    Reason,
    Rejection,
    Resources,
    TaskRecord,
    Transaction,
    TxnMode,
    fallbacks_taken,
)
from cellstate.store.base import (
    _ALLOC_BYTES,
    _MACHINE_BYTES,
    _RESERVED_OPS,
    StoreBase,
    _Prepared,
    _with_revision,
    _Write,
)
from cellstate.validation import (
    Decision,
    Reads,
    check_batch,
    check_shape,
    validate_many,
)

log = logging.getLogger(__name__)


class ClaimCommits(StoreBase):
    """Commits of claims (``commit``, ``commit_many``)."""

    def commit(self, txn: Transaction) -> CommitResult:
        """Validate and apply a transaction. Raises TransactionError if it is malformed
        (then nothing is applied); otherwise every claim is either committed or rejected
        with a reason."""
        check_shape(txn)
        with self._lock:
            return self._commit_all([txn])[0]

    def commit_many(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """Commit several transactions (one per job of a scheduler's plan, say) in as
        few etcd transactions as etcd's limits allow, and answer each on its own.

        They are decided in order, each seeing what those before it placed, with the
        results of committing them one after another (``validation.validate_many``);
        several that fit one etcd transaction are written together, atomically. Raises
        TransactionError naming the transaction if any is malformed; then nothing is
        applied."""
        check_batch(txns)
        with self._lock:
            return self._commit_all(list(txns))

    def commit_checked(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """``commit_many`` of transactions each checked well-formed already (the commit
        leader's batches: its server checked every request on its own)."""
        with self._lock:
            return self._commit_all(list(txns))

    def _commit_all(self, txns: list[Transaction]) -> list[CommitResult]:
        self._ensure_config()
        outs = [_Outcome(self.view.revision) for _ in txns]
        queue = self._plan(txns)
        while queue:
            step = queue.pop(0)
            if isinstance(step, _Staged):
                outs[step.index].merge(self._commit_staged_gang(txns[step.index], step.groups))
            else:
                queue[:0] = self._commit_group(txns, step, outs)
        return [o.result(t) for o, t in zip(outs, txns, strict=True)]

    def _budget(self, nested: bool) -> _Budget:
        def machine_bytes(mid: str) -> int:
            return _MACHINE_BYTES  # its record, without allocations (keys of their own)

        # Nested: the outer lists take at most half of etcd's limit, so that each
        # machine's nested transaction keeps the other half (etcd gives it only what
        # its parent's largest list leaves).
        ops = self.kv.max_txn_ops // 2 if nested else self.kv.max_txn_ops - _RESERVED_OPS
        return _Budget(ops, self.options.max_txn_bytes, nested, machine_bytes)

    def _groups(self, claims: Sequence[Claim], nested: bool = False) -> list[list[Claim]]:
        """Split claims, in order, into groups that each fit one etcd transaction.
        ``nested``: the group will be sent as one nested transaction per machine, so
        only the number of machines and jobs (the outer transaction's ops) and the size
        count."""
        groups: list[list[Claim]] = []
        cur: list[Claim] = []
        budget = self._budget(nested)
        for c in claims:
            if not budget.take(c):
                groups.append(cur)
                cur, budget = [], self._budget(nested)
                budget.take(c)
            cur.append(c)
        if cur:
            groups.append(cur)
        return groups

    def _plan(self, txns: Sequence[Transaction]) -> list[_Group | _Staged]:
        """Split the transactions' claims, in order, into groups that each fit one etcd
        transaction, packing several transactions into a group where they fit. A gang
        stays whole in one group or, too large for one, is staged. Under contention
        (one nested transaction per machine) a gang gets a group of its own, written
        as one plain etcd transaction: its claims cannot commit machine by machine."""
        nested = self._contended()
        steps: list[_Group | _Staged] = []
        parts: list[tuple[int, list[Claim]]] = []
        budget = self._budget(nested)

        def flush() -> None:
            nonlocal parts, budget
            if parts:
                steps.append(_Group(parts))
            parts, budget = [], self._budget(nested)

        for i, t in enumerate(txns):
            if t.mode is TxnMode.GANG:
                if not nested:
                    if budget.take_all(t.claims):
                        parts.append((i, list(t.claims)))
                        continue
                    flush()
                    if budget.take_all(t.claims):
                        parts.append((i, list(t.claims)))
                        continue
                flush()
                own = self._groups(t.claims)
                steps.append(_Staged(i, own) if len(own) > 1 else _Group([(i, list(t.claims))]))
                continue
            cur: list[Claim] | None = None
            for c in t.claims:
                if not budget.take(c):
                    flush()
                    budget.take(c)
                    cur = None
                if cur is None:
                    cur = []
                    parts.append((i, cur))
                cur.append(c)
        flush()
        return steps

    def _decision_write(self, decision: Decision, extra_guards: Mapping[bytes, int] = {}) -> _Write:
        k = self.keys
        v = self.view
        guards: dict[bytes, int] = {k.config: v.config.revision}
        reads = decision.reads
        for mid in reads.machines:
            guards[k.machine(mid)] = v.machine_rev(mid)
        for tid in reads.tasks:
            guards[k.task_key(tid)] = v.task_rev(tid)
        for jid in reads.jobs:
            guards[k.job(jid)] = v.job_rev(jid)
        for gid in reads.gangs:
            guards[k.gang(gid)] = v.guard_revision(k.gang(gid))
        for jid in reads.statuses:
            guards[k.status(jid)] = v.guard_revision(k.status(jid))
        records: dict[bytes, object] = {}
        for mid, m in decision.machines.items():
            records[k.machine(mid)] = m
        for tid, t in decision.tasks.items():
            records[k.task_key(tid)] = t
        self._ensure_usage([*decision.added, *decision.removed])
        for key, u in self._usage_records(decision.added, decision.removed).items():
            guards[key] = v.guard_revision(key)
            records[key] = u
        for s in reads.usage:
            guards[k.usage(s)] = v.guard_revision(k.usage(s))
        guards.update(extra_guards)
        return _Write(guards, records)

    def _commit_group(
        self, txns: Sequence[Transaction], group: _Group, outs: list[_Outcome]
    ) -> list[_Group | _Staged]:
        """Decide one group and write it, deciding again after guard failures. Returns
        the steps to run in its place if it turns out not to fit one etcd transaction."""
        parts = group.parts
        for attempt in range(self.options.max_attempts):
            for i, _cs in parts:
                outs[i].attempts += 1
            subs = [txns[i] if len(cs) == len(txns[i].claims)  # the whole transaction
                    else attrs.evolve(txns[i], claims=tuple(cs)) for i, cs in parts]
            # While guards keep failing (other committers write the machines this view
            # holds), read the machines again before the first attempt: a read-only
            # request costs etcd no log entry and no fsync, a write that fails on
            # stale machines costs both and a second write. Later attempts know the
            # machines that failed from the failed write itself.
            refresh = (attempt == 0 and self.options.refresh_when_contended
                       and self._failing())
            if self._ensure_loaded([c for _, cs in parts for c in cs],
                                   {t.scheduler for t in subs}, refresh):
                # A guard the read kept from failing: others still write these machines.
                self._note_conflict(True)
            decisions = validate_many(self.view, subs, shape_checked=True,
                                      seq_rewrites=[outs[i].rewrites for i, _ in parts],
                                      at=self._now())
            if all(t.mode is TxnMode.INCREMENTAL for t in subs) and self._contended():
                split = self._components(parts, decisions)
                if split is not None:
                    left = self._write_components(split, parts, decisions, outs)
                    if left is not None:
                        if not left:
                            return []
                        parts = left
                        continue
            p = self._prepare(self._decision_write(_merged(decisions)))
            if not self._fits(p):
                return self._split(txns, parts, outs)
            res = self._write_decision(p, parts, decisions, outs)
            self._note_conflict(not res.succeeded)
            if res.succeeded:
                for (i, _), d in zip(parts, decisions, strict=True):
                    outs[i].settle(d.accepted, d.rejected, d.evicted, res.revision)
                return []
        for i, cs in parts:
            outs[i].rejected.extend(
                Rejection(c, Reason.SEQUENCE_CHANGED, "the store gave up after "
                          f"{self.options.max_attempts} attempts: its machines keep changing")
                for c in cs)
        return []

    def _split(self, txns: Sequence[Transaction], parts: list[tuple[int, list[Claim]]],
               outs: list[_Outcome]) -> list[_Group | _Staged]:
        """A group too large for one etcd transaction after all (machine records larger
        than estimated): halve it, at transaction boundaries first."""
        if len(parts) > 1:
            half = len(parts) // 2
            return [_Group(parts[:half]), _Group(parts[half:])]
        ((i, cs),) = parts
        half = len(cs) // 2
        if txns[i].mode is TxnMode.GANG:
            return [_Staged(i, [cs[:half], cs[half:]])]
        if len(cs) > 1:
            return [_Group([(i, cs[:half])]), _Group([(i, cs[half:])])]
        outs[i].rejected.append(_too_big(cs[0]))
        return []

    def _note_conflict(self, conflicted: bool) -> None:
        self._conflicts = 0.9 * self._conflicts + (0.1 if conflicted else 0.0)

    def _contended(self) -> bool:
        """Whether guards fail often enough lately that one etcd transaction per group
        (cheapest when nothing conflicts) loses to one nested transaction per machine
        (a conflict then costs only that machine's claims)."""
        mode = self.options.per_machine_writes
        return mode == "always" or (mode == "auto" and self._failing())

    def _failing(self) -> bool:
        """Whether guards of commit writes fail often lately."""
        return self._conflicts > 0.15

    def _components(
        self, parts: Sequence[tuple[int, list[Claim]]], decisions: Sequence[Decision]
    ) -> tuple[dict[bytes, int], list[_Component]] | None:
        """The decisions as one guarded write per set of machines that claims connect,
        for incremental transactions. A claim reads and writes only the machines it
        tried (its first choice, the fallbacks it went on to, the machine it moves
        from), its task, its victims (on the machine it took) and its job; so claims
        that share no machine or task can commit independently, and a change to one
        machine costs a retry of its component's claims only. Usually a component is
        one machine. The guards all components share (config, jobs, statuses: they
        rarely change) are returned apart, for the enclosing transaction. None when a
        usage counter (shared by all machines) is involved: then the group is one
        write."""
        if any(d.reads.usage or any(self._limited(s) for s in (*d.added, *d.removed))
               for d in decisions):
            return None
        k, v = self.keys, self.view
        new_machines: dict[str, Machine] = {}
        new_tasks: dict[str, TaskRecord] = {}
        for d in decisions:
            new_machines.update(d.machines)
            new_tasks.update(d.tasks)
        shared: dict[bytes, int] = {k.config: v.config.revision}
        for _, cs in parts:
            for jid in dict.fromkeys(c.job for c in cs):
                shared[k.job(jid)] = v.job_rev(jid)
                shared[k.status(jid)] = v.guard_revision(k.status(jid))
        by_machine = _by_machine(parts, decisions)
        comps = list((by_machine if by_machine is not None
                      else _connected(parts, decisions)).values())
        covered_m = {m for comp in comps for m in comp.machines}
        covered_t = {t for comp in comps for t in comp.tasks}
        if not (new_machines.keys() <= covered_m and new_tasks.keys() <= covered_t):
            return None  # a write outside every claim's reads: keep it one transaction
        for comp in comps:
            guards: dict[bytes, int] = {}
            records: dict[bytes, object] = {}
            for mid in comp.machines:
                guards[k.machine(mid)] = v.machine_rev(mid)
                m = v.machines.get(mid)
                if m is not None and m.has_tags:
                    for g in m.gang_tags:
                        guards[k.gang(g)] = v.guard_revision(k.gang(g))
                if mid in new_machines:
                    records[k.machine(mid)] = new_machines[mid]
            for tid in comp.tasks:
                tkey = k.task_key(tid)
                guards[tkey] = v.task_rev(tid)
                rec = v.tasks.get(tid)
                if rec is not None and rec.gang:
                    guards[k.gang(rec.gang)] = v.guard_revision(k.gang(rec.gang))
                if tid in new_tasks:
                    records[tkey] = new_tasks[tid]
            comp.write = _Write(guards, records)
        return shared, comps

    def _write_components(
        self,
        split: tuple[dict[bytes, int], list[_Component]],
        parts: list[tuple[int, list[Claim]]],
        decisions: Sequence[Decision],
        outs: list[_Outcome],
    ) -> list[tuple[int, list[Claim]]] | None:
        """Send every component's write as a nested transaction of one etcd request,
        inside one guarded by the shared records, and settle the claims of those that
        passed. Returns the parts left to decide again, or None when the request would
        not fit (the caller sends the group as one write, which splits it)."""
        shared, comps = split
        prepared = [self._prepare(c.write) for c in comps if c.write is not None]
        outer = max(len(comps), len(shared) + (self._fence is not None))
        # etcd gives a nested transaction only the ops its parent's largest list leaves.
        inner = self.kv.max_txn_ops - outer
        if (outer > self.kv.max_txn_ops
                or any(len(p.write.guards) > inner or len(p.ops) > inner for p in prepared)
                or sum(p.size for p in prepared) > min(self.options.max_txn_bytes,
                                                       self.kv.max_request_bytes)):
            return None
        guard = Compare.mod_revision_is
        gets = self._gets
        ops: list[Op] = [
            TxnOp(tuple([guard(key, rev) for key, rev in p.write.guards.items()]),
                  tuple(p.ops),  # type: ignore[arg-type]
                  tuple(gets(p.write.guards)))
            for p in prepared
        ]
        before = {mid: self.view.machines[mid].seq for d in decisions for mid in d.machines}
        shared_gets = self._gets(shared)
        compares = [Compare.mod_revision_is(key, rev) for key, rev in shared.items()]
        if self._fence is not None:
            compares.append(self._fence)
        self._expect_write([(p.write.records, p.write.guards) for p in prepared], ops)
        res = self.kv.txn(compares, ops, shared_gets)
        if not res.succeeded:  # the config or a job changed: learn it, decide again
            self._check_fence()
            self._observe_reads(shared_gets, res)
            return parts
        self._note_conflict(any(isinstance(r, TxnResult) and not r.succeeded
                                for r in res.responses))
        left: set[tuple[int, str]] = set()
        for comp, op, sub_res in zip(comps, ops, res.responses, strict=True):
            assert isinstance(sub_res, TxnResult) and isinstance(op, TxnOp)
            assert comp.write is not None
            if not sub_res.succeeded:
                self._observe_reads(op.failure, sub_res)
                left.update((j, c.task) for j, c in comp.claims)
                continue
            for key, record in comp.write.records.items():
                self.view.put_record(key, _with_revision(record, res.revision), res.revision)
            for j, c in comp.claims:
                i, d = parts[j][0], decisions[j]
                if c.task in d.accepted_by_task:
                    outs[i].settle((d.accepted_by_task[c.task],), (), c.evict, res.revision)
                else:
                    outs[i].settle((), (d.rejection_of(c.task),), (), res.revision)
            for j in {j for j, _ in comp.claims}:
                outs[parts[j][0]].rewrote(
                    {m: before[m] for m in decisions[j].machines if m in comp.machines},
                    res.revision)
        return [(i, [c for c in cs if (j, c.task) in left])
                for j, (i, cs) in enumerate(parts) if any((j, c.task) in left for c in cs)]

    def _write_decision(
        self, p: _Prepared, parts: Sequence[tuple[int, list[Claim]]],
        decisions: Sequence[Decision], outs: list[_Outcome],
    ) -> TxnResult:
        """Send one group's write; on success remember, per transaction and machine it
        rewrote, the sequence number before that transaction's first write and the one
        after its latest (coarse detection must not count a transaction's own writes)."""
        before = {mid: self.view.machines[mid].seq for d in decisions for mid in d.machines}
        # While guards rarely fail, a failure is learnt by a read after it rather than
        # by a failure branch in every request (see _try_write).
        if not self._failing():
            p = attrs.evolve(p, write=attrs.evolve(p.write, read_back=False))
        res = self._try_write(p)
        if res.succeeded:
            for (i, _), d in zip(parts, decisions, strict=True):
                outs[i].rewrote({mid: before[mid] for mid in d.machines}, res.revision)
        return res

    # -- the commit leader's pipeline ---------------------------------------------------
    #
    # The leader validates the next batch while the previous one's Txn is in flight
    # (cellstate/api/leader.py). ``stage`` decides a batch over the view with the
    # records of the write in flight held under a placeholder revision (its ``mark``,
    # above every real revision, so a claim that saw the machine before cannot match it
    # and nothing read or watched replaces them meanwhile); ``send`` encodes it once
    # the write before it is durable (its guards and the sequence its allocation keys
    # are named by wait for that revision) and sends it; ``settle`` takes what etcd
    # answered. If a write in flight fails, the leader ``abandon``s the batch staged
    # on top of it and commits that batch again from the true state: nothing is
    # answered from a state that did not happen. One etcd request per batch, one nested
    # transaction per machine (``_components``), so a machine an outside writer changed
    # costs only its own claims a second decision.

    def stage(self, txns: Sequence[Transaction], mark: int,
              cuts: Sequence[int] = ()) -> Staged | None:
        """Decide ``txns`` (each checked well-formed) over the view, writes in flight
        included, and hold the records they write under ``mark``. If they do not all
        fit one etcd request, only the first ``n`` are, ``n`` the largest of ``cuts``
        (where the caller may cut: its requests' ends) that fits; ``Staged.txns`` says
        which. None when none fit or they are not all incremental (the caller commits
        them with ``commit_checked`` once nothing is in flight)."""
        with self._lock:
            self._ensure_config()
            if not txns or any(t.mode is not TxnMode.INCREMENTAL for t in txns):
                return None
            txns = list(txns)
            steps = self._plan(txns)
            first = steps[0]
            if not isinstance(first, _Group):
                return None
            if len(steps) > 1:
                # The transactions the first request holds whole.
                whole = next((i for i, (j, cs) in enumerate(first.parts)
                              if j != i or len(cs) != len(txns[j].claims)), len(first.parts))
                n = max((c for c in cuts if 0 < c <= whole), default=0)
                if not n:
                    return None
                txns = txns[:n]
                first = _Group(first.parts[:n])
            parts = first.parts
            subs = [txns[i] if len(cs) == len(txns[i].claims)
                    else attrs.evolve(txns[i], claims=tuple(cs)) for i, cs in parts]
            self._ensure_loaded([c for _, cs in parts for c in cs], {t.scheduler for t in subs})
            decisions = validate_many(self.view, subs, shape_checked=True, at=self._now())
            split = self._components(parts, decisions)
            if split is None:
                return None
            view = self.view
            olds = {mid: view.machines.get(mid) for d in decisions for mid in d.machines}
            pending: dict[bytes, object] = {}
            for comp in split[1]:
                assert comp.write is not None
                for key, record in comp.write.records.items():
                    held = _with_revision(record, mark)
                    view.put_pending(key, held, mark)
                    pending[key] = held
            return Staged(txns, parts, decisions, split, olds, mark, pending)

    def send(self, staged: Staged, durable: Mapping[int, int]) -> SentBatch | None:
        """Encode ``staged`` now that the writes it was decided over are durable
        (``durable``: their marks to their revisions); the caller sends the returned
        request. None when it would not fit one request (then abandon it)."""
        def real(rev: int) -> int:
            return durable.get(rev, rev)

        with self._lock:
            shared, comps = staged.split
            olds = {mid: (m.with_seq(durable[m.seq]) if m is not None and m.seq in durable
                          else m) for mid, m in staged.olds.items()}
            prepared = []
            guards = []
            for comp in comps:
                assert comp.write is not None
                held = comp.write.guards
                if durable and not durable.keys().isdisjoint(held.values()):
                    held = {k: real(v) for k, v in held.items()}
                guards.append(held)
                # (The guards' keys, all _prepare reads of them, are the same.)
                prepared.append(self._prepare(comp.write, olds))
            outer = max(len(comps), len(shared) + (self._fence is not None))
            inner = self.kv.max_txn_ops - outer
            if (outer > self.kv.max_txn_ops
                    or any(len(g) > inner or len(p.ops) > inner
                           for g, p in zip(guards, prepared, strict=True))
                    or sum(p.size for p in prepared) > min(self.options.max_txn_bytes,
                                                           self.kv.max_request_bytes)):
                return None
            guard = Compare.mod_revision_is
            # No failure branches: only writers outside the leader fail a machine's
            # guards, rarely; what they changed is read after (``settle``), not carried
            # in every request and etcd's log.
            ops: list[Op] = [
                TxnOp(tuple([guard(key, rev) for key, rev in g.items()]),
                      tuple(p.ops))  # type: ignore[arg-type]
                for g, p in zip(guards, prepared, strict=True)
            ]
            shared_real = {k: real(v) for k, v in shared.items()}
            compares = [guard(key, rev) for key, rev in shared_real.items()]
            if self._fence is not None:
                compares.append(self._fence)
            self._expect_write([(c.write.records, g) for c, g in zip(comps, guards, strict=True)
                                if c.write is not None], ops)
            return SentBatch(compares, ops, self._gets(shared_real), dict(durable))

    def settle(self, staged: Staged, sent: SentBatch, res: TxnResult) -> Settled:
        """Take etcd's answer to ``sent``: the records of the machines whose nested
        transactions passed are durable at its revision and their claims answered;
        the rest (a guard failed: a writer outside the leader) are dropped from the
        view and left to decide again (``finish``). Raises FencedOut if the fence
        failed the request."""
        with self._lock:
            view = self.view
            outs = [_Outcome(res.revision) for _ in staged.txns]
            parts, decisions = staged.parts, staged.decisions
            if not res.succeeded:  # the config, a job or the fence changed
                self.abandon(staged)
                self._check_fence()
                self._observe_reads(sent.shared_gets, res)
                return Settled(outs, parts)
            left: set[tuple[int, str]] = set()
            failed: set[bytes] = set()
            for comp, op, sub_res in zip(staged.split[1], sent.ops, res.responses, strict=True):
                assert isinstance(sub_res, TxnResult) and isinstance(op, TxnOp)
                assert comp.write is not None
                if not sub_res.succeeded:
                    for key in comp.write.records:
                        view.drop(key)
                        staged.pending.pop(key, None)
                    failed.update(comp.write.guards)
                    left.update((j, c.task) for j, c in comp.claims)
                    continue
                for key in comp.write.records:
                    view.settle_pending(key, staged.pending.pop(key), res.revision)
                for j, c in comp.claims:
                    i, d = parts[j][0], decisions[j]
                    if c.task in d.accepted_by_task:
                        outs[i].settle((d.accepted_by_task[c.task],), (), c.evict, res.revision)
                    else:
                        rejection = _real_detail(d.rejection_of(c.task), sent.durable)
                        outs[i].settle((), (rejection,), (), res.revision)
            # (No ``rewrote``: the claims left are on machines of their own components,
            # none of which this request wrote.)
            if failed:  # learn what the outside writers changed
                self._fetch(k for k in failed if k not in staged.pending)
            self._note_conflict(bool(left))
            rest = [(i, [c for c in cs if (j, c.task) in left])
                    for j, (i, cs) in enumerate(parts) if any((j, c.task) in left for c in cs)]
            return Settled(outs, rest)

    def finish(self, staged: Staged, settled: Settled) -> list[CommitResult]:
        """The answers to ``staged``'s transactions, deciding again (as ``commit_many``
        does, from what etcd holds) the claims ``settle`` left. Call it with nothing
        else staged."""
        with self._lock:
            outs, txns = settled.outs, staged.txns
            for i, cs in settled.left:
                sub = attrs.evolve(txns[i], claims=tuple(cs))
                outs[i].merge(self._commit_all([sub])[0])
            for o in outs:
                o.attempts += 1
            return [o.result(t) for o, t in zip(outs, txns, strict=True)]

    def abandon(self, staged: Staged) -> None:
        """Forget the records ``staged`` holds in flight (its write failed, or the one it
        was decided over did): they are read again when next needed."""
        with self._lock:
            for key in staged.pending:
                self.view.drop(key)
            staged.pending.clear()

    # -- large gangs -------------------------------------------------------------------

    def _commit_staged_gang(self, txn: Transaction, groups: list[list[Claim]]) -> CommitResult:
        raise NotImplementedError  # gangs.LargeGangs: a gang too large for one etcd txn



@attrs.define
class Staged:
    """A batch decided over the writes in flight (``ClaimCommits.stage``)."""

    txns: list[Transaction]
    parts: list[tuple[int, list[Claim]]]
    decisions: list[Decision]
    split: tuple[dict[bytes, int], list[_Component]]
    olds: dict[str, Machine | None]  # the machines it rewrites, as decided over
    mark: int
    pending: dict[bytes, object]  # key -> the record the view holds for it under mark


@attrs.frozen
class SentBatch:
    """A staged batch's etcd request (``ClaimCommits.send``)."""

    compares: list[Compare]
    ops: list[Op]
    shared_gets: list[Get]
    durable: Mapping[int, int]  # the marks it was decided over -> their revisions


@attrs.define
class Settled:
    """What etcd's answer settled of a staged batch, and the claims left to decide."""

    outs: list[_Outcome]
    left: list[tuple[int, list[Claim]]]


def _real_detail(r: Rejection, durable: Mapping[int, int]) -> Rejection:
    """A rejection decided over a write in flight names its placeholder revision; say
    the revision it became instead."""
    detail = r.detail
    for mark, revision in durable.items():
        detail = detail.replace(str(mark), str(revision))
    return r if detail == r.detail else attrs.evolve(r, detail=detail)


@attrs.define
class _Budget:
    """What one etcd transaction holds so far, to split claims over transactions within
    etcd's limits (ops per list, request size). A claim's machine and the machine it
    moves from count, and each new job twice (its spec and its status are guarded).
    Fallbacks do not: they are read only when the first machine fails, which is rare,
    and a decision whose write turns out too large is split before it is sent (see
    ``_split``). ``nested``: one nested transaction per machine, where the outer
    transaction's ops count (machines, and the job guards) and the size."""

    ops: int
    max_bytes: int
    nested: bool
    machine_bytes: Callable[[str], int]
    machines: set[str] = attrs.field(factory=set)
    jobs: set[str] = attrs.field(factory=set)
    compares: int = 0
    puts: int = 0
    reads: int = 0
    size: int = 0

    def take(self, c: Claim) -> bool:
        """Count ``c`` in, unless it would not fit (an empty budget takes anything)."""
        new = [m for m in (c.machine, c.moves_from) if m and m not in self.machines]
        new_job = c.job not in self.jobs
        size = 2 * _ALLOC_BYTES + sum(self.machine_bytes(m) for m in new)
        if self.nested:
            compares, puts, reads = 2 * new_job, len(new), 2 * new_job
        else:
            compares = 1 + len(c.evict) + len(new) + 2 * new_job
            # The task's record and allocation, each victim's, the allocation a move
            # leaves, and each new machine's record.
            puts = 2 + 2 * len(c.evict) + bool(c.moves_from) + len(new)
            # The failure branch reads every guard, and each machine's allocations too.
            reads = compares + len(new)
        if self.jobs and (self.compares + compares > self.ops or self.puts + puts > self.ops
                          or self.reads + reads > self.ops
                          or self.size + size > self.max_bytes):
            return False
        self.machines.update(new)
        self.jobs.add(c.job)
        self.compares += compares
        self.puts += puts
        self.reads += reads
        self.size += size
        return True

    def take_all(self, claims: Sequence[Claim]) -> bool:
        """Count all of ``claims`` in, or (if they do not all fit) none of them."""
        trial = attrs.evolve(self, machines=set(self.machines), jobs=set(self.jobs))
        if not all(trial.take(c) for c in claims):
            return False
        self.machines, self.jobs = trial.machines, trial.jobs
        self.compares, self.puts, self.size = trial.compares, trial.puts, trial.size
        self.reads = trial.reads
        return True


@attrs.define
class _Group:
    """Parts of transactions (index, claims) written by one etcd transaction."""

    parts: list[tuple[int, list[Claim]]]


@attrs.define
class _Staged:
    """A gang too large for one etcd transaction, in groups (see _commit_staged_gang)."""

    index: int
    groups: list[list[Claim]]


@attrs.define
class _Component:
    """Claims (part index, claim) that share machines or tasks: one nested write."""

    claims: list[tuple[int, Claim]]
    machines: set[str]
    tasks: set[str]
    write: _Write | None = None


@attrs.define
class _Outcome:
    """What is settled of one transaction of a commit so far."""

    revision: int
    committed: list[Claim] = attrs.field(factory=list)
    rejected: list[Rejection] = attrs.field(factory=list)
    evicted: list[str] = attrs.field(factory=list)
    attempts: int = 0
    # machine -> (sequence before this transaction's first write, after its latest)
    rewrites: dict[str, tuple[int, int]] = attrs.field(factory=dict)

    def settle(self, committed: Iterable[Claim], rejected: Iterable[Rejection],
               evicted: Iterable[str], revision: int) -> None:
        self.committed.extend(committed)
        self.rejected.extend(rejected)
        self.evicted.extend(evicted)
        self.revision = revision

    def rewrote(self, before: Mapping[str, int], revision: int) -> None:
        for mid, seq in before.items():
            self.rewrites[mid] = (self.rewrites.get(mid, (seq, 0))[0], revision)

    def merge(self, res: CommitResult) -> None:
        self.settle(res.committed, res.rejected, res.evicted, res.revision)
        self.attempts += res.attempts

    def result(self, txn: Transaction) -> CommitResult:
        # Groups and per-machine writes finish out of order: report in the claims' order.
        order = {c.task: i for i, c in enumerate(txn.claims)}
        committed = tuple(sorted(self.committed, key=lambda c: order[c.task]))
        rejected = tuple(sorted(self.rejected, key=lambda r: order[r.claim.task]))
        return CommitResult(committed, rejected, self.revision, tuple(self.evicted),
                            self.attempts, fallbacks_taken(txn.claims, committed))


def _merged(decisions: Sequence[Decision]) -> Decision:
    """Decisions of consecutive transactions (each made over the ones before) as one:
    later records of a key replace earlier ones, reads and usage changes add up."""
    if len(decisions) == 1:
        return decisions[0]
    machines: dict[str, Machine] = {}
    tasks: dict[str, TaskRecord] = {}
    added: dict[str, Resources] = {}
    removed: dict[str, Resources] = {}
    for d in decisions:
        machines.update(d.machines)
        tasks.update(d.tasks)
        _accumulate(added, d.added)
        _accumulate(removed, d.removed)
    reads = Reads(*(frozenset().union(*(getattr(d.reads, f.name) for d in decisions))
                    for f in attrs.fields(Reads)))
    return Decision(
        tuple(c for d in decisions for c in d.accepted),
        tuple(r for d in decisions for r in d.rejected),
        machines, tasks, tuple(v for d in decisions for v in d.evicted), added, removed, reads,
    )


def _by_machine(parts: Sequence[tuple[int, list[Claim]]], decisions: Sequence[Decision]
                ) -> dict[str, _Component] | None:
    """The components when every claim reads one machine and its own task (no
    fallback tried, nothing evicted, no move; the usual case): one per machine. None
    when some claim reads more, or a task is claimed twice."""
    grouped: dict[str, _Component] = {}
    tasks: set[str] = set()
    for j, ((_, cs), d) in enumerate(zip(parts, decisions, strict=True)):
        read = d.claim_machines
        for c in cs:
            mid = c.machine
            if c.evict or c.moves_from or c.task in tasks:
                return None
            tried = read.get(c.task)
            if tried and (len(tried) > 1 or mid not in tried):
                return None
            tasks.add(c.task)
            comp = grouped.get(mid)
            if comp is None:
                comp = grouped[mid] = _Component([], {mid}, set())
            comp.claims.append((j, c))
            comp.tasks.add(c.task)
    return grouped


def _connected(parts: Sequence[tuple[int, list[Claim]]], decisions: Sequence[Decision]
               ) -> dict[tuple[str, str], _Component]:
    """The components in general: claims joined by every machine and task they read."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        while (p := parent.setdefault(x, x)) != x:
            parent[x] = parent.get(p, p)
            x = p
        return x

    members: list[tuple[int, Claim, list[tuple[str, str]]]] = []
    for j, ((_, cs), d) in enumerate(zip(parts, decisions, strict=True)):
        for c in cs:
            keys = [("m", c.machine), *(("m", m) for m in d.claim_machines.get(c.task, ())),
                    *(("t", t) for t in (c.task, *c.evict))]
            root = find(keys[0])
            for key in keys[1:]:
                other = find(key)
                if other != root:
                    parent[other] = root
            members.append((j, c, keys))
    grouped: dict[tuple[str, str], _Component] = {}
    for j, c, keys in members:
        comp = grouped.setdefault(find(keys[0]), _Component([], set(), set()))
        comp.claims.append((j, c))
        for kind, ident in keys:
            (comp.machines if kind == "m" else comp.tasks).add(ident)
    return grouped


def _too_big(claim: Claim) -> Rejection:
    return Rejection(
        claim, Reason.INVALID,
        f"claim for {claim.task} on {claim.machine!r} does not fit in one etcd transaction "
        "(the machine's record is too large); raise etcd's --max-request-bytes",
    )


def _accumulate(into: dict[str, Resources], more: Mapping[str, Resources]) -> None:
    for s, r in more.items():
        into[s] = into.get(s, Resources()) + r

"""The cell-state store: applies validated decisions to a KV backend, atomically.

Every write follows one pattern (optimistic concurrency over etcd revisions):

1. make sure the working view knows every record the decision will read;
2. decide, with a pure function over the view (``validation.validate`` for claims);
3. send one etcd transaction: compares on the mod_revision of every record read,
   the new records as puts, and reads of the same keys as the failure branch;
4. on success remember what was written; on failure learn the fresh values that came
   back with the failure and go to 2.

So any number of stores in any number of processes can commit against one etcd, and a
machine is never over-committed: two commits that read the same machine cannot both
pass their compares. A transaction too big for one etcd transaction is split; an
incremental one commits group by group, a gang one goes through a staged protocol
whose commit point is one key (see docs/architecture.md, "Gangs larger than one etcd
txn").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from cellstate import codec, decisions, records
from cellstate.cell import (
    CellSnapshot,
    scheduler_usage,
)
from cellstate.decisions import Change
from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    NotFoundError as NotFoundError,
    StoreError as StoreError,
)
from cellstate.keys import KeyKind, Keyspace
from cellstate.kv.base import (
    KV,
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    Delete,
    Get,
    KeyValue,
    KVError,
    LeaseNotFoundError,
    Op,
    Put,
    TxnOp,
    TxnResult,
    prefix_end,
    range_all,
)
from cellstate.model import (
    AgentRecord,
    CellConfig,
    Claim,
    CommitResult,
    GangRecord,
    GangState,
    InstanceRecord,
    Job,
    JobState,
    JobStatus,
    Machine,
    MachineState,
    ModelError,
    Reason,
    Rejection,
    Resources,
    SchedulerRecord,
    TaskRecord,
    TaskState,
    Transaction,
    TxnMode,
    UsageRecord,
    check_name,
    fallbacks_taken,
    labels_from as model_labels,
    split_task_id,
)
from cellstate.records import RECORDS
from cellstate.replica import Replica, snapshot_from_kvs
from cellstate.validation import (
    Decision,
    Reads,
    check_batch,
    check_shape,
    validate,
    validate_many,
)
from cellstate.view import VIEWED as _VIEWED, WorkingView

log = logging.getLogger(__name__)

# Ops kept free in every etcd transaction for the config guard, usage counters and the
# gang records the machines in it may reference.
_RESERVED_OPS = 12
_ALLOC_BYTES = 160  # an encoded allocation or task record with its key, roughly
_OP_BYTES = 8  # protobuf framing per op in an etcd request, roughly
_MACHINE_BYTES = 300  # an encoded machine record (without allocations) and its key


class _Done(Exception):
    """A write found its effect in place already (a retried request): here is the
    revision that made it."""

    def __init__(self, revision: int) -> None:
        self.revision = revision


@attrs.frozen
class StoreOptions:
    # Seconds a large gang's record outlives a committer that stopped keeping it alive.
    gang_lease_ttl: int = 10
    # Guarded etcd transactions tried per group of claims before giving up.
    max_attempts: int = 64
    # Stay well under etcd's --max-request-bytes (1.5 MiB by default).
    max_txn_bytes: int = 1_000_000
    # Incremental commits: "auto" sends one nested etcd transaction per machine once
    # guards fail often (see CellStore._contended), "always" or "never" force it.
    per_machine_writes: str = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "always", "never")))


@attrs.frozen
class _Write:
    """One guarded etcd transaction and the records it writes."""

    guards: Mapping[bytes, int]
    records: Mapping[bytes, object]  # key -> record to encode, or None to delete
    leases: Mapping[bytes, int] = attrs.field(factory=dict)
    # Compares beyond the per-key revision guards (e.g. "no key under a prefix changed").
    compares: tuple[Compare, ...] = ()


@attrs.frozen
class _Prepared:
    """A write with its records encoded, so its size is known before it is sent."""

    write: _Write
    ops: list[Op]
    size: int


class CellStore:
    """One committer's handle on a cell. Methods are thread-safe (one write at a time
    per handle); use one handle per thread for parallel commits."""

    def __init__(
        self,
        kv: KV,
        cell: str = "default",
        *,
        options: StoreOptions | None = None,
        snapshots: Callable[[], CellSnapshot] | None = None,
    ):
        """``snapshots``, if given (a replica's ``snapshot``), is where the working view
        learns records it has not seen before it asks etcd: a scheduler process has them
        in its replica already, and the guards catch any that are stale."""
        self.kv = kv
        self.keys = Keyspace(cell)
        self.options = options or StoreOptions()
        self.view = WorkingView(self.keys)
        self._snapshots = snapshots
        self._machine_prefix = self.keys.prefix(KeyKind.MACHINE)
        self._lock = threading.RLock()
        self._conflicts = 0.0  # moving average of guard failures of commit writes
        # Records a followed replica changed, applied to the view by the committing
        # thread at its next attempt (so the replica's thread never waits on a commit).
        # Coalesced: the newest snapshot and the set of keys, however long it idles.
        self._follow_lock = threading.Lock()
        self._follow_snap: CellSnapshot | None = None
        self._follow_changed: set[tuple[KeyKind, str]] = set()

    def use_snapshots(self, snapshots: Callable[[], CellSnapshot]) -> None:
        """Learn unseen records from ``snapshots()`` (see the constructor)."""
        self._snapshots = snapshots

    @property
    def follows_snapshots(self) -> bool:
        return self._snapshots is not None

    def follow(self, replica: Replica) -> None:
        """Keep the working view as fresh as ``replica``: every record it changes
        replaces the view's copy (if newer). Without this, a view only learns of other
        committers' writes when a guard fails, and with several busy committers most
        first attempts would fail (measured: 70% of etcd transactions, 3.3 per commit,
        with 4 committers on 2,000 machines)."""
        self.use_snapshots(replica.snapshot)
        replica.on_changes(self._changed)

    def _changed(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        with self._follow_lock:
            self._follow_snap = snap
            if changed:  # None is a reload: stale keys are caught by the guards as ever
                self._follow_changed.update(changed)

    def _catch_up(self) -> None:
        with self._follow_lock:
            snap, self._follow_snap = self._follow_snap, None
            changed, self._follow_changed = self._follow_changed, set()
        if snap is None:
            return
        k = self.keys
        for kind, ident in changed:
            if kind is KeyKind.CONFIG:
                self.view.put_record(k.config, snap.config, snap.revision)
                continue
            if kind not in _VIEWED:
                continue  # instances, agents...: no decision reads them
            rec = getattr(snap, RECORDS[kind].table).get(ident)
            if rec is None:
                self.view.observe(k.key(kind, ident), None, snap.revision)
            else:
                self.view.put_record(k.key(kind, ident), rec, snap.revision)

    # -- reading ---------------------------------------------------------------------

    def load(self) -> int:
        """Read the whole cell into the working view (optional: it fills lazily)."""
        with self._lock:
            res = range_all(self.kv, self.keys.root)
            self.view.observe_range(res.kvs, res.revision)
            self.view.config_known = True
            return res.revision

    def read_snapshot(self, revision: int = 0) -> CellSnapshot:
        """A consistent snapshot read straight from the backend (slow: a full range
        read; schedulers use a replica instead)."""
        res = range_all(self.kv, self.keys.root, revision=revision)
        return snapshot_from_kvs(self.keys, res.kvs, res.revision)

    def _fetch(self, keys: Iterable[bytes]) -> None:
        wanted = list(dict.fromkeys(keys))
        step = max(self.kv.max_txn_ops // 2, 1)  # a machine's key takes two reads
        for i in range(0, len(wanted), step):
            chunk = wanted[i : i + step]
            res = self.kv.txn([], self._gets(chunk))
            self._observe_reads(chunk, res)

    def _machine_of(self, key: bytes) -> str | None:
        """The machine id if ``key`` is a machine's key."""
        if key.startswith(self._machine_prefix):
            return key[len(self._machine_prefix):].decode()
        return None

    def _gets(self, keys: Iterable[bytes]) -> list[Get]:
        """Reads of ``keys``; a machine's key is read with its allocation keys (the two
        make one record: see keys.py)."""
        out = []
        for key in keys:
            out.append(Get(key))
            mid = self._machine_of(key)
            if mid is not None:
                prefix = self.keys.allocs(mid)
                out.append(Get(prefix, prefix_end(prefix)))
        return out

    def _observe_reads(self, keys: Sequence[bytes], res: TxnResult) -> None:
        """Learn what :meth:`_gets` of ``keys`` returned."""
        found = iter(res.responses)
        for key in keys:
            got = next(found)
            kvs = got if isinstance(got, tuple) else ()
            allocs: tuple[KeyValue, ...] = ()
            if self._machine_of(key) is not None:
                more = next(found)
                allocs = more if isinstance(more, tuple) else ()
            self.view.observe(key, kvs[0] if kvs else None, res.revision, allocs)

    def _ensure_config(self) -> None:
        if not self.view.config_known:
            self._fetch([self.keys.config])
            self.view.config_known = True

    def _adopt_from_snapshot(self, machines: Iterable[str], jobs: Iterable[str]) -> None:
        if self._snapshots is None:
            return
        snap = self._snapshots()
        for mid in machines:
            key = self.keys.machine(mid)
            m = snap.machines.get(mid)
            if m is not None and not self.view.knows(key):
                self.view.put_record(key, m, snap.revision)
        for jid in jobs:
            key = self.keys.job(jid)
            j = snap.jobs.get(jid)
            if j is not None and not self.view.knows(key):
                self.view.put_record(key, j, snap.revision)

    def _ensure_loaded(self, claims: Sequence[Claim], schedulers: Iterable[str]) -> None:
        """Fetch what validating ``claims`` will read and the view does not know."""
        self._catch_up()
        self._ensure_config()
        keys = self.keys
        machines = {m for c in claims for m in c.machines()}
        jids = {c.job for c in claims}
        self._adopt_from_snapshot(machines, jids)
        self._fetch(
            k
            for k in (*map(keys.machine, machines), *map(keys.job, jids),
                      *map(keys.status, jids))
            if not self.view.knows(k)
        )
        # Jobs of the tasks already on those machines (affinity rules read their labels)
        # and gangs that staged holds there.
        jobs: set[str] = set()
        gangs: set[str] = set()
        for mid in machines:
            m = self.view.machines.get(mid)
            if m is not None:
                jobs |= m.job_ids
                gangs |= m.gang_tags
        self._adopt_from_snapshot((), jobs)
        more = [*map(keys.job, jobs), *map(keys.gang, gangs)]
        self._fetch(k for k in more if not self.view.knows(k))
        self._ensure_usage(schedulers)

    # -- per-scheduler usage counters ------------------------------------------------

    def _limited(self, scheduler: str) -> bool:
        lim = self.view.config.limits_for(scheduler)
        return lim is not None and lim.max_resources is not None

    def _ensure_usage(self, schedulers: Iterable[str]) -> None:
        """Make sure the view holds a current usage counter for each limited scheduler.

        A counter counts from the revision of the config that set the limit: its start
        value is what the scheduler held at exactly that revision (read from history,
        so every process computes the same number), and every later change to the
        scheduler's holdings updates it in the same etcd transaction."""
        for s in set(schedulers):
            if not self._limited(s):
                continue
            key = self.keys.usage(s)
            rec = self.view.usage.get(s)
            if rec is not None and rec.base_revision == self.view.config.revision:
                continue
            self._fetch([key])
            rec = self.view.usage.get(s)
            if rec is not None and rec.base_revision == self.view.config.revision:
                continue
            self._init_usage(s)

    def _init_usage(self, scheduler: str) -> None:
        base = self.view.config.revision
        try:
            res = range_all(self.kv, self.keys.root, revision=base)
        except CompactedError as e:
            raise StoreError(
                f"cannot start usage accounting for scheduler {scheduler!r}: the history at "
                f"config revision {base} is compacted; set the limits again"
            ) from e
        used = scheduler_usage(snapshot_from_kvs(self.keys, res.kvs, base), scheduler)
        record = UsageRecord(scheduler, base, used)
        key = self.keys.usage(scheduler)
        self._write_once(
            _Write({key: self.view.guard_revision(key), self.keys.config: base}, {key: record})
        )

    def _usage_records(
        self, added: Mapping[str, Resources], removed: Mapping[str, Resources]
    ) -> dict[bytes, UsageRecord]:
        out = {}
        for s in set(added) | set(removed):
            if not self._limited(s):
                continue
            rec = self.view.usage[s]
            used = rec.used + added.get(s, Resources()) - removed.get(s, Resources())
            out[self.keys.usage(s)] = attrs.evolve(rec, used=used)
        return out

    # -- guarded writes ----------------------------------------------------------------

    def _prepare(self, w: _Write) -> _Prepared:
        ops: list[Op] = []
        size = 0
        for key, record in w.records.items():
            mid = self._machine_of(key)
            if mid is not None:
                size += self._machine_ops(mid, key, record, ops)
            elif record is None:
                ops.append(Delete(key))
                size += len(key) + _OP_BYTES
            else:
                value = records.encode(record)
                size += len(key) + len(value) + _OP_BYTES
                ops.append(Put(key, value, w.leases.get(key, 0)))
        # Each guard is a compare and a read in the failure branch; a machine's read
        # is two (its record and its allocations' range).
        for k in w.guards:
            size += 2 * (len(k) + _OP_BYTES)
            if self._machine_of(k) is not None:
                size += 2 * len(k) + 2 * _OP_BYTES
        return _Prepared(w, ops, size + sum(len(c.key) + 2 * _OP_BYTES for c in w.compares))

    def _machine_ops(self, mid: str, key: bytes, record: object, ops: list[Op]) -> int:
        """The ops that replace machine ``mid``'s record as the view knows it by
        ``record`` (None deletes it): its small record, and a put or delete per
        allocation that changed, so the bytes written do not grow with what the machine
        holds. The caller guards the machine's key at the view's sequence, so the
        view's allocations are exactly those in etcd. Returns the bytes written."""
        old = self.view.machines.get(mid)
        before = old.allocations if old is not None else {}
        if record is None:
            prefix = self.keys.allocs(mid)
            ops.append(Delete(key))
            ops.append(Delete(prefix, prefix_end(prefix)))
            return len(key) + 3 * len(prefix) + 2 * _OP_BYTES
        assert isinstance(record, Machine)
        value = codec.encode_machine(record)
        ops.append(Put(key, value))
        size = len(key) + len(value) + _OP_BYTES
        after = record.allocations
        for tid, a in after.items():
            if before.get(tid) != a:
                akey = self.keys.alloc(mid, tid)
                avalue = codec.encode_alloc(a)
                ops.append(Put(akey, avalue))
                size += len(akey) + len(avalue) + _OP_BYTES
        for tid in before.keys() - after.keys():
            akey = self.keys.alloc(mid, tid)
            ops.append(Delete(akey))
            size += len(akey) + _OP_BYTES
        return size

    def _fits(self, p: _Prepared) -> bool:
        limit = self.kv.max_txn_ops
        reads = len(p.write.guards) + sum(self._machine_of(k) is not None
                                          for k in p.write.guards)
        return (
            len(p.write.guards) + len(p.write.compares) <= limit
            and reads <= limit
            and len(p.ops) <= limit
            and p.size <= min(self.options.max_txn_bytes, self.kv.max_request_bytes)
        )

    def _try_write(self, w: _Write | _Prepared) -> TxnResult:
        p = w if isinstance(w, _Prepared) else self._prepare(w)
        w = p.write
        compares = [Compare.mod_revision_is(k, rev) for k, rev in w.guards.items()]
        compares.extend(w.compares)
        res = self.kv.txn(compares, p.ops, self._gets(w.guards))
        if res.succeeded:
            for key, record in w.records.items():
                self.view.put_record(key, _with_revision(record, res.revision), res.revision)
        else:
            self._observe_reads(list(w.guards), res)
        return res

    def _write_for(self, change: Change) -> _Write:
        """The guarded write that applies a decided change: every record it relied on
        or overwrites is guarded at the revision the view holds (0: absent)."""
        k, v = self.keys, self.view
        guards = {}
        for kind, ident in change.guarded:
            key = k.key(kind, ident)
            guards[key] = v.guard_revision(key)
        records = {k.key(kind, ident): rec for (kind, ident), rec in change.writes.items()}
        if change.added or change.removed:
            self._ensure_usage([*change.added, *change.removed])
            guards[k.config] = v.guard_revision(k.config)
            for key, u in self._usage_records(change.added, change.removed).items():
                guards[key] = v.guard_revision(key)
                records[key] = u
        return _Write(guards, records)

    def _decide_and_write(
        self, what: str, decide: Callable[[], Change],
        compares: Callable[[], tuple[Compare, ...]] = tuple,
    ) -> int:
        """Decide (reading the view) and write, again and again until the write's
        guards hold; returns the revision. ``decide`` does its own fetching."""
        def attempt() -> _Write:
            change = decide()
            if not change.writes:
                raise _Done(change.done_at)
            return attrs.evolve(self._write_for(change), compares=compares())

        try:
            return self._retry(what, attempt).revision
        except _Done as done:
            return done.revision

    def _write_once(self, w: _Write) -> TxnResult:
        res = self._try_write(w)
        if not res.succeeded:
            raise ContentionError("the records changed while writing; try again")
        return res

    def _retry(self, what: str, attempt_fn: Callable[[], _Write]) -> TxnResult:
        """Run ``attempt_fn() -> _Write`` until its guarded write succeeds."""
        for _ in range(self.options.max_attempts):
            w = attempt_fn()
            res = self._try_write(w)
            if res.succeeded:
                return res
        raise ContentionError(
            f"{what}: gave up after {self.options.max_attempts} attempts; the records it "
            "needs keep changing"
        )

    # -- commits -------------------------------------------------------------------------

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
        for _ in range(self.options.max_attempts):
            for i, _cs in parts:
                outs[i].attempts += 1
            subs = [attrs.evolve(txns[i], claims=tuple(cs)) for i, cs in parts]
            self._ensure_loaded([c for _, cs in parts for c in cs], {t.scheduler for t in subs})
            decisions = validate_many(self.view, subs, shape_checked=True,
                                      seq_rewrites=[outs[i].rewrites for i, _ in parts])
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
        return mode == "always" or (mode == "auto" and self._conflicts > 0.15)

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
        parent: dict[tuple[str, str], tuple[str, str]] = {}

        def find(x: tuple[str, str]) -> tuple[str, str]:
            while (p := parent.setdefault(x, x)) != x:
                parent[x] = parent.get(p, p)
                x = p
            return x

        shared: dict[bytes, int] = {k.config: v.config.revision}
        members: list[tuple[int, Claim, list[tuple[str, str]]]] = []
        for j, ((_, cs), d) in enumerate(zip(parts, decisions, strict=True)):
            for c in cs:
                shared[k.job(c.job)] = v.job_rev(c.job)
                shared[k.status(c.job)] = v.guard_revision(k.status(c.job))
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
        comps = list(grouped.values())
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
        outer = max(len(comps), len(shared))
        # etcd gives a nested transaction only the ops its parent's largest list leaves.
        inner = self.kv.max_txn_ops - outer
        if (outer > self.kv.max_txn_ops
                or any(len(p.write.guards) > inner or len(p.ops) > inner for p in prepared)
                or sum(p.size for p in prepared) > min(self.options.max_txn_bytes,
                                                       self.kv.max_request_bytes)):
            return None
        ops: list[Op] = [
            TxnOp(tuple(Compare.mod_revision_is(key, rev) for key, rev in p.write.guards.items()),
                  tuple(p.ops),  # type: ignore[arg-type]
                  tuple(self._gets(p.write.guards)))
            for p in prepared
        ]
        before = {mid: self.view.machines[mid].seq for d in decisions for mid in d.machines}
        res = self.kv.txn([Compare.mod_revision_is(key, rev) for key, rev in shared.items()],
                          ops, self._gets(shared))
        if not res.succeeded:  # the config or a job changed: learn it, decide again
            self._observe_reads(list(shared), res)
            return parts
        self._note_conflict(any(isinstance(r, TxnResult) and not r.succeeded
                                for r in res.responses))
        left: set[tuple[int, str]] = set()
        for comp, sub_res in zip(comps, res.responses, strict=True):
            assert isinstance(sub_res, TxnResult) and comp.write is not None
            if not sub_res.succeeded:
                self._observe_reads(list(comp.write.guards), sub_res)
                left.update((j, c.task) for j, c in comp.claims)
                continue
            for key, record in comp.write.records.items():
                self.view.put_record(key, _with_revision(record, res.revision), res.revision)
            for j, c in comp.claims:
                i, d = parts[j][0], decisions[j]
                if c.task in d.accepted_tasks:
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
        res = self._try_write(p)
        if res.succeeded:
            for (i, _), d in zip(parts, decisions, strict=True):
                outs[i].rewrote({mid: before[mid] for mid in d.machines}, res.revision)
        return res

    # -- large gangs -------------------------------------------------------------------

    def _commit_staged_gang(self, txn: Transaction, groups: list[list[Claim]]) -> CommitResult:
        """All-or-nothing commit of a gang too large for one etcd transaction.

        Stage every placement as a hold tagged with a new gang id whose record (leased,
        state preparing) must exist for the holds to count; then flip the record to
        committed in one etcd transaction: that is the commit point. A committer that
        dies before it lets the lease lapse, which deletes the record and voids every
        hold; after it, anyone can finish the clean-up (``recover``)."""
        self._ensure_loaded(txn.claims, [txn.scheduler])
        whole = validate(self.view, txn, shape_checked=True)
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
                                        gang_coverage=False)
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
                    dim = u.used.exceeding_limit(lim.max_resources)
                    if dim is not None:
                        first = txn.claims[0]
                        return Rejection(
                            first, Reason.LIMIT_EXCEEDED,
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
        self._write_in_batches(f"settling gang {gid}", machines, max(1, budget // 2),
                               lambda b: self._settle_machines(gid, b, committed))
        self._write_in_batches(f"settling gang {gid}", tasks, budget,
                               lambda b: self._settle_tasks(gid, b, committed))

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

    def _settle_machines(self, gid: str, mids: Sequence[str], committed: bool) -> _Write:
        return self._write_for(decisions.settle_gang_machines(self.view, gid, mids, committed))

    def _settle_tasks(self, gid: str, tids: Sequence[str], committed: bool) -> _Write:
        return self._write_for(decisions.settle_gang_tasks(self.view, gid, tids, committed))

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

    def submit_job(self, job: Job) -> int:
        """Store a new job (its tasks start pending). Returns the revision."""
        codec.parse_job(codec.job_to_doc(job))  # the same checks as for user input
        with self._lock:
            return self._decide_and_write(f"submitting job {job.id}",
                                          lambda: decisions.submit_job(self.view, job))

    def add_machine(self, machine: Machine) -> int:
        return self.add_machines([machine])

    def add_machines(self, machines: Sequence[Machine]) -> int:
        """Add many new machines, as few etcd transactions as the limits allow. All are
        checked before anything is written; each transaction adds its machines or, if
        any of them exists already, none of them (and this raises)."""
        for m in machines:
            codec.parse_machine(codec.machine_to_doc(m))
        decisions.add_machines(CellSnapshot.empty(), machines)  # the checks of the whole list
        step = max(self.kv.max_txn_ops // 2, 1)  # a machine's guard reads two ranges
        revision = 0
        with self._lock:
            for i in range(0, len(machines), step):
                batch = machines[i : i + step]
                revision = self._decide_and_write(
                    "adding machines", lambda b=batch: decisions.add_machines(self.view, b))  # type: ignore[misc]
        return revision

    def update_machine(
        self,
        machine_id: str,
        *,
        capacity: Resources | None = None,
        state: MachineState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> int:
        """Change a machine's capacity, state or labels. Taking it down loses every task
        on it (state lost), which frees their resources and sends them back to their
        schedulers; a capacity below what its tasks hold is refused."""
        if capacity is not None:
            codec.parse_resources(capacity.as_dict(), f"machine {machine_id}: capacity")
        if state is not None and not isinstance(state, MachineState):
            raise StoreError(f"machine {machine_id}: {state!r} is not a machine state")
        new_labels = model_labels(labels, f"machine {machine_id}: labels") if labels else None
        with self._lock:
            self._ensure_config()

            def decide() -> Change:
                self._fetch([self.keys.machine(machine_id)])
                m = self.view.machines.get(machine_id)
                if m is not None:
                    self._fetch_gangs(m)
                return decisions.update_machine(
                    self.view, machine_id, capacity=capacity, state=state, labels=new_labels,
                    budget=self._lose_budget())

            return self._decide_and_write(f"updating machine {machine_id}", decide)

    def _lose_budget(self) -> int:
        # Each task lost deletes its allocation and rewrites its record: two ops.
        return (self.kv.max_txn_ops - _RESERVED_OPS) // 2

    def _replace_machine(self, m: Machine, changed: Machine) -> _Write:
        """The write that replaces machine ``m`` by ``changed`` (decisions.replace_machine)."""
        self._fetch_gangs(m)
        return self._write_for(decisions.replace_machine(self.view, m, changed))

    def _fetch_gangs(self, m: Machine) -> None:
        self._fetch(
            self.keys.gang(g) for a in m.allocations.values() for g in (a.gang, a.evicted_by) if g
        )

    def _gang_guards(self, m: Machine) -> dict[bytes, int]:
        return {
            self.keys.gang(g): self.view.guard_revision(self.keys.gang(g))
            for a in m.allocations.values()
            for g in (a.gang, a.evicted_by)
            if g
        }

    def _lose_tasks(self, down: Machine) -> _Write:
        """The write that takes the view's machine down as ``down`` (decisions.take_down)."""
        old = self.view.machines[down.id]
        self._fetch_gangs(old)
        return self._write_for(decisions.take_down(self.view, old, down, self._lose_budget()))

    def remove_machine(self, machine_id: str) -> int:
        """Take the machine down (losing its tasks) and delete it."""
        with self._lock:
            while True:
                self._fetch([self.keys.machine(machine_id)])
                m = self.view.machines.get(machine_id)
                if m is None:
                    raise NotFoundError(f"unknown machine {machine_id!r}")
                if m.state is not MachineState.DOWN or m.allocations:
                    self.update_machine(machine_id, state=MachineState.DOWN)
                    continue
                w = self._write_for(decisions.remove_machine(self.view, machine_id))
                res = self._try_write(w)
                if res.succeeded:
                    return res.revision

    def release_task(self, tid: str, outcome: TaskState, machine: str | None = None) -> int:
        """Record that a running task ended (finished, failed, lost) and free its hold
        (decisions.release_task says when it is refused)."""
        try:
            split_task_id(tid)
        except ModelError as e:
            raise StoreError(str(e)) from e
        with self._lock:
            self._ensure_config()
            k = self.keys

            def decide() -> Change:
                self._fetch([k.task_key(tid)])
                rec = self.view.tasks.get(tid)
                if rec is not None and rec.machine:
                    # Task and machine read together, so they agree with each other.
                    self._fetch([k.task_key(tid), k.machine(rec.machine)])
                    rec = self.view.tasks.get(tid)
                    m = self.view.machines.get(rec.machine) if rec is not None else None
                    if m is not None:
                        self._fetch_gangs(m)
                if rec is not None and rec.gang:
                    self._fetch([k.gang(rec.gang)])
                return decisions.release_task(self.view, tid, outcome, machine)

            return self._decide_and_write(f"releasing task {tid}", decide)

    def set_job_status(self, status: JobStatus) -> int:
        """Record a verdict on a job (abandoned with a reason, or killed). Refused for a
        job that does not exist; a kill is final (an abandonment does not replace it)."""
        with self._lock:
            keys = [self.keys.job(status.job), self.keys.status(status.job)]

            def decide() -> Change:
                self._fetch(keys)
                return decisions.set_job_status(self.view, status)

            return self._decide_and_write(f"setting the status of job {status.job}", decide)

    def kill_job(self, status: JobStatus) -> int:
        """Kill a job: record the status, then end every task of it that runs.

        Every claim reads the job's status (guarded), so once the status is written no
        claim for the job can commit; a read of the job's tasks after that write sees
        every placement that beat it, and each is released (lost). Idempotent: killing
        a killed job ends whatever still runs. Returns the revision of the last write."""
        if status.state is not JobState.KILLED:
            raise StoreError(f"job {status.job}: kill_job records a kill, not {status.state}")
        revision = self.set_job_status(status)
        prefix = self.keys.task_key(status.job + "/")
        with self._lock:
            res = self.kv.range(prefix, prefix_end(prefix))
            self.view.observe_range(res.kvs, res.revision)
            tids = [kv.key[len(self.keys.task_key("")):].decode() for kv in res.kvs]
            running = [tid for tid in tids
                       if (t := self.view.tasks.get(tid)) is not None
                       and t.state is TaskState.RUNNING]
        for tid in running:
            try:
                revision = max(revision, self.release_task(tid, TaskState.LOST))
            except StoreError as e:  # it ended meanwhile (finished, lost): nothing to do
                log.debug("kill %s: %s", status.job, e)
        return revision

    def register_instance(self, record: InstanceRecord, ttl: int) -> int:
        """Announce a live scheduler instance under a new lease of ``ttl`` seconds (the
        caller keeps it alive); also records the scheduler's name for good. Returns the
        lease id. Refused if the same instance id is live already."""
        # Names become key parts: "zeta/y" would read as scheduler "zeta".
        check_name(record.scheduler, "scheduler")
        check_name(record.instance, "instance")
        lease = self.kv.lease_grant(ttl)
        ikey = self.keys.instance(record.scheduler, record.instance)
        skey = self.keys.scheduler(record.scheduler)
        sched = SchedulerRecord(record.scheduler, record.policy)
        with self._lock:
            res = self.kv.txn([Compare.absent(ikey)], [
                Put(ikey, codec.encode_instance(record), lease),
                Put(skey, codec.encode_scheduler(sched)),
            ])
        if not res.succeeded:
            self.kv.lease_revoke(lease)
            raise AlreadyExistsError(f"instance {record.id} is already running")
        return lease

    def keep_alive(self, lease: int) -> None:
        """Renew a lease (an instance's or an agent's); raises KVError when it is gone."""
        self.kv.lease_keepalive(lease)

    def deregister_instance(self, scheduler: str, instance: str, lease: int) -> None:
        """Withdraw an instance at once (its jobs move to the others). Only the holder
        of its registration can: the instance key must be attached to ``lease``, or
        this is refused and nothing changes (a deleted key whose lease lives on would
        keep a live scheduler from ever registering again). An instance already gone
        (lease lapsed, or a repeated call) is not an error."""
        check_name(scheduler, "scheduler")
        check_name(instance, "instance")
        who = f"instance {scheduler}/{instance}"
        if lease == 0:
            raise StoreError(f"{who}: deregistering needs the lease it registered with, not 0")
        ikey = self.keys.instance(scheduler, instance)
        mine = Compare(ikey, CompareTarget.LEASE, CompareResult.EQUAL, lease)
        res = self.kv.txn([mine], [Delete(ikey)], [Get(ikey)])
        if res.succeeded:
            # The lease is proven to be this instance's: end it (and its metrics key).
            with contextlib.suppress(LeaseNotFoundError):
                self.kv.lease_revoke(lease)
            return
        if res.responses[0]:
            raise StoreError(f"{who} is registered under another lease than {lease}; "
                             "only its holder can deregister it")

    def register_agent(
        self, agent: str, machines: Sequence[Machine], ttl: int, now: float = 0.0
    ) -> tuple[int, int]:
        """Announce a live node agent under a new lease of ``ttl`` seconds (the caller
        keeps it alive) and register its machines: new ones are added, known ones are
        brought back up and adopted by this agent, with the capacity, rack, failure
        domain and labels given. When the lease lapses the agent's key goes, and
        :meth:`machine_lost` takes its machines down. Returns (lease, revision).

        Refused, before anything is written, for a machine another live agent owns
        (taking it over would take it down, tasks and all, when this registration
        lapses while the owner is alive) or whose capacity would fall below what its
        tasks hold. A registration refused midway (a race with another agent) revokes
        its lease, so it leaves no agent key behind."""
        mine = self._agent_machines(agent, machines, ttl)
        ids = [m.id for m in mine]
        with self._lock:
            self._fetch(self.keys.machine(i) for i in ids)
            known = [(self.view.machines[m.id], m) for m in mine if m.id in self.view.machines]
            for old, m in known:
                self._replace_machine(old, self._adopted(old, m))  # raises if it cannot fit
            new = [m for m in mine if m.id not in self.view.machines]
        self._refuse_takeover(agent, [old for old, _ in known])
        lease = self.kv.lease_grant(ttl)
        try:
            record = AgentRecord(agent, tuple(ids), now)
            # The agent's key first: a machine naming a live agent must never be seen
            # without that agent's key, or it would be taken for lost.
            res = self.kv.txn([], [Put(self.keys.agent(agent), codec.encode_agent(record), lease)])
            revision = res.revision
            if new:
                revision = self.add_machines(new)
            for _, m in known:
                revision = max(revision, self._adopt_machine(m))
        except BaseException:
            with contextlib.suppress(KVError):
                self.kv.lease_revoke(lease)
            raise
        return lease, revision

    def _agent_machines(self, agent: str, machines: Sequence[Machine], ttl: int) -> list[Machine]:
        """The machines of a registration as the agent will own them; raises on any
        malformed one."""
        check_name(agent, "agent id")
        if ttl < 1:
            raise StoreError(f"agent {agent}: the lease ttl must be at least 1 second")
        mine = []
        for i, m in enumerate(machines):
            codec.parse_machine(codec.machine_to_doc(m), f"machines[{i}]")
            if m.agent and m.agent != agent:
                raise StoreError(f"machines[{i}] ({m.id}) names agent {m.agent!r}, not {agent!r}")
            if m.allocations:
                raise StoreError(f"machines[{i}] ({m.id}): a registration carries no allocations")
            mine.append(attrs.evolve(m, agent=agent, state=MachineState.UP, seq=0))
        ids = [m.id for m in mine]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise StoreError(f"machines listed twice: {', '.join(dupes)}")
        return mine

    def _live_agents(self, agents: Iterable[str]) -> set[str]:
        """Which of ``agents`` hold a live lease (their key exists), read from etcd."""
        names = sorted(set(agents))
        live: set[str] = set()
        step = self.kv.max_txn_ops
        for i in range(0, len(names), step):
            chunk = names[i : i + step]
            res = self.kv.txn([], [Get(self.keys.agent(a)) for a in chunk])
            live.update(a for a, found in zip(chunk, res.responses, strict=True) if found)
        return live

    def _refuse_takeover(self, agent: str, known: Sequence[Machine]) -> None:
        owners: dict[str, list[str]] = {}
        for m in known:
            if m.agent and m.agent != agent:
                owners.setdefault(m.agent, []).append(m.id)
        live = self._live_agents(owners)
        if live:
            taken = "; ".join(
                f"{', '.join(sorted(owners[a]))} to agent {a!r}" for a in sorted(live))
            raise StoreError(
                f"agent {agent}: machines belong to another live agent ({taken}); an agent "
                "cannot take over a live agent's machines (stop that agent, or give these "
                "machines other ids)"
            )

    @staticmethod
    def _adopted(old: Machine, m: Machine) -> Machine:
        """Machine ``old`` as registration ``m`` describes it, keeping its tasks."""
        state = old.state if old.state is MachineState.DRAINING else MachineState.UP
        return attrs.evolve(
            old.with_allocations(old.allocations), capacity=m.capacity, rack=m.rack,
            failure_domain=m.failure_domain, labels=m.labels, agent=m.agent, state=state,
        )

    def _adopt_machine(self, m: Machine) -> int:
        key = self.keys.machine(m.id)
        with self._lock:

            def attempt() -> _Write:
                self._fetch([key])
                old = self.view.machines.get(m.id)
                if old is None:
                    return _Write({key: 0}, {key: m})
                w = self._replace_machine(old, self._adopted(old, m))
                if not old.agent or old.agent == m.agent:
                    return w
                # Another agent owned it a moment ago: only if that agent is gone, and
                # guarded so that it stays gone until this write lands.
                self._refuse_takeover(m.agent, [old])
                return _Write({**w.guards, self.keys.agent(old.agent): 0}, w.records)

            return self._retry(f"registering machine {m.id}", attempt).revision

    def machine_lost(self, machine_id: str) -> bool:
        """Take a machine down whose agent is gone (its leased key has lapsed): its
        tasks are lost and go back to their schedulers. Does nothing (returns False)
        if the machine is down already, has no agent, or its agent is live; the write
        is guarded on the agent's key being absent, so a racing re-registration wins.
        Several servers may call this at once; one write happens."""
        key = self.keys.machine(machine_id)
        wrote = False
        with self._lock:
            for _ in range(self.options.max_attempts):
                self._fetch([key])
                m = self.view.machines.get(machine_id)
                if m is None or not m.agent or (
                    m.state is MachineState.DOWN and not m.allocations
                ):
                    return wrote
                akey = self.keys.agent(m.agent)
                if self.kv.range(akey).kvs:
                    return wrote
                # A machine with more tasks than one write can lose stays down with the
                # rest; the next round loses those.
                w = self._lose_tasks(attrs.evolve(m.with_allocations(m.allocations),
                                                  state=MachineState.DOWN))
                res = self._try_write(_Write({**w.guards, akey: 0}, w.records))
                wrote = wrote or res.succeeded
        raise ContentionError(f"taking machine {machine_id} down: its records keep changing")

    def resize_job(self, job_id: str, task_count: int) -> int:
        """Grow (or shrink to no fewer than its placed-or-ended tasks) a job's task count,
        as an elastic scheduler does to grow a running job into idle resources."""
        prefix = self.keys.task_key(job_id + "/")
        read_at = 0

        def decide() -> Change:
            nonlocal read_at
            read_at = 0
            self._fetch([self.keys.job(job_id)])
            job = self.view.jobs.get(job_id)
            placed: list[int] = []
            if job is not None and task_count < job.task_count:
                res = self.kv.range(prefix, prefix_end(prefix), keys_only=True)
                placed = [int(kv.key.rsplit(b"/", 1)[1]) for kv in res.kvs]
                read_at = res.revision
            return decisions.resize_job(self.view, job_id, task_count, placed)

        def unchanged() -> tuple[Compare, ...]:
            # Claims do not rewrite the job's key, so its revision alone would not see a
            # task placed since the range read: guard that no task key of the job
            # changed (or appeared) since then.
            if not read_at:
                return ()
            return (Compare(prefix, CompareTarget.MOD, CompareResult.LESS, read_at + 1,
                            prefix_end(prefix)),)

        with self._lock:
            return self._decide_and_write(f"resizing job {job_id}", decide, unchanged)

    def set_config(self, config: CellConfig) -> int:
        """Replace the cell's configuration (per-scheduler limits)."""
        codec.parse_config(codec.config_to_doc(config))
        with self._lock:
            self._fetch([self.keys.config])
            key = self.keys.config
            res = self._retry(
                "setting the cell config",
                lambda: _Write({key: self.view.guard_revision(key)}, {key: config}),
            )
            # Start the counters of resource-limited schedulers now, while the history
            # at this revision is surely still there.
            self._ensure_usage(config.limits)
            return res.revision


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


def _too_big(claim: Claim) -> Rejection:
    return Rejection(
        claim, Reason.INVALID,
        f"claim for {claim.task} on {claim.machine!r} does not fit in one etcd transaction "
        "(the machine's record is too large); raise etcd's --max-request-bytes",
    )


def _accumulate(into: dict[str, Resources], more: Mapping[str, Resources]) -> None:
    for s, r in more.items():
        into[s] = into.get(s, Resources()) + r


def _keep_alive(kv: KV, lease: int, ttl: int, stop: threading.Event) -> None:
    while not stop.wait(max(ttl / 3, 0.2)):
        try:
            kv.lease_keepalive(lease)
        except Exception as e:  # the commit point will notice the lapsed lease
            log.warning("gang lease %x: keep-alive failed: %s", lease, e)
            return


def _with_revision(record: object, revision: int) -> object:
    return None if record is None else records.with_revision(record, revision)

"""The store's foundation: the working view, reads, guarded writes and retries.

What follows is how every write of the store works (the package's other modules add
the kinds of write: claims, large gangs, admin operations, registration).

Every write follows one pattern (optimistic concurrency over etcd revisions):

1. make sure the working view knows every record the decision will read;
2. decide, with a pure function over the view (``validation.validate`` for claims);
3. send one etcd transaction: compares on the mod_revision of every record read,
   the new records as puts, and reads of the same keys as the failure branch (claim
   commits, while their guards rarely fail, leave that branch out and read after a
   failure instead: ``_try_write``);
4. on success remember what was written; on failure learn the fresh values that came
   back with the failure and go to 2. A machine the view holds is read back as its
   key and only the allocations changed since (``_gets``).

So any number of stores in any number of processes can commit against one etcd, and a
machine is never over-committed: two commits that read the same machine cannot both
pass their compares. A transaction too big for one etcd transaction is split; an
incremental one commits group by group, a gang one goes through a staged protocol
whose commit point is one key (see docs/architecture.md, "Gangs larger than one etcd
txn").
"""


from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from cellstate import codec, records
from cellstate.cell import (
    CellSnapshot,
    scheduler_usage,
)
from cellstate.decisions import Change
from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    FencedOut,
    NotFoundError as NotFoundError,
    StoreError as StoreError,
)
from cellstate.keys import KeyKind, Keyspace
from cellstate.kv.base import (
    KV,
    CompactedError,
    Compare,
    Delete,
    Get,
    Op,
    Put,
    TxnOp,
    TxnResult,
    prefix_end,
    range_all,
)
from cellstate.model import (
    Claim,
    Machine,
    Resources,
    TaskRecord,
    UsageRecord,
    set_key_seq,
)
from cellstate.records import RECORDS
from cellstate.replica import Expected, Replica, snapshot_from_kvs
from cellstate.view import VIEWED as _VIEWED, WorkingView

log = logging.getLogger(__name__)

# Ops kept free in every etcd transaction for the config guard, usage counters and the
# gang records the machines in it may reference.
_RESERVED_OPS = 12
_ALLOC_BYTES = 180  # an encoded allocation or task record with its key, roughly
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
    # While guards keep failing, read the claimed machines again (what changed) before
    # the first write of a group (see ClaimCommits._commit_group).
    refresh_when_contended: bool = True


@attrs.frozen
class _Write:
    """One guarded etcd transaction and the records it writes."""

    guards: Mapping[bytes, int]
    records: Mapping[bytes, object]  # key -> record to encode, or None to delete
    leases: Mapping[bytes, int] = attrs.field(factory=dict)
    # Compares beyond the per-key revision guards (e.g. "no key under a prefix changed").
    compares: tuple[Compare, ...] = ()
    # Whether a failed guard is learnt from the request's failure branch (else from a
    # read after it; see StoreBase._try_write).
    read_back: bool = True


@attrs.frozen
class _Prepared:
    """A write with its records encoded, so its size is known before it is sent."""

    write: _Write
    ops: list[Op]
    size: int



class StoreBase:
    """The state of one committer's handle and the guarded-write machinery every kind
    of write uses (see the module docstring)."""

    def __init__(
        self,
        kv: KV,
        cell: str = "default",
        *,
        options: StoreOptions | None = None,
        snapshots: Callable[[], CellSnapshot] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        """``snapshots``, if given (a replica's ``snapshot``), is where the working view
        learns records it has not seen before it asks etcd: a scheduler process has them
        in its replica already, and the guards catch any that are stale. ``clock``
        (wall time) dates what it writes into task records: a placement's
        ``placed_at`` and each event of a task's history."""
        self.kv = kv
        self.clock = clock
        self.keys = Keyspace(cell)
        self.options = options or StoreOptions()
        self.view = WorkingView(self.keys)
        self._snapshots = snapshots
        self._machine_prefix = self.keys.prefix(KeyKind.MACHINE)
        self._alloc_prefix = self.keys.prefix(KeyKind.ALLOC)
        self._lock = threading.RLock()
        self._conflicts = 0.0  # moving average of guard failures of commit writes
        # Records a followed replica changed, applied to the view by the committing
        # thread at its next attempt (so the replica's thread never waits on a commit).
        # Coalesced: the newest snapshot and the set of keys, however long it idles.
        self._follow_lock = threading.Lock()
        self._follow_snap: CellSnapshot | None = None
        self._follow_changed: set[tuple[KeyKind, str]] = set()
        # The commit leader's fencing token: every write also compares this key's
        # mod_revision (see fence()).
        self._fence: Compare | None = None
        # A followed replica's ``expect``: told the records of every write this handle
        # made durable, so that the replica need not decode them off the watch again.
        self._expect: Callable[[dict[bytes, Expected]], None] | None = None

    def _now(self) -> float:
        """The time a decision stamps on the records it writes (``placed_at``, history
        events), to the millisecond the records are stored with (codec.encode_task): the
        records this handle holds are then exactly those a reader decodes."""
        return round(self.clock(), 3)

    def _expect_write(self,
                      writes: Iterable[tuple[Mapping[bytes, object], Mapping[bytes, int]]],
                      ops: Sequence[Op]) -> None:
        """Tell a followed replica the machine and task records ``ops`` (about to be
        sent) write, with the values they put and (a machine) the revision the write
        is guarded at, so it need not decode them again when the watch brings them
        (``Replica.expect``). ``writes``: (records by key, guards by key) per write."""
        if self._expect is None:
            return
        puts: dict[bytes, bytes] = {}
        allocs: dict[bytes, bytes] = {}
        prefix = self._alloc_prefix
        for op in ops:
            for o in op.success if type(op) is TxnOp else (op,):
                if type(o) is Put:
                    (allocs if o.key.startswith(prefix) else puts)[o.key] = o.value
        expected: dict[bytes, Expected] = {}
        for written, guards in writes:
            for key, record in written.items():
                kind = type(record)
                if kind is TaskRecord and key in puts:
                    expected[key] = (puts[key], record, None, 0)
                elif kind is Machine and key in puts and key in guards:
                    expected[key] = (puts[key], record, allocs, guards[key])
        self._expect(expected)

    def fence(self, key: bytes, revision: int) -> None:
        """Make every later write of this handle conditional on ``key`` being at
        ``revision`` (the commit leader's election key: its revision is the token). A
        write that finds it changed raises FencedOut: a deposed leader, even one paused
        past its lease and woken mid-batch, can write nothing."""
        self._fence = Compare.mod_revision_is(key, revision)

    def _check_fence(self) -> None:
        """After a failed write: raise FencedOut if the fence, not a guard, failed it."""
        fence = self._fence
        if fence is None:
            return
        kvs = self.kv.range(fence.key).kvs
        held = kvs[0].mod_revision if kvs else 0
        if held != fence.value:
            raise FencedOut(
                f"not the commit leader any more: the leader key {fence.key.decode()} is at "
                f"revision {held}, this server's token is {fence.value!r}")

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
        self._expect = replica.expect

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
        key = self.keys.key
        view = self.view
        put, revision = view.put_record, snap.revision
        tables = {kind: getattr(snap, RECORDS[kind].table) for kind in _VIEWED}
        for kind, ident in changed:
            if kind is KeyKind.CONFIG:
                put(self.keys.config, snap.config, revision)
                continue
            table = tables.get(kind)
            if table is None:
                continue  # instances, agents...: no decision reads them
            rec = table.get(ident)
            if rec is None:
                view.observe(key(kind, ident), None, revision)
            else:
                put(key(kind, ident), rec, revision)

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
            gets = self._gets(chunk)
            res = self.kv.txn([], gets)
            self._observe_reads(gets, res)

    def _machine_of(self, key: bytes) -> str | None:
        """The machine id if ``key`` is a machine's key."""
        if key.startswith(self._machine_prefix):
            return key[len(self._machine_prefix):].decode()
        return None

    def _gets(self, keys: Iterable[bytes]) -> list[Get]:
        """Reads of ``keys``; a machine's key is read with its allocation keys (the two
        make one record: see keys.py). Of a machine the view holds at sequence S, only
        the allocation keys written at S or later come back (keys.py: they sort by
        sequence, so etcd goes through just those): a busy machine's unchanged
        allocations are neither gone through, sent nor decoded."""
        out: list[Get] = []
        machines = self.view.machines
        for key in keys:
            out.append(Get(key))
            mid = self._machine_of(key)
            if mid is not None:
                prefix = self.keys.allocs(mid)
                held = machines.get(mid)
                start = self.keys.allocs_since(mid, held.seq) if held is not None else prefix
                out.append(Get(start, prefix_end(prefix)))
        return out

    def _observe_reads(self, gets: Sequence[Op],
                       res: TxnResult) -> None:
        """Learn what the reads ``gets`` (made by :meth:`_gets`) returned. Every machine
        read is in the view afterwards (callers decide right after): one the view forgot
        because an allocation was deleted since it held it (see _gets) is read again,
        whole."""
        found = iter(res.responses)
        ops = iter(gets)
        view = self.view
        forgotten = []
        for op in ops:
            got = next(found)
            assert type(op) is Get
            key = op.key
            kvs = got if isinstance(got, tuple) else ()
            kv = kvs[0] if kvs else None
            mid = self._machine_of(key)
            if mid is None:
                view.observe(key, kv, res.revision)
                continue
            allocs_op, more = next(ops), next(found)
            assert type(allocs_op) is Get
            changed = more if isinstance(more, tuple) else ()
            prefix = self.keys.allocs(mid)
            if allocs_op.key == prefix:
                view.observe(key, kv, res.revision, changed)
            elif not view.observe_changed(key, kv, res.revision, changed,
                                          int(allocs_op.key[len(prefix):], 16)):
                forgotten.append(key)
        if forgotten:
            self._fetch(forgotten)  # not held any more: read whole (see _gets)

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

    def _ensure_loaded(self, claims: Sequence[Claim], schedulers: Iterable[str],
                       refresh: bool = False) -> bool:
        """Fetch what validating ``claims`` will read and the view does not know.
        ``refresh``: also read again the claims' machines the view holds (any may have
        changed since), in the same read-only request; of those only what changed comes
        back (see _gets). Returns whether a machine read again had changed."""
        self._catch_up()
        self._ensure_config()
        keys = self.keys
        view = self.view
        machines = {m for c in claims for m in c.machines()}
        jids = {c.job for c in claims}
        self._adopt_from_snapshot(machines, jids)
        before = {mid: m.seq for mid in machines if (m := view.machines.get(mid)) is not None
                  } if refresh else {}
        # Victims' task records too: a preemption rewrites them, carrying their
        # history (placements, earlier preemptions) forward.
        victims = [keys.task_key(v) for c in claims for v in c.evict]
        self._fetch(
            k
            for k in (*map(keys.machine, machines), *map(keys.job, jids),
                      *map(keys.status, jids), *victims)
            if not view.knows(k) or (refresh and self._machine_of(k) is not None)
        )
        stale = any(view.machine_rev(mid) != seq for mid, seq in before.items())
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
        return stale

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
        record = UsageRecord(scheduler, base, used, base_used=used)
        key = self.keys.usage(scheduler)
        if self._try_write(_Write({key: self.view.guard_revision(key),
                                   self.keys.config: base}, {key: record})).succeeded:
            return
        # Every store that meets a new config starts its counters (a server that set
        # it, each scheduler's commits through other servers): another may have been
        # first, which is as good. Only a config changed again meanwhile is news. (The
        # failed write has read both guarded keys into the view.)
        rec = self.view.usage.get(scheduler)
        if rec is None or rec.base_revision != self.view.config.revision:
            raise ContentionError("the records changed while writing; try again")

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

    def _prepare(self, w: _Write, olds: Mapping[str, Machine | None] | None = None
                 ) -> _Prepared:
        """Encode ``w``. ``olds``: the machines as etcd will hold them when the write
        applies, where not the view's (a write in flight before this one)."""
        ops: list[Op] = []
        size = 0
        for key, record in w.records.items():
            mid = self._machine_of(key)
            if mid is not None:
                old = olds[mid] if olds is not None and mid in olds else self.view.machines.get(mid)
                size += self._machine_ops(mid, key, record, ops, old)
            elif record is None:
                ops.append(Delete(key))
                size += len(key) + _OP_BYTES
            else:
                value = records.encode(record)
                size += len(key) + len(value) + _OP_BYTES
                ops.append(Put(key, value, w.leases.get(key, 0)))
        # Each guard is a compare and a read in the failure branch; a machine's read
        # is two (its record and its allocations' range).
        machines = self._machine_prefix
        for k in w.guards:
            size += 2 * (len(k) + _OP_BYTES)
            if k.startswith(machines):
                size += 2 * len(k) + 2 * _OP_BYTES
        return _Prepared(w, ops, size + sum(len(c.key) + 2 * _OP_BYTES for c in w.compares))

    def _machine_ops(self, mid: str, key: bytes, record: object, ops: list[Op],
                     old: Machine | None) -> int:
        """The ops that replace machine ``mid``'s record as etcd holds it (``old``) by
        ``record`` (None deletes it): its small record, and a put or delete per
        allocation that changed, so the bytes written do not grow with what the machine
        holds. The caller guards the machine's key at the view's sequence S, so the
        view's allocations are exactly those in etcd, and S is what new and changed
        allocations are stored under (keys.py); they learn it here (``key_seq``), as
        unchanged ones made anew learn the key they keep. Returns the bytes written."""
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
        seq = old.seq if old is not None else 0
        alloc_key = self.keys.alloc
        puts = []
        get = before.get
        diff = record.diff
        if diff is not None and diff[0] is before:
            # The decision says which allocations it may have changed.
            changed = list(dict.fromkeys(diff[1]))
        else:
            # Decisions keep the Allocation objects they do not change: compare by
            # identity first (most of a busy machine's allocations).
            changed = [t for t, a in after.items() if get(t) is not a]
            changed += before.keys() - after.keys()
        for tid in changed:
            a, was = after.get(tid), get(tid)
            if a is was:
                continue
            if was is not None and was == a:
                set_key_seq(a, was.key_seq)
                continue
            if was is not None:
                # Deletes go first: a watcher applying the events in order then ends
                # with the new key (both name the task).
                dkey = alloc_key(mid, was.key_seq, tid)
                ops.append(Delete(dkey))
                size += len(dkey) + _OP_BYTES
            if a is None:
                continue
            set_key_seq(a, seq)
            akey = alloc_key(mid, seq, tid)
            avalue = codec.encode_alloc(a)
            puts.append(Put(akey, avalue))
            size += len(akey) + len(avalue) + _OP_BYTES
        ops.extend(puts)
        return size

    def _fits(self, p: _Prepared) -> bool:
        limit = self.kv.max_txn_ops
        machines = self._machine_prefix
        reads = len(p.write.guards) + sum(k.startswith(machines) for k in p.write.guards)
        return (
            len(p.write.guards) + len(p.write.compares) + (self._fence is not None) <= limit
            and reads <= limit
            and len(p.ops) <= limit
            and p.size <= min(self.options.max_txn_bytes, self.kv.max_request_bytes)
        )

    def _try_write(self, w: _Write | _Prepared) -> TxnResult:
        """Send a guarded write. When a guard fails the view learns the guarded records
        again: from the failure branch of the same request (``w.read_back``), or else
        from a read-only request after it. The second is for writes whose guards rarely
        fail (a claim commit while others seldom write its machines): a failure branch
        reading every guarded record (about 150 reads for 50 claims) goes into every
        request and etcd's log though it almost never runs, while a read-only request
        costs etcd no log entry and no fsync."""
        p = w if isinstance(w, _Prepared) else self._prepare(w)
        w = p.write
        guard = Compare.mod_revision_is
        compares = [guard(k, rev) for k, rev in w.guards.items()]
        compares.extend(w.compares)
        if self._fence is not None:
            compares.append(self._fence)
        read_back = w.read_back
        gets = self._gets(w.guards) if read_back else []
        self._expect_write(((w.records, w.guards),), p.ops)
        res = self.kv.txn(compares, p.ops, gets)
        if res.succeeded:
            put = self.view.put_record
            for key, record in w.records.items():
                put(key, _with_revision(record, res.revision), res.revision)
            return res
        self._check_fence()
        if read_back:
            self._observe_reads(gets, res)
        else:
            self._fetch(w.guards)
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

    def _fetch_gangs(self, m: Machine) -> None:
        self._fetch(self.keys.gang(g) for g in m.gang_tags)


def _with_revision(record: object, revision: int) -> object:
    return None if record is None else records.with_revision(record, revision)

"""The committer's working view: the newest record it knows for each key.

Unlike a replica's snapshot it need not be consistent across keys: every record a
decision relies on is guarded by its revision in the etcd transaction that applies the
decision, so a stale record costs a retry, never a wrong commit. It is filled from
reads, from the committer's own writes, from the values a failed transaction returns,
and (in a server) from a watch. Newer knowledge of a key always wins.
"""

from __future__ import annotations

from collections.abc import Iterable

from cellstate import codec
from cellstate.keys import KeyKind, Keyspace, split_alloc, split_alloc_rest
from cellstate.kv.base import KeyValue
from cellstate.model import (
    Allocation,
    CellConfig,
    GangRecord,
    Job,
    JobStatus,
    Machine,
    TaskRecord,
    UsageRecord,
    sum_resources,
)
from cellstate.records import RECORDS, kind_of, revision_of, with_revision

# Enum members as globals on hot paths (why: cellstate/validation.py).
_MACHINE, _ALLOC, _CONFIG = KeyKind.MACHINE, KeyKind.ALLOC, KeyKind.CONFIG
# The kinds of record a decision reads, which the view therefore keeps.
VIEWED = frozenset({KeyKind.MACHINE, KeyKind.JOB, KeyKind.TASK, KeyKind.GANG, KeyKind.USAGE,
                    KeyKind.STATUS})


class WorkingView:
    """A :class:`~cellstate.cell.CellReader` over the newest known record per key."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys
        self.revision = 0
        self.config = CellConfig()
        self.config_known = False
        self.machines: dict[str, Machine] = {}
        self.jobs: dict[str, Job] = {}
        self.tasks: dict[str, TaskRecord] = {}
        self.gangs: dict[str, GangRecord] = {}
        self.usage: dict[str, UsageRecord] = {}
        # A job's status (killed, abandoned) is read by every claim for the job: a
        # claim must not land after a kill (guarded like the job's spec).
        self.statuses: dict[str, JobStatus] = {}
        # key -> the revision our knowledge of it is as of (a read's revision, a write's
        # revision, an event's revision). Keys never seen are unknown.
        self._as_of: dict[bytes, int] = {}

    def knows(self, key: bytes) -> bool:
        return key in self._as_of

    def guard_revision(self, key: bytes) -> int:
        """The mod_revision a guard on ``key`` must expect (0 for absent or unknown:
        an unknown key is assumed absent, and the guard checks that assumption)."""
        kind = self.keys.classify(key)
        held = self._held_revision(*kind) if kind is not None else None
        return held or 0

    def observe(self, key: bytes, kv: KeyValue | None, as_of: int,
                allocs: Iterable[KeyValue] = ()) -> None:
        """Learn that at revision ``as_of`` the key held ``kv`` (None: absent). For a
        machine's key, ``allocs`` are its allocation keys read at the same revision."""
        if self._as_of.get(key, -1) > as_of:
            return
        kind = self.keys.classify(key)
        if kind is None or kind[0] is _ALLOC:
            return
        self._as_of[key] = as_of
        if kind[0] is _MACHINE:
            if as_of > self.revision:
                self.revision = as_of
            held = self.machines.get(kind[1])
            if kv is None:
                self.machines.pop(kind[1], None)
            elif held is None or held.seq != kv.mod_revision:
                # The same sequence means the same allocations: no need to decode.
                self.machines[kind[1]] = codec.decode_machine(
                    kind[1], kv.value, kv.mod_revision,
                    _allocations(self.keys, kind[1], allocs, held), copy=False)
            return
        if as_of > self.revision:
            self.revision = as_of
        if kv is not None and self._held_revision(*kind) == kv.mod_revision:
            return  # the record we hold is this one: no need to decode it again
        self._set(kind[0], kind[1], kv)

    def observe_changed(self, key: bytes, kv: KeyValue | None, as_of: int,
                        changed: Iterable[KeyValue], since: int) -> bool:
        """Learn a machine's record read at ``as_of`` with only its allocation keys
        written at sequence ``since`` or later (``changed``; keys.py), ``since`` being
        the sequence the view held for it when the read was sent. Every change to a
        machine's allocations rewrites its key and puts the changed ones under new keys,
        so the allocations are the held ones with the changed ones put in, unless some
        were deleted: then the record's count is smaller, and the view forgets the
        machine and returns False (the caller reads it whole)."""
        if self._as_of.get(key, -1) > as_of:
            return True
        kind = self.keys.classify(key)
        assert kind is not None and kind[0] is _MACHINE
        mid = kind[1]
        held = self.machines.get(mid)
        if kv is not None and held is not None and held.seq == kv.mod_revision:
            self._learnt(key, as_of)
            return True
        if kv is None:
            self._learnt(key, as_of)
            self.machines.pop(mid, None)
            return True
        if held is None or held.seq != since:
            self.forget(key)
            return False
        m, count = codec.decode_machine_counted(mid, kv.value, kv.mod_revision)
        new = _allocations(self.keys, mid, changed, None)
        allocs = dict(held.allocations)
        allocs.update(new)
        if len(allocs) != count:
            self.forget(key)
            return False
        self._learnt(key, as_of)
        settled = tags = jobs = None
        # A count that matches means nothing was deleted: the held allocations are all
        # still there, some perhaps changed (in ``new``). What the machine's record
        # caches about them then follows from the held record's and the new ones
        # (going over a busy machine's allocations again is the costlier part).
        plain = not any(a.gang or a.evicted_by for a in new.values())
        if len(allocs) == len(held.allocations) + len(new) and plain:
            # Only plain placements were added: what they hold adds to the held sum.
            settled = held.settled_used + sum_resources(a.resources for a in new.values())
        if plain and held.has_tags is False:
            tags = False
        held_jobs = held.known_job_ids()
        if held_jobs is not None:
            jobs = held_jobs.union([a.job for a in new.values()])
        self.machines[mid] = m.with_allocations(allocs, settled, tags, jobs)
        return True

    def _learnt(self, key: bytes, as_of: int) -> None:
        self._as_of[key] = as_of
        if as_of > self.revision:
            self.revision = as_of

    def forget(self, key: bytes) -> None:
        """Drop what the view knows of a machine's key (read whole when next needed)."""
        self._as_of.pop(key, None)
        kind = self.keys.classify(key)
        if kind is not None and kind[0] is _MACHINE:
            self.machines.pop(kind[1], None)

    def _held_revision(self, kind: KeyKind, ident: str) -> int | None:
        """The revision of the record held for a key, or None if none is held."""
        if kind is _CONFIG:
            return self.config.revision if self.config_known else None
        if kind not in VIEWED:
            return None
        rec = getattr(self, RECORDS[kind].table).get(ident)
        return revision_of(rec) if rec is not None else None

    def observe_range(self, kvs: Iterable[KeyValue], as_of: int) -> None:
        """Learn every record of a range read (a whole cell, or part of one)."""
        allocs: dict[str, list[KeyValue]] = {}
        rest = []
        for kv in kvs:
            kind = self.keys.classify(kv.key)
            if kind is not None and kind[0] is _ALLOC:
                allocs.setdefault(split_alloc(kind[1])[0], []).append(kv)
            else:
                rest.append(kv)
        for kv in rest:
            kind = self.keys.classify(kv.key)
            mine = allocs.get(kind[1], ()) if kind and kind[0] is _MACHINE else ()
            self.observe(kv.key, kv, as_of, mine)

    def _set(self, kind: KeyKind, ident: str, kv: KeyValue | None) -> None:
        if kind is _CONFIG:
            self.config_known = True
            self.config = (
                codec.decode_config(kv.value, kv.mod_revision) if kv is not None else CellConfig()
            )
            return
        if kind not in VIEWED:
            return
        table = getattr(self, RECORDS[kind].table)
        if kv is None:
            table.pop(ident, None)
        else:
            assert kind is not _MACHINE, "machines are observed with their allocations"
            table[ident] = RECORDS[kind].decode(ident, kv.value, kv.mod_revision)

    def machine_rev(self, mid: str) -> int:
        m = self.machines.get(mid)
        return m.seq if m is not None else 0

    def task_rev(self, tid: str) -> int:
        t = self.tasks.get(tid)
        return t.revision if t is not None else 0

    def job_rev(self, jid: str) -> int:
        j = self.jobs.get(jid)
        return j.revision if j is not None else 0

    def put_record(self, key: bytes, record: object, revision: int) -> None:
        """Learn a record this process just wrote at ``revision`` (no decode needed);
        the record already carries that revision. A key held as of ``revision`` or later
        is left as it is (the same record, or a newer one: a replica echoing the
        records this process wrote, say)."""
        if self._as_of.get(key, -1) >= revision:
            return
        self._as_of[key] = revision
        if revision > self.revision:
            self.revision = revision
        if type(record) is Machine:  # the records every placement writes, first
            self.machines[record.id] = record
        elif type(record) is TaskRecord:
            self.tasks[record.id] = record
        elif isinstance(record, CellConfig):
            self.config, self.config_known = record, True
        elif record is not None:
            rk = kind_of(record)
            if rk.kind in VIEWED:
                getattr(self, rk.table)[rk.ident(record)] = record
        elif (kind := self.keys.classify(key)) is not None:
            self._set(kind[0], kind[1], None)


    # -- records being written (the commit leader's pipeline: cellstate/store/claims.py)

    def put_pending(self, key: bytes, record: object, mark: int) -> None:
        """Hold ``record`` (already carrying the placeholder revision ``mark``) for a
        write in flight: decisions see it, and nothing a read or the watch brings
        replaces it (``mark`` is above every real revision) until it is settled or
        dropped."""
        self._as_of[key] = mark
        self._hold(key, record)

    def settle_pending(self, key: bytes, pending: object, revision: int) -> None:
        """The write of ``pending`` is durable at ``revision``: if the view still holds
        that record (no later write in flight replaced it), hold it as of ``revision``."""
        # The records every placement writes first (a hundred a commit).
        if type(pending) is Machine:
            if self.machines.get(pending.id) is not pending:
                return
            self.machines[pending.id] = pending.with_seq(revision)
        elif type(pending) is TaskRecord:
            if self.tasks.get(pending.id) is not pending:
                return
            self.tasks[pending.id] = with_revision(pending, revision)
        else:
            kind = self.keys.classify(key)
            if kind is None or self._held(kind[0], kind[1]) is not pending:
                return
            self._hold(key, with_revision(pending, revision))
        self._as_of[key] = revision
        if revision > self.revision:
            self.revision = revision

    def drop(self, key: bytes) -> None:
        """Forget ``key`` whatever is held (a write in flight failed): it is read again
        when a decision next needs it."""
        self._as_of.pop(key, None)
        kind = self.keys.classify(key)
        if kind is not None and kind[0] in VIEWED:
            getattr(self, RECORDS[kind[0]].table).pop(kind[1], None)

    def _held(self, kind: KeyKind, ident: str) -> object:
        if kind not in VIEWED:
            return None
        return getattr(self, RECORDS[kind].table).get(ident)

    def _hold(self, key: bytes, record: object) -> None:
        if type(record) is Machine:
            self.machines[record.id] = record
        elif type(record) is TaskRecord:
            self.tasks[record.id] = record
        elif record is not None:
            rk = kind_of(record)
            if rk.kind in VIEWED:
                getattr(self, rk.table)[rk.ident(record)] = record
        elif (kind := self.keys.classify(key)) is not None and kind[0] in VIEWED:
            getattr(self, RECORDS[kind[0]].table).pop(kind[1], None)


def _allocations(keys: Keyspace, machine: str, kvs: Iterable[KeyValue],
                 held: Machine | None) -> dict[str, Allocation]:
    """A machine's allocations from its allocation keys (``keys.allocs(machine)`` then
    ``<seq>/<task>``). One the view holds already (``held``) under the same key is kept
    rather than decoded again: a key is written once (a changed allocation moves to a
    key of its own), so the same key holds the same value."""
    out = {}
    start = len(keys.allocs(machine))
    known = held.allocations if held is not None else {}
    for kv in kvs:
        seq, tid = split_alloc_rest(machine, kv.key[start:].decode())
        a = known.get(tid)
        out[tid] = (a if a is not None and a.key_seq == seq
                    else codec.decode_alloc(tid, kv.value, seq))
    return out

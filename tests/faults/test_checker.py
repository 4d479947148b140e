"""The fault suite's history checker finds each kind of broken promise at the revision
it happened, even when a later revision hides it (fast: the in-memory KV keeps the same
history etcd does). Bad records are written straight to the KV, as a buggy writer
would."""

from __future__ import annotations

import attrs
import pytest

from cellstate import codec
from cellstate.cell import task_view
from cellstate.keys import Keyspace
from cellstate.kv.base import Delete, EventType, KeyValue, Put, WatchEvent, WatchResponse
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Allocation,
    Claim,
    GangRecord,
    GangState,
    JobState,
    JobStatus,
    Machine,
    Resources,
    TaskRecord,
    TaskState,
    Transaction,
)
from cellstate.store import CellStore
from schedulers.testing import job, machine, make_cell
from tests.faults.checker import Ack, History, _OneRevisionAtATime, walk

K = Keyspace("default")
CPU1 = Resources.of(cpu=1, mem=1)


@pytest.fixture
def kv() -> MemoryKV:
    return MemoryKV()


@pytest.fixture
def store(kv: MemoryKV) -> CellStore:
    return make_cell(kv, [machine("m1"), machine("m2")], [job("j", tasks=5)])


def _walk(kv: MemoryKV, acks: list[Ack] | None = None) -> History:
    return walk(kv, "default", acks or [], kv.revision)


Record = tuple[bytes, bytes | None]  # a key and its new value (None deletes it)


def _put(kv: MemoryKV, *records: Record | list[Record]) -> int:
    ops: list[Put | Delete] = []
    for r in records:
        for key, value in r if isinstance(r, list) else [r]:
            ops.append(Delete(key) if value is None else Put(key, value))
    return kv.txn([], ops).revision


def _machine_as(m: Machine, allocs: dict[str, Allocation]) -> list[Record]:
    """Machine ``m`` written with exactly ``allocs`` (its record and allocation keys)."""
    out: list[Record] = [(K.machine(m.id), codec.encode_machine(m.with_allocations(allocs)))]
    for t, a in allocs.items():
        was = m.allocations.get(t)
        if was is a:
            continue
        if was is not None:
            out.append((K.alloc(m.id, was.key_seq, t), None))
        out.append((K.alloc(m.id, m.seq, t), codec.encode_alloc(a)))
    out += [(K.alloc(m.id, a.key_seq, t), None) for t, a in m.allocations.items()
            if t not in allocs]
    return out


def _machine_with(store: CellStore, mid: str, *allocs: Allocation) -> list[Record]:
    m: Machine = store.read_snapshot().machines[mid]
    return _machine_as(m, {**m.allocations, **{a.task: a for a in allocs}})


def _running(tid: str, mid: str, gang: str = "") -> tuple[bytes, bytes]:
    j, i = tid.split("/")
    return K.task_key(tid), codec.encode_task(
        TaskRecord(j, int(i), TaskState.RUNNING, mid, "batch", gang))


def _alloc(tid: str, gang: str = "") -> Allocation:
    return Allocation(tid, tid.split("/")[0], "batch", 0, CPU1, gang)


def test_a_sound_history_has_nothing_to_report(kv: MemoryKV, store: CellStore) -> None:
    res = store.commit(Transaction("batch", (Claim("j", 0, "m1"), Claim("j", 1, "m2"))))
    released = store.release_task("j/0", TaskState.FINISHED, "m1")
    h = _walk(kv, [Ack("commit", res.revision, 0.0, task=c.task, machine=c.machine)
                   for c in res.committed])
    assert h.problems() == []
    assert h.acks_checked == 2
    assert h.placements == {"j/0": [(res.revision, "m1")], "j/1": [(res.revision, "m2")]}
    assert h.last == released
    assert h.revisions == released  # every revision from 1 on, each checked


def test_an_invariant_broken_for_one_revision_is_found(kv: MemoryKV, store: CellStore) -> None:
    m1 = store.read_snapshot().machines["m1"]
    # Five one-cpu tasks on a four-cpu machine, then the machine as it was.
    bad = _put(kv, _machine_with(store, "m1", *(_alloc(f"j/{i}") for i in range(5))),
               *(_running(f"j/{i}", "m1") for i in range(5)))
    now = store.read_snapshot().machines["m1"]
    _put(kv, _machine_as(now, dict(m1.allocations)),
         *((K.task_key(f"j/{i}"), codec.encode_task(
             TaskRecord("j", i, TaskState.FINISHED, "m1", "batch"))) for i in range(5)))
    problems = _walk(kv).problems()
    assert any(f"revision {bad}: machine m1 over-committed in cpu" in p for p in problems)
    assert all(f"revision {bad}:" in p for p in problems), problems  # that revision only


def test_acknowledgements_missing_from_history_are_reported(kv: MemoryKV,
                                                           store: CellStore) -> None:
    res = store.commit(Transaction("batch", (Claim("j", 0, "m1"),)))
    h = _walk(kv, [
        Ack("commit", res.revision, 0.0, task="j/0", machine="m2"),  # another machine
        Ack("commit", res.revision, 0.0, task="j/1", machine="m1"),  # never placed
        Ack("submit", res.revision, 0.0, job="j"),  # submitted earlier
        Ack("kill", res.revision, 0.0, job="j"),  # never killed
        Ack("commit", res.revision + 5, 0.0, task="j/0", machine="m1"),  # in the future
    ])
    assert len(h.ack_problems) == 5, h.ack_problems
    assert "not running on m2" in h.ack_problems[0]


def test_a_commit_of_several_writes_is_acknowledged_at_its_last(kv: MemoryKV,
                                                                store: CellStore) -> None:
    """CommitResult.revision is that of a commit's last etcd write: a claim written by
    an earlier one of its writes is acknowledged at the later revision, and is there."""
    first = store.commit(Transaction("batch", (Claim("j", 0, "m1"),)))
    last = store.commit(Transaction("batch", (Claim("j", 1, "m2"),)))
    assert first.revision < last.revision
    h = _walk(kv, [Ack("commit", last.revision, 0.0, task="j/0", machine="m1"),
                   Ack("commit", last.revision, 0.0, task="j/1", machine="m2")])
    assert h.ack_problems == []


def test_a_placement_after_the_kill_is_reported(kv: MemoryKV, store: CellStore) -> None:
    killed = _put(kv, (K.status("j"), codec.encode_status(
        JobStatus("j", JobState.KILLED, "by a test"))))
    placed = _put(kv, _machine_with(store, "m1", _alloc("j/0")), _running("j/0", "m1"))
    h = _walk(kv)
    assert h.placed_after_kill == [f"task j/0 placed on m1 at revision {placed}; its job was "
                                   f"killed at revision {killed}"]


def test_an_end_recorded_for_another_machine_is_reported(kv: MemoryKV,
                                                         store: CellStore) -> None:
    store.commit(Transaction("batch", (Claim("j", 0, "m1"),)))
    m1 = store.read_snapshot().machines["m1"]
    # The task's run on m1 is ended by a report naming m2 (a late report of an old run).
    rev = _put(kv, _machine_as(m1, {}),
               (K.task_key("j/0"), codec.encode_task(
                   TaskRecord("j", 0, TaskState.FINISHED, "m2", "batch"))))
    h = _walk(kv)
    assert h.stale_ends == [f"task j/0 running on m1 recorded finished on m2 at revision {rev}"]
    assert h.violations == []


def test_a_gang_committed_without_all_its_claims_is_reported(kv: MemoryKV,
                                                             store: CellStore) -> None:
    gang = GangRecord("g1", "batch", GangState.PREPARING, claims=3)
    _put(kv, (K.gang("g1"), codec.encode_gang(gang)))
    _put(kv, _machine_with(store, "m1", _alloc("j/0", "g1"), _alloc("j/1", "g1")),
         _running("j/0", "m1", "g1"), _running("j/1", "m1", "g1"))
    flipped = _put(kv, (K.gang("g1"), codec.encode_gang(
        attrs.evolve(gang, state=GangState.COMMITTED))))
    h = _walk(kv)
    assert h.partial_gangs == [
        f"gang g1 committed at revision {flipped} with 2 of its 3 claims running"]
    assert {t: p[0][0] for t, p in h.placements.items()} == {"j/0": flipped, "j/1": flipped}


def test_a_gang_whose_record_lapses_before_its_commit_point_is_recorded_aborted(
        kv: MemoryKV, store: CellStore) -> None:
    gang = GangRecord("g1", "batch", GangState.PREPARING, claims=3)
    _put(kv, (K.gang("g1"), codec.encode_gang(gang)))
    _put(kv, _machine_with(store, "m1", _alloc("j/0", "g1")), _running("j/0", "m1", "g1"))
    kv.txn([], [Delete(K.gang("g1"))])  # its committer's lease lapsed
    h = _walk(kv)
    assert h.aborted_gangs == {"g1": (3, 1)}
    assert h.placements == {} and h.problems() == []


def test_machines_going_down_and_registrations_going_away_are_recorded(
        kv: MemoryKV, store: CellStore) -> None:
    lease, _ = store.register_agent("a1", [machine("m3")], ttl=5)
    kv.lease_revoke(lease)
    store.machine_lost("m3")
    h = _walk(kv)
    assert [what for _, what in h.registrations_gone] == ["agent a1"]
    assert [m for _, m in h.machines_down] == ["m3"]
    assert h.problems() == []


def test_a_task_lost_on_a_healthy_machine_is_reported(kv: MemoryKV,
                                                      store: CellStore) -> None:
    """A running task is lost only with a reason: its job killed, its machine down or
    drained, its agent gone. One recorded lost otherwise is a broken promise."""
    store.commit(Transaction("batch", (Claim("j", 0, "m1"), Claim("j", 1, "m2"))))
    store.set_machine_state("m2", "drain")
    m1 = store.read_snapshot().machines["m1"]
    rev = _put(kv, _machine_as(m1, {}), (K.task_key("j/0"), codec.encode_task(
        TaskRecord("j", 0, TaskState.LOST, "m1", "batch"))))
    h = _walk(kv)
    assert h.healthy_losses == [
        f"task j/0 running on m1 recorded lost at revision {rev}, its job not killed, the "
        "machine up and its agent - registered"]
    assert [(t, why) for _, t, why in h.losses] == [("j/1", "drained"), ("j/0", "healthy")]
    assert any("lost while its job, agent and machine were healthy" in p
               for p in h.problems())


def test_the_tasks_of_a_killed_job_are_killed_not_lost(kv: MemoryKV,
                                                      store: CellStore) -> None:
    """A kill records its running tasks ``killed`` (the word ``lost`` is a machine's
    failure): the checker counts no loss and finds nothing wrong."""
    store.commit(Transaction("batch", (Claim("j", 0, "m1"),)))
    store.kill_job(JobStatus("j", JobState.KILLED, "by a test"))
    h = _walk(kv)
    assert task_view(store.read_snapshot(), "j/0").state is TaskState.KILLED
    assert h.losses == []
    assert h.problems() == []


class _Responses:
    """A watcher that hands out given responses (etcd packs revisions like this)."""

    def __init__(self, *responses: WatchResponse) -> None:
        self.responses = list(responses)

    def next(self, timeout: float | None = None) -> WatchResponse | None:
        return self.responses.pop(0) if self.responses else None

    def request_progress(self) -> None:
        """Not needed here."""

    def cancel(self) -> None:
        """Nothing to cancel."""


def test_a_response_of_several_revisions_is_handed_out_one_revision_at_a_time() -> None:
    def put(key: bytes, rev: int) -> WatchEvent:
        return WatchEvent(EventType.PUT, KeyValue(key, b"{}", rev, rev, 1))

    packed = WatchResponse(12, (put(b"/a", 11), put(b"/b", 11), put(b"/c", 12)))
    split = _OneRevisionAtATime(_Responses(packed, WatchResponse(13)))
    first, second, progress = split.next(), split.next(), split.next()
    assert first is not None and second is not None and progress is not None
    assert (first.revision, [e.kv.key for e in first.events]) == (11, [b"/a", b"/b"])
    assert (second.revision, [e.kv.key for e in second.events]) == (12, [b"/c"])
    assert progress.is_progress and progress.revision == 13
    assert split.next() is None

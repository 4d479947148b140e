"""Several transactions in one commit, claims with fallbacks, and moves: run unchanged
against etcd and the memory backend, with one etcd transaction per group and with
per-machine (nested) writes."""

from __future__ import annotations

import random

import pytest

from cellstate.cell import task_view
from cellstate.invariants import violations
from cellstate.kv.base import KV
from cellstate.model import (
    CellConfig,
    Claim,
    Detection,
    Fallback,
    Reason,
    Resources,
    SchedulerLimits,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore, StoreOptions
from cellstate.validation import TransactionError
from schedulers.testing import job, machine, make_cell

WRITES = ["never", "always"]  # StoreOptions.per_machine_writes


def _store(kv: KV, cell: str, writes: str) -> CellStore:
    store = CellStore(kv, cell, options=StoreOptions(per_machine_writes=writes))
    store.load()
    return store


def _answers(results: list) -> list:  # type: ignore[type-arg]
    return [([(c.task, c.machine) for c in r.committed],
             [(r2.claim.task, r2.reason) for r2 in r.rejected], r.evicted) for r in results]


def _random_batch(rng: random.Random, snap_seqs: dict[str, int], jobs: list[str],
                  machines: list[str]) -> list[Transaction]:
    txns = []
    for jid in jobs:
        gang = jid.startswith("g")
        coarse = rng.random() < 0.3
        claims = []
        for index in range(3):
            mid = rng.choice(machines)
            seq = snap_seqs[mid] if rng.random() < 0.7 else 1
            alts = tuple(Fallback(m, snap_seqs[m]) for m in rng.sample(machines, 3) if m != mid)
            claims.append(Claim(jid, index, mid, seq, fallbacks=alts[:rng.randint(0, 2)]))
        txns.append(Transaction("batch", tuple(claims), TxnMode.GANG if gang else
                                TxnMode.INCREMENTAL,
                                Detection.COARSE if coarse else Detection.FINE, job=jid))
    return txns


@pytest.mark.parametrize("writes", WRITES)
@pytest.mark.parametrize("seed", [1, 2])
def test_commit_many_answers_as_separate_commits_would(kv: KV, writes: str, seed: int) -> None:
    """The same batch (incremental and gang, fine and coarse, fallbacks, machines that
    fill up, stale sequence numbers) committed with commit_many on one cell and one
    transaction at a time on another: the same answers and the same cell."""
    machines = [machine(f"m{i}", cpu=3) for i in range(5)]
    jobs = [job(f"{'g' if i % 4 == 3 else 'j'}{i}", tasks=3, gang=i % 4 == 3) for i in range(10)]
    many = make_cell(kv, machines, jobs, cell=f"many{seed}{writes}")
    one = make_cell(kv, machines, jobs, cell=f"one{seed}{writes}")
    snap = many.read_snapshot()
    seqs = {m: snap.machines[m].seq for m in snap.machines}
    rng = random.Random(seed)
    txns = _random_batch(rng, seqs, [j.id for j in jobs], [m.id for m in machines])
    # Both cells were built alike, so their sequence numbers differ by a constant.
    shift = one.read_snapshot().machines["m0"].seq - snap.machines["m0"].seq

    def shifted(t: Transaction) -> Transaction:
        return Transaction(t.scheduler, tuple(
            Claim(c.job, c.index, c.machine, c.seen_seq + shift if c.seen_seq != 1 else 1,
                  fallbacks=tuple(Fallback(f.machine, f.seen_seq + shift) for f in c.fallbacks))
            for c in t.claims), t.mode, t.detection, t.job)

    got = _store(kv, f"many{seed}{writes}", writes).commit_many(txns)
    sequential = _store(kv, f"one{seed}{writes}", writes)
    expected = [sequential.commit(shifted(t)) for t in txns]
    assert _answers(got) == _answers(expected)
    assert [r.fell_back for r in got] == [r.fell_back for r in expected]
    assert any(r.fell_back for r in got) and any(r.rejected for r in got)
    a, b = many.read_snapshot(), one.read_snapshot()
    assert {m: sorted(x.allocations) for m, x in a.machines.items()} == {
        m: sorted(x.allocations) for m, x in b.machines.items()}
    assert violations(a) == []


@pytest.mark.parametrize("writes", WRITES)
def test_a_plan_of_many_jobs_is_one_etcd_transaction_when_it_fits(kv: KV, writes: str) -> None:
    store = make_cell(kv, [machine(f"m{i}", cpu=16) for i in range(4)],
                      [job(f"j{i}", tasks=2) for i in range(10)])
    before = store.read_snapshot().revision
    txns = [Transaction("batch", (Claim(f"j{i}", 0, f"m{i % 4}"), Claim(f"j{i}", 1, "m3")),
                        job=f"j{i}") for i in range(10)]
    results = _store(kv, "default", writes).commit_many(txns)
    assert all(r.ok for r in results)
    after = store.read_snapshot()
    assert after.revision == before + 1  # one etcd write for the ten jobs
    assert {r.revision for r in results} == {after.revision}
    assert len(after.machines["m3"].allocations) == 12 and violations(after) == []


@pytest.mark.parametrize("writes", WRITES)
def test_a_plan_too_large_for_one_etcd_transaction_is_split_and_answered_whole(
        kv: KV, writes: str) -> None:
    n = 80  # claims on 80 machines for 80 jobs: more guards than one etcd txn may hold
    store = make_cell(kv, [machine(f"m{i}", cpu=8) for i in range(n)],
                      [job(f"j{i}", tasks=4) for i in range(n)])
    before = store.read_snapshot().revision
    txns = [Transaction("batch", tuple(Claim(f"j{i}", k, f"m{(i + k) % n}") for k in range(4)),
                        job=f"j{i}") for i in range(n)]
    results = _store(kv, "default", writes).commit_many(txns)
    assert [len(r.committed) for r in results] == [4] * n
    after = store.read_snapshot()
    assert 1 < after.revision - before < n  # several writes, far fewer than one per job
    assert sum(len(m.allocations) for m in after.machines.values()) == 4 * n
    assert violations(after) == []


@pytest.mark.parametrize("writes", WRITES)
def test_a_claim_falls_back_when_its_machine_filled_since_the_scheduler_looked(
        kv: KV, writes: str) -> None:
    admin = make_cell(kv, [machine("m1", cpu=2), machine("m2", cpu=2), machine("m3", cpu=2)],
                      [job("rival", cpu=2, scheduler="svc"), job("j", tasks=2, cpu=2)])
    store = _store(kv, "default", writes)
    snap = admin.read_snapshot()
    assert admin.commit(Transaction("svc", (Claim("rival", 0, "m1"),))).ok  # store is stale
    fb = (Fallback("m2", snap.machines["m2"].seq), Fallback("m3", snap.machines["m3"].seq))
    res = store.commit(Transaction("batch", (
        Claim("j", 0, "m1", snap.machines["m1"].seq, fallbacks=fb),
        Claim("j", 1, "m1", snap.machines["m1"].seq, fallbacks=fb))))
    assert res.ok and res.fell_back == ("j/0", "j/1")
    assert res.placed_on() == {"j/0": "m2", "j/1": "m3"}
    assert res.attempts == 2  # the first decision was made on a stale m1, and refused
    after = admin.read_snapshot()
    assert {t: task_view(after, t).machine for t in ("j/0", "j/1")} == {"j/0": "m2", "j/1": "m3"}
    assert violations(after) == []


@pytest.mark.parametrize("writes", WRITES)
def test_a_move_frees_the_old_machine_in_the_same_write(kv: KV, writes: str) -> None:
    admin = make_cell(kv, [machine("m1", cpu=2), machine("m2", cpu=2)],
                      [job("j", cpu=2), job("k", cpu=2)])
    admin.set_config(CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=4))}))
    assert admin.commit(Transaction("batch", (Claim("j", 0, "m1"),))).ok
    store = _store(kv, "default", writes)
    before = admin.read_snapshot()
    res = store.commit(Transaction("batch", (Claim("j", 0, "m2", moves_from="m1"),
                                             Claim("k", 0, "m1"))))
    assert res.ok and res.placed_on() == {"j/0": "m2", "k/0": "m1"}
    after = admin.read_snapshot()
    assert after.revision == before.revision + 1
    assert sorted(after.machines["m1"].allocations) == ["k/0"]
    assert sorted(after.machines["m2"].allocations) == ["j/0"]
    assert task_view(after, "j/0").state is TaskState.RUNNING
    assert after.tasks["j/0"].machine == "m2"
    # The move changed nothing of what the scheduler holds; the placement of k did.
    assert after.usage["batch"].used == Resources.of(cpu=4, mem=2)  # type: ignore[attr-defined]
    assert violations(after) == []


@pytest.mark.parametrize("writes", WRITES)
def test_a_move_of_a_task_that_ended_meanwhile_is_refused_and_writes_nothing(
        kv: KV, writes: str) -> None:
    admin = make_cell(kv, [machine("m1"), machine("m2")], [job("j")])
    assert admin.commit(Transaction("batch", (Claim("j", 0, "m1"),))).ok
    store = _store(kv, "default", writes)  # it sees j/0 running on m1
    admin.release_task("j/0", TaskState.FINISHED)
    before = admin.read_snapshot()
    res = store.commit(Transaction("batch", (Claim("j", 0, "m2", moves_from="m1"),)))
    (r,) = res.rejected
    assert r.reason is Reason.INVALID and "it is finished" in r.detail
    assert admin.read_snapshot().revision == before.revision


def test_a_malformed_transaction_refuses_the_whole_batch(kv: KV) -> None:
    store = make_cell(kv, [machine("m1")], [job("j"), job("k")])
    before = store.read_snapshot().revision
    good = Transaction("batch", (Claim("j", 0, "m1"),))
    bad = Transaction("batch", (Claim("k", 0, "m1", fallbacks=(Fallback("m1"),)),))
    with pytest.raises(TransactionError, match=r"transactions\[1\]: .*named twice"):
        store.commit_many([good, bad])
    assert store.read_snapshot().revision == before


@pytest.mark.parametrize("writes", WRITES)
def test_claims_whose_fallbacks_make_the_write_too_large_are_split(kv: KV, writes: str) -> None:
    """Fallbacks are not budgeted (they are read only when needed): when every claim
    goes down its list, the decided write exceeds etcd's 128 compares, and the group is
    split instead of sent."""
    n = 25
    full = [machine(f"f{i}", cpu=1) for i in range(4 * n)]
    free = [machine(f"e{i}", cpu=1) for i in range(n)]
    admin = make_cell(kv, [*full, *free], [job("rival", tasks=4 * n, scheduler="svc"),
                                           job("j", tasks=n, gang=True)])
    rival = admin.commit_many([Transaction("svc", tuple(
        Claim("rival", i, f"f{i}") for i in range(4 * n)))])
    assert len(rival[0].committed) == 4 * n
    store = _store(kv, "default", writes)
    claims = tuple(Claim("j", i, f"f{i}", fallbacks=tuple(
        Fallback(m) for m in (f"f{n + i}", f"f{2 * n + i}", f"f{3 * n + i}", f"e{i}")))
        for i in range(n))
    (res,) = store.commit_many([Transaction("batch", claims, TxnMode.GANG)])
    assert res.ok and res.placed_on() == {f"j/{i}": f"e{i}" for i in range(n)}
    assert len(res.fell_back) == n and res.attempts > 1
    assert violations(admin.read_snapshot()) == []

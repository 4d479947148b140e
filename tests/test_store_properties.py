"""Random interleavings of several schedulers' transactions, checked against a simple
sequential model (tests/reference_model.py) and the store's invariants.

Each scheduler has its own CellStore handle (its own working view, which goes stale as
the others commit) and decides from snapshots it took earlier, so guards fail, views
refresh and coarse detection sees real sequence changes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cellstate.cell import task_view
from cellstate.invariants import violations
from cellstate.kv.base import KV
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Claim,
    Detection,
    Fallback,
    JobState,
    JobStatus,
    MachineState,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore, StoreError, StoreOptions
from schedulers.testing import job, machine
from tests.reference_model import MClaim, MModel

MACHINES = ["m0", "m1", "m2", "m3"]
SCHEDULERS = ["s0", "s1", "s2"]
TASKS = 8
_cells = itertools.count()

claim_st = st.tuples(
    st.integers(0, TASKS),  # index (TASKS itself is out of range on purpose)
    st.sampled_from([*MACHINES, "mX"]),  # mX does not exist
    st.booleans(),  # try to evict a victim seen on that machine
    st.lists(st.sampled_from([*MACHINES, "mX"]), max_size=2),  # fallbacks (if no victim)
    st.booleans(),  # a move, if the task runs (as last seen) on another machine
)
op_st = st.one_of(
    st.tuples(st.just("snapshot"), st.sampled_from(SCHEDULERS)),
    st.tuples(
        st.just("commit"),
        st.sampled_from(SCHEDULERS),
        st.lists(claim_st, min_size=1, max_size=6, unique_by=lambda c: c[0]),
        st.booleans(),  # gang
        st.booleans(),  # coarse
    ),
    st.tuples(st.just("release"), st.sampled_from(SCHEDULERS), st.integers(0, TASKS - 1),
              st.sampled_from(["finished", "failed", "lost"])),
    st.tuples(st.just("machine"), st.sampled_from(MACHINES), st.booleans()),
    st.tuples(st.just("kill"), st.sampled_from(SCHEDULERS)),
    st.tuples(st.just("resize"), st.sampled_from(SCHEDULERS), st.integers(1, TASKS + 1)),
)
GANG_SCHEDULER, GANG_TASKS = "s2", 3  # s2's job is a gang job of 3 tasks


def run_program(kv: KV, program: list[tuple],  # type: ignore[type-arg]
                per_machine: str = "auto") -> None:
    cell = f"prop{next(_cells)}"
    admin = CellStore(kv, cell)
    for mid in MACHINES:
        admin.add_machine(machine(mid, cpu=4, mem=64))
    model = MModel({m: 4.0 for m in MACHINES})
    for i, s in enumerate(SCHEDULERS):
        cpu = 1.0 + (i % 2)
        gang = s == GANG_SCHEDULER
        n = GANG_TASKS if gang else TASKS
        admin.submit_job(job(f"j{s}", tasks=n, cpu=cpu, mem=1, scheduler=s, precedence=i + 1,
                             gang=gang))
        model.need[f"j{s}"], model.precedence[f"j{s}"] = cpu, i + 1
        model.owner[f"j{s}"], model.tasks[f"j{s}"] = s, n
        if gang:
            model.gang_jobs.add(f"j{s}")
    options = StoreOptions(per_machine_writes=per_machine)
    stores = {s: CellStore(kv, cell, options=options) for s in SCHEDULERS}
    seen: dict[str, dict[str, tuple[int, int]]] = {s: {} for s in SCHEDULERS}
    victims_seen: dict[str, dict[str, list[str]]] = {s: {} for s in SCHEDULERS}
    where_seen: dict[str, dict[str, str]] = {s: {} for s in SCHEDULERS}  # task -> machine

    def take_snapshot(s: str) -> None:
        snap = admin.read_snapshot()
        seen[s] = {m: (snap.machines[m].seq, model.version[m]) for m in MACHINES}
        victims_seen[s] = {m: sorted(snap.machines[m].allocations) for m in MACHINES}
        where_seen[s] = {t: m for m in MACHINES for t in snap.machines[m].allocations}

    for s in SCHEDULERS:
        take_snapshot(s)
    for op in program:
        if op[0] == "snapshot":
            take_snapshot(op[1])
        elif op[0] == "commit":
            _, s, raw, gang, coarse = op
            store_claims: list[Claim] = []
            model_claims: list[MClaim] = []
            for index, m, evict, alts, move in raw:
                seq, ver = seen[s].get(m, (0, 0))
                cands = [v for v in victims_seen[s].get(m, []) if not v.startswith(f"j{s}/")]
                victims: tuple[str, ...] = (cands[0],) if evict and cands else ()
                here = where_seen[s].get(f"j{s}/{index}", "")
                moves_from = here if move and here and here != m else ""
                fallbacks = [] if victims else [
                    f for f in dict.fromkeys(alts) if f not in (m, moves_from)]
                store_claims.append(Claim(
                    f"j{s}", index, m, seq, victims, moves_from=moves_from,
                    fallbacks=tuple(Fallback(f, seen[s].get(f, (0, 0))[0]) for f in fallbacks)))
                model_claims.append((f"j{s}", index, m, ver, victims,
                                     tuple((f, seen[s].get(f, (0, 0))[1]) for f in fallbacks),
                                     moves_from))
            txn = Transaction(s, tuple(store_claims),
                              TxnMode.GANG if gang else TxnMode.INCREMENTAL,
                              Detection.COARSE if coarse else Detection.FINE)
            res = stores[s].commit(txn)
            ok, bad = model.commit(s, model_claims, gang, coarse)
            assert [(c.task, c.machine) for c in res.committed] == ok, (txn, res)
            assert {r.claim.task: r.reason.value for r in res.rejected} == bad, (txn, res)
        elif op[0] == "release":
            _, s, index, outcome = op
            tid = f"j{s}/{index}"
            expected = model.release(tid, outcome)
            try:
                admin.release_task(tid, TaskState(outcome))
                assert expected, f"store released {tid}, model says it was not running"
            except StoreError:
                assert not expected, f"store refused to release running {tid}"
        elif op[0] == "kill":
            jid = f"j{op[1]}"
            admin.kill_job(JobStatus(jid, JobState.KILLED, "test"))
            model.kill(jid)
        elif op[0] == "resize":
            _, s, count = op
            try:
                admin.resize_job(f"j{s}", count)
                assert model.resize(f"j{s}", count), f"store shrank j{s} below a placed task"
            except StoreError:
                assert not model.resize(f"j{s}", count), f"store refused to resize j{s}"
        else:
            _, m, up = op
            admin.update_machine(m, state=MachineState.UP if up else MachineState.DOWN)
            model.set_up(m, up)
        snap = admin.read_snapshot()
        assert violations(snap) == []
        for jid in snap.statuses:
            running = [t for t, r in snap.tasks.items()
                       if r.job == jid and task_view(snap, t).state is TaskState.RUNNING]
            assert not running, f"killed job {jid} still runs {running}"
    final = admin.read_snapshot()
    placed = {t: v.machine for s in SCHEDULERS for i in range(TASKS + 1)
              if (v := task_view(final, t := f"j{s}/{i}")).state is TaskState.RUNNING}
    assert placed == model.on
    for m in MACHINES:
        assert (final.machines[m].state is MachineState.UP) == model.up[m]
        used = sum(a.resources.get("cpu") for a in final.machines[m].allocations.values())
        assert used == pytest.approx(model.used(m))
        assert used <= 4.0 + 1e-9


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=25))
def test_memory_store_matches_the_sequential_model(program: list[tuple]) -> None:  # type: ignore[type-arg]
    run_program(MemoryKV(), program)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=25))
def test_per_machine_writes_match_the_sequential_model(program: list[tuple]) -> None:  # type: ignore[type-arg]
    run_program(MemoryKV(), program, per_machine="always")


@pytest.mark.etcd
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(op_st, min_size=1, max_size=20))
def test_etcd_store_matches_the_sequential_model(etcd_kv: KV, program: list[tuple]) -> None:  # type: ignore[type-arg]
    run_program(etcd_kv, program, per_machine="always" if len(program) % 2 else "never")


def test_model_and_store_agree_on_a_hand_written_interleaving() -> None:
    """A fixed program that exercises each reason at least once (a regression anchor)."""
    program: list[tuple] = [  # type: ignore[type-arg]
        ("commit", "s0", [(0, "m0", False, [], False), (1, "m0", False, [], False),
                          (2, "m0", False, [], False)], False, False),
        ("commit", "s1", [(0, "m0", False, [], False)], False, True),  # s1's snapshot is stale
        ("snapshot", "s2"),
        ("commit", "s2", [(0, "m0", True, [], False), (1, "mX", False, [], False),
                          (8, "m1", False, [], False)], False, False),
        ("machine", "m1", False),
        ("commit", "s1", [(1, "m1", False, [], False), (2, "m2", False, [], False)], True, False),
        ("release", "s0", 1, "finished"),
        ("commit", "s0", [(1, "m2", False, [], False)], False, False),
        ("commit", "s1", [(3, "m0", False, [], False)], False, False),  # m0 is full now
        # The first fallback, mX, is unknown; m3 fits.
        ("commit", "s0", [(3, "m0", False, ["mX", "m3"], False)], False, False),
        ("snapshot", "s0"),
        ("commit", "s0", [(0, "m1", False, [], True)], False, False),  # m1 is down
        ("commit", "s0", [(0, "m2", False, [], True)], False, True),  # moves j s0/0 to m2
        ("release", "s0", 0, "finished"),
        ("commit", "s0", [(0, "m3", False, [], True)], False, False),  # it ended: invalid
    ]
    run_program(MemoryKV(), program)

"""Random interleavings of several schedulers' transactions, checked against a simple
sequential model (tests/reference_model.py), the store's invariants and, where the
simulator's cell can follow (no scheduler limits: it keeps none), the simulator's cell.

Each scheduler has its own CellStore handle (its own working view, which goes stale as
the others commit) and decides from snapshots it took earlier, so guards fail, views
refresh and coarse detection sees real sequence changes.

The cell has four dimensions, each the one that binds for some job: s0's tasks run out
of memory first, s1's of disk (and of its disk limit), s2's gang of GPUs, which only m0
and m1 have. s0 may put at most 3 tasks on a machine, s1 only on zone-a machines (not
m3), and s0 and s1 are limited schedulers; claims evict, fall back, move, and machines
go down and up between them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from cellstate.cell import CellSnapshot, task_view
from cellstate.invariants import violations
from cellstate.kv.base import KV
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    CellConfig,
    Claim,
    Detection,
    Fallback,
    JobState,
    JobStatus,
    MachineState,
    Reason,
    Resources,
    SchedulerLimits,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore, StoreError, StoreOptions
from schedulers.testing import JobBuilder, MachineBuilder
from simulator.cell import SimCell
from tests.reference_model import MClaim, MModel

# machine -> (capacity, zone label)
CELL = {
    "m0": ({"cpu": 4, "mem": 16, "disk": 100, "gpu": 2}, "a"),
    "m1": ({"cpu": 4, "mem": 16, "disk": 100, "gpu": 1}, "a"),
    "m2": ({"cpu": 4, "mem": 16, "disk": 200}, "a"),
    "m3": ({"cpu": 4, "mem": 32, "disk": 200}, "b"),
}
MACHINES = list(CELL)
SCHEDULERS = ["s0", "s1", "s2"]
TASKS = 8
# scheduler -> per-task needs of its job (j<scheduler>)
NEEDS = {
    "s0": {"cpu": 1, "mem": 4, "disk": 10},
    "s1": {"cpu": 2, "mem": 2, "disk": 60},
    "s2": {"cpu": 1, "mem": 2, "gpu": 1},
}
LIMITS = {"s0": {"mem": 24}, "s1": {"disk": 150}}
MAX_PER_MACHINE = {"s0": 3}
ZONE_A_ONLY = {"s1"}
_cells = itertools.count()

claim_st = st.tuples(
    st.integers(0, TASKS),  # index (TASKS itself is out of range on purpose)
    st.sampled_from([*MACHINES, "mX"]),  # mX does not exist
    st.booleans(),  # try to evict a victim seen on that machine
    st.lists(st.sampled_from([*MACHINES, "mX"]), max_size=2),  # fallbacks (if no victim)
    st.booleans(),  # a move, if the task runs (as last seen) on another machine
)
commit_st = st.tuples(
    st.just("commit"),
    st.sampled_from(SCHEDULERS),
    st.lists(claim_st, min_size=1, max_size=6, unique_by=lambda c: c[0]),
    st.booleans(),  # gang
    st.booleans(),  # coarse
)
# s2's whole gang (tasks 0-2) in one gang transaction, as its scheduler would send it:
# random claims would rarely name exactly those.
def _whole_gang(where: list[str], evict: list[bool], coarse: bool) -> tuple:  # type: ignore[type-arg]
    claims: list[tuple] = [  # type: ignore[type-arg]
        (i, m, e, [], False) for i, (m, e) in enumerate(zip(where, evict, strict=True))]
    return ("commit", "s2", claims, True, coarse)


whole_gang_st = st.builds(
    _whole_gang,
    st.lists(st.sampled_from(MACHINES), min_size=3, max_size=3),
    st.lists(st.booleans(), min_size=3, max_size=3),
    st.booleans(),
)
op_st = st.one_of(
    st.tuples(st.just("snapshot"), st.sampled_from(SCHEDULERS)),
    commit_st,
    commit_st,  # listed again: commits are what the test is about
    whole_gang_st,
    st.tuples(st.just("release"), st.sampled_from(SCHEDULERS), st.integers(0, TASKS - 1),
              st.sampled_from(["finished", "failed", "lost"])),
    st.tuples(st.just("machine"), st.sampled_from(MACHINES), st.booleans()),
    st.tuples(st.just("kill"), st.sampled_from(SCHEDULERS)),
    st.tuples(st.just("resize"), st.sampled_from(SCHEDULERS), st.integers(1, TASKS + 1)),
)
GANG_SCHEDULER, GANG_TASKS = "s2", 3  # s2's job is a gang job of 3 tasks


def _machine(mid: str) -> MachineBuilder:
    capacity, zone = CELL[mid]
    b = MachineBuilder(mid).label("zone", zone)
    for d, a in capacity.items():
        b.resource(d, a)
    return b


def _job(s: str, precedence: int) -> JobBuilder:
    b = (JobBuilder(f"j{s}").tasks(GANG_TASKS if s == GANG_SCHEDULER else TASKS)
         .scheduler(s).precedence(precedence).gang(s == GANG_SCHEDULER))
    for d, a in NEEDS[s].items():
        b.resource(d, a)
    if s in MAX_PER_MACHINE:
        b.spread(MAX_PER_MACHINE[s])
    if s in ZONE_A_ONLY:
        b.on_machines_with("zone", "a")
    return b


def _contents(snap: CellSnapshot) -> object:
    """The cell but its revisions and sequence numbers (the simulator counts its own)."""
    return ({m.id: (m.state, sorted(m.allocations.items())) for m in snap.machines.values()},
            {t: (r.state, r.machine) for t, r in snap.tasks.items()},
            {j.id: j.task_count for j in snap.jobs.values()},
            {s.job: s.state for s in snap.statuses.values()})


def run_program(kv: KV, program: list[tuple],  # type: ignore[type-arg]
                per_machine: str = "auto", limits: bool = True) -> set[str]:
    """Run ``program`` through the store, the model and (without limits) a SimCell;
    returns the rejection reasons seen."""
    reasons: set[str] = set()
    cell = f"prop{next(_cells)}"
    admin = CellStore(kv, cell)
    sim = None if limits else SimCell()
    machines = [_machine(m).build() for m in MACHINES]
    admin.add_machines(machines)
    model = MModel({m: dict(CELL[m][0]) for m in MACHINES})
    jobs = [_job(s, i + 1).build() for i, s in enumerate(SCHEDULERS)]
    for j, s in zip(jobs, SCHEDULERS, strict=True):
        admin.submit_job(j)
        model.need[j.id], model.precedence[j.id] = dict(NEEDS[s]), j.precedence
        model.owner[j.id], model.tasks[j.id] = s, j.task_count
        if j.gang:
            model.gang_jobs.add(j.id)
        if s in MAX_PER_MACHINE:
            model.per_machine[j.id] = MAX_PER_MACHINE[s]
        if s in ZONE_A_ONLY:
            model.allowed[j.id] = {m for m in MACHINES if CELL[m][1] == "a"}
    if sim is not None:
        sim.add_machines(machines)
        for j in jobs:
            sim.submit_job(j)
    if limits:
        admin.set_config(CellConfig({
            s: SchedulerLimits(max_resources=Resources.from_mapping(lim))
            for s, lim in LIMITS.items()}))
        model.limit = {s: dict(lim) for s, lim in LIMITS.items()}
    options = StoreOptions(per_machine_writes=per_machine)
    stores = {s: CellStore(kv, cell, options=options) for s in SCHEDULERS}
    # scheduler -> machine -> (store's, model's, simulator's sequence seen)
    seen: dict[str, dict[str, tuple[int, int, int]]] = {s: {} for s in SCHEDULERS}
    victims_seen: dict[str, dict[str, list[str]]] = {s: {} for s in SCHEDULERS}
    where_seen: dict[str, dict[str, str]] = {s: {} for s in SCHEDULERS}  # task -> machine

    def take_snapshot(s: str) -> None:
        snap = admin.read_snapshot()
        sim_snap = sim.snapshot() if sim is not None else snap
        seen[s] = {m: (snap.machines[m].seq, model.version[m], sim_snap.machines[m].seq)
                   for m in MACHINES}
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
            sim_claims: list[Claim] = []
            model_claims: list[MClaim] = []
            for index, m, evict, alts, move in raw:
                seq, ver, sim_seq = seen[s].get(m, (0, 0, 0))
                cands = [v for v in victims_seen[s].get(m, []) if not v.startswith(f"j{s}/")]
                victims: tuple[str, ...] = (cands[0],) if evict and cands else ()
                here = where_seen[s].get(f"j{s}/{index}", "")
                moves_from = here if move and here and here != m else ""
                fallbacks = [] if victims else [
                    f for f in dict.fromkeys(alts) if f not in (m, moves_from)]
                for which, claims_of in ((0, store_claims), (2, sim_claims)):
                    claims_of.append(Claim(
                        f"j{s}", index, m, (seq, ver, sim_seq)[which], victims,
                        moves_from=moves_from,
                        fallbacks=tuple(Fallback(f, seen[s].get(f, (0, 0, 0))[which])
                                        for f in fallbacks)))
                model_claims.append((f"j{s}", index, m, ver, victims,
                                     tuple((f, seen[s].get(f, (0, 0, 0))[1]) for f in fallbacks),
                                     moves_from))
            mode = TxnMode.GANG if gang else TxnMode.INCREMENTAL
            detection = Detection.COARSE if coarse else Detection.FINE
            txn = Transaction(s, tuple(store_claims), mode, detection)
            res = stores[s].commit(txn)
            ok, bad = model.commit(s, model_claims, gang, coarse)
            assert [(c.task, c.machine) for c in res.committed] == ok, (txn, res)
            assert {r.claim.task: r.reason.value for r in res.rejected} == bad, (txn, res)
            reasons.update(bad.values())
            if sim is not None:
                sim_res = sim.commit(Transaction(s, tuple(sim_claims), mode, detection))
                assert [(c.task, c.machine) for c in sim_res.committed] == ok, (txn, sim_res)
                assert [(r.claim.task, r.reason) for r in sim_res.rejected] == [
                    (r.claim.task, r.reason) for r in res.rejected], (txn, sim_res)
        elif op[0] == "release":
            _, s, index, outcome = op
            tid = f"j{s}/{index}"
            expected = model.release(tid, outcome)
            for target in (admin, sim):
                if target is None:
                    continue
                try:
                    target.release_task(tid, TaskState(outcome))
                    assert expected, f"{target} released {tid}, model says it was not running"
                except StoreError:
                    assert not expected, f"{target} refused to release running {tid}"
        elif op[0] == "kill":
            jid = f"j{op[1]}"
            admin.kill_job(JobStatus(jid, JobState.KILLED, "test"))
            if sim is not None:
                sim.kill_job(JobStatus(jid, JobState.KILLED, "test"))
            model.kill(jid)
        elif op[0] == "resize":
            _, s, count = op
            resized = model.resize(f"j{s}", count)
            for target in (admin, sim):
                if target is None:
                    continue
                try:
                    target.resize_job(f"j{s}", count)
                    assert resized, f"{target} shrank j{s} below a placed task"
                except StoreError:
                    assert not resized, f"{target} refused to resize j{s}"
        else:
            _, m, up = op
            admin.update_machine(m, state=MachineState.UP if up else MachineState.DOWN)
            if sim is not None:
                sim.update_machine(m, state=MachineState.UP if up else MachineState.DOWN)
            model.set_up(m, up)
        snap = admin.read_snapshot()
        assert violations(snap) == []
        if sim is not None:
            assert _contents(sim.snapshot()) == _contents(snap), op
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
        used = sum((a.resources for a in final.machines[m].allocations.values()), Resources())
        assert used.as_dict() == pytest.approx(
            {d: a for d, a in model.used(m).items() if a > 1e-9})
        assert used.exceeding(final.machines[m].capacity) is None
    return reasons


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=25), st.booleans())
def test_memory_store_matches_the_sequential_model(program: list[tuple],  # type: ignore[type-arg]
                                                   limits: bool) -> None:
    for reason in sorted(run_program(MemoryKV(), program, limits=limits)):
        event(reason)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=25))
def test_per_machine_writes_and_the_simulator_match_the_sequential_model(
        program: list[tuple]) -> None:  # type: ignore[type-arg]
    for reason in sorted(run_program(MemoryKV(), program, per_machine="always", limits=False)):
        event(reason)


@pytest.mark.etcd
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(op_st, min_size=1, max_size=20), st.booleans())
def test_etcd_store_matches_the_sequential_model(etcd_kv: KV, program: list[tuple],  # type: ignore[type-arg]
                                                 limits: bool) -> None:
    """Without limits the simulator's cell runs beside it: the same results over etcd."""
    run_program(etcd_kv, program, per_machine="always" if len(program) % 2 else "never",
                limits=limits)


def test_model_and_store_agree_on_a_hand_written_interleaving() -> None:
    """A fixed program that meets every reason (a regression anchor)."""
    program: list[tuple] = [  # type: ignore[type-arg]
        ("commit", "s0", [(0, "m0", False, [], False), (1, "m0", False, [], False),
                          (2, "m0", False, [], False)], False, False),
        ("commit", "s0", [(3, "m0", False, [], False)], False, False),  # 3 per machine
        ("commit", "s1", [(0, "m0", False, [], False)], False, True),  # s1's snapshot is stale
        ("commit", "s1", [(0, "m3", False, [], False)], False, False),  # not zone a
        ("commit", "s1", [(1, "m2", False, [], False), (2, "m2", False, [], False),
                          (3, "m1", False, [], False)], False, False),  # disk limit at s1/3
        ("commit", "s2", [(0, "m0", False, [], False)], False, False),  # a gang job, alone
        ("commit", "s2", [(0, "m0", False, [], False), (1, "m1", False, [], False),
                          (2, "m2", False, [], False)], True, False),  # m2 has no gpu
        ("snapshot", "s2"),
        ("commit", "s2", [(0, "m0", True, [], False), (1, "m0", False, [], False),
                          (2, "m1", False, [], False)], True, False),  # evicts js0/0
        ("snapshot", "s0"),
        ("commit", "s0", [(4, "m0", True, [], False)], False, False),  # js2 ranks higher
        ("machine", "m1", False),
        ("commit", "s0", [(4, "m1", False, [], False), (1, "m2", False, [], False),
                          (5, "mX", False, [], False)], False, False),
        ("kill", "s1"),
        ("commit", "s1", [(5, "m2", False, [], False)], False, False),
        ("commit", "s0", [(1, "m3", False, [], True)], False, False),  # moves js0/1 to m3
        ("release", "s0", 1, "finished"),
        ("commit", "s0", [(1, "m2", False, [], True)], False, False),  # it ended: invalid
        # The first fallback, m1, is down; m3 takes it.
        ("commit", "s0", [(4, "mX", False, ["m1", "m3"], False)], False, False),
        ("commit", "s0", [(5, "m3", False, [], False), (6, "m2", False, [], False)],
         False, False),
    ]
    assert run_program(MemoryKV(), program) == {r.value for r in Reason}


def test_a_gang_refused_on_a_stale_job_record_is_decided_again() -> None:
    """Found by the property test: a handle whose view still held a gang job at 4
    tasks refused a gang transaction as leaving task 3 unclaimed after another handle
    had shrunk the job to 3. The refusal read the job's record, so the record is
    guarded: the commit learns the new size and decides again."""
    kv = MemoryKV()
    admin = CellStore(kv, "stale")
    admin.add_machines([_machine("m0").build()])
    admin.submit_job(JobBuilder("g").tasks(4).cpu(1).mem(1).scheduler("s").gang().build())
    mine = CellStore(kv, "stale")
    # The handle reads the job at 4 tasks (an incremental claim of a gang job: refused).
    first = mine.commit(Transaction("s", (Claim("g", 0, "m0"),)))
    assert [r.reason for r in first.rejected] == [Reason.INVALID]
    admin.resize_job("g", 3)
    res = mine.commit(Transaction("s", tuple(Claim("g", i, "m0") for i in range(3)),
                                  TxnMode.GANG))
    assert not res.rejected, res.rejected
    assert violations(mine.read_snapshot()) == []

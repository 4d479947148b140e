"""SimCell gives the same results as CellStore over MemoryKV, for every write kind.

The same random sequence of transactions (incremental and gang, fine and coarse,
claims seen on fresh or stale snapshots, tasks placed twice, machines that are full)
and task releases is applied to both; every commit result and the cell afterwards
must agree claim by claim."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cellstate.admission import held_by
from cellstate.cell import CellSnapshot, task_state, task_view
from cellstate.errors import StoreError
from cellstate.invariants import violations
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    CellConfig,
    Claim,
    CommitResult,
    Detection,
    Fallback,
    Job,
    JobState,
    JobStatus,
    MachineState,
    Reason,
    Resources,
    SchedulerLimits,
    TaskState,
    Transaction,
    TxnMode,
    UsageRecord,
)
from cellstate.store import CellStore
from schedulers.testing import job, machine, make_cell
from simulator.cell import SimCell

MACHINES = [machine(f"m{i}", cpu=2, mem=8) for i in range(4)]
JOBS = [job(f"j{i}", tasks=4, cpu=1, mem=1, scheduler="a" if i % 2 else "b")
        for i in range(8)]


# Scheduler "a" may hold 3 cpus (of the cell's 8), "b" is not limited.
LIMITS = CellConfig({"a": SchedulerLimits(max_resources=Resources.of(cpu=3))})


def _cells(limits: CellConfig | None = None) -> tuple[CellStore, SimCell]:
    store = make_cell(MemoryKV(), MACHINES, JOBS)
    sim = SimCell()
    sim.add_machines(MACHINES)
    for j in JOBS:
        sim.submit_job(j)
    if limits is not None:
        store.set_config(limits)
        sim.set_config(limits)
    return store, sim


def _outcome(snap: CellSnapshot) -> tuple[dict[str, list[str]], dict[str, TaskState]]:
    allocs = {mid: sorted(m.allocations) for mid, m in snap.machines.items()}
    states = {f"{j.id}/{i}": task_view(snap, f"{j.id}/{i}").state for j in JOBS
              for i in range(j.task_count)}
    return allocs, states


@pytest.mark.parametrize("mode", list(TxnMode))
@pytest.mark.parametrize("detection", list(Detection))
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("limits", [None, LIMITS], ids=["no limits", "limits"])
def test_same_commit_results(mode: TxnMode, detection: Detection, seed: int,
                             limits: CellConfig | None) -> None:
    rng = random.Random(seed)
    store, sim = _cells(limits)
    refused = 0
    # Each side's snapshots, newest last; a claim may be made on an older one, as a
    # scheduler deciding slowly would.
    seen: list[tuple[CellSnapshot, CellSnapshot]] = [(store.read_snapshot(), sim.snapshot())]
    for _ in range(60):
        if rng.random() < 0.25:
            running = [t for t, s in _outcome(sim.snapshot())[1].items()
                       if s is TaskState.RUNNING]
            if running:
                tid = rng.choice(sorted(running))
                store.release_task(tid, TaskState.FINISHED)
                assert sim.release_tasks([tid]) == [tid]
        else:
            j = rng.choice(JOBS)
            tasks = rng.sample(range(j.task_count), rng.randint(1, 3))
            mids = [rng.choice(MACHINES).id for _ in tasks]
            old_store, old_sim = seen[-rng.randint(1, min(3, len(seen)))]
            results = []
            for snap, target in ((old_store, store), (old_sim, sim)):
                claims = tuple(Claim(j.id, i, mid, snap.machines[mid].seq)
                               for i, mid in zip(tasks, mids, strict=True))
                txn = Transaction(j.scheduler, claims, mode, detection, job=j.id)
                results.append(target.commit(txn))
            a, b = results
            assert [c.task for c in a.committed] == [c.task for c in b.committed]
            assert [(r.claim.task, r.reason) for r in a.rejected] == [
                (r.claim.task, r.reason) for r in b.rejected]
            refused += sum(r.reason is Reason.LIMIT_EXCEEDED for r in a.rejected)
        seen.append((store.read_snapshot(), sim.snapshot()))
        assert _outcome(seen[-1][0]) == _outcome(seen[-1][1])
        assert held_by(seen[-1][0], "a") == held_by(seen[-1][1], "a")
        if limits is not None:
            assert held_by(seen[-1][1], "a").get("cpu") <= 3
    if limits is None:
        assert refused == 0


def test_a_limit_is_met_and_freed_the_same() -> None:
    store, sim = _cells(LIMITS)
    for target in (store, sim):
        res = target.commit(Transaction("a", tuple(Claim("j1", i, f"m{i % 4}")
                                                   for i in range(4)), job="j1"))
        assert [c.index for c in res.committed] == [0, 1, 2]
        assert [(r.claim.index, r.reason) for r in res.rejected] == [
            (3, Reason.LIMIT_EXCEEDED)]
        target.release_task("j1/1", TaskState.FINISHED)
        res = target.commit(Transaction("a", (Claim("j1", 3, "m3"),), job="j1"))
        assert [c.task for c in res.committed] == ["j1/3"]
        res = target.commit(Transaction("a", (Claim("j3", 0, "m2"),), job="j3"))
        assert res.rejected[0].reason is Reason.LIMIT_EXCEEDED
    snaps = (store.read_snapshot(), sim.snapshot())
    assert [held_by(x, "a").get("cpu") for x in snaps] == [3.0, 3.0]
    records = [x.usage["a"] for x in snaps]
    assert all(isinstance(r, UsageRecord) and r.used == Resources.of(cpu=3, mem=3)
               for r in records), records


def test_an_end_event_of_an_earlier_placement_releases_nothing() -> None:
    """A task preempted and placed again must not be ended by its first placement's
    end event (the simulator passes the revision the task was placed at)."""
    _, sim = _cells()
    first = sim.commit(Transaction("a", (Claim("j1", 0, "m0"),), job="j1"))
    assert sim.release_tasks(["j1/0"], placed_at=first.revision - 1) == []
    assert sim.release_tasks(["j1/0"], placed_at=first.revision) == ["j1/0"]
    assert sim.release_tasks(["j1/0"]) == []  # finished already


def test_a_task_named_twice_in_one_end_is_released_once() -> None:
    _, sim = _cells()
    placed = sim.commit(Transaction("a", (Claim("j1", 0, "m0"), Claim("j1", 1, "m0")),
                                    job="j1"))
    before = sim.snapshot().machines["m0"]
    assert sim.release_tasks(["j1/0", "j1/0"]) == ["j1/0"]
    after = sim.snapshot().machines["m0"]
    assert set(after.allocations) == {"j1/1"}
    assert after.settled_used == before.settled_used - before.allocations["j1/0"].resources
    assert sim.usage["a"] == before.allocations["j1/1"].resources
    assert placed.revision < sim.snapshot().revision


# -- every write kind, random sequences (hypothesis) -----------------------------------

N_MACHINES, N_JOBS, N_TASKS = 4, 4, 3
write_st = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, N_JOBS - 1),
              st.lists(st.tuples(st.integers(0, N_TASKS), st.integers(0, N_MACHINES)),
                       min_size=1, max_size=4, unique_by=lambda c: c[0]),
              st.booleans(), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, N_JOBS - 1), st.integers(0, N_TASKS - 1),
              st.sampled_from(["finished", "failed", "lost"]), st.booleans()),
    st.tuples(st.just("kill"), st.integers(0, N_JOBS - 1)),
    st.tuples(st.just("abandon"), st.integers(0, N_JOBS)),
    st.tuples(st.just("resize"), st.integers(0, N_JOBS - 1), st.integers(0, N_TASKS + 2)),
    st.tuples(st.just("machine"), st.integers(0, N_MACHINES),
              st.sampled_from(["up", "down", "draining", "shrink", "grow", "label"])),
    st.tuples(st.just("remove"), st.integers(0, N_MACHINES)),
    st.tuples(st.just("add"), st.integers(0, N_MACHINES + 1)),
    st.tuples(st.just("submit"), st.integers(0, N_JOBS + 1)),
    # Limits of the scheduler "s": none, a precedence limit, a resource limit, both.
    st.tuples(st.just("limits"), st.sampled_from([None, 0, 1]),
              st.sampled_from([None, 1.0, 3.0, 5.0])),
)


def _apply_to(target: CellStore | SimCell, op: tuple) -> str:  # type: ignore[type-arg]
    """Apply one write; returns "ok" or the error's class and message."""
    kind = op[0]
    try:
        if kind == "commit":
            _, j, raw, gang, coarse = op
            jid = f"j{j}"
            snap = target.snapshot() if isinstance(target, SimCell) else target.read_snapshot()
            claims = tuple(Claim(jid, i, f"m{m}", snap.machines[f"m{m}"].seq
                                 if f"m{m}" in snap.machines else 0) for i, m in raw)
            res = target.commit(Transaction("s", claims, TxnMode.GANG if gang else
                                            TxnMode.INCREMENTAL,
                                            Detection.COARSE if coarse else Detection.FINE))
            return repr(([c.task for c in res.committed],
                         [(r.claim.task, r.reason.value) for r in res.rejected]))
        if kind == "release":
            _, j, i, outcome, here = op
            target.release_task(f"j{j}/{i}", TaskState(outcome), "m0" if here else None)
        elif kind == "kill":
            target.kill_job(JobStatus(f"j{op[1]}", JobState.KILLED, "test"))
        elif kind == "abandon":
            target.set_job_status(JobStatus(f"j{op[1]}", JobState.ABANDONED, "gave up"))
        elif kind == "resize":
            target.resize_job(f"j{op[1]}", op[2])
        elif kind == "machine":
            mid, what = f"m{op[1]}", op[2]
            if what in ("up", "down", "draining"):
                target.update_machine(mid, state=MachineState(what))
            elif what == "label":
                target.update_machine(mid, labels={"zone": "a"})
            else:
                target.update_machine(mid, capacity=Resources.of(
                    cpu=1 if what == "shrink" else 4, mem=8))
        elif kind == "remove":
            target.remove_machine(f"m{op[1]}")
        elif kind == "add":
            target.add_machines([machine(f"m{op[1]}", cpu=2, mem=8)])
        elif kind == "submit":
            target.submit_job(job(f"j{op[1]}", tasks=N_TASKS, cpu=1, mem=1, scheduler="s",
                                  gang=op[1] == 1, precedence=op[1] % 2))
        elif kind == "limits":
            cpu = op[2]
            target.set_config(CellConfig({"s": SchedulerLimits(
                max_precedence=op[1],
                max_resources=None if cpu is None else Resources.of(cpu=cpu))}))
    except StoreError as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def _cell_of(snap: CellSnapshot) -> object:
    """Everything a cell holds but the revisions (etcd's count reads the store makes
    in between; the simulator's does not)."""
    machines = {m.id: (m.capacity, m.state, m.labels, sorted(m.allocations.items()))
                for m in snap.machines.values()}
    tasks = {t: (r.state, r.machine, r.scheduler) for t, r in snap.tasks.items()}
    jobs = {j.id: j.task_count for j in snap.jobs.values()}
    statuses = {s.job: (s.state, s.reason) for s in snap.statuses.values()}
    # What each limited scheduler holds, as its usage record (or the machines) says.
    limits = {name: (lim, held_by(snap, name)) for name, lim in snap.config.limits.items()}
    return machines, tasks, jobs, statuses, limits


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(write_st, min_size=1, max_size=30))
def test_every_write_kind_gives_the_same_results_and_cell(program: list[tuple]) -> None:  # type: ignore[type-arg]
    """Claims, releases, kills, abandonments, resizes, machine changes, removals and
    additions, job submissions: the store over MemoryKV and the simulator's cell answer
    each the same (the same commit results, the same refusals) and end in the same
    cell, because both apply the same decisions (cellstate.decisions)."""
    machines = [machine(f"m{i}", cpu=2, mem=8) for i in range(N_MACHINES)]
    jobs = [job(f"j{i}", tasks=N_TASKS, cpu=1, mem=1, scheduler="s", gang=i == 1)
            for i in range(N_JOBS)]
    store = make_cell(MemoryKV(), machines, jobs)
    sim = SimCell()
    sim.add_machines(machines)
    for j in jobs:
        sim.submit_job(j)
    for op in program:
        a, b = _apply_to(store, op), _apply_to(sim, op)
        assert a == b, op
        assert _cell_of(store.read_snapshot()) == _cell_of(sim.snapshot()), op
        for snap in (store.read_snapshot(), sim.snapshot()):
            _check_shortcuts(snap)


def _check_shortcuts(snap: CellSnapshot) -> None:
    """What the hot paths read without the long way agrees with the long way: a task's
    state (``task_state``, also with gangs staged, committed or aborted) and the jobs
    on a machine carried over from the record it was made from (``job_ids``)."""
    for j in snap.jobs.values():
        for i in range(j.task_count):
            tid = f"{j.id}/{i}"
            assert task_state(snap, tid) is task_view(snap, tid).state, tid
    for m in snap.machines.values():
        known = m.known_job_ids()
        assert known is None or known == frozenset(a.job for a in m.allocations.values())


def _answers(results: list[CommitResult]) -> list[tuple[object, ...]]:
    return [([(c.task, c.machine) for c in r.committed],
             [(r2.claim.task, r2.reason) for r2 in r.rejected], r.evicted, r.fell_back)
            for r in results]


@pytest.mark.parametrize("mode", list(TxnMode))
@pytest.mark.parametrize("detection", list(Detection))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_results_for_plans_of_several_jobs_with_fallbacks_and_moves(
        mode: TxnMode, detection: Detection, seed: int) -> None:
    """Plans of one to three jobs in one commit_many, claims with fallbacks, moves of
    running tasks (also of tasks that ended meanwhile): the same on both sides."""
    rng = random.Random(seed)
    store, sim = _cells()
    seen: list[tuple[CellSnapshot, CellSnapshot]] = [(store.read_snapshot(), sim.snapshot())]
    fell_back = moved = 0
    for _ in range(80):
        old_store, old_sim = seen[-rng.randint(1, min(3, len(seen)))]
        running = sorted(t for t, s in _outcome(old_sim)[1].items() if s is TaskState.RUNNING)
        now = sorted(t for t, s in _outcome(sim.snapshot())[1].items() if s is TaskState.RUNNING)
        if rng.random() < 0.2 and now:
            tid = rng.choice(now)
            store.release_task(tid, TaskState.FINISHED)
            assert sim.release_tasks([tid]) == [tid]
        else:
            jobs = rng.sample(JOBS, rng.randint(1, 3))
            plan: list[tuple[Job, list[tuple[int, str, tuple[str, ...], str]]]] = []
            for j in jobs:
                claims: list[tuple[int, str, tuple[str, ...], str]] = []
                mine = [t for t in running if t.startswith(f"{j.id}/")]
                if mine and rng.random() < 0.4:
                    tid = rng.choice(mine)
                    here = old_sim.tasks[tid].machine
                    to = rng.choice([m.id for m in MACHINES if m.id != here])
                    claims.append((int(tid.rpartition("/")[2]), to, (), here))
                free = [i for i in range(j.task_count) if f"{j.id}/{i}" not in mine]
                for i in rng.sample(free, min(len(free), rng.randint(1, 3))):
                    mids = rng.sample([m.id for m in MACHINES], 3)
                    claims.append((i, mids[0], tuple(mids[1:rng.randint(1, 3)]), ""))
                if claims:
                    plan.append((j, claims))
            if not plan:
                continue
            results = []
            for snap, target in ((old_store, store), (old_sim, sim)):
                txns = [Transaction(j.scheduler, tuple(
                    Claim(j.id, i, mid, snap.machines[mid].seq,
                          fallbacks=tuple(Fallback(f, snap.machines[f].seq) for f in fbs),
                          moves_from=src)
                    for i, mid, fbs, src in claims), mode, detection, job=j.id)
                    for j, claims in plan]
                results.append(target.commit_many(txns))
            a, b = results
            assert _answers(a) == _answers(b)
            fell_back += sum(len(r.fell_back) for r in a)
            moved += sum(1 for r in a for c in r.committed if c.moves_from)
        seen.append((store.read_snapshot(), sim.snapshot()))
        assert _outcome(seen[-1][0]) == _outcome(seen[-1][1])
        assert violations(seen[-1][1]) == []
    # Both paths were exercised (moves rarely commit under coarse gangs: any task of
    # the job that moved meanwhile aborts them).
    assert fell_back and moved >= (0 if (mode, detection) == (TxnMode.GANG, Detection.COARSE)
                                   else 1)


def test_records_read_as_written_at_their_write_and_older_snapshots_stay() -> None:
    """SimCell sets the revision of the records a decision built in place: each reads
    as written at the revision of its write, and a snapshot taken before still shows
    the records as they were."""
    sim = SimCell()
    sim.add_machines([machine("m0", cpu=2, mem=8)])
    sim.submit_job(job("j", tasks=2, cpu=1, mem=1, scheduler="s"))
    before = sim.snapshot()
    res = sim.commit_many([Transaction("s", (Claim("j", 0, "m0", before.machines["m0"].seq),
                                             Claim("j", 1, "m0", before.machines["m0"].seq)),
                                       job="j")])[0]
    placed = sim.snapshot()
    assert len(res.committed) == 2 and res.revision == placed.revision
    assert placed.machines["m0"].seq == placed.revision
    assert placed.tasks["j/0"].revision == placed.tasks["j/1"].revision == placed.revision
    assert before.machines["m0"].seq < placed.revision and "j/0" not in before.tasks
    assert sim.release_tasks(["j/0"]) == ["j/0"]
    ended = sim.snapshot()
    assert ended.revision == placed.revision + 1
    assert ended.machines["m0"].seq == ended.tasks["j/0"].revision == ended.revision
    assert ended.tasks["j/1"].revision == placed.revision  # not written: as it was
    assert placed.machines["m0"].seq == placed.tasks["j/0"].revision == placed.revision
    assert placed.tasks["j/0"].state is TaskState.RUNNING

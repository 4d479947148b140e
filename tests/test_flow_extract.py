"""Extraction: every unit of flow that arrives on a machine becomes exactly one claim
(or is counted as turned back by the repair step), no task is claimed twice, claims
and unscheduled tasks add up to the waiting supply, migrations carry ``moves_from``,
evictions hit lower precedence only, and what the store is then asked to commit it
accepts. Tasks that changed while the solver ran are dropped."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest

from cellstate.cell import CellSnapshot, alloc_placed, machine_used, task_view
from cellstate.fit import selector
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    PLACEABLE,
    Claim,
    JobState,
    JobStatus,
    MachineState,
    TaskState,
    Transaction,
)
from cellstate.store import CellStore
from schedulers.api import CellView
from schedulers.flow.costs import make_cost_model
from schedulers.flow.extract import Extraction, arrivals, extract
from schedulers.flow.graph import ArcKind, GraphManager
from schedulers.flow.network import Arrays
from schedulers.flow.solvers import OrToolsSolver
from schedulers.testing import JobBuilder, machine, make_cell
from tests.flow_support import FLOW, NOW, random_cell


def _solve(store: CellStore, policy: str, preempt_below: int | None = None,
           move_guard: float = 60.0) -> tuple[CellSnapshot, GraphManager, Arrays,
                                               npt.NDArray[np.int64], Extraction]:
    snap = store.read_snapshot()
    gm = GraphManager(make_cost_model(policy), FLOW, move_guard=move_guard,
                      preempt_below=preempt_below)
    gm.rebuild(snap, NOW)
    net = gm.net.arrays()
    flow = OrToolsSolver().solve(net).flow
    return snap, gm, net, flow, extract(gm, net, flow, CellView(snap, FLOW))


def check_exact(snap: CellSnapshot, gm: GraphManager, net: Arrays,
                flow: npt.NDArray[np.int64], ex: Extraction,
                preempt_below: int | None) -> None:
    """Everything an extraction promises, checked against the flow and the snapshot."""
    key = gm.net.node_key
    # Units arriving on each machine, read straight off the arcs into machines.
    inflow: Counter[str] = Counter()
    waiting_supply = 0
    for i in range(len(net.tail)):
        head, tail = key(int(net.head[i])), key(int(net.tail[i]))
        if head[0] == "M" and net.kind[i] != ArcKind.STAY:
            inflow[str(head[1])] += int(flow[i])
        if tail[0] == "W" and net.kind[i] == ArcKind.UNSCHEDULED:
            waiting_supply += int(net.supply[net.tail[i]])
    units, _, _ = arrivals(gm, net, flow)
    assert Counter(a.machine for a in units) == +inflow
    back_home = sum(1 for a in units if a.origin == a.machine)
    # Each arrival is one claim, one turned back, or a unit that left and came back.
    assert len(ex.claims) + ex.repaired + back_home == len(units) and ex.stale == 0
    placements = [c for c in ex.claims if not c.moves_from]
    assert len(placements) + sum(ex.unscheduled.values()) == waiting_supply
    for jid in gm.jobs:
        placed = sum(1 for c in placements if c.job == jid)
        assert placed + ex.unscheduled.get(jid, 0) == len(gm.waiting_of(jid))
    assert ex.placed == len(placements) and ex.migrated == len(ex.claims) - len(placements)
    # Claims only where units arrived, for the job the units came from.
    came = Counter((a.job, a.machine, a.origin) for a in units)
    made = Counter((c.job, c.machine, c.moves_from) for c in ex.claims)
    assert not made - came
    # No task twice; waiting tasks placed, running ones moved from where they run.
    tasks = [c.task for c in ex.claims]
    assert len(set(tasks)) == len(tasks)
    evicted = [v for c in ex.claims for v in c.evict]
    assert len(set(evicted)) == len(evicted) == ex.preempted
    assert not set(evicted) & set(tasks)
    for c in ex.claims:
        job = snap.jobs[c.job]
        m = snap.machines[c.machine]
        assert job.scheduler == FLOW and m.state is MachineState.UP
        assert selector(job, m) is None
        v = task_view(snap, c.task)
        if c.moves_from:
            assert v.state is TaskState.RUNNING and v.machine == c.moves_from != c.machine
        else:
            assert v.state in PLACEABLE
        for victim in c.evict:
            a = m.allocations[victim]
            assert alloc_placed(a, snap.gangs) and a.precedence < job.precedence
            if a.scheduler != FLOW:
                assert preempt_below is not None and a.precedence < preempt_below
    # Once applied, no machine holds more than it has, in any dimension.
    for mid, m in snap.machines.items():
        used = machine_used(m, snap.gangs).as_dict()
        for c in ex.claims:
            for victim in c.evict if c.machine == mid else ():
                for dim, amount in m.allocations[victim].resources.amounts:
                    used[dim] -= amount
            sign = 1 if c.machine == mid else -1 if c.moves_from == mid else 0
            for dim, amount in snap.jobs[c.job].task_resources.amounts:
                used[dim] = used.get(dim, 0.0) + sign * amount
        for dim, amount in used.items():
            assert amount <= m.capacity.get(dim) + 1e-9, f"{mid} over in {dim}"


@pytest.mark.parametrize("policy", ["trivial", "load-spread", "quincy", "network"])
def test_extraction_is_exact_and_the_store_accepts_it(policy: str) -> None:
    seen: Counter[str] = Counter()
    for seed in range(40):
        preempt_below = random.Random(seed).choice([None, 2, 4])
        store = random_cell(seed, net=policy == "network")
        snap, gm, net, flow, ex = _solve(store, policy, preempt_below)
        check_exact(snap, gm, net, flow, ex, preempt_below)
        if ex.claims:
            # The claims, in their order, as one transaction: the store's own rules
            # agree with the repair step's.
            res = store.commit(Transaction(FLOW, tuple(ex.claims)))
            assert not res.rejected, f"seed {seed}: {res.rejected}"
        seen.update(placed=ex.placed, migrated=ex.migrated, preempted=ex.preempted,
                    unscheduled=sum(ex.unscheduled.values()))
    assert seen["placed"] and seen["unscheduled"]
    if policy != "trivial":
        assert seen["migrated"] and seen["preempted"]


def _low_and_high(guarded: bool) -> tuple[CellStore, GraphManager, Extraction]:
    """Two running tasks of ``low`` fill m0; ``high`` (higher precedence) can run only
    on m0; m1 has room for one of ``low``. The best flow moves one ``low`` to m1 and
    preempts the other (unless one is under the flapping guard)."""
    store = make_cell(MemoryKV(), [machine("m0", cpu=2, labels=[("big", "1")]),
                                   machine("m1", cpu=1)],
                      [JobBuilder("low").tasks(2).scheduler(FLOW).build(),
                       JobBuilder("high").tasks(2).precedence(5).scheduler(FLOW)
                       .on_machines_with("big").build()])
    seq = store.read_snapshot().machines["m0"].seq
    assert store.commit(Transaction(FLOW, (Claim("low", 0, "m0", seq),
                                           Claim("low", 1, "m0", seq)))).ok
    snap = store.read_snapshot()
    gm = GraphManager(make_cost_model("load-spread"), FLOW, move_guard=60)
    if guarded:
        gm.note_moved([("low/0", "m0")], NOW - 10)
    gm.rebuild(snap, NOW)
    net = gm.net.arrays()
    flow = OrToolsSolver().solve(net).flow
    ex = extract(gm, net, flow, CellView(snap, FLOW))
    check_exact(snap, gm, net, flow, ex, None)
    return store, gm, ex


def test_a_group_that_both_migrates_and_is_preempted_gives_distinct_tasks() -> None:
    store, _, ex = _low_and_high(guarded=False)
    moved = [c.task for c in ex.claims if c.moves_from]
    evicted = [v for c in ex.claims for v in c.evict]
    assert len(moved) == 1 and len(evicted) == 1 and moved != evicted
    assert ex.placed == 2
    res = store.commit(Transaction(FLOW, tuple(ex.claims)))
    assert res.ok and not res.rejected


def test_a_guarded_task_neither_moves_nor_is_preempted() -> None:
    store, _, ex = _low_and_high(guarded=True)
    assert all(c.task != "low/0" and "low/0" not in c.evict for c in ex.claims)
    assert [c.task for c in ex.claims if c.moves_from] == ["low/1"]
    assert ex.placed == 1 and ex.unscheduled == {"high": 1}
    assert not store.commit(Transaction(FLOW, tuple(ex.claims))).rejected


def test_the_repair_step_turns_back_what_the_slots_let_through() -> None:
    # Slots count tasks of the smallest shape: 4 of "small" (1 cpu) fit, 1 of "big"
    # (3 cpu); the flow may send 3 small and 1 big, which is 6 cpu on a 4-cpu machine.
    store = make_cell(MemoryKV(), [machine("m0", cpu=4, mem=64)],
                      [JobBuilder("small").tasks(3).cpu(1).scheduler(FLOW).build(),
                       JobBuilder("big").tasks(1).cpu(3).scheduler(FLOW).build()])
    snap, gm, net, flow, ex = _solve(store, "trivial")
    check_exact(snap, gm, net, flow, ex, None)
    units, _, _ = arrivals(gm, net, flow)
    assert len(units) == 4 and ex.repaired >= 1
    assert len(ex.claims) + ex.repaired == 4
    turned = next(iter(ex.why))
    assert "cpu" in ex.why[turned] and "once this round's other placements" in ex.why[turned]
    assert (turned, "m0") in ex.turned_back
    assert not store.commit(Transaction(FLOW, tuple(ex.claims))).rejected


def test_the_repair_step_keeps_a_jobs_tasks_per_machine_rule() -> None:
    store = make_cell(MemoryKV(), [machine("m0", cpu=8)],
                      [JobBuilder("spread").tasks(3).scheduler(FLOW).spread(1).build()])
    snap, gm, net, flow, ex = _solve(store, "trivial")
    check_exact(snap, gm, net, flow, ex, None)
    assert len(ex.claims) == 1 and ex.repaired == 2 and ex.unscheduled == {"spread": 2}
    assert "m0" in ex.why["spread"]


# -- stale drops -------------------------------------------------------------------------


def _stale_cell() -> CellStore:
    """m0 full of ``run``, m1 and m2 empty, load-spread: some of ``run`` migrate,
    ``wait`` and ``doomed`` get placed."""
    store = make_cell(MemoryKV(), [machine(f"m{i}", cpu=8) for i in range(3)],
                      [JobBuilder("run").tasks(8).scheduler(FLOW).build(),
                       JobBuilder("wait").tasks(2).scheduler(FLOW).build(),
                       JobBuilder("doomed").tasks(2).scheduler(FLOW).build()])
    seq = store.read_snapshot().machines["m0"].seq
    assert store.commit(Transaction(FLOW, tuple(Claim("run", i, "m0", seq)
                                                for i in range(8)))).ok
    return store


def test_tasks_that_changed_while_the_solver_ran_are_dropped() -> None:
    store = _stale_cell()
    snap = store.read_snapshot()
    gm = GraphManager(make_cost_model("load-spread"), FLOW)
    gm.rebuild(snap, NOW)
    net = gm.net.arrays()
    flow = OrToolsSolver().solve(net).flow
    fresh = extract(gm, net, flow, CellView(snap, FLOW))
    moving = sorted(c.task for c in fresh.claims if c.moves_from)
    assert moving and {c.job for c in fresh.claims if not c.moves_from} == {"wait", "doomed"}
    # Meanwhile: a moving task ends, a waiting task is placed by another instance,
    # and a job is killed.
    store.release_task(moving[0], TaskState.FINISHED)
    seq = store.read_snapshot().machines["m2"].seq
    assert store.commit(Transaction(FLOW, (Claim("wait", 0, "m2", seq),))).ok
    store.kill_job(JobStatus("doomed", JobState.KILLED, "by the test", "test", NOW))
    latest = store.read_snapshot()
    ex = extract(gm, net, flow, CellView(snap, FLOW), latest)
    claimed = {c.task for c in ex.claims}
    assert moving[0] not in claimed and "wait/0" not in claimed
    assert not any(c.job == "doomed" for c in ex.claims)
    assert "wait/1" in claimed and set(moving[1:]) <= claimed
    assert ex.stale == 1 + 1 + 2
    # What is left commits.
    assert not store.commit(Transaction(FLOW, tuple(ex.claims))).rejected
    assert task_view(store.read_snapshot(), "wait/1").state is TaskState.RUNNING

"""Extraction: every unit of flow that arrives on a machine becomes exactly one claim
(on that machine, or, turned back by the repair step, spilled to one the flow left
room on) or is counted as turned back, no task is claimed twice, claims
and unscheduled tasks add up to the waiting supply, migrations carry ``moves_from``,
evictions hit lower precedence only, and what the store is then asked to commit it
accepts. Tasks that changed while the solver ran are dropped."""

from __future__ import annotations

import random
from collections import Counter, deque

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from cellstate.cell import CellSnapshot, alloc_placed, machine_used, task_view
from cellstate.fit import selector
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    PLACEABLE,
    Claim,
    Job,
    JobState,
    JobStatus,
    MachineState,
    TaskState,
    Transaction,
)
from cellstate.store import CellStore
from schedulers.api import CellView
from schedulers.flow.costs import make_cost_model
from schedulers.flow.extract import Arrival, Extraction, arrivals, extract
from schedulers.flow.graph import ArcKind, GraphManager, Shape
from schedulers.flow.network import Arrays, NodeKey
from schedulers.flow.solvers import OrToolsSolver
from schedulers.testing import JobBuilder, machine, make_cell
from tests.flow_support import FLOW, NOW, OTHER, random_cell


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
    units, unscheduled, preempted = arrivals(gm, net, flow)
    assert (units, unscheduled, preempted) == _handed_on_in_order(gm, net, flow)
    assert Counter(a.machine for a in units) == +inflow
    assert all(a.source[0] in ("W", "G") for a in units)
    back_home = sum(1 for a in units if a.source[0] == "G" and a.source[1] == a.machine)
    # Each arrival is one claim (where it arrived, or spilled elsewhere), one turned
    # back, or a unit that left and came back.
    assert len(ex.claims) + ex.repaired + back_home == len(units) and ex.stale == 0
    placements = [c for c in ex.claims if not c.moves_from]
    assert len(placements) + sum(ex.unscheduled.values()) == waiting_supply
    for jid in gm.jobs:
        placed = sum(1 for c in placements if c.job == jid)
        assert placed + ex.unscheduled.get(jid, 0) == len(gm.waiting_of(jid))
    assert ex.placed == len(placements) and ex.migrated == len(ex.claims) - len(placements)
    # Moves only of movable tasks of a group whose units arrived there.
    came = Counter((a.source, a.machine) for a in units
                   if a.source[0] == "G" and a.source[1] != a.machine)
    made = Counter((_group_node(gm, c.moves_from, c.task), c.machine)
                   for c in ex.claims if c.moves_from)
    assert not made - came
    for c in ex.claims:
        if c.moves_from:
            assert c.task in gm.group_tasks(_group_node(gm, c.moves_from, c.task))
    # Placements where the job's units arrived, but for those the repair step turned
    # back and spilled: on a machine the flow left room on for the job's shape.
    came_w = Counter((str(a.source[1]), a.machine) for a in units if a.source[0] == "W")
    made_w = Counter((c.job, c.machine) for c in placements)
    spilled = made_w - came_w
    assert sum(spilled.values()) <= ex.spilled
    for jid, mid in spilled:
        assert mid in _spare_room(gm, net, flow, gm.jobs[jid].shape), (jid, mid)
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
            assert victim in gm.group_tasks(_group_node(gm, c.machine, victim))
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


def _handed_on_in_order(gm: GraphManager, net: Arrays, flow: npt.NDArray[np.int64]
                        ) -> tuple[list[Arrival], dict[str, int], dict[NodeKey, int]]:
    """What ``arrivals`` promises, unit by unit: arcs taken in layer order (out of
    sources, then cluster to rack, then into machines), then by index; each aggregator
    a queue, first in first out."""
    layer = {int(ArcKind.TO_RACK): 1, int(ArcKind.INTO_MACHINE): 2}
    key = gm.net.node_key
    order = sorted(range(len(flow)), key=lambda i: (layer.get(int(net.kind[i]), 0), i))
    queues: dict[NodeKey, deque[NodeKey]] = {}
    out: list[Arrival] = []
    unscheduled: dict[str, int] = {}
    preempted: dict[NodeKey, int] = {}
    for i in order:
        f, kind = int(flow[i]), int(net.kind[i])
        tail, head = key(int(net.tail[i])), key(int(net.head[i]))
        if f == 0 or kind in (ArcKind.STAY, ArcKind.TO_SINK, ArcKind.LEAVE_UNSCHEDULED):
            continue
        if kind == ArcKind.UNSCHEDULED:
            unscheduled[str(tail[1])] = unscheduled.get(str(tail[1]), 0) + f
            continue
        if kind == ArcKind.PREEMPT:
            preempted[tail] = preempted.get(tail, 0) + f
            continue
        units = ([tail] * f if tail[0] in ("W", "G")
                 else [queues[tail].popleft() for _ in range(f)])
        if head[0] == "M":
            out.extend(Arrival(src, str(head[1])) for src in units)
        else:
            queues.setdefault(head, deque()).extend(units)
    return out, unscheduled, preempted


def _group_node(gm: GraphManager, mid: str, tid: str) -> NodeKey:
    """The group node a running task ``tid`` on ``mid`` is re-offered through."""
    return ("G", mid, gm.machines[mid].where[tid])


def _spare_room(gm: GraphManager, net: Arrays, flow: npt.NDArray[np.int64],
                shape: Shape) -> set[str]:
    """Machines with an arc into them for ``shape`` that the flow did not fill."""
    key = gm.net.node_key
    out = set()
    for i in range(len(net.tail)):
        tail, head = key(int(net.tail[i])), key(int(net.head[i]))
        if (net.kind[i] == ArcKind.INTO_MACHINE and tail[1] == shape
                and flow[i] < net.capacity[i]):
            out.add(str(head[1]))
    return out


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
                    unscheduled=sum(ex.unscheduled.values()), spilled=ex.spilled)
    assert seen["placed"] and seen["unscheduled"] and seen["spilled"]
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


def test_a_task_the_repair_step_turns_back_spills_to_a_machine_with_room() -> None:
    # Both jobs' data lie on m0, so the flow sends all four tasks there (6 cpu for 4);
    # m1, in another rack, has room the flow left unused.
    def reads_m0(b: JobBuilder) -> Job:
        return attrs.evolve(b.scheduler(FLOW).build(), input=(("m0", 10.0),))

    store = make_cell(MemoryKV(), [machine("m0", cpu=4, mem=64, rack="r0"),
                                   machine("m1", cpu=4, mem=64, rack="r1")],
                      [reads_m0(JobBuilder("small").tasks(3).cpu(1)),
                       reads_m0(JobBuilder("big").tasks(1).cpu(3))])
    snap, gm, net, flow, ex = _solve(store, "quincy")
    check_exact(snap, gm, net, flow, ex, None)
    units, _, _ = arrivals(gm, net, flow)
    assert [a.machine for a in units] == ["m0"] * 4
    on = {mid: [c for c in ex.claims if c.machine == mid] for mid in ("m0", "m1")}
    # Every task placed: what did not fit on m0 went to m1, nothing waits.
    assert ex.placed == 4 and ex.spilled == len(on["m1"]) >= 1
    assert ex.repaired == 0 and not ex.unscheduled and not ex.why and not ex.turned_back
    cpu = {c.task: snap.jobs[c.job].task_resources.get("cpu") for c in ex.claims}
    used = sum(cpu[c.task] for c in on["m0"])
    assert used <= 4 and all(used + cpu[c.task] > 4 for c in on["m1"])
    assert not store.commit(Transaction(FLOW, tuple(ex.claims))).rejected


def test_a_cost_model_that_never_preempts_evicts_nothing_to_repair() -> None:
    # The flow sends 3 small and 1 big (6 cpu) into the 4 cpu that batch's task
    # leaves free; the repair step may evict only what the cost model lets be preempted, and
    # the trivial model preempts nothing, even below preempt_below.
    store = make_cell(MemoryKV(), [machine("m0", cpu=6, mem=64)],
                      [JobBuilder("low").tasks(1).cpu(2).scheduler(OTHER).build(),
                       JobBuilder("small").tasks(3).cpu(1).precedence(3).scheduler(FLOW)
                       .build(),
                       JobBuilder("big").tasks(1).cpu(3).precedence(3).scheduler(FLOW).build()])
    seq = store.read_snapshot().machines["m0"].seq
    assert store.commit(Transaction(OTHER, (Claim("low", 0, "m0", seq),))).ok
    snap, gm, net, flow, ex = _solve(store, "trivial", preempt_below=5)
    check_exact(snap, gm, net, flow, ex, 5)
    assert len(arrivals(gm, net, flow)[0]) == 4
    assert ex.preempted == 0 and not any(c.evict for c in ex.claims) and not ex.moved
    assert ex.repaired >= 1 and len(ex.claims) + ex.repaired == 4
    assert sum(snap.jobs[c.job].task_resources.get("cpu") for c in ex.claims) <= 4
    assert not store.commit(Transaction(FLOW, tuple(ex.claims))).rejected
    assert task_view(store.read_snapshot(), "low/0").state is TaskState.RUNNING


def test_the_repair_step_keeps_a_jobs_tasks_per_machine_rule() -> None:
    store = make_cell(MemoryKV(), [machine("m0", cpu=8)],
                      [JobBuilder("spread").tasks(3).scheduler(FLOW).spread(1).build()])
    snap, gm, net, flow, ex = _solve(store, "trivial")
    check_exact(snap, gm, net, flow, ex, None)
    assert len(ex.claims) == 1 and ex.repaired == 2 and ex.unscheduled == {"spread": 2}
    assert "m0" in ex.why["spread"]


def test_the_repair_step_keeps_a_neighbours_anti_affinity_rule() -> None:
    """The extraction skips reading machines' jobs only when no job in the cell has an
    anti-affinity rule (``placement.calm``): here one has, on the only machine."""
    store = make_cell(MemoryKV(), [machine("m0", cpu=8)],
                      [JobBuilder("quiet").tasks(1).scheduler(OTHER).away_from("app", "noisy")
                       .build(),
                       JobBuilder("noisy").tasks(1).scheduler(FLOW).label("app", "noisy")
                       .build()])
    seq = store.read_snapshot().machines["m0"].seq
    assert store.commit(Transaction(OTHER, (Claim("quiet", 0, "m0", seq),))).ok
    snap, gm, net, flow, ex = _solve(store, "trivial")
    check_exact(snap, gm, net, flow, ex, None)
    assert ex.claims == [] and ex.repaired == 1 and ex.unscheduled == {"noisy": 1}
    assert "anti-affinity" in ex.why["noisy"]


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

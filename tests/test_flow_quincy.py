"""Quincy's arithmetic, pinned on small cells worked out by hand (issue 33, item 4).

Each case states its numbers: the arcs the graph manager builds must cost exactly
those, and the flow scheduler (graph manager, OR-Tools, extraction; or the whole policy
under the testing harness) must place, keep, move or preempt as those numbers say.

The rules (``QuincyCostModel``), with ``S`` = data_scale, ``rc`` = rack_cost, ``cc`` =
core_cost and a task reading ``T`` in all, ``m`` of it on machine ``x`` and ``r`` on
``x``'s rack (a block counted once per machine and once per rack)::

    transfer(x) = S * (rc * (r - m) + cc * (T - r))
    machine arc = transfer(x)                 where m >= machine_threshold * T
    rack arc    = transfer(rack's worst machine: one holding none if it has one)
                                              where r >= rack_threshold * T
    cluster arc = S * cc * T                  while some rack holds none of it
                = max over racks of the rack's worst machine, otherwise
    unscheduled = cluster arc + unscheduled_cost + wait_cost * waited
                  + precedence_cost * precedence
    staying     = transfer(where it runs) - run_discount * seconds it has run
    moving      = the new machine's (or rack's, or cluster's) arc + migrate_cost
    preempting  = preempt_cost + precedence_cost * precedence
                  + wait_cost * (seconds it waited before it started)

Every case uses the options of ``OPTIONS`` (the model's defaults, written out so the
arithmetic below reads from this file alone) unless it says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import pytest

from cellstate.cell import CellSnapshot, task_view
from cellstate.keys import KeyKind
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Block,
    Claim,
    Job,
    Machine,
    Resources,
    TaskState,
    Transaction,
    split_task_id,
    task_id,
)
from cellstate.store import CellStore
from schedulers.api import CellView
from schedulers.flow.costs import Group, QuincyCostModel, Racks
from schedulers.flow.extract import Extraction, extract
from schedulers.flow.graph import ArcKind, GraphManager, GroupKey, shape_of
from schedulers.flow.network import NodeKey
from schedulers.flow.policy import FlowPolicy
from schedulers.flow.solvers import OrToolsSolver
from schedulers.runtime import RuntimeConfig
from schedulers.testing import Harness, JobBuilder, machine, make_cell
from tests.flow_support import random_cell

FLOW = "flow"
OTHER = "batch"
NOW = 1000.0

OPTIONS: dict[str, float] = {
    "rack_cost": 1, "core_cost": 4, "data_scale": 100,
    "machine_threshold": 0.1, "rack_threshold": 0.25, "max_preferences": 8,
    "unscheduled_cost": 1000, "wait_cost": 2, "precedence_cost": 1000,
    "migrate_cost": 500, "preempt_cost": 3000, "run_discount": 1,
}


def quincy(**changes: float) -> QuincyCostModel:
    return QuincyCostModel(**{**OPTIONS, **changes})


# -- cells ----------------------------------------------------------------------------------


def node(mid: str, rack: str, cpu: float = 2) -> Machine:
    """A machine with room for ``cpu`` tasks of 1 cpu (memory is never short)."""
    return machine(mid, cpu=cpu, mem=64, rack=rack)


def reader(jid: str, *task_input: tuple[Block, ...], submitted: float = NOW,
           precedence: int = 0) -> Job:
    """A job of the flow scheduler, one task of 1 cpu per entry of ``task_input``."""
    j = (JobBuilder(jid).tasks(len(task_input)).cpu(1).mem(1).scheduler(FLOW)
         .precedence(precedence).submitted_at(submitted).build())
    return attrs.evolve(j, task_input=tuple(task_input))


def plain(jid: str, tasks: int = 1, *, submitted: float = NOW, precedence: int = 0) -> Job:
    """A job of the flow scheduler with no input: it costs the same anywhere."""
    return (JobBuilder(jid).tasks(tasks).cpu(1).mem(1).scheduler(FLOW)
            .precedence(precedence).submitted_at(submitted).build())


def cell(machines: Sequence[Machine], jobs: Sequence[Job], full: Sequence[str] = ()
         ) -> CellStore:
    """The cell, with the machines ``full`` filled up by another scheduler's task (so
    the flow scheduler has no room there, though they hold data)."""
    fillers = [JobBuilder(f"fill-{mid}").cpu(next(m for m in machines if m.id == mid)
                                             .capacity.get("cpu"))
               .mem(1).scheduler(OTHER).build() for mid in full]
    store = make_cell(MemoryKV(), machines, [*jobs, *fillers])
    for mid, f in zip(full, fillers, strict=True):
        claim(store, OTHER, f.id, 0, mid)
    return store


def claim(store: CellStore, scheduler: str, jid: str, index: int, mid: str) -> None:
    seq = store.read_snapshot().machines[mid].seq
    assert store.commit(Transaction(scheduler, (Claim(jid, index, mid, seq),))).ok


def network(store: CellStore, model: QuincyCostModel, now: float = NOW,
            move_guard: float = 60.0) -> tuple[GraphManager, CellSnapshot]:
    gm = GraphManager(model, FLOW, move_guard=move_guard)
    snap = store.read_snapshot()
    gm.update(snap, None, now)
    return gm, snap


def solve(gm: GraphManager, snap: CellSnapshot) -> Extraction:
    net = gm.net.arrays()
    return extract(gm, net, OrToolsSolver().solve(net).flow, CellView(snap, FLOW))


def placed(ex: Extraction) -> dict[str, str]:
    """Task -> the machine the round claims for it (placements and moves)."""
    return {task_id(c.job, c.index): c.machine for c in ex.claims}


# -- reading arcs ---------------------------------------------------------------------------


def arcs_out(gm: GraphManager, owner: NodeKey, kind: ArcKind) -> dict[str, int]:
    """Cost of each arc of ``kind`` leaving ``owner`` that can carry flow, by where it
    goes: a machine's id, ``rack:<rack>``, ``cluster`` (a shape's aggregator) or
    ``unscheduled`` (the job's unscheduled aggregator)."""
    out: dict[str, int] = {}
    for s in gm.net.arcs_of(owner):
        a = gm.net.arc(s)
        if a.kind != kind or a.capacity <= 0:
            continue
        head = a.head
        name = (str(head[1]) if head[0] == "M" else f"rack:{head[2]}" if head[0] == "R"
                else "cluster" if head[0] == "E" else "unscheduled")
        assert name not in out
        out[name] = a.cost
    return out


def prefs(gm: GraphManager, owner: NodeKey) -> dict[str, int]:
    return arcs_out(gm, owner, ArcKind.PREFERENCE)


def cost_of(gm: GraphManager, owner: NodeKey, kind: ArcKind) -> int:
    (cost,) = arcs_out(gm, owner, kind).values()
    return cost


def own_node(snap: CellSnapshot, tid: str, mid: str) -> NodeKey:
    """The node of a running task priced on its own, on ``mid``."""
    jid, _ = split_task_id(tid)
    j = snap.jobs[jid]
    return ("G", mid, GroupKey(shape_of(j), j.precedence, True, tid))


# -- 1. locality -----------------------------------------------------------------------------


def test_a_task_runs_on_the_machine_holding_its_block_not_on_an_empty_one() -> None:
    """One block of 10 on a0; r0 = {a0, a1}, r1 = {b0}, every machine empty.

    a0: 100 * (1 * (10 - 10) + 4 * (10 - 10)) = 0
    rack r0 (holds 10 >= 2.5): its worst machine is a1, holding none:
        100 * (1 * 10 + 4 * 0) = 1000
    cluster: r1 holds none, so all of it across the core: 100 * 4 * 10 = 4000
    The whole flow scheduler (a policy under the harness) places it on a0."""
    machines = [node("a0", "r0"), node("a1", "r0"), node("b0", "r1")]
    etl = reader("etl", (Block(10, ("a0",)),))
    gm, _ = network(cell(machines, [etl]), quincy())
    assert prefs(gm, ("W", "etl", 0)) == {"a0": 0, "rack:r0": 1000}
    assert cost_of(gm, ("W", "etl", 0), ArcKind.TO_CLUSTER) == 4000

    h = Harness()
    h.admin.add_machines(machines)
    h.add(FlowPolicy(policy="quincy", costs=OPTIONS))
    h.submit([etl])
    h.run(_running("etl"), max_time=10)
    assert h.machines_of("etl") == ["a0"]


@pytest.mark.parametrize(("on_a0", "on_b0", "lands"), [(6, 4, "a0"), (4, 6, "b0")])
def test_of_two_blocks_on_two_machines_the_one_holding_the_bigger_wins(
        on_a0: float, on_b0: float, lands: str) -> None:
    """Blocks of 6 and 4 on a0 (rack r0 = {a0, a1}) and b0 (r1 = {b0, b1}), all empty.

    Bigger block (6) on a0:
      a0: 100 * (1 * 0 + 4 * (10 - 6)) = 1600     b0: 100 * (1 * 0 + 4 * (10 - 4)) = 2400
      rack r0: worst is a1 (none): 100 * (1 * 6 + 4 * 4) = 2200
      rack r1: worst is b1 (none): 100 * (1 * 4 + 4 * 6) = 2800
      cluster (both racks hold some): max(2200, 2800) = 2800
    so the task goes to a0 for 1600; with the sizes swapped, to b0 (mirror image)."""
    machines = [node("a0", "r0"), node("a1", "r0"), node("b0", "r1"), node("b1", "r1")]
    job = reader("etl", (Block(on_a0, ("a0",)), Block(on_b0, ("b0",))))
    gm, snap = network(cell(machines, [job]), quincy())
    big, small = ("a0", "b0") if on_a0 > on_b0 else ("b0", "a0")
    big_rack, small_rack = ("r0", "r1") if big == "a0" else ("r1", "r0")
    assert prefs(gm, ("W", "etl", 0)) == {big: 1600, small: 2400, f"rack:{big_rack}": 2200,
                                          f"rack:{small_rack}": 2800}
    assert placed(solve(gm, snap)) == {"etl/0": lands}


# -- 2. rack against core --------------------------------------------------------------------


RACKS_2X2 = [node("a0", "r0"), node("a1", "r0"), node("b0", "r1"), node("b1", "r1")]


def test_a_task_whose_data_machines_are_full_goes_into_the_rack_holding_more() -> None:
    """Blocks of 6 on a0 and 4 on b1; r0 = {a0, a1}, r1 = {b0, b1}; a0 and b1 are full.
    rack_cost 1 within a rack, core_cost 4 across racks:

      machine a0: 100 * (1 * (6 - 6) + 4 * (10 - 6)) = 1600   (full: no room there)
      machine b1: 100 * (1 * (4 - 4) + 4 * (10 - 4)) = 2400   (full)
      rack r0: worst machine a1: 100 * (1 * 6 + 4 * 4) = 2200
      rack r1: worst machine b0: 100 * (1 * 4 + 4 * 6) = 2800
      cluster: max(2200, 2800) = 2800
    The task lands on a1 (2200), inside the rack holding 6, not on b0 (2800).

    With rack_cost and core_cost swapped in the transfer formula every number changes
    (a0 400, b1 600, r0 2800, r1 2200) and the task would land on b0."""
    job = reader("etl", (Block(6, ("a0",)), Block(4, ("b1",))))
    gm, snap = network(cell(RACKS_2X2, [job], full=["a0", "b1"]), quincy())
    assert prefs(gm, ("W", "etl", 0)) == {"a0": 1600, "b1": 2400, "rack:r0": 2200,
                                          "rack:r1": 2800}
    assert cost_of(gm, ("W", "etl", 0), ArcKind.TO_CLUSTER) == 2800
    assert placed(solve(gm, snap)) == {"etl/0": "a1"}


def test_transfer_prices_data_in_the_rack_at_rack_cost_and_the_rest_at_core_cost() -> None:
    """The same input with rack_cost 2 and core_cost 7 (data_scale 100), priced on each
    machine (6 on a0, 4 on b1; T = 10):

      a0: 100 * (2 * (6 - 6) + 7 * (10 - 6)) = 2800
      a1: 100 * (2 * (6 - 0) + 7 * (10 - 6)) = 4000
      b0: 100 * (2 * (4 - 0) + 7 * (10 - 4)) = 5000
      b1: 100 * (2 * (4 - 4) + 7 * (10 - 4)) = 4200
      c0 (a rack holding none): 100 * 7 * 10 = 7000"""
    model = quincy(rack_cost=2, core_cost=7)
    job = reader("etl", (Block(6, ("a0",)), Block(4, ("b1",))))
    racks = Racks({m.id: m.rack for m in RACKS_2X2} | {"c0": "r2"})
    assert {mid: model.transfer(job, 0, mid, racks) for mid in sorted(racks)} == {
        "a0": 2800, "a1": 4000, "b0": 5000, "b1": 4200, "c0": 7000}


def test_a_block_with_two_copies_in_one_rack_counts_once_for_the_rack() -> None:
    """A block of 5 on a0 and a1 (both in r0 = {a0, a1, a2}) and one of 5 on b0
    (r1 = {b0, b1}): r0 holds 5, not 10.

      a0 = a1: 100 * (1 * (5 - 5) + 4 * (10 - 5)) = 2000
      a2:      100 * (1 * 5 + 4 * 5) = 2500   (counted twice: 100 * 1 * 10 = 1000)
      rack r0: its worst machine, a2: 2500"""
    machines = [node("a0", "r0"), node("a1", "r0"), node("a2", "r0"), node("b0", "r1"),
                node("b1", "r1")]
    job = reader("etl", (Block(5, ("a0", "a1")), Block(5, ("b0",))))
    gm, _ = network(cell(machines, [job]), quincy())
    assert prefs(gm, ("W", "etl", 0))["rack:r0"] == 2500
    assert quincy().transfer(job, 0, "a2", Racks({m.id: m.rack for m in machines})) == 2500


# -- 3. rack threshold -----------------------------------------------------------------------


@pytest.mark.parametrize(("rack_threshold", "first_lands", "second_lands"),
                         [(0.25, "a1", "b0"), (0.45, "b0", "a1")])
def test_the_rack_threshold_decides_whether_a_task_gets_into_its_datas_rack(
        rack_threshold: float, first_lands: str, second_lands: str) -> None:
    """r0 = {a0, a1}, r1 = {b0}, one slot each; a0 is full. Two tasks of one job, each
    reading 10, most of it from outside the cell ("gone"):

      task 0: 4 on a0, 6 elsewhere. a0: 100 * (4 * 6) = 2400 (full);
              r0 holds 4 (40%): its arc costs its worst machine, a1:
              100 * (1 * 4 + 4 * 6) = 2800
      task 1: 2 on a1, 8 elsewhere. a1: 100 * (4 * 8) = 3200;
              r0 holds 2 (20%): below both thresholds, no rack arc
      cluster, both: r1 holds none: 100 * 4 * 10 = 4000

    rack_threshold 0.25 (4 >= 2.5, the rack arc exists):
        task 0 on a1 via r0 (2800) + task 1 on b0 via the cluster (4000) = 6800
      < task 0 on b0 (4000) + task 1 on a1 (3200) = 7200
    rack_threshold 0.45 (4 < 4.5, no rack arc: task 0 reaches a1 only through the
    cluster, at 4000):
        task 0 on b0 (4000) + task 1 on a1 (3200) = 7200 < 4000 + 4000 = 8000"""
    job = reader("scan", (Block(4, ("a0",)), Block(6, ("gone",))),
                 (Block(2, ("a1",)), Block(8, ("gone",))))
    machines = [node("a0", "r0", cpu=1), node("a1", "r0", cpu=1), node("b0", "r1", cpu=1)]
    gm, snap = network(cell(machines, [job], full=["a0"]),
                       quincy(rack_threshold=rack_threshold))
    rack_arc = {"rack:r0": 2800} if rack_threshold < 0.4 else {}
    assert prefs(gm, ("W", "scan", 0)) == {"a0": 2400, **rack_arc}
    assert prefs(gm, ("W", "scan", 1)) == {"a1": 3200}
    assert placed(solve(gm, snap)) == {"scan/0": first_lands, "scan/1": second_lands}


@pytest.mark.parametrize(("machine_threshold", "first_lands", "second_lands"),
                         [(0.25, "a0", "b0"), (0.4, "b0", "a0")])
def test_the_machine_threshold_decides_whether_a_task_gets_an_arc_to_a_machine(
        machine_threshold: float, first_lands: str, second_lands: str) -> None:
    """r0 = {a0}, r1 = {b0}, one slot each; rack_threshold 1 (no rack arcs: a rack
    arc into r0 would reach a0 all the same). Two tasks of one job:

      task 0 reads 10, 3 of it on a0 (30%): a0 100 * 4 * 7 = 2800, cluster 4000
      task 1 reads 2, 1 of it on a0 (50%):  a0 100 * 4 * 1 = 400,  cluster 800

    machine_threshold 0.25 (both have their arc to a0):
        task 0 on a0 (2800) + task 1 on b0 (800) = 3600 < 400 + 4000 = 4400
    machine_threshold 0.4 (3 < 4: task 0 reaches a0 only through the cluster, 4000):
        task 1 on a0 (400) + task 0 on b0 (4000) = 4400 < 4000 + 800 = 4800"""
    job = reader("scan", (Block(3, ("a0",)), Block(7, ("gone",))),
                 (Block(1, ("a0",)), Block(1, ("gone",))))
    machines = [node("a0", "r0", cpu=1), node("b0", "r1", cpu=1)]
    gm, snap = network(cell(machines, [job]),
                       quincy(machine_threshold=machine_threshold, rack_threshold=1))
    assert prefs(gm, ("W", "scan", 0)) == ({"a0": 2800} if machine_threshold < 0.3 else {})
    assert prefs(gm, ("W", "scan", 1)) == {"a0": 400}
    assert placed(solve(gm, snap)) == {"scan/0": first_lands, "scan/1": second_lands}


def test_a_task_gets_arcs_to_at_most_max_preferences_machines_the_biggest_first() -> None:
    """Blocks of 5, 3 and 2 on a0, a1 and a2 (rack r0 = {a0, a1, a2}); with
    max_preferences 2 the task's machine arcs go to a0 and a1 only:
    a0: 100 * (1 * (10 - 5)) = 500, a1: 100 * (1 * (10 - 3)) = 700; its rack arc
    costs its worst machine, a2: 100 * (1 * 8) = 800."""
    machines = [node("a0", "r0"), node("a1", "r0"), node("a2", "r0"), node("b0", "r1")]
    job = reader("etl", (Block(5, ("a0",)), Block(3, ("a1",)), Block(2, ("a2",))))
    gm, _ = network(cell(machines, [job]), quincy(max_preferences=2))
    assert prefs(gm, ("W", "etl", 0)) == {"a0": 500, "a1": 700, "rack:r0": 800}


# -- 4. a rack's real worst machine ----------------------------------------------------------


def test_a_rack_whose_every_machine_holds_some_costs_its_worst_holder() -> None:
    """6 on a0 and 4 on a1; r0 = {a0, a1} (every machine of it holds some), r1 = {b0}.

      a0: 100 * (1 * (10 - 6) + 4 * 0) = 400     a1: 100 * (1 * (10 - 4)) = 600
      rack r0: max(400, 600) = 600, not a machine holding none (100 * 1 * 10 = 1000:
      r0 has none such)
    With a2 added to r0, holding none, the rack's worst machine is a2: 1000."""
    job = reader("etl", (Block(6, ("a0",)), Block(4, ("a1",))))
    two = [node("a0", "r0"), node("a1", "r0"), node("b0", "r1")]
    gm, _ = network(cell(two, [job]), quincy())
    assert prefs(gm, ("W", "etl", 0)) == {"a0": 400, "a1": 600, "rack:r0": 600}
    gm, _ = network(cell([*two, node("a2", "r0")], [job]), quincy())
    assert prefs(gm, ("W", "etl", 0)) == {"a0": 400, "a1": 600, "rack:r0": 1000}


# -- 5. the cluster arc ----------------------------------------------------------------------


def test_the_cluster_arc_costs_the_worst_racks_worst_machine_when_every_rack_holds_some(
        ) -> None:
    """6 on a0 and 4 on b0; r0 = {a0, a1}, r1 = {b0, b1}: both racks hold some.

      r0's worst, a1: 100 * (1 * 6 + 4 * 4) = 2200
      r1's worst, b1: 100 * (1 * 4 + 4 * 6) = 2800
      cluster: 2800, not all of it across the core (100 * 4 * 10 = 4000)
      unscheduled at NOW + 30: 2800 + 1000 + 2 * 30 = 3860
    A job reading the same input evenly with its 2 tasks (Job.input, a shared node) is
    priced at half the scale (100 / 2 tasks): cluster 1400.
    With a third rack r2 = {c0} holding none, all of it crosses the core: 4000."""
    job = reader("etl", (Block(6, ("a0",)), Block(4, ("b0",))), submitted=NOW - 30)
    shared = attrs.evolve(plain("even", tasks=2), input=(("a0", 6.0), ("b0", 4.0)))
    gm, _ = network(cell(RACKS_2X2, [job, shared]), quincy())
    assert cost_of(gm, ("W", "etl", 0), ArcKind.TO_CLUSTER) == 2800
    assert cost_of(gm, ("W", "etl", 0), ArcKind.UNSCHEDULED) == 3860
    assert cost_of(gm, ("W", "even"), ArcKind.TO_CLUSTER) == 1400
    gm, _ = network(cell([*RACKS_2X2, node("c0", "r2")], [job]), quincy())
    assert cost_of(gm, ("W", "etl", 0), ArcKind.TO_CLUSTER) == 4000


# -- 6. the continuation discount ------------------------------------------------------------


@pytest.mark.parametrize(("ran", "ends_on"), [(10, "a0"), (3400, "a0"), (3600, "b0")])
def test_a_task_that_has_run_long_enough_stays_though_a_better_machine_appears(
        ran: float, ends_on: str) -> None:
    """A task reading 10 from a0 runs on b0 (r1 = {b0}); a0 (r0 = {a0}) joins the cell
    ``ran`` seconds after the scheduler saw the task start.

      staying on b0: transfer 100 * 4 * 10 = 4000, less 1 a second run: 4000 - ran
      moving to a0: its machine arc 0 + migrate_cost 500 = 500
    so it moves while 4000 - ran > 500, i.e. if it has run less than 3500 s. The
    flapping guard (move_guard) is 1 s: not what keeps it."""
    job = reader("etl", (Block(10, ("a0",)),), submitted=NOW)
    store = cell([node("b0", "r1")], [job])
    claim(store, FLOW, "etl", 0, "b0")
    gm, _ = network(store, quincy(), NOW, move_guard=1.0)  # it sees etl/0 start
    store.add_machine(node("a0", "r0"))
    snap = store.read_snapshot()
    gm.update(snap, None, NOW + ran)
    stay = own_node(snap, "etl/0", "b0")
    assert cost_of(gm, stay, ArcKind.STAY) == 4000 - ran
    assert prefs(gm, stay) == {"a0": 500, "rack:r0": 500}
    ex = solve(gm, snap)
    if ends_on == "b0":
        assert ex.claims == []
    else:
        (c,) = ex.claims
        assert (c.machine, c.moves_from) == ("a0", "b0")


def _run_until(h: Harness, end: float) -> None:
    h.run(lambda s: h.clock.now >= end, max_time=end - h.clock.now + 10)


def _running(jid: str) -> Callable[[CellSnapshot], bool]:
    return lambda s: task_view(s, f"{jid}/0").state is TaskState.RUNNING


def test_the_flow_scheduler_moves_a_fresh_task_and_keeps_an_old_one() -> None:
    """The case above, run by the whole policy under the harness (a round a second; a
    lease that outlives the clock's jumps). Two jobs, each reading 10 from a0 (full
    meanwhile), start on b0 about 60 s apart; the scheduler sees each start within 1 s.
    a0 empties 3530 s after old started:

      old has run 3528..3530 s: staying costs 4000 - 3530 = 470..472 < 500: it stays
      new has run 3465..3470 s: staying costs 530..535 > 500 (a move): it moves to a0"""
    h = Harness()
    h.admin.add_machines([node("a0", "r0"), node("b0", "r1")])
    h.admin.submit_job(JobBuilder("fill").cpu(2).mem(1).scheduler(OTHER).build())
    claim(h.admin, OTHER, "fill", 0, "a0")
    h.add(FlowPolicy(policy="quincy", costs=OPTIONS, move_guard=1.0),
          config=RuntimeConfig(lease_ttl=100_000))
    h.submit([reader("old", (Block(10, ("a0",)),), submitted=h.clock.now)])
    h.run(_running("old"), max_time=10)
    start = h.clock.now
    _run_until(h, start + 2)  # a round sees it running
    h.clock.now = start + 60
    h.submit([reader("new", (Block(10, ("a0",)),), submitted=h.clock.now)])
    h.run(_running("new"), max_time=10)
    _run_until(h, h.clock.now + 2)
    assert h.machines_of("old") == h.machines_of("new") == ["b0"]
    h.clock.now = start + 3530
    h.admin.release_task("fill/0", TaskState.FINISHED)
    _run_until(h, h.clock.now + 5)
    assert (h.machines_of("old"), h.machines_of("new")) == (["b0"], ["a0"])


# -- 7. waiting ------------------------------------------------------------------------------


def test_the_unscheduled_arc_grows_by_wait_cost_a_second_waited() -> None:
    """A task of its own (cluster arc 4000: 10 on a0, r1 holds none) and a job of two
    plain tasks (cluster arc 0), both submitted at NOW, precedence 1:

      own node at NOW + 10:  4000 + 1000 + 2 * 10 + 1000 * 1 = 6020; at NOW + 110: 6220
      shared node:           0 + 1000 + 2 * 10 + 1000 = 2020;         then 2220"""
    jobs = [reader("etl", (Block(10, ("a0",)),), precedence=1),
            plain("web", tasks=2, precedence=1)]
    store = cell([node("a0", "r0", cpu=0.5), node("b0", "r1", cpu=0.5)], jobs)
    gm, snap = network(store, quincy(), NOW + 10)
    assert cost_of(gm, ("W", "etl", 0), ArcKind.UNSCHEDULED) == 6020
    assert cost_of(gm, ("W", "web"), ArcKind.UNSCHEDULED) == 2020
    gm.update(snap, frozenset(), NOW + 110)  # nothing changed but the clock
    assert cost_of(gm, ("W", "etl", 0), ArcKind.UNSCHEDULED) == 6220
    assert cost_of(gm, ("W", "web"), ArcKind.UNSCHEDULED) == 2220


#: Preempting a task of precedence 0 costs 3001 here, one more than the default: the
#: crossing below falls between two whole seconds, so no round sees a tie.
PREEMPT_3001 = {**OPTIONS, "preempt_cost": 3001}


@pytest.mark.parametrize(("waited", "placed_now"), [(0, False), (500, False), (501, True),
                                                     (900, True)])
def test_a_task_waits_while_its_only_machine_costs_more_than_waiting(
        waited: float, placed_now: bool) -> None:
    """Leaving a task unscheduled costs its cluster arc and more, so a machine with
    room always wins; the only machine costs more than waiting when its room must be
    taken back. m0 has one slot, held by this scheduler's task low/0 (precedence 0, a
    node of its group: preempting it costs 3001 + 1000 * 0, staying costs 0); vip
    (precedence 1, no input: cluster arc 0) was submitted at NOW:

      vip waiting ``w`` s:      0 + 1000 + 2 * w + 1000 * 1 = 2000 + 2 * w
      vip on m0, low preempted: 0 + 3001
    so vip waits while 2000 + 2 * w < 3001 (at 500 s: 3000) and is placed, evicting
    low/0, once it is more (at 501 s: 3002)."""
    store = cell([node("m0", "r0", cpu=1)], [plain("low", submitted=NOW - 600),
                                              plain("vip", precedence=1)])
    claim(store, FLOW, "low", 0, "m0")
    gm, snap = network(store, QuincyCostModel(**PREEMPT_3001), NOW + waited)
    assert cost_of(gm, ("W", "vip"), ArcKind.UNSCHEDULED) == 2000 + 2 * waited
    assert cost_of(gm, ("G", "m0", GroupKey(shape_of(snap.jobs["low"]), 0, True)),
                   ArcKind.PREEMPT) == 3001
    ex = solve(gm, snap)
    if placed_now:
        (c,) = ex.claims
        assert (c.job, c.machine, c.evict) == ("vip", "m0", ("low/0",))
    else:
        assert ex.claims == [] and ex.unscheduled == {"vip": 1}


def test_the_flow_scheduler_places_the_waiting_task_once_waiting_costs_more() -> None:
    """The case above run by the whole policy, a round a second: vip is placed in the
    first round at least 501 s after it was submitted, and low/0 is preempted."""
    h = Harness()
    h.admin.add_machines([node("m0", "r0", cpu=1)])
    h.add(FlowPolicy(policy="quincy", costs=PREEMPT_3001))
    h.submit([plain("low", submitted=h.clock.now)])
    h.run(_running("low"), max_time=10)
    submitted = h.clock.now
    h.submit([plain("vip", precedence=1, submitted=submitted)])
    h.run(_running("vip"), max_time=1000)
    assert 501 <= h.clock.now - submitted < 502
    assert task_view(h.snapshot(), "low/0").state is TaskState.PREEMPTED


# -- 8. preemption -------------------------------------------------------------------------


def test_a_preemption_costs_more_the_longer_the_task_waited_before_it_started() -> None:
    """preempt_cost 3000, precedence_cost 1000, wait_cost 2:
    waited 0: 3000; waited 100: 3200; precedence 2, waited 100: 5200."""
    model = quincy()
    g = Group(Resources.of(cpu=1), 0, "m0", 1, 1, True, "etl/0")
    assert [model.preempt(g, w) for w in (0.0, 100.0)] == [3000, 3200]
    assert model.preempt(attrs.evolve(g, precedence=2), 100.0) == 5200


@pytest.mark.parametrize(("vip_waited", "preempted"), [(250, False), (350, True)])
def test_the_graph_manager_prices_a_preemption_by_the_real_wait_before_start(
        vip_waited: float, preempted: bool) -> None:
    """old (submitted at NOW - 300, reading 1 from m0: it runs where its data is,
    transfer 0) is seen starting on m0, the only machine, at NOW: it waited 300 s.
    run_discount 0 here, so staying costs 0 however long it runs.

      preempting old/0: 3000 + 1000 * 0 + 2 * 300 = 3600, at NOW and at any later time
      vip (precedence 2, no input, submitted at NOW) waiting w s: 1000 + 2 * w + 2000
    so vip evicts old/0 once 3000 + 2 * w > 3600: after 300 s (with no wait counted
    the preemption would cost 3000 and vip would take m0 at once)."""
    old = reader("old", (Block(1, ("m0",)),), submitted=NOW - 300)
    store = cell([node("m0", "r0", cpu=1)], [old, plain("vip", precedence=2)])
    claim(store, FLOW, "old", 0, "m0")
    model = quincy(run_discount=0)
    gm, snap = network(store, model, NOW)
    victim = own_node(snap, "old/0", "m0")
    assert cost_of(gm, victim, ArcKind.PREEMPT) == 3600
    gm.update(snap, frozenset(), NOW + vip_waited)
    assert cost_of(gm, victim, ArcKind.PREEMPT) == 3600
    gm.update(snap, None, NOW + vip_waited)  # made again from scratch: the same price
    assert cost_of(gm, victim, ArcKind.PREEMPT) == 3600
    assert cost_of(gm, victim, ArcKind.STAY) == 0
    assert cost_of(gm, ("W", "vip"), ArcKind.UNSCHEDULED) == 3000 + 2 * vip_waited
    ex = solve(gm, snap)
    if preempted:
        (c,) = ex.claims
        assert (c.job, c.machine, c.evict) == ("vip", "m0", ("old/0",))
    else:
        assert ex.claims == []


# -- the per-task network against the model ------------------------------------------------


def _fits_ever(job: Job, m: Machine) -> bool:
    """Whether one task of ``job`` fits on an empty ``m`` (capacity and selector)."""
    if not all(r.matches(m.label(r.key)) for r in job.constraints.machine_selector):
        return False
    return all(a <= 0 or m.capacity.get(d) >= a for d, a in job.task_resources.amounts)


def _expected_prefs(model: QuincyCostModel, snap: CellSnapshot, job: Job, index: int,
                    skip: str = "", extra: int = 0) -> dict[str, int]:
    racks = Racks({mid: m.rack for mid, m in snap.machines.items()})
    tc = model.task_costs(job, index, racks)
    assert tc is not None
    out = {}
    for p in tc.preferences:
        m = snap.machines.get(p.machine)
        if p.machine and m is not None and p.machine != skip and _fits_ever(job, m):
            out[p.machine] = p.cost + extra
        elif not p.machine:
            out[f"rack:{p.rack}"] = p.cost + extra
    return out


@pytest.mark.parametrize("seed", range(40))
def test_each_tasks_own_arcs_are_what_the_model_prices_it_at(seed: int) -> None:
    """On random cells (tests/flow_support.py: tasks reading their own blocks, some on
    a machine the cell lacks, some tasks running): every waiting task with a node of
    its own has the preference arcs ``QuincyCostModel.task_costs`` gives it (to the
    machines of the cell it could ever fit on, and its racks), its cluster arc, and
    the unscheduled arc of its wait; every such running task has the same arcs to
    move by, plus migrate_cost (none to its own machine), and stays at its transfer
    cost (it has run 0 s)."""
    store = random_cell(seed)
    model = quincy()
    now = 1000.0
    gm, snap = network(store, model, now)
    racks = Racks({mid: m.rack for mid, m in snap.machines.items()})
    checked = 0
    for jid in sorted(gm.jobs):
        job = gm.jobs[jid].job
        for i in range(len(job.task_input)):
            tc = model.task_costs(job, i, racks)
            assert tc is not None
            tid = task_id(jid, i)
            rec = snap.tasks.get(tid)
            if i in gm.waiting_of(jid):
                w: NodeKey = ("W", jid, i)
                assert prefs(gm, w) == _expected_prefs(model, snap, job, i)
                assert cost_of(gm, w, ArcKind.TO_CLUSTER) == tc.cluster
                assert cost_of(gm, w, ArcKind.UNSCHEDULED) == model.task_unscheduled(
                    job, tc, max(now - job.submitted_at, 0.0))
                checked += 1
            elif rec is not None and rec.state is TaskState.RUNNING:
                g = own_node(snap, tid, rec.machine)
                assert prefs(gm, g) == _expected_prefs(model, snap, job, i, rec.machine, 500)
                assert cost_of(gm, g, ArcKind.MIGRATE) == tc.cluster + 500
                assert cost_of(gm, g, ArcKind.STAY) == model.transfer(job, i, rec.machine,
                                                                      racks)
                checked += 1
    assert checked == sum(len(gm.jobs[j].job.task_input) for j in gm.jobs)


def test_the_random_cells_have_tasks_of_their_own_to_check() -> None:
    """The property above is not vacuous: its cells hold tasks priced on their own,
    waiting and running, with preference arcs to machines and to racks."""
    kinds: set[str] = set()
    for seed in range(40):
        gm, _ = network(random_cell(seed), quincy())
        for owner in gm.net.owners():
            if not isinstance(owner, tuple) or not owner:
                continue
            own = (owner[0] == "W" and len(owner) == 3) or (
                owner[0] == "G" and isinstance(owner[2], GroupKey) and owner[2].task)
            if own:
                kinds.add(str(owner[0]))
                kinds.update("rack" if name.startswith("rack:") else "machine"
                             for name in prefs(gm, owner))
    assert kinds == {"W", "G", "rack", "machine"}


def test_jobs_arriving_together_get_the_task_nodes_they_get_arriving_one_by_one() -> None:
    """A round's arriving jobs are priced and given their task nodes together (one
    pass for all): each task's arcs are those of its own input and its own shape, as
    when each job arrives in a round of its own, and as its prices say."""
    machines = [node(f"m{i}", f"r{i % 3}", cpu=4) for i in range(9)]
    small = reader("a", (Block(4.0, ("m0", "m4")),), (Block(1.0, ("m1",)), Block(3.0, ("m2",))))
    big = attrs.evolve(reader("b", (Block(2.0, ("m3", "m5", "m7")),), (Block(5.0, ("m8",)),)),
                       task_resources=Resources.of(cpu=2, mem=1))
    third = reader("c", (Block(1.0, ("m6",)),), submitted=NOW - 30)
    model = quincy(machine_threshold=0.2, rack_threshold=0.2)
    together, _ = network(cell(machines, [small, big, third]), model)
    apart = GraphManager(model, FLOW, move_guard=60.0)
    store = cell(machines, [])
    assert apart.update(store.read_snapshot(), None, NOW).full
    for j in (small, big, third):
        store.submit_job(j)
        # Only the job changed: an update of its own, not a rebuild.
        assert not apart.update(store.read_snapshot(), {(KeyKind.JOB, j.id)}, NOW).full
    assert together.net.canonical() == apart.net.canonical()
    racks = Racks({m.id: m.rack for m in machines})
    for j in (small, big, third):
        for i in range(j.task_count):
            tc = model.task_costs(j, i, racks)
            assert tc is not None
            want = {("M", p.machine) if p.machine else ("R", shape_of(j), p.rack): p.cost
                    for p in tc.preferences}
            got = {together.net.arc(s).head: together.net.arc(s).cost
                   for s in together.net.arcs_of(("W", j.id, i))
                   if together.net.arc(s).kind == ArcKind.PREFERENCE}
            assert got == want, (j.id, i)
            assert want  # every task here prefers somewhere

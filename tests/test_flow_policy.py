"""The flow scheduler as a policy of the runtime, stepped by the testing kit's harness:
tasks that fit nowhere, commits that conflict, bad options, continuous rescheduling
(migrations, the flapping guard, quiet rounds, preemption) and the cost models'
placements."""

from __future__ import annotations

import random
import sys
from typing import Any

import attrs
import pytest

from cellstate.cell import CellSnapshot, task_view
from cellstate.codec import parse_job
from cellstate.errors import StoreError
from cellstate.invariants import placed_tasks_of, violations
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Claim,
    InstanceRecord,
    Job,
    JobState,
    JobStatus,
    ModelError,
    Reason,
    TaskState,
    Transaction,
)
from schedulers.api import CellView, Context
from schedulers.flow import FlowPolicy
from schedulers.flow.costs import CostModelError, make_cost_model
from schedulers.flow.policy import FlowOptionError
from schedulers.options import OptionError
from schedulers.runtime import SchedulerInstance
from schedulers.testing import Harness, JobBuilder, job, machine, make_cell, settled

POLICIES = ["trivial", "load-spread", "quincy", "network"]


def _flow_job(jid: str, tasks: int = 1, cpu: float = 1, **kw: Any) -> Job:
    return job(jid, tasks=tasks, cpu=cpu, scheduler="flow", **kw)


def _moves(h: Harness, inst: SchedulerInstance) -> list[Claim]:
    return [c for r in h.committer(inst).log if r.result is not None
            for c in r.result.committed if c.moves_from]


def _other_scheduler(h: Harness, name: str = "batch") -> None:
    """A scheduler that ran in the cell once (so its jobs are not orphans)."""
    lease = h.admin.register_instance(InstanceRecord(name, "0"), 10)
    h.admin.deregister_instance(name, "0", lease)


def _run_for(h: Harness, seconds: float) -> None:
    end = h.clock.now + seconds
    h.run(lambda s: h.clock.now >= end, max_time=seconds + 10)


# -- tasks that fit nowhere --------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_tasks_that_fit_no_machine_stay_unscheduled_with_a_reason(policy: str) -> None:
    kv = MemoryKV()
    big = JobBuilder("huge").cpu(64).scheduler("flow").build()
    picky = JobBuilder("picky").scheduler("flow").on_machines_with("gpu").build()
    odd = JobBuilder("odd").resource("fpga", 1).scheduler("flow").build()
    fine = _flow_job("fine", tasks=3)
    store = make_cell(kv, [machine(f"m{i}", rack=f"r{i % 2}") for i in range(3)],
                      [big, picky, odd, fine])
    snap = store.read_snapshot()
    pol = FlowPolicy(policy=policy)
    ctx = Context(CellView(snap, "flow"), 1000.0, random.Random(0), "flow", "0")
    plan = pol.schedule_jobs(ctx, [snap.jobs[j] for j in ("huge", "picky", "odd", "fine")])
    assert sorted(c.job for c in plan.claims) == ["fine"] * 3
    why = {u.job: u for u in plan.unplaced}
    assert set(why) == {"huge", "picky", "odd"}
    assert all(u.permanent and u.tasks == 1 for u in why.values())
    assert "each task needs 64 cpu; the largest machine has 4" in why["huge"].reason
    assert "machine selector" in why["picky"].reason
    assert "needs 1 fpga; the largest machine has 0" in why["odd"].reason


@pytest.mark.parametrize("policy", POLICIES)
def test_the_runtime_abandons_what_fits_nowhere_and_places_the_rest(policy: str) -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", rack=f"r{i % 2}") for i in range(3)])
    h.add(FlowPolicy(policy=policy))
    h.submit([JobBuilder("huge").cpu(64).scheduler("flow").build(), _flow_job("fine", 5)])
    h.run(settled)
    snap = h.snapshot()
    assert snap.statuses["huge"].state is JobState.ABANDONED
    assert "each task needs 64 cpu" in snap.statuses["huge"].reason
    assert placed_tasks_of(snap, "fine") == 5 and violations(snap) == []


def test_tasks_that_fit_only_later_wait_with_a_reason_that_is_not_final() -> None:
    store = make_cell(MemoryKV(), [machine("m0", cpu=2)], [_flow_job("big", tasks=3, cpu=2)])
    snap = store.read_snapshot()
    ctx = Context(CellView(snap, "flow"), 1000.0, random.Random(0), "flow", "0")
    plan = FlowPolicy(policy="quincy").schedule_jobs(ctx, [snap.jobs["big"]])
    assert len(plan.claims) == 1
    (u,) = plan.unplaced
    assert u.job == "big" and u.tasks == 2 and not u.permanent
    assert "left 2 task(s) unscheduled" in u.reason


# -- conflicts ----------------------------------------------------------------------------


def test_a_rejected_commit_is_retried_on_fresh_state_and_ends_placed() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}") for i in range(2)])
    inst = h.add(FlowPolicy(policy="load-spread"))
    committer = h.committer(inst)
    committer.reject_next(1)
    h.submit([_flow_job("j", tasks=4)])
    h.run(settled)
    first, *rest = committer.log
    assert first.result is not None and not first.result.committed
    assert len(first.injected) == 4
    assert any(r.result is not None and r.result.committed for r in rest)
    assert placed_tasks_of(h.snapshot(), "j") == 4


def test_a_machine_taken_by_another_scheduler_meanwhile_is_not_taken_twice() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4), machine("m1", cpu=4)])
    _other_scheduler(h)
    inst = h.add(FlowPolicy(policy="load-spread"))
    h.submit([_flow_job("j", cpu=4)])
    h.pump()
    attempt = inst.decide()
    assert not isinstance(attempt, float)
    (claim,) = attempt.plan.claims
    # Between the snapshot and the commit, another scheduler fills that machine.
    h.admin.submit_job(job("hog", cpu=4, scheduler="batch"))
    seq = h.snapshot().machines[claim.machine].seq
    assert h.admin.commit(Transaction("batch", (Claim("hog", 0, claim.machine, seq),))).ok
    results = inst.finish(attempt)
    (rejection,) = results["j"].rejected
    assert rejection.reason is Reason.INSUFFICIENT_RESOURCES
    h.run(settled)
    other = "m1" if claim.machine == "m0" else "m0"
    assert h.machines_of("j") == [other] and violations(h.snapshot()) == []


#: A move out of a machine's second tier (cost 500) into another's first (250) saves
#: 250: with the default ``migrate_cost`` of 250 that is a tie, which a solver may break
#: either way; below it, the move is strictly cheaper.
SPREAD_MOVES = {"migrate_cost": 200}


def test_a_rejected_migration_is_redone_on_fresh_state_without_the_guarded_task() -> None:
    """A migration whose commit is rejected still counts for the flapping guard: the
    next round (on fresh state) spreads the tasks with others than the one it tried."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=8, mem=64)])
    pol = FlowPolicy(policy="load-spread", move_guard=50.0, costs=SPREAD_MOVES)
    inst = h.add(pol)
    h.submit([_flow_job("web", tasks=4)])
    h.run(settled)
    h.committer(inst).reject_next(1)
    h.admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in (1, 2, 3)])
    h.run(lambda s: any(r.migrated for r in pol.rounds), max_time=20)
    last = h.committer(inst).log[-1]
    tried = {c.task for c in last.transaction.claims if c.moves_from}
    assert tried and last.result is not None and not last.result.committed
    h.admin.update_machine("m1", labels={"zone": "a"})  # a change: a new round
    h.run(lambda s: bool(_moves(h, inst)), max_time=20)
    assert not {c.task for c in _moves(h, inst)} & tried
    assert all(task_view(h.snapshot(), t).machine == "m0" for t in tried)


def test_a_round_drops_what_changed_while_it_solved() -> None:
    """Context.latest shows the cell after the solve: a task another instance placed
    meanwhile and a job killed meanwhile are not claimed."""
    store = make_cell(MemoryKV(), [machine(f"m{i}", cpu=8) for i in range(2)],
                      [_flow_job("a", tasks=2), _flow_job("b", tasks=2)])
    snap = store.read_snapshot()
    seq = snap.machines["m0"].seq
    assert store.commit(Transaction("flow", (Claim("a", 0, "m0", seq),))).ok
    store.kill_job(JobStatus("b", JobState.KILLED, "by the test", "test", 1000.0))
    latest = store.read_snapshot()
    ctx = Context(CellView(snap, "flow"), 1000.0, random.Random(0), "flow", "0",
                  latest=lambda: latest)
    pol = FlowPolicy(policy="load-spread")
    plan = pol.schedule_jobs(ctx, [snap.jobs["a"], snap.jobs["b"]])
    assert [c.task for c in plan.claims] == ["a/1"]
    assert pol.rounds[-1].stale == 3 and pol.rounds[-1].placed == 1


# -- options and job fields ----------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"polcy": "quincy"}, "unknown option(s) polcy (known: policy, solver"),
    ({"policy": "firmament"}, "option policy: no cost model named 'firmament' (known: "
                              "load-spread, "),
    ({"policy": ["quincy"]},
     "option policy must name a cost model or a planner, got ['quincy']"),
    ({"policy": 3}, "option policy must name a cost model or a planner, got 3"),
    ({"solver": "cplex"}, "option solver must be one of firmament, networkx, ortools, got 'cplex'"),
    ({"solver": {"name": "ortools"}}, "option solver must be one of"),
    ({"interval": -1}, "option interval must be a number from 0 to 3600, got -1"),
    ({"interval": "fast"}, "option interval must be a number from 0 to 3600, got 'fast'"),
    ({"move_guard": True}, "option move_guard must be a number"),
    ({"preempt_below": -2}, "option preempt_below must be a whole number from 0 to 1000001, "
                            "got -2"),
    ({"preempt_below": 2.5}, "option preempt_below must be a whole number from 0 to"),
    ({"preempt_below": True}, "option preempt_below must be a whole number from 0 to"),
    ({"interval": float("inf")}, "option interval must be a number from 0 to 3600, got inf"),
    ({"costs": "cheap"}, "option costs must be a table (e.g. --option costs.KEY=VALUE), "
                         "got 'cheap'"),
    ({"costs": {"migrate": 1}}, "cost model quincy: unknown option(s) migrate (known: "),
    ({"policy": "trivial", "costs": {"migrate_cost": 1}},
     "cost model trivial: unknown option(s) migrate_cost (known: none)"),
    ({"costs": {"migrate_cost": "lots"}}, "option migrate_cost must be a number, got 'lots'"),
    ({"costs": {"migrate_cost": True}}, "option migrate_cost must be a number, got True"),
    ({"costs": {"migrate_cost": -5}}, "option migrate_cost must be from 0 to 1e9, got -5"),
    ({"costs": {"migrate_cost": float("nan")}}, "option migrate_cost must be from 0 to 1e9"),
    ({"policy": "load-spread", "costs": {"tiers": 0}}, "option tiers must be at least 1"),
])
def test_bad_options_are_refused_naming_what_is_wrong(options: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(FlowOptionError) as e:
        FlowPolicy(**options)
    assert message in str(e.value)
    # The shared checker's error (schedulers/options.py), as the other policies raise.
    assert isinstance(e.value, OptionError)
    assert str(e.value).startswith("flow scheduler: ")


def test_options_from_the_config_file_are_checked_too() -> None:
    """Options of the scheduler's config file (Context.options) are checked as
    constructor options are, unknown ones included."""
    snap = make_cell(MemoryKV(), [machine("m0")], [_flow_job("j")]).read_snapshot()

    def ctx(options: dict[str, Any]) -> Context:
        return Context(CellView(snap, "flow"), 1000.0, random.Random(0), "flow", "0", options)

    with pytest.raises(FlowOptionError, match="unknown option\\(s\\) move_gaurd"):
        FlowPolicy().propose(ctx({"move_gaurd": 5}))
    with pytest.raises(FlowOptionError, match="option solver must be one of"):
        FlowPolicy().propose(ctx({"solver": "gurobi"}))
    # Good ones are used; the constructor's win over the file's.
    pol = FlowPolicy(interval=7)
    plan = pol.propose(ctx({"policy": "trivial", "interval": 3, "costs": {}}))
    assert pol.model is not None and pol.model.name == "trivial"
    assert pol.interval == 7 and len(plan.claims) == 1


def test_the_network_model_needs_a_dimension_name() -> None:
    with pytest.raises(CostModelError, match="option resource must name a resource dimension"):
        make_cost_model("network", resource="")
    with pytest.raises(CostModelError, match="no cost model named 'spread' \\(known: "):
        make_cost_model("spread")


@pytest.mark.parametrize(("field", "message"), [
    ([["m0", 1]], "job.input must be a mapping of machine id to the amount"),
    ("m0", "job.input must be a mapping of machine id"),
    ({"m0": -3}, "job.input.m0 is negative (-3)"),
    ({"m0": "lots"}, "job.input.m0 must be a number, got 'lots'"),
    ({"m0": float("inf")}, "job.input.m0 is infinite"),
    ({"bad name!": 1}, "job.input: machine id 'bad name!' is not a valid name"),
    ({"": 1}, "job.input: machine id '' is not a valid name"),
])
def test_bad_input_locations_are_refused_naming_the_field(field: object, message: str) -> None:
    doc = {"id": "j", "scheduler": "flow", "task_resources": {"cpu": 1}, "input": field}
    with pytest.raises(ModelError) as e:
        parse_job(doc)
    assert message in str(e.value)


def test_the_store_refuses_a_job_with_bad_input_locations() -> None:
    store = make_cell(MemoryKV(), [machine("m0")])
    bad = attrs.evolve(_flow_job("j"), input=(("m0", -1.0),))
    with pytest.raises((ModelError, StoreError), match=r"input\.m0 is negative"):
        store.submit_job(bad)
    good = attrs.evolve(_flow_job("k"), input=(("m0", 2.0), ("m9", 1.0)))
    store.submit_job(good)
    assert store.read_snapshot().jobs["k"].input == (("m0", 2.0), ("m9", 1.0))


# -- continuous rescheduling ------------------------------------------------------------------


def _piled_up(move_guard: float = 30.0) -> tuple[Harness, FlowPolicy, SchedulerInstance]:
    """Four tasks of ``web`` on m0, the only machine; then three more machines come up."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=8, mem=64)])
    pol = FlowPolicy(policy="load-spread", move_guard=move_guard, costs=SPREAD_MOVES)
    inst = h.add(pol)
    h.submit([_flow_job("web", tasks=4)])
    h.run(settled)
    assert h.machines_of("web") == ["m0"] * 4
    h.admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in (1, 2, 3)])
    return h, pol, inst


def test_load_spreading_moves_piled_up_tasks_as_claims_the_store_validates() -> None:
    h, pol, inst = _piled_up()
    h.run(lambda s: max(h.machines_of("web").count(m) for m in ("m0", "m1", "m2", "m3")) <= 2,
          max_time=60)
    moves = _moves(h, inst)
    assert moves and all(c.moves_from == "m0" and c.machine != "m0" for c in moves)
    snap = h.snapshot()
    for c in moves:
        v = task_view(snap, c.task)
        assert v.state is TaskState.RUNNING and v.machine == c.machine
        assert c.task not in snap.machines["m0"].allocations
    assert placed_tasks_of(snap, "web") == 4 and violations(snap) == []
    assert sum(r.migrated for r in pol.rounds) == len(moves)


def test_a_round_with_nothing_changed_commits_nothing() -> None:
    h, pol, inst = _piled_up()
    _run_for(h, 100)  # moves happen and their guards run out
    log = len(h.committer(inst).log)
    rounds = len(pol.rounds)
    _run_for(h, 100)
    assert len(h.committer(inst).log) == log and len(pol.rounds) == rounds
    # A change that moves nothing: a round runs and commits nothing.
    h.admin.update_machine("m3", labels={"zone": "a"})
    _run_for(h, 5)
    assert len(pol.rounds) > rounds and len(h.committer(inst).log) == log


def test_the_flapping_guard_keeps_a_moved_task_in_place_until_it_runs_out() -> None:
    h, pol, inst = _piled_up(move_guard=30.0)
    h.run(lambda s: bool(_moves(h, inst)), max_time=20)
    first = _moves(h, inst)[0]
    moved_at = next(r.at for r in pol.rounds if r.migrated)
    # Another scheduler crowds the machine it moved to: moving on would spread better.
    _other_scheduler(h)
    h.admin.submit_job(job("hog", cpu=6, mem=1, scheduler="batch"))
    seq = h.snapshot().machines[first.machine].seq
    assert h.admin.commit(Transaction("batch", (Claim("hog", 0, first.machine, seq),))).ok
    h.run(lambda s: task_view(s, first.task).machine != first.machine, max_time=100)
    again = [r.at for r in pol.rounds if r.migrated and r.at > moved_at]
    assert again and min(again) >= moved_at + 30.0
    assert first.task in {c.task for c in _moves(h, inst)[1:]}


def test_a_higher_precedence_job_preempts_the_schedulers_own_lower_tasks() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4, mem=64)])
    h.add(FlowPolicy(policy="load-spread"))
    h.submit([_flow_job("low", tasks=4)])
    h.run(settled)
    h.submit([_flow_job("high", cpu=2, precedence=5)])
    h.run(lambda s: placed_tasks_of(s, "high") == 1, max_time=30)
    snap = h.snapshot()
    states = [task_view(snap, f"low/{i}").state for i in range(4)]
    assert states.count(TaskState.PREEMPTED) == 2 and states.count(TaskState.RUNNING) == 2
    assert violations(snap) == []


def _others_below_and_at(preempt_below: int | None) -> tuple[Harness, CellSnapshot]:
    """m0 runs another scheduler's task of precedence 3, m1 one of precedence 1; the
    flow scheduler wants both machines for a job of precedence 5."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4), machine("m1", cpu=4)])
    _other_scheduler(h)
    h.admin.submit_job(job("at", cpu=4, precedence=3, scheduler="batch"))
    h.admin.submit_job(job("below", cpu=4, precedence=1, scheduler="batch"))
    snap = h.snapshot()
    assert h.admin.commit(Transaction("batch", (
        Claim("at", 0, "m0", snap.machines["m0"].seq),
        Claim("below", 0, "m1", snap.machines["m1"].seq)))).ok
    h.add(FlowPolicy(policy="load-spread", preempt_below=preempt_below))
    h.submit([_flow_job("vip", tasks=2, cpu=4, precedence=5)])
    _run_for(h, 30)
    return h, h.snapshot()


def test_preempt_below_preempts_another_schedulers_lower_tasks_only() -> None:
    h, snap = _others_below_and_at(preempt_below=3)
    assert task_view(snap, "below/0").state is TaskState.PREEMPTED
    assert task_view(snap, "at/0").state is TaskState.RUNNING  # at the bound: never
    assert h.machines_of("vip").count("m1") == 1 and placed_tasks_of(snap, "vip") == 1


def test_without_preempt_below_other_schedulers_tasks_are_left_alone() -> None:
    _, snap = _others_below_and_at(preempt_below=None)
    assert task_view(snap, "below/0").state is TaskState.RUNNING
    assert task_view(snap, "at/0").state is TaskState.RUNNING
    assert placed_tasks_of(snap, "vip") == 0


# -- what the cost models prefer ---------------------------------------------------------------


def test_quincy_places_a_job_of_a_shape_that_arrives_later() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", rack=f"r{i % 2}") for i in range(4)])
    h.add(FlowPolicy(policy="quincy"))
    h.submit([_flow_job("first", tasks=2)])
    h.run(settled)
    h.submit([JobBuilder("second").tasks(3).cpu(2).mem(2).scheduler("flow").build()])
    h.run(settled)
    assert placed_tasks_of(h.snapshot(), "second") == 3


def test_quincy_puts_tasks_next_to_their_data() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, rack=f"r{i % 2}") for i in range(6)])
    h.add(FlowPolicy(policy="quincy"))
    h.submit([attrs.evolve(_flow_job("etl", tasks=4), input=(("m3", 90.0), ("m4", 10.0)))])
    h.run(settled)
    assert h.machines_of("etl") == ["m3"] * 4


def test_load_spreading_spreads_a_job_over_the_machines() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, mem=64) for i in range(4)])
    h.add(FlowPolicy(policy="load-spread"))
    h.submit([_flow_job("web", tasks=8)])
    h.run(settled)
    assert sorted(h.machines_of("web")) == sorted(["m0", "m1", "m2", "m3"] * 2)


def test_the_network_model_keeps_tasks_within_each_machines_bandwidth() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=16, mem=64)]
                         + [attrs.evolve(machine(f"n{i}", cpu=16, mem=64), capacity=machine(
                             "x", cpu=16, mem=64).capacity + _net(10)) for i in range(2)])
    h.add(FlowPolicy(policy="network"))
    h.submit([JobBuilder("stream").tasks(6).resource("net", 3).scheduler("flow").build()])
    h.run(settled)
    snap = h.snapshot()
    where = h.machines_of("stream")
    assert "m0" not in where and max(where.count(m) for m in ("n0", "n1")) == 3
    assert placed_tasks_of(snap, "stream") == 6 and violations(snap) == []


def _net(amount: float) -> Any:
    from cellstate.model import Resources
    return Resources.of(net=amount)


def test_the_ortools_solver_without_its_extra_is_refused_when_chosen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """OR-Tools is an extra: choosing it where it is not installed fails at once,
    saying how to install it, not at the first round."""
    monkeypatch.setitem(sys.modules, "ortools.graph.python.min_cost_flow", None)
    with pytest.raises(FlowOptionError, match=r"omega-cell\[ortools\]"):
        FlowPolicy(solver="ortools")

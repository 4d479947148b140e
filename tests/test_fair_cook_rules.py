"""Cook's rules in the fair scheduler, with hand-worked CRS values: the safe threshold,
per-user per-resource shares, quotas, the DRU modes, max-preemption counted in
decisions, and start times read from the cell.

Cells of two machines of 4 cpu and 16 GiB unless a test says otherwise; the real
runtime, store and replica underneath (schedulers.testing)."""

from __future__ import annotations

import random

import attrs
import pytest

from cellstate.invariants import violations
from cellstate.model import (
    CellConfig,
    JobState,
    JobStatus,
    Resources,
    SchedulerLimits,
    TaskState,
    UserQuota,
)
from schedulers.api import CellView, Context
from schedulers.fair import FairPolicy
from schedulers.fair.shares import ShareBook, entitlement
from schedulers.runtime import SchedulerInstance
from schedulers.testing import Harness, JobBuilder, machine
from tests.test_fair_policy import (
    LONG_LEASE,
    evicted,
    fair_job,
    running,
    settle,
    state,
    until_running,
)


def fair_cell(limits: SchedulerLimits | None = None, machines: int = 2, cpu: float = 4,
              **options: object) -> tuple[Harness, SchedulerInstance]:
    h = Harness()
    h.admin.add_machines([machine(f"m{i + 1}", cpu=cpu, mem=16) for i in range(machines)])
    if limits is not None:
        h.admin.set_config(CellConfig({"fair": limits}))
    inst = h.add(FairPolicy(**{"min_runtime": 0.0, "delta": 0.05, **options}),
                 scheduler="fair", config=LONG_LEASE)
    return h, inst


def shares(**by_user: Resources) -> SchedulerLimits:
    return SchedulerLimits(shares=by_user)


# -- the safe threshold -----------------------------------------------------------------


@pytest.mark.parametrize(("safe", "victims"), [(1.0, []), (0.0, ["a/8"])])
def test_a_task_inside_its_owners_share_is_never_a_victim(safe: float,
                                                          victims: list[str]) -> None:
    # Every user is entitled to the whole 10-cpu cell ({cpu = 10}). alice's 9 tasks
    # have CRS 0.1 ... 0.9, dave's one 0.1: the cell is full. bob's task would have
    # CRS 0.1, so alice's tasks from 0.2 on are more than delta above it; but all are
    # below Cook's safe threshold of 1.0: inside her share, none goes. With the
    # threshold at 0, her top task (0.9) goes.
    h, inst = fair_cell(shares(default=Resources.of(cpu=10)), cpu=5, safe_threshold=safe)
    h.submit([fair_job("a", "alice", 9), fair_job("d", "dave", 1)])
    h.run(lambda s: len(running(s, "a")) + len(running(s, "d")) == 10)
    h.submit([fair_job("b", "bob", 1)])
    settle(h)
    assert evicted(h, inst) == victims
    assert (state(h.snapshot(), "b/0") is TaskState.RUNNING) is bool(victims)
    if not victims:
        why = inst.policy.report()
        assert why["preemptions"] == 0
        reason = h.snapshot().statuses.get("b")
        assert reason is None  # it waits (not abandoned)


def test_the_reason_names_the_safe_threshold_with_its_count() -> None:
    from schedulers.fair.policy import FairConfig
    from schedulers.fair.report import share_table

    h, _ = fair_cell(shares(default=Resources.of(cpu=10)), cpu=5)
    h.submit([fair_job("a", "alice", 9), fair_job("d", "dave", 1)])
    h.run(lambda s: len(running(s, "a")) + len(running(s, "d")) == 10)
    h.submit([fair_job("b", "bob", 1)])
    (row,) = [r for r in share_table(h.snapshot(), "fair", FairConfig()) if r.user == "bob"]
    assert row.verdict == "waits"
    # alice's 8 tasks above 0.1 + 0.05 (CRS 0.2 ... 0.9) are each below 1.0.
    assert ("8 are inside their owner's share (CRS below the safe threshold 1)"
            in row.detail), row.detail


# -- per-user, per-resource shares --------------------------------------------------------


def mem_heavy(jid: str, owner: str, tasks: int) -> object:
    return (JobBuilder(jid).scheduler("fair").owner(owner).tasks(tasks).cpu(1).mem(6)
            .build())


@pytest.mark.parametrize(("mem_share", "victim_job"), [(32, "a"), (12, "c")])
def test_a_per_resource_share_changes_who_is_preempted(mem_share: float,
                                                        victim_job: str) -> None:
    # alice runs 5 tasks of 1 cpu and 1 GiB, carol 3 of 1 cpu and 6 GiB: the 8 cpus
    # are taken. Everyone's share is {cpu = 4, mem = mem_share}.
    # mem share 32: alice's top CRS is 5/4 = 1.25, carol's max(3/4, 18/32) = 0.75:
    #   bob's task (CRS 0.25) preempts alice's a/4.
    # mem share 12: carol's top is max(3/4, 18/12) = 1.5, above alice's 1.25: carol's
    #   c/2 goes.
    h, inst = fair_cell(shares(default=Resources.of(cpu=4, mem=mem_share)))
    h.submit([mem_heavy("c", "carol", 3)])  # type: ignore[list-item]
    h.run(lambda s: len(running(s, "c")) == 3)  # first: 6 GiB fit 2 to a machine
    h.submit([fair_job("a", "alice", 5)])
    h.run(lambda s: len(running(s, "a")) == 5)
    h.submit([fair_job("b", "bob", 1)])
    h.run(until_running("b/0"))
    assert evicted(h, inst) == [f"{victim_job}/{4 if victim_job == 'a' else 2}"]


def test_a_users_own_share_overrides_the_default_and_weights_scale_it() -> None:
    book = ShareBook(entitlement(
        Resources.of(cpu=8, mem=32),
        shares(default=Resources.of(cpu=4), alice=Resources.of(cpu=2, mem=4)),
        users=["alice", "bob"], weights={"bob": 2.0}))
    book.add("alice", (0, 0.0, 0.0, "a", 0), "a/0", Resources.of(cpu=1, mem=3))
    book.add("bob", (0, 0.0, 0.0, "b", 0), "b/0", Resources.of(cpu=2, mem=30))
    # alice: max(1/2, 3/4) = 0.75. bob: the default names only cpu (mem is not
    # counted, as a share Cook leaves out is infinite), times his weight 2: 2/8.
    assert book.crs("a/0") == 0.75
    assert book.crs("b/0") == 0.25


def test_without_configured_shares_the_users_with_work_split_the_pool() -> None:
    ent = entitlement(Resources.of(cpu=8, mem=32), None, users=["a", "b", "c", "a"],
                      weights={"c": 2.0})
    assert ent.of("a") == {"cpu": 2.0, "mem": 8.0}  # weight 1 of 4
    assert ent.of("c") == {"cpu": 4.0, "mem": 16.0}


# -- the DRU modes ------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "crs"), [("default", 0.25), ("gpu", 1.0), ("dominant", 1.0)])
def test_the_dru_mode_decides_which_resources_count(mode: str, crs: float) -> None:
    # alice alone: entitled to the whole pool (4 gpu, 8 cpu). Her task takes 2 cpu
    # and all 4 gpus: Cook's default mode leaves GPUs out (2/8), its GPU mode counts
    # only them (4/4), this project's dominant mode every dimension (the largest).
    pool = Resources.of(cpu=8, mem=32, gpu=4)
    book = ShareBook(entitlement(pool, None, ["alice"], mode=mode))
    book.add("alice", (0, 0.0, 0.0, "a", 0), "a/0", Resources.of(cpu=2, mem=1, gpu=4))
    assert book.crs("a/0") == crs


def test_in_gpu_mode_a_user_holding_no_gpu_is_never_above_the_safe_threshold() -> None:
    # Cook's GPU pools rank users by GPUs alone: alice's cpu-only tasks have CRS 0,
    # so in gpu mode bob's cpu task finds no victim; in the default mode it does.
    for mode, preempts in (("gpu", False), ("default", True)):
        h, inst = fair_cell(dru_mode=mode)
        h.submit([fair_job("a", "alice", 8)])
        h.run(lambda s: len(running(s, "a")) == 8)
        h.submit([fair_job("b", "bob", 1)])
        settle(h)
        assert bool(evicted(h, inst)) is preempts, mode


# -- quotas -------------------------------------------------------------------------------


def test_a_quota_stops_placement_and_says_so() -> None:
    h, _ = fair_cell(SchedulerLimits(quotas={"bob": UserQuota(2, Resources())}))
    h.submit([fair_job("b", "bob", 5), fair_job("c", "carol", 3)])
    settle(h)
    snap = h.snapshot()
    assert len(running(snap, "b")) == 2  # his quota, although 3 cpus stay free
    assert len(running(snap, "c")) == 3  # carol has none
    ctx = Context(CellView(snap, "fair"), h.clock.now, random.Random(0), "fair", "t")
    plan = FairPolicy(min_runtime=0.0).schedule_jobs(ctx, [snap.jobs["b"]])
    (u,) = plan.unplaced
    assert plan.claims == () and u.tasks == 3
    assert "bob's quota of 2 running task(s) is reached (2 run)" in u.reason, u.reason


def test_a_cpu_quota_is_a_cap_on_what_the_user_holds() -> None:
    quota = UserQuota(None, Resources.of(cpu=3))
    h, _ = fair_cell(SchedulerLimits(quotas={"default": quota}))
    h.submit([fair_job("b", "bob", 5), fair_job("c", "carol", 5)])
    settle(h)
    snap = h.snapshot()
    assert (len(running(snap, "b")), len(running(snap, "c"))) == (3, 3)


def test_past_its_quota_a_task_preempts_only_its_owners_tasks() -> None:
    # bob may run 4 tasks. His low-priority job holds his 4; alice holds the other 4
    # cpus with 4 tasks (CRS up to 1.0, entitled to half the cell). His high-priority
    # job's task comes first in his order (CRS 1/4): past his quota, it may not take
    # alice's tasks (her 4/4 is at the safe threshold, and above 0.3), only his own
    # low-priority ones: his last, lo/3 (CRS 5/4 once the new one counts before it).
    h, inst = fair_cell(SchedulerLimits(quotas={"bob": UserQuota(4, Resources())}))
    h.submit([fair_job("lo", "bob", 4, priority=0), fair_job("a", "alice", 4)])
    h.run(lambda s: len(running(s, "lo")) + len(running(s, "a")) == 8)
    h.submit([fair_job("hi", "bob", 1, priority=5)])
    h.run(until_running("hi/0"))
    assert evicted(h, inst) == ["lo/3"]
    assert len(running(h.snapshot(), "a")) == 4


def test_quotas_are_never_exceeded_under_a_random_workload() -> None:
    rng = random.Random(30)
    quotas = {"u0": UserQuota(3, Resources()), "u1": UserQuota(None, Resources.of(cpu=4)),
              "default": UserQuota(6, Resources.of(cpu=5))}
    h, inst = fair_cell(SchedulerLimits(quotas=quotas), machines=4)
    live: list[str] = []
    for step in range(120):
        if rng.random() < 0.3:
            owner = f"u{rng.randrange(4)}"
            jid = f"j{step}"
            h.submit([attrs.evolve(fair_job(jid, owner, rng.randint(1, 4),
                                            priority=rng.randrange(2)),
                                   task_resources=Resources.of(cpu=rng.choice([1, 2]),
                                                               mem=1))])
            live.append(jid)
        if live and rng.random() < 0.15:
            gone = live.pop(rng.randrange(len(live)))
            h.admin.kill_job(JobStatus(gone, JobState.KILLED, "done", "test", h.clock()))
        settle(h, rounds=1)
        snap = h.snapshot()
        held: dict[str, list[float]] = {}
        for m in snap.machines.values():
            for a in m.allocations.values():
                held.setdefault(snap.jobs[a.job].owner, []).append(a.resources.get("cpu"))
        for user, cpus in held.items():
            q = quotas.get(user, quotas["default"])
            assert q.count is None or len(cpus) <= q.count, (step, user, cpus)
            cap = q.resources.get("cpu") if "cpu" in dict(q.resources.amounts) else None
            assert cap is None or sum(cpus) <= cap, (step, user, cpus)
        assert violations(snap) == []
    assert inst.policy.report()["placed"] > 20  # the workload did run


# -- max-preemption in decisions -------------------------------------------------------------


def test_the_round_cap_counts_decisions_not_tasks() -> None:
    # bob's task needs 2 cpus on a full cell of alice's 1-cpu tasks: one decision that
    # evicts two of them. A cap of 1 decision per round allows it (Cook's
    # max-preemption); counted in tasks it would not.
    h, inst = fair_cell(max_preemptions_per_round=1)
    h.submit([fair_job("a", "alice", 8)])
    h.run(lambda s: len(running(s, "a")) == 8)
    h.submit([attrs.evolve(fair_job("b", "bob", 1), task_resources=Resources.of(cpu=2, mem=1))])
    settle(h, rounds=1)
    assert sorted(evicted(h, inst)) == ["a/6", "a/7"]
    assert inst.policy.report()["preemptions"] == 1


# -- start times from the cell --------------------------------------------------------------


def test_a_restarted_instance_judges_the_minimum_run_time_by_the_cell() -> None:
    # alice's tasks were placed 100 s before a new instance starts. With start times
    # read from the task records it preempts at once; counting from when it first
    # saw them, it would wait another 60 s.
    h, first = fair_cell(min_runtime=60.0)
    h.submit([fair_job("a", "alice", 8)])
    h.run(lambda s: len(running(s, "a")) == 8)
    placed = h.snapshot().tasks["a/7"].placed_at
    assert placed == pytest.approx(h.clock.now, abs=2.0)
    h.remove(first)
    h.clock.now += 100
    second = h.add(FairPolicy(min_runtime=60.0, delta=0.05), scheduler="fair",
                   config=LONG_LEASE, instance="1")
    h.submit([fair_job("b", "bob", 1)])
    settle(h, rounds=3)
    assert evicted(h, second) == ["a/7"]


def test_a_task_placed_again_is_protected_from_its_new_start() -> None:
    # bob preempts a/7; a/7 runs again once bob's task ends; carol, arriving 10 s
    # later, must not take it: it has run 10 s of its new run, under the minimum of 60.
    h, inst = fair_cell(min_runtime=60.0)
    h.submit([fair_job("a", "alice", 8)])
    h.run(lambda s: len(running(s, "a")) == 8)
    h.clock.now += 100
    h.submit([fair_job("b", "bob", 1)])
    h.run(until_running("b/0"))
    h.admin.kill_job(JobStatus("b", JobState.KILLED, "done", "test", h.clock()))
    h.run(until_running("a/7"))
    h.clock.now += 10
    h.submit([fair_job("c", "carol", 1)])
    settle(h, rounds=20)
    # a/7 is the youngest; a/6 (run 120 s) is the one that may go for carol.
    assert evicted(h, inst) == ["a/7", "a/6"]
    history = [(e.state.value, e.by) for e in h.snapshot().tasks["a/7"].history]
    assert history[-1] == ("running", "fair")

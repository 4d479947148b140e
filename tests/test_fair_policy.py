"""The fair scheduler on small cells with hand-computed shares: whom it preempts and
in what order, the delta boundary, the storm guards (minimum run time, caps per round
and per minute), gangs counted whole, and the store refusing what the scheduler's
precedence does not allow.

The cells have two machines of 4 cpu and 16 GiB (8 cpu in all) and 1-cpu tasks. No
shares are configured, so the users with work split the pool: with two users each is
entitled to 4 cpu, and a user's k-th task has CRS k/4. Cook's safe threshold (1.0)
keeps a user's first 4 tasks from ever being victims. The real runtime, store and
replica run underneath (schedulers.testing)."""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs
import pytest

from cellstate import codec
from cellstate.cell import CellSnapshot, task_view
from cellstate.invariants import violations
from cellstate.model import (
    CellConfig,
    Claim,
    Job,
    Reason,
    Resources,
    SchedulerLimits,
    TaskState,
    Transaction,
)
from schedulers.api import CellView, Context
from schedulers.fair import FairPolicy
from schedulers.fair.policy import FairConfig, FairOptionError
from schedulers.fair.report import share_table
from schedulers.runtime import RuntimeConfig, SchedulerInstance
from schedulers.testing import Harness, JobBuilder, claims, machine, txn

LONG_LEASE = RuntimeConfig(lease_ttl=10**6)  # the clock jumps minutes at once


def fair_job(jid: str, owner: str, tasks: int, *, priority: int = 0, gang: bool = False,
             precedence: int = 0, at: float = 0.0) -> Job:
    b = (JobBuilder(jid).scheduler("fair").owner(owner).tasks(tasks).cpu(1).mem(1)
         .priority(priority).gang(gang).precedence(precedence))
    if at:
        b.submitted_at(at)
    return b.build()


def cell(**options: object) -> tuple[Harness, SchedulerInstance]:
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=4, mem=16), machine("m2", cpu=4, mem=16)])
    opts: dict[str, object] = {"min_runtime": 0.0, **options}
    inst = h.add(FairPolicy(**opts), scheduler="fair", config=LONG_LEASE)
    return h, inst


def state(snap: CellSnapshot, tid: str) -> TaskState:
    return task_view(snap, tid).state


def running(snap: CellSnapshot, jid: str) -> list[str]:
    return [f"{jid}/{i}" for i in range(snap.jobs[jid].task_count)
            if state(snap, f"{jid}/{i}") is TaskState.RUNNING]


def evicted(h: Harness, inst: SchedulerInstance) -> list[str]:
    """Every task the instance's committed claims evicted, in order."""
    return [v for r in Harness.committer(inst).results for v in r.evicted]


def settle(h: Harness, rounds: int = 30, seconds: float = 1.0) -> None:
    """Step the instance through rounds, moving the clock on each time."""
    for _ in range(rounds):
        h.pump()
        for inst in h.instances:
            inst.step()
        h.clock.now += seconds


def fill(h: Harness, owner: str = "alice", jid: str = "a", mem: float = 1) -> None:
    """``owner`` takes the whole cell with one job of 8 tasks."""
    h.submit([attrs.evolve(fair_job(jid, owner, 8),
                           task_resources=Resources.of(cpu=1, mem=mem))])
    h.run(lambda s: len(running(s, jid)) == 8)


def until_running(tid: str) -> Callable[[CellSnapshot], bool]:
    return lambda s: state(s, tid) is TaskState.RUNNING


def test_a_light_user_preempts_the_heaviest_users_least_important_task() -> None:
    h, inst = cell(delta=0.05)
    fill(h)
    h.submit([fair_job("b", "bob", 1)])
    h.run(until_running("b/0"))
    snap = h.snapshot()
    # alice's last task in her own order has the highest CRS (8/4): it goes first.
    assert evicted(h, inst) == ["a/7"]
    assert state(snap, "a/7") is TaskState.PREEMPTED
    # No ping-pong: a/7 waiting again has CRS 2.0, bob's task 1/4 < 2.0 - delta.
    settle(h)
    assert evicted(h, inst) == ["a/7"]
    assert violations(h.snapshot()) == []


def test_victims_go_in_order_of_crs_until_the_shares_are_within_delta() -> None:
    h, inst = cell(delta=0.05)
    fill(h)
    h.submit([fair_job("b", "bob", 5)])
    settle(h, rounds=20)
    snap = h.snapshot()
    # bob's k-th task has CRS k/4; alice's victims 8/4, 7/4, 6/4, 5/4. bob's 5th
    # (5/4 + 0.05) would need a victim above 1.3: alice's top is then 4/4.
    assert evicted(h, inst) == ["a/7", "a/6", "a/5", "a/4"]
    assert len(running(snap, "b")) == 4 and len(running(snap, "a")) == 4
    assert violations(snap) == []


def test_the_users_own_order_decides_which_of_their_tasks_go() -> None:
    h, inst = cell(delta=0.05)
    # alice ranks "late" above "early" although she submitted it later.
    h.submit([fair_job("early", "alice", 4, priority=0, at=10.0),
              fair_job("late", "alice", 4, priority=5, at=20.0)])
    h.run(lambda s: len(running(s, "early")) + len(running(s, "late")) == 8)
    h.submit([fair_job("b", "bob", 1)])
    h.run(until_running("b/0"))
    assert evicted(h, inst) == ["early/3"]


def test_of_equal_priority_the_most_recently_started_task_goes_first() -> None:
    # As Cook orders a user's tasks: by start, not by submission. alice's job "newer"
    # (submitted at 20) starts first, "older" (submitted at 10) 100 s later; ordered
    # by submission, bob's task would take newer/3, which has run longest, and lose
    # the most work.
    h, inst = cell(delta=0.05)
    h.submit([fair_job("newer", "alice", 4, at=20.0)])
    h.run(lambda s: len(running(s, "newer")) == 4)
    settle(h, rounds=2)  # the instance sees newer's tasks run
    h.clock.now += 100
    h.submit([fair_job("older", "alice", 4, at=10.0)])
    h.run(lambda s: len(running(s, "older")) == 4)
    settle(h, rounds=2)
    h.submit([fair_job("b", "bob", 2)])
    h.run(lambda s: len(running(s, "b")) == 2)
    assert evicted(h, inst) == ["older/3", "older/2"]


def test_a_waiting_task_does_not_preempt_its_owners_running_tasks_of_its_priority() -> None:
    # alice's waiting job was submitted before the one that holds the cell, but it
    # comes after every running task of its priority in her order (CRS 9/8: she is
    # the only user with work, entitled to all 8 cpu), so it
    # waits rather than preempting her own work.
    h, inst = cell(delta=0.05)
    h.submit([fair_job("later", "alice", 8, at=20.0)])
    h.run(lambda s: len(running(s, "later")) == 8)
    h.submit([fair_job("earlier", "alice", 2, at=10.0)])
    settle(h)
    assert evicted(h, inst) == []
    assert running(h.snapshot(), "earlier") == []


@pytest.mark.parametrize(("delta", "preempts"), [(1.75, False), (1.74, True)])
def test_equal_crs_plus_delta_does_not_preempt(delta: float, preempts: bool) -> None:
    h, inst = cell(delta=delta)
    fill(h)
    h.submit([fair_job("b", "bob", 1)])
    settle(h)
    # bob's task: CRS 1/4; alice's top: 8/4 = 1/4 + 1.75 exactly.
    assert (state(h.snapshot(), "b/0") is TaskState.RUNNING) is preempts
    assert evicted(h, inst) == (["a/7"] if preempts else [])


def test_weights_change_who_is_over_their_share() -> None:
    # alice at weight 4 and bob at 1 split the 8 cpu 6.4 to 1.6: alice's top task has
    # CRS 8/6.4 = 1.25; bob's first is at 1/1.6 = 0.625, more than delta below, so one
    # preemption; his second at 1.25 is above alice's next (7/6.4 = 1.09).
    h, inst = cell(delta=0.05, weights={"alice": 4})
    fill(h)
    h.submit([fair_job("b", "bob", 3)])
    settle(h)
    assert evicted(h, inst) == ["a/7"]
    assert inst.policy.report()["weight.alice"] == 4


def test_two_resources_combine_by_the_dominant_share() -> None:
    # carol's tasks take 1 cpu but 8 GiB: each is half her entitled 16 GiB, so her k-th
    # task has CRS k/2 where a cpu-bound user's has k/4. Against alice holding all 8
    # cpus: her 1st (0.5) and 2nd (1.0) preempt; her 3rd (1.5 + delta) would need a
    # victim above 1.55 and alice's top is then 6/4. (A 1-cpu, 1-GiB user gets 4: the
    # test above.) alice's tasks need no memory, so each of carol's fits once one goes.
    h, inst = cell(delta=0.05)
    fill(h, mem=0)
    h.submit([JobBuilder("c").scheduler("fair").owner("carol").tasks(3).cpu(1).mem(8)
              .build()])
    settle(h)
    snap = h.snapshot()
    assert len(running(snap, "c")) == 2
    assert evicted(h, inst) == ["a/7", "a/6"] and len(running(snap, "a")) == 6
    assert inst.policy.report()["share.carol"] == 1.0
    assert inst.policy.report()["share.alice"] == 1.5
    assert violations(snap) == []


def test_the_minimum_run_time_protects_young_tasks() -> None:
    h, inst = cell(delta=0.05, min_runtime=60.0)
    fill(h)
    started = h.clock.now
    h.submit([fair_job("b", "bob", 1)])
    settle(h, rounds=20)  # 20 s later: alice's tasks are younger than a minute
    assert state(h.snapshot(), "b/0") is TaskState.PENDING
    assert evicted(h, inst) == []
    h.run(until_running("b/0"))
    assert evicted(h, inst) == ["a/7"]
    assert h.clock.now - started >= 60.0


def test_caps_per_round_and_per_minute() -> None:
    h, inst = cell(delta=0.05, max_preemptions_per_round=2, max_preemptions_per_minute=3)
    fill(h)
    start = h.clock.now
    h.submit([fair_job("b", "bob", 5)])
    settle(h, rounds=1)
    assert len(evicted(h, inst)) == 2  # the round's cap
    settle(h, rounds=30)
    assert len(evicted(h, inst)) == 3  # the minute's cap
    while h.clock.now < start + 62:
        settle(h, rounds=1)
    settle(h, rounds=3)
    assert evicted(h, inst) == ["a/7", "a/6", "a/5", "a/4"]


def solo_then_gang_then_bob(h: Harness) -> None:
    """alice runs "solo" (ranked first) and then the gang "g", 4 tasks each; bob's one
    task then arrives and runs."""
    h.submit([fair_job("solo", "alice", 4, priority=1)])
    h.run(lambda s: len(running(s, "solo")) == 4)
    h.submit([fair_job("g", "alice", 4, gang=True)])
    h.run(lambda s: len(running(s, "g")) == 4)
    h.submit([fair_job("b", "bob", 1)])
    h.run(until_running("b/0"))


def test_a_gang_counts_whole_against_the_cap_and_its_tasks_must_all_qualify() -> None:
    # alice runs "solo" (ranked first) on m1 and the gang "g" on m2: the gang's tasks
    # are her least important, CRS 5/4 to 8/4. Preempting any ends the whole gang,
    # which counts 4 tasks against the per-minute cap; with a cap of 3 the scheduler
    # takes solo/3 (CRS 4/4, at the safe threshold: not below it) instead.
    h, inst = cell(delta=0.05, max_preemptions_per_minute=3)
    solo_then_gang_then_bob(h)
    assert evicted(h, inst) == ["solo/3"]


def test_a_gang_is_preempted_for_whole_when_the_cap_allows() -> None:
    h, inst = cell(delta=0.05)
    solo_then_gang_then_bob(h)
    # The gang's most important task has CRS 5/4, above solo's 4/4: the gang goes,
    # one task evicted, and the round counts 4 tasks of work lost.
    (victim,) = evicted(h, inst)
    assert victim.startswith("g/")
    assert inst.policy.report()["preempted"] == 4


def test_a_waiting_gang_is_placed_whole_or_not_at_all() -> None:
    h, inst = cell(delta=0.05)
    fill(h)
    # bob's gang of 5: its CRS would be 5/4 and alice's victims above 1.3 are only
    # 3 (8/4, 7/4, 6/4 ... once 3 go, her top is 5/4): it cannot fit whole.
    h.submit([fair_job("bg", "bob", 5, gang=True)])
    settle(h)
    snap = h.snapshot()
    assert running(snap, "bg") == [] and evicted(h, inst) == []
    assert len(running(snap, "a")) == 8


def test_other_schedulers_work_is_out_of_reach() -> None:
    # The service scheduler's tasks fill the cell at the fair jobs' precedence: the fair
    # scheduler does not propose evicting them, and its jobs wait with a reason.
    h, inst = cell(delta=0.05)
    svc = JobBuilder("svc").scheduler("service").owner("ops").tasks(8).cpu(1).mem(1).build()
    h.submit([svc])
    h.admin.commit(txn(claims(h.snapshot(), "svc", [(i, f"m{1 + i % 2}") for i in range(8)]),
                       scheduler="service"))
    h.submit([fair_job("b", "bob", 1)])
    settle(h)
    assert state(h.snapshot(), "b/0") is TaskState.PENDING
    assert Harness.committer(inst).transactions == []


def test_the_store_refuses_preempting_above_the_schedulers_precedence() -> None:
    # A fair scheduler limited to precedence 2: the store refuses a job above it, and
    # refuses evicting another scheduler's work of higher precedence.
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=1, mem=16)])
    h.admin.set_config(CellConfig({"fair": SchedulerLimits(max_precedence=2)}))
    svc = JobBuilder("svc").scheduler("service").precedence(5).cpu(1).build()
    h.submit([svc, fair_job("b", "bob", 1, precedence=2),
              fair_job("hi", "bob", 1, precedence=6)])
    h.admin.commit(txn(claims(h.snapshot(), "svc", [(0, "m1")]), scheduler="service"))
    before = h.snapshot()
    seq = before.machines["m1"].seq
    res = h.admin.commit(Transaction("fair", (Claim("b", 0, "m1", seq, ("svc/0",)),)))
    assert res.rejected[0].reason is Reason.PRECEDENCE_TOO_LOW
    res = h.admin.commit(Transaction("fair", (Claim("hi", 0, "m1", seq, ("svc/0",)),)))
    assert res.rejected[0].reason is Reason.LIMIT_EXCEEDED
    assert h.snapshot().revision == before.revision


@pytest.mark.parametrize(("options", "message"), [
    ({"delta": -1}, "option delta must be a number from 0"),
    ({"weights": {"alice": 0}}, "option weights.alice must be a number above 0"),
    ({"weights": 3}, "option weights must be a table"),
    ({"max_preemptions_per_round": 1.5}, "must be a whole number"),
    ({"preempt": "yes"}, "option preempt must be true or false"),
    ({"safe_threshold": -0.5}, "option safe_threshold must be a number from 0"),
    ({"dru_mode": "gpus"}, "option dru_mode must be one of default, gpu, dominant"),
    ({"speed": 1}, "unknown option(s) speed"),
])
def test_bad_options_are_refused_with_what_is_wrong(options: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(FairOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FairPolicy(**options)


def test_without_preemption_it_is_a_fair_queue() -> None:
    h, inst = cell(preempt=False)
    fill(h)
    h.submit([fair_job("b", "bob", 1)])
    settle(h)
    assert state(h.snapshot(), "b/0") is TaskState.PENDING
    assert evicted(h, inst) == []
    # Waiting is not failing: the job is still queued, not abandoned, after many rounds.
    settle(h, rounds=200)
    assert "b" not in h.snapshot().statuses


def test_a_rolled_back_claim_leaves_the_view_as_it_was() -> None:
    h, _ = cell()
    fill(h)
    h.submit([fair_job("b", "bob", 2)])
    view = CellView(h.snapshot(), "fair")
    b = view.jobs["b"]
    before = (view.free("m1"), view.pending_tasks(b), view.claimed("a/7"))
    mark = view.mark()
    victim = next(t for t in view.machine("m1").allocations)  # type: ignore[union-attr]
    view.claim(b, 0, "m1", [victim])
    assert view.pending_tasks(b) == [1] and view.claims
    view.rollback(mark)
    assert (view.free("m1"), view.pending_tasks(b), view.claimed("a/7")) == before
    assert victim in view.machine("m1").allocations  # type: ignore[union-attr]
    assert view.claims == ()


def test_a_resource_limit_is_the_pool_shares_are_taken_of() -> None:
    # The fair scheduler may hold 4 of the cell's 8 cpus: alice gets 4 and the rest of
    # hers wait (room on the machines is no use past the limit); bob's task, at CRS
    # 1/2 (of his 2 cpus, half the pool), preempts alice's top task (4/2) although
    # machines have room.
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=4, mem=16), machine("m2", cpu=4, mem=16)])
    h.admin.set_config(CellConfig({"fair": SchedulerLimits(
        max_resources=Resources.of(cpu=4))}))
    inst = h.add(FairPolicy(min_runtime=0.0, delta=0.05), scheduler="fair",
                 config=LONG_LEASE)
    h.submit([fair_job("a", "alice", 8)])
    settle(h)
    assert running(h.snapshot(), "a") == ["a/0", "a/1", "a/2", "a/3"]
    rejected = [r for res in Harness.committer(inst).results for r in res.rejected]
    assert rejected == []  # it never asked past its limit
    h.submit([fair_job("b", "bob", 1)])
    h.run(until_running("b/0"))
    assert evicted(h, inst) == ["a/3"]
    assert inst.policy.report()["share.bob"] == 0.5
    assert violations(h.snapshot()) == []


def test_a_limit_of_zero_cpu_leaves_the_fair_scheduler_no_cpu() -> None:
    # A cpu limit of 0 is a pool of 0 cpus, not "cpu not limited": nothing runs, and
    # nothing is asked of the store in vain.
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=4, mem=16)])
    h.admin.set_config(codec.parse_config(
        {"limits": {"fair": {"max_resources": {"cpu": 0, "mem": 16}}}}))
    inst = h.add(FairPolicy(min_runtime=0.0, delta=0.05), scheduler="fair",
                 config=LONG_LEASE)
    h.submit([fair_job("a", "alice", 2)])
    settle(h)
    assert running(h.snapshot(), "a") == []
    assert [r for res in Harness.committer(inst).results for r in res.rejected] == []


@pytest.mark.parametrize(("options", "says"), [
    # alice's tasks at 2/4 ... 8/4 are above 1/4 + 0.05; the first two of them are
    # inside her share, the other five too young.
    ({"min_runtime": 60.0}, "no running task above it may go: 2 are inside their owner's "
                            "share (CRS below the safe threshold 1); 5 have run less "
                            "than the minimum run time (60 s)"),
    ({"delta": 1.8}, "no running task's CRS is above that"),
    ({"max_preemptions_per_round": 0},
     "the preemption cap is reached (0 decisions per round)"),
    ({"max_preemptions_per_minute": 0}, "the preemption cap is reached (0 tasks per minute)"),
    ({"preempt": False}, "this fair scheduler does not preempt"),
])
def test_a_waiting_job_says_why(options: dict[str, object], says: str) -> None:
    h, _ = cell()
    fill(h)
    h.submit([fair_job("b", "bob", 1)])
    snap = h.snapshot()
    ctx = Context(CellView(snap, "fair"), h.clock.now, random.Random(0), "fair", "t")
    plan = FairPolicy(**{"min_runtime": 0.0, **options}).schedule_jobs(ctx, [snap.jobs["b"]])
    (u,) = plan.unplaced
    assert plan.claims == () and u.job == "b" and not u.permanent
    assert says in u.reason, u.reason
    # Its CRS would be 1/4 and it could preempt only above 1/4 + delta.
    assert "its CRS would be 0.250" in u.reason or "does not preempt" in u.reason


def test_a_reason_names_the_precedence_that_kept_every_victim_out() -> None:
    """alice's 8 tasks (precedence 1) are all above bob's threshold, but fair
    preemption never takes a task of higher precedence: the reason says so, with the
    count, rather than "no running task's CRS is above that" (issue 30); so does the
    share view (omega shares)."""
    h, _ = cell()
    h.submit([fair_job("a", "alice", 8, precedence=1)])
    h.run(lambda s: len(running(s, "a")) == 8)
    h.submit([fair_job("b", "bob", 1)])
    snap = h.snapshot()
    ctx = Context(CellView(snap, "fair"), h.clock.now, random.Random(0), "fair", "t")
    plan = FairPolicy(min_runtime=0.0, delta=0.05).schedule_jobs(ctx, [snap.jobs["b"]])
    (u,) = plan.unplaced
    assert plan.claims == ()
    assert ("no running task above it may go: 7 task(s) above it have a higher precedence "
            "than this task's (0), which fair preemption never takes") in u.reason, u.reason
    rows = {r.user: r for r in share_table(snap, "fair", FairConfig())}
    assert rows["bob"].verdict == "waits"
    assert ("7 task(s) above it have a higher precedence than this task's (0)"
            in rows["bob"].detail)


def test_a_job_no_machine_could_ever_hold_is_refused_for_good() -> None:
    # "big" (5 cpu a task, machines have 4) can never run: its refusal is permanent.
    # "b2" gets the one free cpu for one of its 3 tasks; the others wait for now.
    h, _ = cell(preempt=False)
    h.submit([fair_job("a", "alice", 7)])
    h.run(lambda s: len(running(s, "a")) == 7)
    h.submit([fair_job("b2", "bob", 3),
              attrs.evolve(fair_job("big", "bob", 2), task_resources=Resources.of(cpu=5, mem=1))])
    snap = h.snapshot()
    ctx = Context(CellView(snap, "fair"), h.clock.now, random.Random(0), "fair", "t")
    plan = FairPolicy(min_runtime=0.0, preempt=False).schedule_jobs(
        ctx, [snap.jobs["b2"], snap.jobs["big"]])
    assert [c.task for c in plan.claims] == ["b2/0"]
    why = {u.job: u for u in plan.unplaced}
    assert why["big"].permanent and "each task needs 5 cpu" in why["big"].reason
    assert why["big"].tasks == 2
    assert not why["b2"].permanent and why["b2"].tasks == 2

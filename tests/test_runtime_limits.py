"""A resource-limited scheduler's jobs wait for its quota; they are neither refused
at commit over and over nor given up on (schedulers/limits.py). A job its limits can
never take is abandoned at once, with the reason."""

from __future__ import annotations

from cellstate.cell import CellSnapshot
from cellstate.invariants import violations
from cellstate.model import (
    CellConfig,
    JobState,
    Reason,
    Resources,
    SchedulerLimits,
    TaskState,
    task_id,
)
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig
from schedulers.testing import job, machine
from schedulers.testing.harness import Harness
from schedulers.why import PendingBook

CPU2 = CellConfig({"batch": SchedulerLimits(max_resources=Resources((("cpu", 2.0),)))})


def _cell(config: CellConfig = CPU2) -> Harness:
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=8, mem=64)])
    h.admin.set_config(config)
    return h


def _states(h: Harness, jid: str) -> list[TaskState]:
    from cellstate.cell import task_view
    snap = h.snapshot()
    return [task_view(snap, task_id(jid, i)).state for i in range(snap.jobs[jid].task_count)]


def _sent_claims(h: Harness) -> int:
    return sum(len(t.claims) for inst in h.instances for t in h.committer(inst).transactions)


def _limit_rejections(h: Harness) -> int:
    return sum(1 for inst in h.instances for r in h.committer(inst).results
               for x in r.rejected if x.reason is Reason.LIMIT_EXCEEDED)


def test_a_job_past_the_quota_waits_and_runs_when_the_quota_frees() -> None:
    h = _cell()
    inst = h.add(BatchPolicy())
    h.submit([job("j1", tasks=3, cpu=1)])
    h.run(lambda s: _states(h, "j1").count(TaskState.RUNNING) == 2)
    # Four hours: far past 100 fruitless attempts (about 48 minutes of retries).
    start = h.clock.now
    h.run(lambda s: h.clock.now - start > 4 * 3600, max_steps=100_000)
    assert "j1" not in h.snapshot().statuses  # not abandoned
    assert _states(h, "j1").count(TaskState.PENDING) == 1
    assert _sent_claims(h) == 2 and _limit_rejections(h) == 0  # nothing sent to be refused
    assert inst.metrics.jobs_held >= 1
    # A task ends: its cpu goes back to the quota and the waiting task runs at once.
    h.admin.release_task(task_id("j1", 0), TaskState.FINISHED, "m1")
    ended = h.clock.now
    h.run(lambda s: _states(h, "j1").count(TaskState.RUNNING) == 2)
    assert h.clock.now - ended < 1.0
    assert _limit_rejections(h) == 0


def test_a_raised_limit_lets_held_jobs_run_at_once() -> None:
    h = _cell()
    h.add(BatchPolicy())
    h.submit([job("j1", tasks=2, cpu=1), job("j2", tasks=2, cpu=1)])
    h.run(lambda s: sum(st is TaskState.RUNNING for st in _states(h, "j1") + _states(h, "j2"))
          == 2)
    start = h.clock.now  # long enough for any retry backoff to reach its 30 s
    h.run(lambda s: h.clock.now - start > 600, max_steps=100_000)
    h.admin.set_config(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 4.0),)))}))
    raised = h.clock.now
    h.run(lambda s: _states(h, "j1") + _states(h, "j2") == [TaskState.RUNNING] * 4)
    assert h.clock.now - raised < 1.0
    assert _limit_rejections(h) == 0


def test_a_job_the_limit_cut_short_runs_at_once_when_the_limit_is_raised() -> None:
    """Raised while the job's other tasks wait out their retry delay (a minute here)
    after the limit kept them out of its plan: they run at once, as held jobs do."""
    h = _cell()
    h.add(BatchPolicy(), config=RuntimeConfig(retry_delay=60.0, max_retry_delay=120.0))
    h.submit([job("j1", tasks=4, cpu=1)])
    h.run(lambda s: _states(h, "j1").count(TaskState.RUNNING) == 2)
    h.admin.set_config(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 4.0),)))}))
    raised = h.clock.now
    h.run(lambda s: _states(h, "j1") == [TaskState.RUNNING] * 4)
    assert h.clock.now - raised < 1.0
    assert _limit_rejections(h) == 0


def test_a_job_the_limit_cut_short_runs_at_once_when_its_own_task_ends() -> None:
    """Within the retry delay, one of the scheduler's tasks ends: the task the limit
    kept out runs at once. (What the scheduler held when the job started waiting counts
    the claims it had just committed, which its copy of the cell did not show yet;
    counted without them, the end of a task would not read as room that grew.)"""
    h = _cell()
    h.add(BatchPolicy(), config=RuntimeConfig(retry_delay=60.0, max_retry_delay=120.0))
    h.submit([job("j1", tasks=3, cpu=1)])
    h.run(lambda s: _states(h, "j1").count(TaskState.RUNNING) == 2)
    h.admin.release_task(task_id("j1", 0), TaskState.FINISHED, "m1")
    ended = h.clock.now
    h.run(lambda s: _states(h, "j1").count(TaskState.RUNNING) == 2
          and _states(h, "j1")[2] is TaskState.RUNNING)
    assert h.clock.now - ended < 1.0
    assert _limit_rejections(h) == 0


def test_claims_past_the_room_left_are_not_sent() -> None:
    h = _cell(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 3.0),)))}))
    inst = h.add(BatchPolicy())
    h.submit([job("j1", tasks=5, cpu=1)])
    h.run(lambda s: _states(h, "j1").count(TaskState.RUNNING) == 3)
    # The policy (which knows nothing of limits) proposed five; three were sent.
    assert _sent_claims(h) == 3 and _limit_rejections(h) == 0
    assert inst.metrics.conflicted == 0


def test_a_gang_waits_whole_for_room_for_all_its_tasks() -> None:
    h = _cell(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 4.0),)))}))
    h.add(BatchPolicy())
    h.submit([job("small", tasks=2, cpu=1)])
    h.run(lambda s: _states(h, "small") == [TaskState.RUNNING] * 2)
    h.submit([job("g", tasks=3, cpu=1, gang=True)])
    start = h.clock.now
    h.run(lambda s: h.clock.now - start > 600, max_steps=100_000)
    assert _states(h, "g") == [TaskState.PENDING] * 3 and "g" not in h.snapshot().statuses
    h.admin.release_task(task_id("small", 0), TaskState.FINISHED, "m1")
    h.run(lambda s: _states(h, "g") == [TaskState.RUNNING] * 3)
    assert _limit_rejections(h) == 0


def _abandoned(jid: str) -> object:
    def done(snap: CellSnapshot) -> bool:
        st = snap.statuses.get(jid)
        return st is not None and st.state is JobState.ABANDONED
    return done


def test_a_job_the_limits_can_never_take_is_abandoned_at_once_with_the_reason() -> None:
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=8, mem=64)])
    # Submitted before the limits were set (the service refuses such a job at submit).
    h.submit([job("big", tasks=1, cpu=3), job("high", tasks=1, cpu=1, precedence=7)])
    h.admin.set_config(CellConfig({"batch": SchedulerLimits(
        max_precedence=4, max_resources=Resources((("cpu", 2.0),)))}))
    h.add(BatchPolicy())
    start = h.clock.now
    h.run(lambda s: all(_abandoned(j)(s) for j in ("big", "high")))  # type: ignore[operator]
    assert h.clock.now - start < 1.0
    statuses = h.snapshot().statuses
    assert statuses["big"].reason == (
        "one task needs 3 cpu, above scheduler 'batch''s limit of 2")
    assert statuses["high"].reason.startswith(
        "precedence 7 is above scheduler 'batch''s limit of 4")
    assert _sent_claims(h) == 0


def test_why_a_held_job_waits_is_recorded() -> None:
    h = _cell()
    book = PendingBook()
    inst = h.add(BatchPolicy())
    inst.pending = book
    h.submit([job("j1", tasks=2, cpu=1), job("j2", tasks=1, cpu=1)])
    start = h.clock.now
    h.run(lambda s: h.clock.now - start > 120, max_steps=100_000)
    puts, _ = book.take(h.snapshot(), inst.still_waiting)
    assert "j2" in puts and b"scheduler 'batch' holds 2 of its limit of 2 cpu" in puts["j2"]


def test_the_fair_policy_divides_its_quota_itself() -> None:
    from schedulers.fair.policy import FairPolicy
    assert FairPolicy.handles_limits and not BatchPolicy.handles_limits


def test_trim_keeps_the_plans_order_and_what_evicts() -> None:
    from cellstate.model import Claim
    from schedulers import limits
    from schedulers.api import Plan
    h = _cell(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 3.0),)))}))
    h.submit([job("a", tasks=3, cpu=2), job("b", tasks=2, cpu=1), job("c", tasks=1, cpu=5)])
    snap = h.snapshot()
    plan = Plan((Claim("a", 0, "m1", 0), Claim("a", 1, "m1", 0),
                 Claim("c", 0, "m1", 0, evict=("x/0",)),
                 Claim("b", 0, "m1", 0), Claim("b", 1, "m1", 0)))
    out = limits.trim(snap, "batch", plan, snap.jobs, Resources())
    # a/0 takes 2 of 3 cpus; a/1 would pass the limit; b/0 fits the last cpu; b/1 not.
    # The evicting claim goes as proposed: what it frees is the store's to count.
    assert [(c.job, c.index) for c in out.claims] == [("a", 0), ("c", 0), ("b", 0)]
    assert [(u.job, u.tasks) for u in out.unplaced] == [("a", 1), ("b", 1)]
    # What is in flight counts as held.
    out = limits.trim(snap, "batch", plan, snap.jobs, Resources((("cpu", 2.0),)))
    assert [(c.job, c.index) for c in out.claims] == [("c", 0), ("b", 0)]
    # No limit, nothing trimmed; a scheduler listed without limits has none.
    assert limits.trim(snap, "other", plan, snap.jobs, Resources()) is plan
    assert not limits.binding(SchedulerLimits()) and not limits.binding(None)
    assert limits.binding(SchedulerLimits(max_precedence=0))


def test_a_held_job_is_counted_and_reported_once_while_it_waits() -> None:
    """Every change of the scheduler's usage looks at its held jobs again; the report
    of why one waits is written once per wait, not at each look."""
    h = _cell()
    book = PendingBook()
    inst = h.add(BatchPolicy())
    inst.pending = book
    h.submit([job("j1", tasks=2, cpu=1), job("j2", tasks=1, cpu=1)])
    h.run(lambda s: _states(h, "j1") == [TaskState.RUNNING] * 2)
    h.clock.now += 5
    h.pump()
    inst.step()
    assert inst.metrics.jobs_held == 1
    book.take(h.snapshot(), inst.still_waiting)
    # A usage change (the limit is raised and lowered again: the counter restarts)
    # makes the held job due again; it is held again without a new report.
    h.admin.set_config(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 2.0),)), max_precedence=9)}))
    h.pump()
    inst.step()
    puts, _ = book.take(h.snapshot(), inst.still_waiting)
    assert puts == {} and inst.metrics.jobs_held == 1
    assert _states(h, "j2") == [TaskState.PENDING]


def test_only_less_held_or_new_limits_let_held_jobs_be_looked_at_again() -> None:
    """The scheduler's own placements move its usage too; they let no held job in, so
    they do not make the held jobs due again (each look costs a check per job)."""
    h = _cell(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources((("cpu", 3.0),)))}))
    inst = h.add(BatchPolicy())
    h.submit([job("j1", tasks=2, cpu=1)])
    h.run(lambda s: _states(h, "j1") == [TaskState.RUNNING] * 2)
    h.submit([job("wide", tasks=1, cpu=2)])  # 2 cpus: 1 left, held
    h.pump()
    inst.step()
    held_until = inst._state("wide").next_try_at
    assert held_until > h.clock.now and _states(h, "wide") == [TaskState.PENDING]
    h.clock.now += 5  # a look now would hold it until a later time
    h.submit([job("small", tasks=1, cpu=1)])  # takes the last cpu: usage grows
    h.run(lambda s: _states(h, "small") == [TaskState.RUNNING])
    h.pump()
    inst.step()
    assert inst._state("wide").next_try_at == held_until  # not looked at again
    # A task of its own ends: less held, the held job is looked at (and fits once two end).
    h.admin.release_task(task_id("j1", 0), TaskState.FINISHED, "m1")
    h.admin.release_task(task_id("j1", 1), TaskState.FINISHED, "m1")
    ended = h.clock.now
    h.run(lambda s: _states(h, "wide") == [TaskState.RUNNING])
    assert h.clock.now - ended < 1.0


def test_an_elastic_scheduler_grows_a_job_only_as_far_as_its_limit() -> None:
    """The MapReduce scheduler's extra workers come from proposals, not from a job's
    attempt: they are kept within the limit as well, none sent to be refused."""
    from schedulers.mapreduce import MapReducePolicy
    from schedulers.testing import JobBuilder
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=8, mem=64)])
    h.admin.set_config(CellConfig({"mapreduce": SchedulerLimits(
        max_resources=Resources((("cpu", 3.0),)))}))
    h.add(MapReducePolicy(interval=1.0))
    h.submit([JobBuilder("mr").scheduler("mapreduce").cpu(1).mem(1)
              .mapreduce(maps=40, map_seconds=60, workers=2, max_workers=6).build()])
    start = h.clock.now
    h.run(lambda s: h.clock.now - start > 30, max_steps=100_000)
    snap = h.snapshot()
    running = [t for t, r in snap.tasks.items() if r.job == "mr" and r.state is TaskState.RUNNING]
    assert len(running) == 3  # two asked for, one extra: the limit's 3 cpus
    assert _limit_rejections(h) == 0


def test_a_flow_scheduler_under_a_limit_places_what_it_allows_and_the_rest_later() -> None:
    """The flow scheduler solves for the whole queue at once; the limit trims its plan
    and it proposes the rest in later rounds, once its tasks end."""
    from schedulers.flow.policy import FlowPolicy
    from schedulers.testing import JobBuilder
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4, mem=16) for i in range(3)])
    h.admin.set_config(CellConfig({"flow": SchedulerLimits(
        max_resources=Resources((("cpu", 3.0),)))}))
    h.add(FlowPolicy(policy="quincy"))
    h.submit([JobBuilder("f").tasks(5).cpu(1).mem(1).scheduler("flow").build()])
    h.run(lambda s: _states(h, "f").count(TaskState.RUNNING) == 3)
    start = h.clock.now
    h.run(lambda s: h.clock.now - start > 120, max_steps=100_000)
    assert _states(h, "f").count(TaskState.RUNNING) == 3 and "f" not in h.snapshot().statuses
    for i, st in enumerate(_states(h, "f")):
        if st is TaskState.RUNNING:
            h.admin.release_task(task_id("f", i), TaskState.FINISHED)
    h.run(lambda s: _states(h, "f").count(TaskState.RUNNING) == 2)
    assert _limit_rejections(h) == 0
    assert violations(h.snapshot()) == []

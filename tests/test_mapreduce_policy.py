"""The mapreduce scheduler on small cells, with hand-computed expectations: what each
policy adds, where workers go when room is short, that growing never over-commits and
retries a lost race on fresh state, and that extra workers are the first to go.

The cells have 1-cpu workers on 4-cpu machines, so counts of workers are counts of
cpus. Map activities last long (10,000 s by default), so that a round's jump of the
virtual clock never finishes a job. The real runtime, store and replica run
underneath (schedulers.testing)."""

from __future__ import annotations

import pytest

from cellstate.cell import CellSnapshot, task_view
from cellstate.invariants import violations
from cellstate.jobinfo import job_summary
from cellstate.model import (
    OPPORTUNISTIC_PRECEDENCE,
    Claim,
    CommitResult,
    Job,
    Reason,
    TaskState,
    Transaction,
)
from schedulers.api import Plan
from schedulers.batch import BatchPolicy
from schedulers.mapreduce import MapReduceOptionError, MapReducePolicy
from schedulers.runtime import Attempt, RuntimeConfig, SchedulerInstance
from schedulers.service import ServicePolicy
from schedulers.testing import Harness, JobBuilder, job, machine

INTERVAL = 1000.0  # rounds only when a test asks for one
LONG_LEASE = RuntimeConfig(lease_ttl=10**6)  # the clock jumps a round's interval at once


def mr(jid: str, maps: int, workers: int, *, map_seconds: float = 1e4, reduces: int = 0,
       reduce_seconds: float = 0.0, max_workers: int | None = None,
       precedence: int = 0) -> Job:
    return (JobBuilder(jid).scheduler("mapreduce").cpu(1).mem(1).precedence(precedence)
            .mapreduce(maps, map_seconds, reduces=reduces, reduce_seconds=reduce_seconds,
                       workers=workers, max_workers=max_workers).build())


def cell(machines: int, **options: object) -> tuple[Harness, SchedulerInstance]:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4, mem=16) for i in range(machines)])
    inst = h.add(MapReducePolicy(interval=INTERVAL, **options), scheduler="mapreduce",
                 config=LONG_LEASE)
    return h, inst


def running(snap: CellSnapshot, jid: str) -> list[int]:
    job_ = snap.jobs[jid]
    return [i for i in range(job_.task_count)
            if task_view(snap, f"{jid}/{i}").state is TaskState.RUNNING]


def place(h: Harness, *jobs: Job) -> None:
    """Submit the jobs and step until each runs the workers it asked for."""
    h.submit(jobs)
    h.run(lambda snap: all(len(running(snap, j.id)) >= (j.mapreduce.workers if j.mapreduce
                                                         else j.task_count) for j in jobs))


def grow(h: Harness, inst: SchedulerInstance) -> tuple[Plan, dict[str, CommitResult]]:
    """One growth round, committed; returns its plan and results."""
    attempt = decide_round(h, inst)
    results = inst.finish(attempt)
    h.pump()
    return attempt.plan, results


def decide_round(h: Harness, inst: SchedulerInstance) -> Attempt:
    h.clock.now += INTERVAL
    h.pump()
    attempt = inst.decide()
    assert isinstance(attempt, Attempt) and attempt.jobs == (), "not a growth round"
    return attempt


def used_cpu(snap: CellSnapshot) -> float:
    return sum(a.resources.get("cpu") for m in snap.machines.values()
               for a in m.allocations.values())


# -- each policy's choice ----------------------------------------------------------------------


def test_max_parallel_adds_workers_while_they_bring_the_finish_forward() -> None:
    h, inst = cell(4)
    place(h, mr("wc", maps=8, workers=2, max_workers=100))
    plan, results = grow(h, inst)
    # 8 maps: with 8 workers every map runs at once; a 9th would not help.
    assert plan.resize == {"wc": 8} and len(results["wc"].committed) == 6
    snap = h.snapshot()
    assert len(running(snap, "wc")) == 8 and snap.jobs["wc"].task_count == 8
    precedence = {a.task: a.precedence for m in snap.machines.values()
                  for a in m.allocations.values()}
    assert precedence == {f"wc/{i}": 0 if i < 2 else OPPORTUNISTIC_PRECEDENCE
                          for i in range(8)}
    report = inst.policy.report()
    assert (report["extra_workers"], report["jobs_grown"], report["last_added"]) == (6, 1, 6)
    # T(2) = 80 s, T(8) = 10 s, seen right at the start of the job: 8x.
    assert report["predicted_speedup_max"] == pytest.approx(4.0)
    plan, results = grow(h, inst)  # nothing more helps
    assert plan.empty and results == {}


def test_relative_size_never_exceeds_four_times_the_workers_asked_for() -> None:
    h, inst = cell(4, policy="relative-size")
    place(h, mr("wc", maps=100, workers=2))
    plan, _ = grow(h, inst)
    assert plan.resize == {"wc": 8}  # 4 x 2, though 14 more would still help
    plan, _ = grow(h, inst)
    assert plan.empty
    assert len(running(h.snapshot(), "wc")) == 8 and used_cpu(h.snapshot()) == 8


def test_relative_size_takes_its_factor_as_an_option() -> None:
    h, inst = cell(4, policy="relative-size", factor=1.5)
    place(h, mr("wc", maps=100, workers=2))
    plan, _ = grow(h, inst)
    assert plan.resize == {"wc": 3}


@pytest.mark.parametrize(("other_cpus", "added"), [
    (8, 0),  # 8 + 2 = 10 of 16 cpus: 62.5%, above the 60% target already
    (6, 1),  # 8 of 16 (50%): one more makes 56.25%, a second 62.5% > 60%
    (0, 7),  # 2 of 16: up to 9 of 16 (56.25%)
])
def test_global_cap_adds_nothing_above_the_target_utilization(other_cpus: int,
                                                             added: int) -> None:
    h, inst = cell(4, policy="global-cap")
    if other_cpus:
        h.submit([job("other", tasks=other_cpus, cpu=1, mem=1, scheduler="batch")])
        res = h.admin.commit(Transaction("batch", tuple(
            Claim("other", i, f"m{i % 4}") for i in range(other_cpus))))
        assert res.ok
    place(h, mr("wc", maps=100, workers=2))
    plan, _ = grow(h, inst)
    assert len(plan.claims) == added
    snap = h.snapshot()
    assert used_cpu(snap) / 16 <= 0.6 or added == 0
    assert inst.policy.report()["utilization"] == pytest.approx((other_cpus + 2 + added) / 16)


def test_global_cap_takes_its_target_as_an_option() -> None:
    h, inst = cell(4, policy="global-cap", target=0.25)
    place(h, mr("wc", maps=100, workers=2))
    plan, _ = grow(h, inst)
    assert len(plan.claims) == 2  # 4 of 16 cpus


def test_workers_go_where_they_bring_a_finish_forward_the_most() -> None:
    # x: 100 maps (1,000,000 worker-s left), y: 10 maps (100,000 worker-s); 12 cpus
    # free. The next worker saves 10^6/(w(w+1)) s of x's time and 10^5/(w(w+1)) s of
    # y's; taken greedily: x to 8, y to 3, x to 11, y to 4, x to 12.
    h, inst = cell(4)
    place(h, mr("x", maps=100, workers=2), mr("y", maps=10, workers=2))
    plan, _ = grow(h, inst)
    assert plan.resize == {"x": 12, "y": 4}
    snap = h.snapshot()
    assert (len(running(snap, "x")), len(running(snap, "y"))) == (12, 4)


def test_a_larger_worker_must_save_more_per_cpu() -> None:
    # Equal work and workers, but a's workers take 2 cpus: per cpu, w's next worker
    # saves twice what a's does at the same count. (Named so that a tie, which the
    # growth heap breaks by job id, would go to a: only the per-cpu gain favours w.)
    h, inst = cell(4)
    a = (JobBuilder("a").scheduler("mapreduce").cpu(2).mem(1)
         .mapreduce(100, 1e4, workers=2).build())
    place(h, mr("w", maps=100, workers=2), a)
    grow(h, inst)
    snap = h.snapshot()
    w_n, a_n = len(running(snap, "w")), len(running(snap, "a"))
    assert w_n + 2 * a_n == 16  # the cell is full
    # Per cpu, w's workers help twice as much: it ends with at least twice a's workers
    # (8 and 4; gains per worker rather than per cpu give 6 and 5).
    assert w_n >= 2 * a_n


# -- growing safely ----------------------------------------------------------------------------


def test_growing_never_over_commits_and_retries_a_lost_race_on_fresh_state() -> None:
    h, inst = cell(2)
    place(h, mr("wc", maps=100, workers=1))
    attempt = decide_round(h, inst)
    targets = {c.machine for c in attempt.plan.claims}
    assert len(attempt.plan.claims) == 7 and targets == {"m0", "m1"}
    # Another scheduler commits first: it takes what is left of one of the machines.
    victim_machine = "m1" if "wc/0" in h.snapshot().machines["m0"].allocations else "m0"
    free = 4 - len(h.snapshot().machines[victim_machine].allocations)
    h.submit([job("rival", tasks=1, cpu=free, mem=1, scheduler="batch")])
    assert h.admin.commit(Transaction("batch", (Claim("rival", 0, victim_machine),))).ok
    results = inst.finish(attempt)
    h.pump()
    res = results["wc"]
    lost = [r for r in res.rejected]
    assert len(res.committed) == 7 - free and len(lost) == free
    assert {r.claim.machine for r in lost} == {victim_machine}
    assert {r.reason for r in lost} == {Reason.INSUFFICIENT_RESOURCES}
    snap = h.snapshot()
    assert violations(snap) == [] and used_cpu(snap) == 8
    # The rival ends; the next round, on fresh state, places the workers that lost.
    h.admin.release_task("rival/0", TaskState.FINISHED)
    plan, results = grow(h, inst)
    assert len(results["wc"].committed) == free and not results["wc"].rejected
    assert plan.resize == {}  # the slots made last round are used, not new ones
    snap = h.snapshot()
    assert len(running(snap, "wc")) == 8 and snap.jobs["wc"].task_count == 8
    assert violations(snap) == []


def test_extra_workers_are_evicted_before_requested_ones() -> None:
    h, inst = cell(2)
    place(h, mr("wc", maps=100, workers=2))
    grow(h, inst)
    snap = h.snapshot()
    assert len(running(snap, "wc")) == 8 and used_cpu(snap) == 8  # the cell is full
    # A service job at a higher precedence needs 3 cpus on one machine: it could evict
    # a requested worker, but three extra workers go instead.
    service = h.add(ServicePolicy())
    h.submit([job("web", tasks=1, cpu=3, mem=1, scheduler="service", precedence=5)])
    h.run(lambda s: task_view(s, "web/0").state is TaskState.RUNNING)
    # A batch job (precedence 0, as the MapReduce job) takes room on loan too.
    batch = h.add(BatchPolicy())
    h.submit([job("etl", tasks=1, cpu=1, mem=1, scheduler="batch")])
    h.run(lambda s: task_view(s, "etl/0").state is TaskState.RUNNING)
    snap = h.snapshot()
    states = {i: task_view(snap, f"wc/{i}").state for i in range(8)}
    assert states[0] is states[1] is TaskState.RUNNING  # what the job asked for stays
    assert sorted(i for i, s in states.items() if s is TaskState.PREEMPTED) == sorted(
        i for i in range(2, 8) if states[i] is not TaskState.RUNNING)
    assert list(states.values()).count(TaskState.PREEMPTED) == 4
    assert violations(snap) == []
    # Evicted extra workers are optional: the job is not queued for them, and many
    # attempts later it is still running, not abandoned for want of room.
    for _ in range(3):
        grow(h, inst)
    assert "wc" not in inst.queued() and "wc" not in h.snapshot().statuses
    assert inst.metrics.jobs_abandoned == 0
    h.remove(service)
    h.remove(batch)


def test_extra_workers_go_even_where_a_requested_one_would_take_fewer_evictions() -> None:
    # m0: big's requested 2-cpu worker and two of small's extra workers; m1: small's
    # requested worker and three extra ones. A 2-cpu service task evicting the fewest
    # tasks would take big's requested worker; two extra workers go instead.
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4, mem=16) for i in range(2)])
    big = (JobBuilder("big").scheduler("mapreduce").cpu(2).mem(1)
           .mapreduce(100, 1e4, workers=1).build())
    small = mr("small", maps=100, workers=1)
    h.submit([big, small])
    h.admin.resize_job("small", 6)
    where = {"big/0": "m0", "small/1": "m0", "small/2": "m0",
             "small/0": "m1", "small/3": "m1", "small/4": "m1", "small/5": "m1"}
    claims = [Claim(t.split("/")[0], int(t.split("/")[1]), m) for t, m in where.items()]
    assert all(h.admin.commit(Transaction("mapreduce", (c,))).ok for c in claims)
    h.add(ServicePolicy())
    h.submit([job("web", tasks=1, cpu=2, mem=1, scheduler="service", precedence=5)])
    h.run(lambda s: task_view(s, "web/0").state is TaskState.RUNNING)
    snap = h.snapshot()
    assert task_view(snap, "big/0").state is TaskState.RUNNING
    assert task_view(snap, "small/0").state is TaskState.RUNNING
    preempted = [t for t in where if task_view(snap, t).state is TaskState.PREEMPTED]
    assert len(preempted) == 2 and all(t.startswith("small/") for t in preempted)
    assert violations(snap) == []


def test_an_evicted_requested_worker_is_placed_again() -> None:
    h, inst = cell(1)
    place(h, mr("wc", maps=100, workers=4))  # the machine is full of requested workers
    service = h.add(ServicePolicy())
    h.submit([job("web", tasks=1, cpu=1, mem=1, scheduler="service", precedence=5)])
    h.run(lambda s: task_view(s, "web/0").state is TaskState.RUNNING)
    snap = h.snapshot()
    assert len(running(snap, "wc")) == 3
    inst.step()  # tries, finds no room
    assert "wc" in inst.queued()  # a worker it asked for waits
    h.admin.release_task("web/0", TaskState.FINISHED)
    h.run(lambda s: len(running(s, "wc")) == 4)
    h.remove(service)


def test_a_job_whose_worker_finished_is_done() -> None:
    h, inst = cell(2)
    place(h, mr("wc", maps=100, workers=2))
    grow(h, inst)
    h.submit([job("web", tasks=1, cpu=4, mem=1, scheduler="service", precedence=5)])
    service = h.add(ServicePolicy())
    h.run(lambda s: task_view(s, "web/0").state is TaskState.RUNNING)
    # The job's work is done: an agent ends its workers (one report each).
    snap = h.snapshot()
    for i in running(snap, "wc"):
        h.admin.release_task(f"wc/{i}", TaskState.FINISHED)
    h.admin.release_task("web/0", TaskState.FINISHED)
    plan, _ = grow(h, inst)
    assert plan.empty  # evicted extra slots stay empty: the work is done
    snap = h.snapshot()
    assert job_summary(snap, snap.jobs["wc"]).state == "finished"
    assert inst.policy.report()["jobs_sped_up"] == 1
    h.remove(service)


def test_several_instances_grow_each_job_once() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4, mem=16) for i in range(4)])
    a = h.add(MapReducePolicy(interval=INTERVAL), instance="a", scheduler="mapreduce",
              config=LONG_LEASE)
    b = h.add(MapReducePolicy(interval=INTERVAL), instance="b", scheduler="mapreduce",
              config=LONG_LEASE)
    jobs = [mr(f"j{i}", maps=100, workers=1) for i in range(4)]
    place(h, *jobs)
    plans = [grow(h, inst)[0] for inst in (a, b)]
    grown = [set(p.resize) for p in plans]
    assert not grown[0] & grown[1]  # each job has one owner
    assert violations(h.snapshot()) == [] and used_cpu(h.snapshot()) == 16


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"policy": "fastest"}, "option policy must be one of max-parallel, global-cap, "
                            "relative-size, got 'fastest'"),
    ({"interval": 0}, "option interval must be a number from 0.01 to 3600, got 0"),
    ({"target": 1.5}, "option target must be a number from 0 to 1, got 1.5"),
    ({"factor": "four"}, "option factor must be a number from 1 to 1e+06, got 'four'"),
    ({"target": True}, "option target must be a number"),
    ({"speed": 1}, "unknown option(s) speed (known: policy, interval, target, factor)"),
])
def test_bad_options_are_refused_at_construction(options: dict[str, object],
                                                 message: str) -> None:
    with pytest.raises(MapReduceOptionError) as e:
        MapReducePolicy(**options)
    assert message in str(e.value)


def test_interval_sets_how_often_it_grows() -> None:
    assert MapReducePolicy(interval=2.5).propose_interval == 2.5
    assert MapReducePolicy().propose_interval == 5.0


def test_a_job_without_a_mapreduce_table_is_placed_whole() -> None:
    h, inst = cell(1)
    h.submit([job("plain", tasks=3, scheduler="mapreduce")])
    h.run(lambda s: len(running(s, "plain")) == 3)
    plan, _ = grow(h, inst)
    assert plan.empty

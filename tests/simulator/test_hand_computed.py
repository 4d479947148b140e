"""Small runs whose every time and count is worked out by hand in the docstrings.

Decision times are fixed (t_task = 0), retries come 1 s after an attempt ends, and
tasks run for the trace's duration from the moment their claim commits."""

from __future__ import annotations

from pathlib import Path

from cellstate.model import Detection, TxnMode
from simulator.config import Architecture
from tests.simulator.helpers import job, sched, simulate


def test_queueing_behind_a_busy_scheduler(tmp_path: Path) -> None:
    """One monolithic scheduler, t_job = 10 s. Job a arrives at 0 and is decided
    from 0 to 10; job b arrives at 1 and waits until the scheduler is free at 10
    (wait 9), then is decided from 10 to 20. Busy 20 s of 100."""
    sim, r = simulate(tmp_path, Architecture.MONOLITHIC,
                      (sched("mono", 10.0, ("batch", "service")),),
                      [job(0.0, "batch"), job(1.0, "batch")])
    assert sorted(sim.recorder.waits["batch"]) == [0.0, 9.0]
    assert r["batch_wait_mean_s"] == 4.5
    assert r["mono_busyness"] == 0.2
    assert r["mono_attempts"] == 2
    assert r["mono_successful"] == 2
    assert r["mono_conflict_fraction"] == 0.0
    # Placed at 10 and 20, each task running 100 s: both still run at the end.
    assert sim.cell.used("cpu") == 2.0


def test_multi_path_does_not_queue_batch_behind_service(tmp_path: Path) -> None:
    """Single scheduler, service decisions 10 s, batch 1 s (multi-path): a service
    job at 0 still blocks a batch job at 1 until 10 (head-of-line blocking); the
    batch job is then decided 10..11. Busy 11 s."""
    from cellstate.model import JobKind
    from simulator.config import DecisionTime, SchedulerSpec

    spec = SchedulerSpec("mono", ("batch", "service"),
                         decision={JobKind.SERVICE: DecisionTime(10.0, 0.0),
                                   JobKind.BATCH: DecisionTime(1.0, 0.0)})
    sim, r = simulate(tmp_path, Architecture.MONOLITHIC, (spec,),
                      [job(0.0, "service"), job(1.0, "batch")])
    assert sim.recorder.waits == {"service": [0.0], "batch": [9.0]}
    assert r["mono_busyness"] == 0.11


def test_conflict_between_two_schedulers_on_one_machine(tmp_path: Path) -> None:
    """One machine with 1 CPU. Both schedulers snapshot it free at 0. Service
    (t_job 2) commits at 2; its task runs until 22. Batch (t_job 5) commits at 5 and
    conflicts (no room left). Batch retries at 6 and 12 and 18 (each attempt lasts
    5 s and places nothing: the machine is busy until 22), then at 24 it fits and
    commits at 29. Batch: 5 attempts, 2 transactions, 1 conflicted, 1 successful,
    busy 25 s of 100, of which 5 s wasted."""
    sim, r = simulate(tmp_path, Architecture.SHARED,
                      (sched("batch", 5.0), sched("service", 2.0)),
                      [job(0.0, "batch"), job(0.0, "service", duration=20.0)], cpu=1.0)
    assert r["batch_attempts"] == 5
    assert r["batch_transactions"] == 2
    assert r["batch_conflicted"] == 1
    assert r["batch_successful"] == 1
    assert r["batch_conflict_fraction"] == 1.0
    assert r["batch_busyness"] == 0.25
    assert r["batch_busyness_wasted"] == 0.05
    assert r["service_busyness"] == 0.02
    assert r["service_conflicted"] == 0
    assert r["batch_wait_mean_s"] == 0.0
    util = dict((t, cpu) for t, cpu, _ in sim.recorder.utilization)
    assert util[1.0] == 0.0 and util[2.0] == 1.0 and util[22.0] == 0.0
    assert util[28.0] == 0.0 and util[29.0] == 1.0


def test_coarse_detection_conflicts_where_fine_does_not(tmp_path: Path) -> None:
    """The same two jobs on a machine with room for both. Fine detection: both
    commit (service at 2, batch at 5), no conflict. Coarse: the service commit at 2
    changed the machine's sequence number, so the batch claim conflicts at 5; the
    retry at 6 commits at 11."""
    jobs = [job(0.0, "batch"), job(0.0, "service")]
    _, fine = simulate(tmp_path, Architecture.SHARED,
                       (sched("batch", 5.0), sched("service", 2.0)), jobs, cpu=2.0)
    assert (fine["batch_conflicted"], fine["batch_successful"]) == (0, 1)
    coarse_specs = (sched("batch", 5.0, detection=Detection.COARSE),
                    sched("service", 2.0, detection=Detection.COARSE))
    sim, coarse = simulate(tmp_path, Architecture.SHARED, coarse_specs, jobs, cpu=2.0)
    assert (coarse["batch_conflicted"], coarse["batch_successful"]) == (1, 1)
    assert coarse["batch_busyness"] == 0.10
    util = dict((t, cpu) for t, cpu, _ in sim.recorder.utilization)
    assert util[10.0] == 0.5 and util[11.0] == 1.0


def test_gang_rolled_back(tmp_path: Path) -> None:
    """Two 1-CPU machines. The batch scheduler commits all-or-nothing. At 0 it sees
    both machines free and claims both for its 2-task job; service (t_job 1) takes
    one machine at 1 (until 11). The gang commit at 3 conflicts on that machine, so
    nothing of it is applied: one task runs (service's), not three. Retry 4..7 places
    one task (a gang of one claim), retry 8..11 finds no room, retry 12..15 places
    the last task once the service task ended at 11. Batch: 4 attempts, 3
    transactions, 1 conflicted, 2 successful."""
    sim, r = simulate(tmp_path, Architecture.SHARED,
                      (sched("batch", 3.0, mode=TxnMode.GANG), sched("service", 1.0)),
                      [job(0.0, "batch", tasks=2), job(0.0, "service", duration=10.0)],
                      machines=2, cpu=1.0)
    assert r["batch_attempts"] == 4
    assert r["batch_transactions"] == 3
    assert (r["batch_conflicted"], r["batch_successful"]) == (1, 2)
    assert r["batch_conflict_fraction"] == 0.5
    assert r["batch_tasks_placed"] == 2
    util = dict((t, cpu) for t, cpu, _ in sim.recorder.utilization)
    assert util[3.0] == 0.5  # the gang left nothing behind
    assert util[7.0] == 1.0 and util[11.0] == 0.5 and util[15.0] == 1.0


def test_two_level_offer_locks_resources(tmp_path: Path) -> None:
    """Two-level, one machine of 4 CPUs, offer rounds every 1 s at no cost. Service
    asks at 0 and is offered all 4 free CPUs at 0; it decides for 10 s. The batch job
    arriving at 0.5 waits: the rounds at 1..9 have nothing to offer (everything is
    locked). At 10 service commits one task and returns the other 3 CPUs; in the
    round at 10 both frameworks wait and batch has the smaller dominant share (0
    against service's 1/4 CPU), so batch is offered the 3 CPUs, decides 10..11 and
    commits. Batch waited 9.5 s; one attempt each."""
    from simulator.config import TwoLevelSpec

    sim, r = simulate(tmp_path, Architecture.TWO_LEVEL,
                      (sched("batch", 1.0), sched("service", 10.0)),
                      [job(0.0, "service"), job(0.5, "batch")], horizon=20.0,
                      two_level=TwoLevelSpec(offer_interval=1.0, offer_cost=0.0))
    assert sim.recorder.waits == {"service": [0.0], "batch": [9.5]}
    assert (r["batch_attempts"], r["service_attempts"]) == (1, 1)
    assert r["batch_tasks_placed"] == 1
    assert r["batch_busyness"] == 0.05 and r["service_busyness"] == 0.5
    assert r["batch_conflicted"] == 0 and r["service_conflicted"] == 0
    util = dict((t, cpu) for t, cpu, _ in sim.recorder.utilization)
    assert util[9.0] == 0.0 and util[10.0] == 0.25 and util[11.0] == 0.5


def test_two_level_framework_sees_only_its_offer(tmp_path: Path) -> None:
    """Two machines of 2 CPUs. A service task of 1 CPU runs from 0 (t_job 0; offered
    at 0, committed at 0). The batch job at 0.5 asks; at 1 it is offered the 3 free
    CPUs (1 + 2) and places its 3 tasks there, in one attempt; a 4th task has no room
    in the offer and waits for the service task to end at 100."""
    from simulator.config import TwoLevelSpec

    _, r = simulate(tmp_path, Architecture.TWO_LEVEL,
                    (sched("batch", 1.0), sched("service", 0.0)),
                    [job(0.0, "service", duration=99.0), job(0.5, "batch", tasks=4)],
                    machines=2, cpu=2.0, horizon=60.0,
                    two_level=TwoLevelSpec(offer_interval=1.0, offer_cost=0.0))
    assert r["batch_tasks_placed"] == 3
    assert r["batch_unscheduled"] == 1
    assert r["batch_wait_mean_s"] == 0.5


def test_abandoned_after_fruitless_attempts(tmp_path: Path) -> None:
    """A task bigger than what is free (but not than the machine) is retried every
    1 s after 1 s attempts; after 100 attempts that placed nothing it is abandoned."""
    from simulator.config import RetrySpec

    _, r = simulate(tmp_path, Architecture.SHARED,
                    (sched("batch", 1.0), sched("service", 1.0)),
                    [job(0.0, "service", cpu=3.0, duration=1000.0),
                     job(0.5, "batch", cpu=2.0)], horizon=300.0,
                    retry=RetrySpec(max_fruitless=100))
    assert r["batch_attempts"] == 100
    assert r["batch_abandoned"] == 1
    assert r["batch_unscheduled"] == 0

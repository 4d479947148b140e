"""Machine failures in the simulator (``[failures]``): a failed machine loses its running
tasks, which their scheduler places again; it comes back after its repair time. The
first tests are worked out by hand (decision times 0, retries every second)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cellstate.model import JobKind, MachineState, TaskState
from simulator.config import (
    Architecture,
    CellSpec,
    DecisionTime,
    FailureSpec,
    SchedulerSpec,
    SimConfig,
)
from simulator.engine import SAMPLE
from simulator.experiment import load
from simulator.sim import Simulation
from simulator.workload import Distribution, InputError, JobClass, MapReduceClass, Prefill

ROOT = Path(__file__).resolve().parents[2]
F = Distribution.fixed
ZERO = DecisionTime(0.0, 0.0)
# The hand-worked runs: one job at t = 10 (from a trace), one task of 1 cpu running
# 100 s, on a machine of 4 cpus.
ONE_JOB = '{"submit": 10, "class": "batch", "tasks": 1, "duration": 100, "cpu": 1, "mem": 2}\n'
BATCH = JobClass("batch", JobKind.BATCH, F(10.0), F(1.0), F(100.0), cpu=F(1.0))


def run(arch: Architecture, failures: FailureSpec, machines: int = 1, rack_size: int = 40,
        classes: tuple[JobClass, ...] = (BATCH,), horizon: float = 300.0,
        trace: Path | None = None,
        probe: tuple[tuple[float, Callable[[Simulation], None]], ...] = ()
        ) -> tuple[Simulation, dict[str, Any]]:
    config = SimConfig(arch, (SchedulerSpec("batch", ("batch",), default=ZERO),),
                       classes, CellSpec(machines, 4.0, 16.0, rack_size), prefill=None,
                       horizon=horizon, day=horizon, sample_interval=1.0,
                       trace=str(trace) if trace else None, failures=failures)
    sim = Simulation(config)
    for at, look in probe:
        sim.loop.at(at, SAMPLE, lambda look=look: look(sim))  # type: ignore[misc]
    return sim, sim.run()


@pytest.fixture
def one_job(tmp_path: Path) -> Path:
    trace = tmp_path / "one.jsonl"
    trace.write_text(ONE_JOB)
    return trace


def test_a_task_lost_to_a_failure_runs_again_after_the_repair(one_job: Path) -> None:
    """Placed at 10 on the only machine, which fails at 30 (20 cpu-seconds lost) and is
    down for 20 s: the scheduler retries every second until the machine is back at 50,
    places the task again, and it runs its whole 100 s from there, to 150."""
    sim, r = run(Architecture.SHARED, FailureSpec(at=((30.0, "m00000"),), repair=F(20.0)),
                 trace=one_job)
    assert r["machine_failures"] == 1 and r["runs_lost_to_failures"] == 1
    assert r["cpu_hours_lost_to_failures"] == pytest.approx(20 / 3600)
    util = {t: cpu for t, cpu, _ in sim.recorder.utilization}
    assert util[29.0] == 0.25 and util[30.0] == 0.0 and util[49.0] == 0.0
    assert util[50.0] == 0.25 and util[149.0] == 0.25 and util[150.0] == 0.0
    snap = sim.cell.snapshot()
    assert snap.machines["m00000"].state is MachineState.UP
    assert not snap.jobs  # the job ended and was forgotten
    assert r["batch_unscheduled"] == 0


def test_under_two_level_the_down_machine_is_not_offered(one_job: Path) -> None:
    """The same under two-level scheduling: while the machine is down the allocator has
    nothing to offer, and the task runs again once it is back."""
    offers: list[int] = []

    def look(sim: Simulation) -> None:
        assert sim.allocator is not None
        offers.append(sim.allocator.offers_made)

    sim, r = run(Architecture.TWO_LEVEL,
                 FailureSpec(at=((30.0, "m00000"),), repair=F(20.0)), trace=one_job,
                 probe=((31.0, look), (49.0, look)))
    assert offers[0] == offers[1]  # down from 30 to 50: no offer went out
    assert r["machine_failures"] == 1 and r["runs_lost_to_failures"] == 1
    util = {t: cpu for t, cpu, _ in sim.recorder.utilization}
    assert util[30.0] == 0.0 and util[49.0] == 0.0
    assert util[52.0] == 0.25 and util[148.0] == 0.25 and util[160.0] == 0.0


def test_a_failure_of_an_idle_or_down_machine_loses_nothing(one_job: Path) -> None:
    sim, r = run(Architecture.SHARED, FailureSpec(
        at=((5.0, "m00000"), (6.0, "m00000")), repair=F(2.0)), trace=one_job)
    # Down from 5 to 7 (the second failure finds it down); the job arrives at 10.
    assert r["machine_failures"] == 1 and r["runs_lost_to_failures"] == 0
    util = {t: cpu for t, cpu, _ in sim.recorder.utilization}
    assert util[10.0] == 0.25 and util[109.0] == 0.25 and util[110.0] == 0.0


def assert_running_counts_match(sim: Simulation) -> int:
    """The simulation's own count of running tasks per job is what the cell holds, and
    every running task is on a machine that is up. Returns the tasks running."""
    snap = sim.cell.snapshot()
    running: dict[str, int] = {}
    for t in snap.tasks.values():
        if t.state is TaskState.RUNNING:
            running[t.job] = running.get(t.job, 0) + 1
            assert snap.machines[t.machine].state is MachineState.UP
    assert {j: n for j, n in sim._running.items() if n} == running
    return sum(running.values())


BUSY = JobClass("batch", JobKind.BATCH, Distribution.exponential(4.0),
                Distribution.exponential(5.0), Distribution.exponential(60.0),
                cpu=F(1.0), mem=F(1.0))


@pytest.mark.parametrize("arch", [Architecture.SHARED, Architecture.TWO_LEVEL,
                                  Architecture.MONOLITHIC])
def test_random_failures_lose_no_task_and_count_what_runs(arch: Architecture) -> None:
    """Machines failing at random (mean 300 s each, 20 machines) in a busy cell: tasks
    are lost and placed again, and at every failure and at the end the simulation's
    own count of running tasks per job is what the cell holds (the cell itself is
    checked for over-commit and double placement after the test)."""
    sim, r = run(arch, FailureSpec(mtbf=300.0, repair=Distribution.exponential(30.0)),
                 machines=20, classes=(BUSY,), horizon=600.0)
    assert r["machine_failures"] > 5 and r["runs_lost_to_failures"] > 0
    assert_running_counts_match(sim)


def test_a_rack_fails_and_comes_back_as_one(one_job: Path) -> None:
    """Scope rack: the failure listed for m00041 takes its whole rack (m00040 to m00079,
    40 to a rack) down at once, and the repair brings all of it back together; the
    other rack runs on."""
    states: list[tuple[int, int]] = []

    def look(sim: Simulation) -> None:
        machines = sim.cell.snapshot().machines.values()
        down = [m.id for m in machines if m.state is MachineState.DOWN]
        states.append((len(down), len({d for d in down if "m00040" <= d <= "m00079"})))

    _, r = run(Architecture.SHARED,
                 FailureSpec(at=((30.0, "m00041"),), repair=F(20.0), scope="rack"),
                 machines=80, trace=one_job, probe=((29.0, look), (31.0, look), (51.0, look)))
    assert states == [(0, 0), (40, 40), (0, 0)]
    assert r["failures"] == 1 and r["machine_failures"] == 40


def test_random_failures_of_failure_domains() -> None:
    """Scope failure_domain (ten racks of 5 here: 50 machines, 2 in the cell): each
    event takes every machine of one domain not already down."""
    _, r = run(Architecture.SHARED,
                 FailureSpec(mtbf=200.0, repair=F(100.0), scope="failure_domain"),
                 machines=100, rack_size=5, classes=(BUSY,), horizon=600.0)
    assert r["failures"] >= 1
    assert r["machine_failures"] % 50 == 0 and r["machine_failures"] >= 50


FAILURES = """
name = "failing"
architecture = "shared"
horizon = 100.0
[cell]
machines = 3
[[workload]]
name = "batch"
interarrival = 10.0
tasks = 1
duration = 5.0
[[scheduler]]
name = "batch"
serves = ["batch"]
[failures]
{failures}
"""


def test_the_failures_table_loads(tmp_path: Path) -> None:
    exp = tmp_path / "f.toml"
    exp.write_text(FAILURES.format(failures='mtbf = 3600\nrepair = {dist = "exponential", '
                                            'mean = 120}\nat = [[50, "m00002"], [20, "m00001"]]'))
    (run_,) = load(exp).runs
    f = run_.config.failures
    assert f is not None and f.mtbf == 3600 and f.repair == Distribution.exponential(120)
    assert f.at == ((20.0, "m00001"), (50.0, "m00002"))
    r = Simulation(run_.config).run()
    assert r["machine_failures"] >= 2


def test_a_failures_table_with_mtbf_0_is_the_baseline_of_a_sweep(tmp_path: Path) -> None:
    exp = tmp_path / "f.toml"
    exp.write_text(FAILURES.format(failures="mtbf = 0"))
    (run_,) = load(exp).runs
    r = Simulation(run_.config).run()
    assert r["machine_failures"] == 0 and r["runs_lost_to_failures"] == 0
    assert r["batch_jobs"] > 0


@pytest.mark.parametrize(("failures", "expected"), [
    ("mtbf = -1", "field 'failures.mtbf': must be"),
    ('mtbf = 10\nscope = "zone"', "field 'failures.scope': str 'zone' is not one of machine, rack, "
                                  "failure_domain"),
    ("mtbf = 10\nbreaks = 3", "field 'failures.breaks': unknown field"),
    ("mtbf = 10\nrepair = 0", "field 'failures.repair': a machine is down for some time"),
    ('at = [[10, "m00003"]]', "field 'failures.at.0.1': 'm00003' is not a machine of the "
                              "cell \\(m00000 to m00002\\)"),
    ('at = [[10, "web-1"]]', "field 'failures.at.0.1': 'web-1' is not a machine"),
    ('at = [10]', "field 'failures.at.0': must be a pair \\[seconds, machine id\\]"),
    ('at = [["soon", "m00001"]]', "field 'failures.at.0.0': must be a number"),
])
def test_a_bad_failures_table_is_named(tmp_path: Path, failures: str, expected: str) -> None:
    exp = tmp_path / "f.toml"
    exp.write_text(FAILURES.format(failures=failures))
    with pytest.raises(InputError, match=expected):
        load(exp)


# Half as busy: the policies below decide with their real cost.
LIGHT = JobClass("batch", JobKind.BATCH, Distribution.exponential(8.0),
                 Distribution.exponential(5.0), Distribution.exponential(60.0),
                 cpu=F(1.0), mem=F(1.0))
MR = JobClass("mr", JobKind.MAPREDUCE, Distribution.exponential(30.0), F(2.0), F(0.0),
              cpu=F(1.0), mem=F(1.0),
              mapreduce=MapReduceClass(F(6.0), F(1.0), F(20.0), F(10.0)))


@pytest.mark.parametrize(("policy", "options", "classes"), [
    ("service", {}, (LIGHT,)),
    ("flow", {}, (LIGHT,)),
    ("fair", {}, (LIGHT,)),
    ("mapreduce", {"interval": 5.0}, (MR,)),
])
def test_every_policy_places_lost_tasks_again(policy: str, options: dict[str, object],
                                              classes: tuple[JobClass, ...]) -> None:
    """Each scheduler of the platform meets machines going down under it (its tasks
    lost, the machine unusable until repaired) and keeps the simulation's count of
    running tasks equal to the cell's."""
    served = tuple(c.name for c in classes)
    config = SimConfig(Architecture.SHARED,
                       (SchedulerSpec(policy, served, policy=policy, default=ZERO,
                                      options=options),),
                       classes, CellSpec(20, 4.0, 16.0), prefill=None, horizon=400.0,
                       day=400.0, sample_interval=10.0,
                       failures=FailureSpec(mtbf=300.0, repair=Distribution.exponential(30.0)))
    sim = Simulation(config)
    r = sim.run()
    assert r["machine_failures"] > 5 and r["runs_lost_to_failures"] > 0
    assert assert_running_counts_match(sim) > 0  # still scheduling after dozens of failures


def test_placing_lost_prefill_tasks_again_is_no_wait_of_a_measured_job() -> None:
    """The prefill's jobs (placed at time 0, owned by the service scheduler here) are not
    measured: when a failure at 300 s loses some of their tasks and the scheduler places
    them again, that attempt is not their first one ending a 300 s wait. The service
    jobs arriving every 20 s each wait at most for those few attempts."""
    svc = JobClass("service", JobKind.SERVICE, F(20.0), F(10.0), F(500.0))
    config = SimConfig(
        Architecture.SHARED,
        (SchedulerSpec("service", ("service",), default=DecisionTime(0.1, 0.005)),),
        (svc,), CellSpec(200, 4.0, 16.0), prefill=Prefill(0.6, 100, 1.0, 2.0, None, "service"),
        horizon=1000.0, day=1000.0, sample_interval=60.0,
        failures=FailureSpec(at=((300.0, "m00001"),), repair=F(600.0)))
    sim = Simulation(config)
    r = sim.run()
    assert r["runs_lost_to_failures"] > 0 and r["service_jobs"] == 50
    waits = sim.recorder.waits["service"]
    assert len(waits) == 50 and max(waits) < 1.0


@pytest.mark.parametrize("name", ["failures_shared", "failures_two_level"])
def test_the_committed_failure_experiments_load(name: str) -> None:
    exp = load(ROOT / "experiments" / "failures" / f"{name}.toml")
    mtbfs = [r.config.failures.mtbf for r in exp.runs if r.config.failures is not None]
    assert mtbfs == [0, 2592000, 604800, 86400, 21600]
    assert all(r.config.prefill is not None and r.config.prefill.scheduler == "service"
               for r in exp.runs)


def test_random_failures_are_the_same_in_another_process(tmp_path: Path) -> None:
    """Which machines fail depends on the seed only, not on the process's string-hash
    seed (a snapshot map's order does)."""
    exp = tmp_path / "f.toml"
    exp.write_text(FAILURES.format(failures="mtbf = 60\nrepair = 10"))
    outs = []
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "simulator", str(exp), "--out",
                        str(tmp_path / hash_seed), "--no-progress"],
                       check=True, cwd=ROOT, env=env, capture_output=True)
        outs.append((tmp_path / hash_seed / "failing" / "results.json").read_bytes())
    assert outs[0] == outs[1] and b'"machine_failures": 0' not in outs[0]


def test_lost_work_counts_only_inside_the_measured_window() -> None:
    from simulator.recorder import Recorder
    rec = Recorder(100.0, 100.0, warmup=10.0)
    rec.machine_failed(50.0, [(0.0, 2.0), (40.0, 1.0)])  # from the warm-up's end: 80 + 10
    rec.run_ended("j", 1.0, 5.0, 60.0, preempted_by="c")  # 50
    # A drain runs past the horizon: a run that starts and ends after it adds nothing
    # (it made the counts negative), one across it counts up to the horizon.
    rec.machine_failed(150.0, [(120.0, 4.0), (90.0, 1.0)])
    rec.run_ended("j", 1.0, 110.0, 130.0, preempted_by="c")
    assert rec.failed_cpu_s == 90.0 + 10.0
    assert rec.lost_cpu_s == 50.0

"""The retry queue's order and the prefill's source, on hand-computed cases.

Decision times are fixed (t_task = 0), retries come 1 s after an attempt ends, and
tasks run for their job's duration from the moment their claim commits."""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest

from cellstate.model import JobKind
from simulator.config import Architecture, CellSpec, RetrySpec, SimConfig
from simulator.experiment import load
from simulator.prefill import steady_cpu, workload_jobs
from simulator.sim import Simulation
from simulator.workload import Distribution, InputError, JobClass, Prefill
from tests.simulator.helpers import job, sched, simulate
from tests.simulator.test_experiments import SMALL

# One 2-CPU machine, one scheduler deciding every job in 1 s. Job a (3 tasks, 5 s) is
# decided 0..1 and places 2 tasks: the machine is full until 6. b arrives at 0.5, c
# at 1.5 (1 task each).
JOBS = [job(0.0, "batch", tasks=3, duration=5.0), job(0.5, "batch"), job(1.5, "batch")]


def _waits(tmp_path: Path, order: str) -> list[float]:
    """Each job's wait for its first attempt, in the order the attempts came."""
    sim, _ = simulate(tmp_path, Architecture.MONOLITHIC, (sched("mono", 1.0, ("batch",)),),
                      JOBS, cpu=2.0, horizon=30.0, retry=RetrySpec(order=order))
    return sim.recorder.waits["batch"]


def test_submission_order_lets_retried_jobs_starve_a_newcomer(tmp_path: Path) -> None:
    """Oldest first: b is tried 1..2 (nothing fits; due again at 3). At 2, a (due at 2,
    submitted first) goes before c; at 3 b (due at 3) does; at 4 a, at 5 b, each
    placing nothing. At 6 the machine frees: a places its last task (6..7), b its
    task (7..8), and only at 8 does c get its first look: wait 6.5 s."""
    assert _waits(tmp_path, "submission") == [0.0, 0.5, 6.5]


def test_back_order_puts_a_retry_behind_the_newcomer(tmp_path: Path) -> None:
    """The released simulator's order: a's retry re-enters the queue at 2, b's at 3;
    c entered at 1.5, so at 2 c goes first (2..3): wait 0.5 s."""
    assert _waits(tmp_path, "back") == [0.0, 0.5, 0.5]


def test_back_is_the_simulators_default() -> None:
    assert RetrySpec().order == "back"


def _classes(batch_duration: float, service_duration: float) -> tuple[JobClass, ...]:
    fixed = Distribution.fixed
    return (JobClass("batch", JobKind.BATCH, fixed(10.0), fixed(2.0), fixed(batch_duration)),
            JobClass("service", JobKind.SERVICE, fixed(10.0), fixed(1.0),
                     fixed(service_duration)))


def test_steady_cpu_is_littles_law() -> None:
    """Batch: a job every 10 s of 2 tasks x 5 s x 1 CPU holds 1 CPU on average;
    service: 1 task x 30 s every 10 s holds 3."""
    batch, service = _classes(5.0, 30.0)
    assert steady_cpu(batch) == 1.0
    assert steady_cpu(service) == 3.0


def test_prefill_from_the_workload_trims_the_last_job_to_the_target() -> None:
    """Only service has weight (batch runs 0 s): 40% of 10 CPUs is 4 one-task service
    jobs of 30 s."""
    jobs = workload_jobs(Prefill(utilization=0.4), _classes(0.0, 30.0), 10.0,
                         random.Random(1))
    assert [(j.kind, j.tasks, j.duration, j.cpu) for j in jobs] == [
        (JobKind.SERVICE, 1, 30.0, 1.0)] * 4


def _prefilled_run(from_workload: bool) -> dict[float, float]:
    """One 4-CPU machine filled to half by jobs of one 1-CPU task lasting 10 s (from
    the workload), or by the fixed prefill (which runs to the end); no arrivals before
    the horizon. CPU used, sampled every second."""
    classes = (JobClass("service", JobKind.SERVICE, Distribution.fixed(1000.0),
                        Distribution.fixed(1.0), Distribution.fixed(10.0)),)
    config = SimConfig(Architecture.SHARED, (sched("service", 1.0),), classes,
                       CellSpec(1, 4.0, 16.0),
                       Prefill(utilization=0.5, tasks=1, from_workload=from_workload),
                       horizon=20.0, day=20.0, sample_interval=1.0)
    sim = Simulation(config)
    sim.run()
    return {t: cpu for t, cpu, _ in sim.recorder.utilization}


def test_prefill_from_the_workload_ends_with_its_durations() -> None:
    """Two tasks placed at 0 end at 10: half the CPU used until then, none after."""
    used = _prefilled_run(True)
    assert used[0.0] == 0.5 and used[9.0] == 0.5
    assert used[10.0] == 0.0 and used[20.0] == 0.0


def test_fixed_prefill_runs_to_the_end() -> None:
    used = _prefilled_run(False)
    assert used[0.0] == 0.5 and used[20.0] == 0.5


def test_prefill_table_without_a_shape_comes_from_the_workload(tmp_path: Path) -> None:
    exp = tmp_path / "p.toml"
    exp.write_text(SMALL.replace("utilization = 0.5\ntasks = 10", "utilization = 0.5"))
    assert load(exp).runs[0].config.prefill == Prefill(utilization=0.5, from_workload=True)
    exp.write_text(SMALL)
    prefill = load(exp).runs[0].config.prefill
    assert prefill is not None and not prefill.from_workload and prefill.tasks == 10


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("tasks = 10\n", 'tasks = 10\njobs = "workload"\n',
     "line 11, field 'prefill.tasks': a prefill from the workload takes"),
    ("tasks = 10\n", 'jobs = "trace"\n', "field 'prefill.jobs': str 'trace' is not one of"),
    ("[[sweep]]", '[retry]\norder = "front"\n\n[[sweep]]',
     "field 'retry.order': str 'front' is not one of submission, back"),
])
def test_bad_queue_or_prefill_option_names_the_field(tmp_path: Path, old: str, new: str,
                                                      expected: str) -> None:
    exp = tmp_path / "bad.toml"
    assert old in SMALL
    exp.write_text(SMALL.replace(old, new, 1))
    with pytest.raises(InputError, match=expected.replace("(", r"\(")):
        load(exp)


def test_runtime_refuses_an_unknown_retry_order() -> None:
    from schedulers.runtime import RuntimeConfig

    with pytest.raises(ValueError, match="retry_order"):
        RuntimeConfig(retry_order="front")
    assert attrs.evolve(RuntimeConfig(), retry_order="back").retry_order == "back"


def test_prefill_from_the_workload_holds_each_class_at_its_steady_share() -> None:
    """Batch: a job every 10 s of 20 tasks x 5 s x 1 CPU: 0.5 jobs running on
    average, holding 10 CPUs; service: 1 task x 30 s every 10 s: 3 jobs, 3 CPUs.
    Picked per running job (0.5 : 3), the prefill's CPUs split about 10 : 3, as the
    steady state's do; picked by CPU share (10 : 3 per job, 20 : 1 CPUs per job) they
    would split about 200 : 3."""
    fixed = Distribution.fixed
    classes = (JobClass("batch", JobKind.BATCH, fixed(10.0), fixed(20.0), fixed(5.0)),
               JobClass("service", JobKind.SERVICE, fixed(10.0), fixed(1.0), fixed(30.0)))
    jobs = workload_jobs(Prefill(utilization=1.0), classes, 26_000.0, random.Random(3))
    held = {k: sum(j.tasks * j.cpu for j in jobs if j.kind is k) for k in JobKind}
    assert held[JobKind.BATCH] / held[JobKind.SERVICE] == pytest.approx(10 / 3, rel=0.1)


@pytest.mark.parametrize("order", ["back", "submission"])
def test_the_next_job_is_the_first_due_in_queue_order(
        tmp_path: Path, order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime finds the next job from a heap instead of sorting the queue at every
    decision; it must pick what the sorted queue gives. One saturated scheduler (a job
    every 0.2 s, 0.5 s per decision) on a cell that fills, so that the queue grows to
    hundreds of jobs and retries re-enter it (back) or keep their place (submission)."""
    from schedulers.runtime import SchedulerInstance

    picks: list[tuple[int, bool]] = []  # (queue length, the first queued job was due)
    original = SchedulerInstance._next_due

    def checked(self: SchedulerInstance, now: float) -> list[str]:
        got = original(self, now)
        order_now = self.queued()
        want = [j for j in order_now if self._state(j).next_try_at <= now][:1]
        assert got == want
        picks.append((len(order_now), bool(want) and want[0] == order_now[0]))
        return got

    monkeypatch.setattr(SchedulerInstance, "_next_due", checked)
    jobs = [job(0.2 * i, "batch", tasks=2, duration=20.0) for i in range(400)]
    simulate(tmp_path, Architecture.MONOLITHIC, (sched("mono", 0.5, ("batch",)),), jobs,
             machines=4, cpu=4.0, horizon=80.0, retry=RetrySpec(order=order))
    assert len(picks) > 100
    assert max(n for n, _ in picks) > 200  # the queue did grow
    if order == "submission":
        # Retries not yet due at the head of the queue: the scan past them was used.
        assert any(not first for _, first in picks)

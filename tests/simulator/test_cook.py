"""Cook's experiment in the simulator: effective utilization and per-job speedups on
hand-computed cases, the workload's owners, priorities and daily patterns, bad input
naming the field, determinism, and a fair run that never breaks the cell's
invariants."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from cellstate.invariants import violations
from cellstate.model import JobKind
from simulator.cli import main
from simulator.config import Architecture, CellSpec, DecisionTime, SchedulerSpec, SimConfig
from simulator.experiment import load
from simulator.recorder import JobOutcome, Usage
from simulator.sim import Simulation
from simulator.speedup import pair_jobs, pairs, summarize
from simulator.workload import Distribution, Diurnal, InputError, JobClass, generate, load_trace

FIXED = Distribution.fixed(1.0)
CLASSES = (JobClass("batch", JobKind.BATCH, FIXED, FIXED, FIXED),
           JobClass("interactive", JobKind.BATCH, FIXED, FIXED, FIXED))


def fair_sim(tmp: Path, jobs: list[dict[str, Any]], preempt: bool, machines: int = 1,
             cpu: float = 2.0, horizon: float = 300.0, **options: Any) -> Simulation:
    trace = tmp / f"trace-{preempt}.jsonl"
    trace.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    sched = SchedulerSpec("fair", ("batch", "interactive"), policy="fair",
                          default=DecisionTime(0.0, 0.0),
                          options={"preempt": preempt, "min_runtime": 0.0, "interval": 1.0,
                                   **options})
    return Simulation(SimConfig(Architecture.SHARED, (sched,), CLASSES,
                                CellSpec(machines, cpu, 16.0), prefill=None, horizon=horizon,
                                day=horizon, trace=str(trace), sample_interval=10.0))


# A batch user's job of two 1-cpu tasks fills a 2-cpu machine at t = 0 for 100 s; an
# interactive user's 1-task job of 10 s arrives at t = 30. Its CRS is 1/2; the batch
# tasks' are 1/2 and 2/2, and 2/2 > 1/2 + delta: with preemption it takes task b/1.
TWO_USERS = [
    {"submit": 0, "class": "batch", "tasks": 2, "duration": 100, "cpu": 1, "mem": 1,
     "owner": "bea", "id": "b"},
    {"submit": 30, "class": "interactive", "tasks": 1, "duration": 10, "cpu": 1, "mem": 1,
     "owner": "ivy", "id": "i"},
]


def test_usage_counts_finished_runs_as_effective_in_the_buckets_they_cover() -> None:
    u = Usage(width=10.0, until=30.0)
    u.add(2.0, 5.0, 25.0, effective=True)  # 2 cpu from 5 to 25
    u.add(1.0, 0.0, 15.0, effective=False)  # 1 cpu from 0 to 15, then preempted
    u.add(1.0, 28.0, 40.0, effective=True)  # past the end: counted up to 30 only
    assert u.raw == [2 * 5 + 10, 2 * 10 + 5, 2 * 5 + 2]
    assert u.effective == [10, 20, 12]
    s = u.series(capacity=4.0)
    assert s["t"] == [0, 10, 20]
    assert s["raw"] == [0.5, 0.625, 0.3]
    assert s["effective"] == [0.25, 0.5, 0.3]
    # From t = 15: half of the second bucket's (its CPU taken as spread evenly) and the
    # third's, over 4 cpu x 15 s.
    assert u.mean(4.0, since=15.0, effective=True) == pytest.approx((20 / 2 + 12) / (4 * 15))


def test_a_preempted_run_loses_its_work_and_counts_only_as_raw(tmp_path: Path) -> None:
    with_ = fair_sim(tmp_path, TWO_USERS, preempt=True)
    m = with_.run()
    done = {o.job: (o.completion, o.preempted) for o in with_.recorder.outcomes.values()}
    # i runs 30..40 at once; b/1 ran 0..30, was preempted, and ran again from scratch
    # when i's end freed its cpu at 40 (the fair scheduler's next round): 40 + 100.
    assert done == {"i": (10.0, 0), "b": (140.0, 1)}
    assert m["lost_cpu_hours"] * 3600 == pytest.approx(30.0)
    assert m["batch_preempted_runs"] == 1 and m["interactive_preemptions"] == 1
    # Effective: b/0 100 + i 10 + b/1's last run 100 = 210 cpu-s of 2 cpu x 300 s;
    # raw adds b/1's lost 30 s.
    assert m["effective_utilization_mean"] == pytest.approx(210 / 600)
    assert m["raw_utilization_mean"] == pytest.approx(240 / 600)
    s = with_.recorder.series()
    assert s["raw"][:3] == [1.0, 1.0, 1.0] and s["effective"][:3] == [0.5, 0.5, 0.5]

    without = fair_sim(tmp_path, TWO_USERS, preempt=False)
    m0 = without.run()
    assert {o.job: o.completion for o in without.recorder.outcomes.values()} == {
        "b": 100.0, "i": 80.0}  # i waits for b's end at 100
    assert m0["effective_utilization_mean"] == m0["raw_utilization_mean"] == 210 / 600

    speedups, unpaired = pair_jobs(list(with_.recorder.outcomes.values()),
                                   list(without.recorder.outcomes.values()))
    assert unpaired == 0
    assert {s.job: s.ratio for s in speedups} == {"b": 1.4, "i": 10 / 80}


def test_speedup_pairs_jobs_by_id_and_counts_the_unpaired() -> None:
    def o(job: str, cls: str, done: float | None) -> JobOutcome:
        return JobOutcome(job, cls, "u", 0.0, done)

    run = [o("a", "interactive", 10.0), o("b", "batch", 300.0), o("c", "interactive", None),
           o("d", "interactive", 50.0)]
    base = [o("a", "interactive", 40.0), o("b", "batch", 200.0), o("c", "interactive", 20.0),
            o("d", "interactive", 50.2), o("e", "batch", 100.0)]
    speedups, unpaired = pair_jobs(run, base)
    assert [(s.job, s.ratio) for s in speedups] == [("a", 0.25), ("b", 1.5), ("d", 50 / 50.2)]
    assert unpaired == 2  # c did not complete in the run; e is not in it
    summary = summarize(speedups, unpaired, tolerance=0.01)
    # d is 0.4% faster: within the tolerance, unchanged.
    assert summary["faster_fraction"] == pytest.approx(1 / 3)
    assert summary["slower_fraction"] == pytest.approx(1 / 3)
    assert summary["interactive_faster_fraction"] == 0.5
    assert summary["batch_slower_fraction"] == 1.0
    assert summary["speedup_geomean"] == pytest.approx((0.25 * 1.5 * 50 / 50.2) ** (1 / 3))


def test_pairs_match_every_other_axis() -> None:
    points = [{"w": 1, "p": "with"}, {"w": 1, "p": "without"}, {"w": 2, "p": "with"},
              {"w": 2, "p": "without"}, {"w": 3, "p": "with"}]
    assert pairs(points, "p", "without") == [(0, 1), (2, 3)]  # w = 3 has no baseline


def test_diurnal_maps_active_time_to_the_slots_of_the_day() -> None:
    d = Diurnal((0.0, 2.0), period=100.0)  # nothing in 0..50, twice the rate in 50..100
    assert d.wall_time(0.0) == 50.0
    assert d.wall_time(30.0) == 65.0
    assert d.wall_time(100.0) == 150.0  # a period's 100 s of active time used up
    with pytest.raises(ValueError, match="above 0"):
        Diurnal((0.0, 0.0))


def test_generated_jobs_have_owners_priorities_and_follow_the_pattern() -> None:
    base = JobClass("i", JobKind.BATCH, Distribution.exponential(5.0), FIXED, FIXED)
    cls = JobClass("i", JobKind.BATCH, Distribution.exponential(5.0), FIXED, FIXED,
                   users=("ivy", "ian"), priority=Distribution.choice([0, 1.4, 2.6], [1, 1, 1]),
                   diurnal=Diurnal((1.0, 0.0), period=100.0))
    jobs = [j for j, _ in zip(generate(cls, random.Random(3)), range(200), strict=False)]
    assert {j.owner for j in jobs} == {"ivy", "ian"}
    assert {j.priority for j in jobs} == {0, 1, 3}
    assert all(j.submit % 100.0 < 50.0 for j in jobs)  # none in the idle half
    job = jobs[0].job("fair")
    assert (job.owner, job.priority) == (jobs[0].owner, jobs[0].priority)
    # A class without owners or priorities draws what it drew before they existed.
    plain = [j for j, _ in zip(generate(base, random.Random(3)), range(5), strict=False)]
    assert {j.owner for j in plain} == {"sim"} and {j.priority for j in plain} == {0}
    assert [j.submit for j in plain] == [
        t for t, _ in zip(_exponential_times(random.Random(3), 5.0), range(5), strict=False)]


def _exponential_times(rng: random.Random, mean: float) -> Any:
    t = 0.0
    while True:
        t += rng.expovariate(1 / mean)
        yield t  # fixed tasks, duration and shape draw nothing from the stream


SMALL = """name = "cook-tiny"
horizon = 1200
warmup = 200
drain = 600
seed = 2
sample_interval = 100

[cell]
machines = 2
cpu = 4
mem = 16
rack_size = 1

[[workload]]
name = "interactive"
kind = "batch"
users = ["ivy", "ian"]
interarrival = {dist = "exponential", mean = 40}
tasks = {dist = "choice", values = [1, 2]}
duration = {dist = "exponential", mean = 30}
cpu = 1
mem = 1
diurnal = {rates = [0, 1, 1], period = 600}

[[workload]]
name = "batch"
kind = "batch"
users = ["bea", "bob"]
interarrival = {dist = "exponential", mean = 150}
tasks = {dist = "choice", values = [2, 4]}
duration = {dist = "exponential", mean = 300}
cpu = 1
mem = 1
priority = {dist = "choice", values = [0, 1]}

[[scheduler]]
name = "fair"
serves = ["interactive", "batch"]
policy = "fair"
decision = {default = {t_job = 0.001, t_task = 0.0001}}
options = {interval = 5, delta = 0.05, min_runtime = 10}

[[sweep]]
name = "preemption"
set = ["scheduler.fair.options.preempt"]
values = [true, false]
labels = ["with", "without"]

[speedup]
axis = "preemption"
baseline = "without"

[[plot]]
kind = "speedup"
file = "speedup.png"

[[plot]]
kind = "effective"
file = "effective.png"
y = ["effective", "raw"]
series = "preemption"
"""


def test_cook_experiment_is_deterministic_and_pairs_its_runs(tmp_path: Path) -> None:
    exp = tmp_path / "tiny.toml"
    exp.write_text(SMALL)
    for out in ("a", "b"):
        assert main([str(exp), "--out", str(tmp_path / out), "--no-progress"]) == 0
    a, b = tmp_path / "a" / "cook-tiny", tmp_path / "b" / "cook-tiny"
    for name in ("results.json", "results.csv", "jobs.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    doc = json.loads((a / "results.json").read_text())
    with_, without = (r["metrics"] for r in doc["runs"])
    assert with_["jobs_paired"] > 0 and "jobs_paired" not in without
    assert with_["interactive_preemptions"] + with_["batch_preemptions"] > 0
    assert without["lost_cpu_hours"] == 0
    assert doc["speedup"][0]["baseline"] == {"preemption": "without"}
    for png in ("speedup.png", "effective.png"):
        assert (a / png).stat().st_size > 1000
    (a / "speedup.png").unlink()
    assert main([str(exp), "--out", str(tmp_path / "a"), "--replot"]) == 0
    assert (a / "speedup.png").stat().st_size > 1000  # from jobs.csv again


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('users = ["ivy", "ian"]', 'users = "ivy"', "field 'workload.0.users': must be a list"),
    ('users = ["ivy", "ian"]', 'users = ["ivy", "i an"]',
     "field 'workload.0.users': user 'i an' is not a valid name"),
    ('users = ["ivy", "ian"]', 'users = ["ivy", "ivy"]',
     "field 'workload.0.users': names a user twice"),
    ("rates = [0, 1, 1]", "rates = [0, 0]",
     "field 'workload.0.diurnal.rates': needs at least one rate above 0"),
    ("rates = [0, 1, 1]", "rates = [0, -1, 1]",
     "field 'workload.0.diurnal.rates': must be non-negative"),
    ("period = 600}", "period = 600, phase = 3}", "field 'workload.0.diurnal.phase': unknown"),
    ("period = 600}", "period = 0}", "field 'workload.0.diurnal.period': must be positive"),
    ("values = [0, 1]}", 'values = [0, "high"]}',
     "field 'workload.1.priority.values': must be a number"),
    ('baseline = "without"', 'baseline = "none"',
     "field 'speedup.baseline': str 'none' is not a value of axis 'preemption'"),
    ('axis = "preemption"', 'axis = "delta"', "field 'speedup.axis': 'delta' is not a sweep"),
    ("delta = 0.05", "delta = -1", "field 'scheduler.0.options': fair scheduler: option delta"),
    ("drain = 600", "drain = -1", "field 'drain': must be non-negative"),
    ('y = ["effective", "raw"]', 'y = ["cpu"]', "field 'plot.1.y': 'cpu' is not a utilization"),
])
def test_bad_cook_fields_are_named(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in SMALL
    exp = tmp_path / "bad.toml"
    exp.write_text(SMALL.replace(old, new, 1))
    with pytest.raises(InputError) as e:
        load(exp)
    assert expected in str(e.value)


def test_a_speedup_plot_needs_pairs(tmp_path: Path) -> None:
    exp = tmp_path / "bad.toml"
    exp.write_text(SMALL.replace('[speedup]\naxis = "preemption"\nbaseline = "without"\n', ""))
    with pytest.raises(InputError, match=r"field 'plot.0.kind': a speedup plot needs"):
        load(exp)


@pytest.mark.parametrize(("extra", "expected"), [
    ('"owner": "b o"', "line 1, field 'owner': user 'b o' is not a valid name"),
    ('"owner": 7', "line 1, field 'owner': must be a string"),
    ('"priority": 1.5', "line 1, field 'priority': must be a whole number"),
    ('"priority": "high"', "line 1, field 'priority': 'high' is not a finite number"),
])
def test_bad_trace_owner_or_priority_is_named(tmp_path: Path, extra: str, expected: str
                                              ) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"submit": 0, "class": "batch", "tasks": 1, "cpu": 1, "mem": 1, '
                     f'{extra}}}\n')
    with pytest.raises(InputError, match=expected):
        load_trace(trace, {"batch": JobKind.BATCH})


def test_trace_owner_and_priority_reach_the_job(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"submit": 0, "class": "batch", "tasks": 1, "cpu": 1, "mem": 1, '
                     '"owner": "bea", "priority": -2}\n')
    job = load_trace(trace, {"batch": JobKind.BATCH})[0].job("fair")
    assert (job.owner, job.priority) == ("bea", -2)


def test_a_fair_run_with_preemption_never_breaks_the_cell_invariants(tmp_path: Path) -> None:
    rng = random.Random(7)
    jobs = []
    for n in range(60):
        batch = n % 3 == 0
        jobs.append({"submit": round(rng.uniform(0, 400), 1),
                     "class": "batch" if batch else "interactive",
                     "tasks": rng.choice([3, 6]) if batch else rng.choice([1, 2]),
                     "duration": rng.choice([200, 400]) if batch else rng.choice([5, 20]),
                     "cpu": rng.choice([1, 2]), "mem": 1,
                     "owner": rng.choice(["bea", "bob"] if batch else ["ivy", "ian", "ida"]),
                     "priority": rng.choice([0, 1]), "id": f"j{n}"})
    sim = fair_sim(tmp_path, jobs, preempt=True, machines=3, cpu=4.0, horizon=900.0,
                   delta=0.0, max_preemptions_per_minute=1000)
    broken: list[str] = []
    checked = [0]

    def check(snap: Any, changes: Any) -> None:
        checked[0] += 1
        broken.extend(violations(snap))

    sim.cell.on_changes(check)
    m = sim.run()
    assert m["batch_preempted_runs"] + m["interactive_preempted_runs"] > 0
    assert checked[0] > 100
    assert broken == []

"""MapReduce jobs in the simulator, worked out by hand: the mapreduce scheduler grows a
job at its next round, a batch job takes room on loan back, and the job's end follows
the workers it had (decision times 0; rounds every 5 s from time 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellstate.model import JobKind, MapReduceSpec
from simulator.config import Architecture, CellSpec, DecisionTime, SchedulerSpec, SimConfig
from simulator.experiment import load
from simulator.sim import Simulation
from simulator.workload import Distribution, InputError, JobClass, MapReduceClass, load_trace

ROOT = Path(__file__).resolve().parents[2]
F = Distribution.fixed
ZERO = DecisionTime(0.0, 0.0)
# One job at t = 50 asking for 1 worker: 8 maps of 10 s (80 worker-s), no reduces.
MR = JobClass("mr", JobKind.MAPREDUCE, F(50.0), F(1.0), F(0.0),
              mapreduce=MapReduceClass(F(8.0), F(0.0), F(10.0), F(0.0)))
# One batch job at t = 60: one task of 2 cpus running 1,000 s.
BATCH = JobClass("batch", JobKind.BATCH, F(60.0), F(1.0), F(1000.0), cpu=F(2.0))


def run(policy: str, classes: tuple[JobClass, ...]) -> tuple[Simulation, dict[str, object]]:
    options: dict[str, object] = {"interval": 5.0}
    if policy != "mapreduce":
        options = {}
    config = SimConfig(
        Architecture.SHARED,
        (SchedulerSpec("mapreduce", ("mr",), policy=policy, default=ZERO, options=options),
         SchedulerSpec("batch", ("batch",), default=ZERO)),
        classes, CellSpec(1, 4.0, 16.0), prefill=None, horizon=99.0, day=99.0,
        sample_interval=1.0)
    sim = Simulation(config)
    return sim, sim.run()


def test_a_grown_job_ends_when_its_work_is_done() -> None:
    """Placed at 50 with 1 worker; the round at 55 adds 3 (the machine's 4 cpus; 8
    maps would use 8): 5 worker-s done by then, 75 left at 4 workers = 18.75 s, so it
    ends at 73.75. With 1 worker it would take 80 s: speedup 80 / 23.75."""
    sim, r = run("mapreduce", (MR,))
    assert r["mapreduce_jobs_done"] == 1 and r["mapreduce_jobs_grown"] == 1
    assert r["mapreduce_speedup_mean"] == pytest.approx(80 / 23.75)
    util = {t: cpu for t, cpu, _ in sim.recorder.utilization}
    assert util[54.0] == 0.25 and util[55.0] == 1.0
    assert util[73.0] == 1.0 and util[74.0] == 0.0
    assert len(sim.cell.snapshot().jobs) == 0  # done and forgotten


def test_a_batch_job_takes_room_on_loan_and_the_job_slows_down() -> None:
    """As above until 60, when a batch task of 2 cpus evicts two extra workers: 75 -
    4 x 5 = 55 worker-s left at 2 workers, so the job ends at 87.5 instead of 73.75;
    speedup 80 / 37.5. The batch task keeps its room after that."""
    sim, r = run("mapreduce", (MR, BATCH))
    assert r["mapreduce_speedup_mean"] == pytest.approx(80 / 37.5)
    assert r["mapreduce_benefit_fraction"] == 1.0
    util = {t: cpu for t, cpu, _ in sim.recorder.utilization}
    assert util[60.0] == 1.0 and util[87.0] == 1.0 and util[88.0] == 0.5
    assert r["batch_abandoned"] == 0 and r["mapreduce_abandoned"] == 0


def test_without_growth_the_job_takes_what_the_model_says() -> None:
    """The batch policy places the worker it asked for and nothing more: 80 s, from
    50 to 130, past the horizon (99): no job done yet."""
    sim, r = run("batch", (MR,))
    assert r["mapreduce_jobs_done"] == 0
    assert sim.cell.used("cpu") == 1.0


@pytest.mark.parametrize("name", ["fig15_mapreduce_heavy", "fig15_mapreduce_light",
                                  "fig16_mapreduce_utilization"])
def test_the_committed_experiment_files_load(name: str) -> None:
    exp = load(ROOT / "experiments" / "omega" / f"{name}.toml")
    assert exp.runs and all(
        any(c.mapreduce is not None for c in r.config.classes) for r in exp.runs)


TINY = """\
name = "tiny_mapreduce"
horizon = 1200
seed = 5
sample_interval = 60

[cell]
machines = 40

[prefill]
utilization = 0.5
tasks = 10

[[workload]]
name = "batch"
interarrival = {dist = "exponential", mean = 10}
tasks = {dist = "exponential", mean = 10}
duration = {dist = "exponential", mean = 100}

[[workload]]
name = "mapreduce"
kind = "mapreduce"
interarrival = {dist = "exponential", mean = 30}
tasks = {dist = "choice", values = [2, 5, 11], weights = [1, 1, 1]}

[workload.mapreduce]
maps_per_worker = {dist = "exponential", mean = 8}
reduces_per_worker = 1
map_seconds = {dist = "exponential", mean = 30}
reduce_seconds = 20

[[scheduler]]
name = "batch"
serves = ["batch"]

[[scheduler]]
name = "mapreduce"
serves = ["mapreduce"]
policy = "mapreduce"
options = {interval = 10}

[[plot]]
kind = "cdf"
y = ["mapreduce_speedup"]
"""


def test_mapreduce_runs_give_the_same_data_whatever_the_hash_seed(tmp_path: Path) -> None:
    """Which machines a randomized first fit draws, and so which extra workers a batch
    job evicts, must not depend on the process's string hashing."""
    exp = tmp_path / "tiny.toml"
    exp.write_text(TINY)
    out = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "simulator", str(exp), "--out",
                        str(tmp_path / seed), "--no-progress"], check=True, cwd=ROOT, env=env,
                       capture_output=True)
        out.append((tmp_path / seed / "tiny_mapreduce" / "results.json").read_bytes())
    assert out[0] == out[1]
    runs = json.loads(out[0])["runs"]
    assert runs[0]["metrics"]["mapreduce_jobs_grown"] > 0
    assert len(runs[0]["distributions"]["mapreduce_speedup"]) == 101
    assert (tmp_path / "1" / "tiny_mapreduce" / "plot1.png").stat().st_size > 1000


# -- MapReduce jobs from a trace ---------------------------------------------------------

# A class of kind mapreduce with no [mapreduce] table: its jobs' activities come from the
# trace (only allowed when the experiment has one).
MR_TRACED = JobClass("mr", JobKind.MAPREDUCE, F(50.0), F(1.0), F(0.0))


def test_a_traced_job_grows_and_ends_as_a_generated_one(tmp_path: Path) -> None:
    """The job of test_a_grown_job_ends_when_its_work_is_done, from a trace line: the
    same growth at 55 and the same end at 73.75."""
    trace = tmp_path / "mr.jsonl"
    trace.write_text('{"submit": 50, "class": "mr", "tasks": 1, "cpu": 1, "mem": 2, '
                     '"maps": 8, "map_seconds": 10, "id": "wordcount"}\n')
    config = SimConfig(
        Architecture.SHARED,
        (SchedulerSpec("mapreduce", ("mr",), policy="mapreduce", default=ZERO,
                       options={"interval": 5.0}),),
        (MR_TRACED,), CellSpec(1, 4.0, 16.0), prefill=None, horizon=99.0, day=99.0,
        sample_interval=1.0, trace=str(trace))
    sim = Simulation(config)
    r = sim.run()
    assert r["mapreduce_jobs_done"] == 1 and r["mapreduce_jobs_grown"] == 1
    assert r["mapreduce_speedup_mean"] == pytest.approx(80 / 23.75)
    util = {t: cpu for t, cpu, _ in sim.recorder.utilization}
    assert util[55.0] == 1.0 and util[73.0] == 1.0 and util[74.0] == 0.0


def test_trace_activities_reach_the_job(tmp_path: Path) -> None:
    trace = tmp_path / "mr.csv"
    trace.write_text("submit,class,tasks,cpu,mem,maps,reduces,map_seconds,reduce_seconds,"
                     "max_workers\n0,mr,2,1,2,40,4,12.5,30,16\n3,mr,3,1,2,5,,7,,\n")
    first, second = load_trace(trace, {"mr": JobKind.MAPREDUCE})
    assert first.mapreduce == MapReduceSpec(40, 4, 12.5, 30.0, 2, 16)
    # Defaults as a job spec's: no reduces; may grow until every map runs at once.
    assert second.mapreduce == MapReduceSpec(5, 0, 7.0, 0.0, 3, 5)
    job = first.job("mapreduce")
    assert job.kind is JobKind.MAPREDUCE and job.duration is None
    assert job.task_count == 2 and job.mapreduce == first.mapreduce


@pytest.mark.parametrize(("kind", "fields", "expected"), [
    (JobKind.BATCH, '"duration": 5, "maps": 3', "field 'maps': only a job of a class of kind "
                                               "mapreduce has activities"),
    (JobKind.MAPREDUCE, '"map_seconds": 3',
     "maps is required \\(the number of map activities\\)"),
    (JobKind.MAPREDUCE, '"maps": 3', "map_seconds is required"),
    (JobKind.MAPREDUCE, '"maps": 3, "map_seconds": 1, "duration": 60',
     "field 'duration': a MapReduce job runs as long as its activities take"),
    (JobKind.MAPREDUCE, '"maps": 3, "map_seconds": 1, "reduces": 2',
     "reduce_seconds is required"),
    (JobKind.MAPREDUCE, '"maps": 1.5, "map_seconds": 1', "maps must be an integer, got 1.5"),
    (JobKind.MAPREDUCE, '"maps": 0, "map_seconds": 1', "maps must be between 1 and 10000000, "
                                                       "got 0"),
    (JobKind.MAPREDUCE, '"maps": 3, "map_seconds": 0',
     "map_seconds must be a number of seconds above 0 and at most 1e\\+07, got 0"),
    (JobKind.MAPREDUCE, '"maps": 3, "map_seconds": "fast"',
     "field 'map_seconds': 'fast' is not a finite number"),
    (JobKind.MAPREDUCE, '"maps": 3, "map_seconds": 1, "max_workers": 1',
     "max_workers \\(1\\) is below tasks \\(2\\): the elastic upper bound"),
])
def test_bad_trace_activities_are_named(tmp_path: Path, kind: JobKind, fields: str,
                                        expected: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(f'{{"submit": 0, "class": "c", "tasks": 2, "cpu": 1, "mem": 1, {fields}}}\n')
    with pytest.raises(InputError, match=f"t.jsonl, line 1(, |: ){expected}"):
        load_trace(trace, {"c": kind})


MR_CLASS_WITHOUT_TABLE = """
architecture = "shared"
horizon = 100.0
{trace}
[cell]
machines = 2
[[workload]]
name = "mr"
kind = "mapreduce"
interarrival = 10.0
tasks = 1
[[scheduler]]
name = "mapreduce"
serves = ["mr"]
policy = "mapreduce"
"""


def test_a_mapreduce_class_needs_its_table_unless_a_trace_gives_the_activities(
        tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text(MR_CLASS_WITHOUT_TABLE.format(trace=""))
    with pytest.raises(InputError, match=r"field 'workload.0.mapreduce': .*with a trace, the "
                                         r"trace may give them"):
        load(bare)
    traced = tmp_path / "traced.toml"
    traced.write_text(MR_CLASS_WITHOUT_TABLE.format(trace='trace = "jobs.jsonl"'))
    (tmp_path / "jobs.jsonl").write_text(
        '{"submit": 1, "class": "mr", "tasks": 1, "cpu": 1, "mem": 1, "maps": 4, '
        '"map_seconds": 5}\n')
    (run,) = load(traced).runs
    assert run.config.classes[0].mapreduce is None and run.config.trace == "jobs.jsonl"
    r = Simulation(run.config, base_dir=tmp_path).run()
    assert r["mapreduce_jobs_done"] == 1


def test_the_trace_example_in_the_docs_loads(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "simulator.md").read_text()
    section = text.split("## Trace format", 1)[1]
    example = section.split("```", 2)[1]
    trace = tmp_path / "example.jsonl"
    trace.write_text(example)
    specs = load_trace(trace, {"batch": JobKind.BATCH, "service": JobKind.SERVICE,
                               "mr": JobKind.MAPREDUCE})
    assert [s.cls for s in specs] == ["batch", "service", "service", "mr"]
    assert specs[-1].mapreduce == MapReduceSpec(200, 10, 30.0, 60.0, 4, 50)

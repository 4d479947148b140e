"""Every committed Firmament experiment (experiments/firmament/) runs at a tiny scale:
its first and last sweep points on a 40-machine cell for at most 3 simulated seconds,
measured from the start (the arrival rates are the file's: the small cell is
overloaded, which only makes the rounds do more), and writes its data and plots. Bad
values in such files are named by line and field."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from simulator.experiment import Experiment, load
from simulator.runner import run_experiment
from simulator.workload import InputError

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "experiments" / "firmament").glob("*.toml"))
MACHINES = 40


def _tiny(exp: Experiment) -> Experiment:
    runs = []
    for run in (exp.runs[0], exp.runs[-1]) if len(exp.runs) > 1 else exp.runs:
        c = run.config
        horizon = min(c.horizon, 3.0)
        runs.append(attrs.evolve(run, config=attrs.evolve(
            c, cell=attrs.evolve(c.cell, machines=MACHINES, rack_size=10), horizon=horizon,
            day=horizon, warmup=0.0,
            sample_interval=min(c.sample_interval, horizon / 4))))
    return attrs.evolve(exp, runs=tuple(runs))


def test_there_are_firmament_experiments() -> None:
    assert {f.stem for f in FILES} >= {"fig14_placement_latency", "fig15_locality_threshold",
                                       "fig17_breaking_point_100",
                                       "fig17_breaking_point_1000", "placement_quality"}


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_experiment_runs_at_a_tiny_scale(path: Path, tmp_path: Path) -> None:
    exp = _tiny(load(path))
    results = run_experiment(exp, tmp_path, show=False)
    assert len(results) == len(exp.runs)
    for r in results:
        assert r.metrics["tasks_measured"] > 0, r.point
        assert r.distributions["placement_latency_s"], r.point
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [run["point"] for run in doc["runs"]] == [run.point for run in exp.runs]
    for plot in exp.plots:
        assert (tmp_path / plot.file).stat().st_size > 1000, plot.file


FIG15 = (ROOT / "experiments" / "firmament" / "fig15_locality_threshold.toml").read_text()


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('policy = "quincy"', 'policy = "quincey"',
     "field 'scheduler.0.options': flow scheduler: option policy: no cost model named "
     "'quincey'"),
    ("max_preferences = 1000", "max_preference = 1000",
     "field 'scheduler.0.options': flow scheduler: option policy: cost model quincy: "
     "unknown option(s) max_preference"),
    ("max_preferences = 1000", "max_preferences = {a = 1}",
     "field 'scheduler.0.options.costs.max_preferences': must be a string, number or "
     "boolean, got dict"),
    ('policy = "flow"', 'policy = "flow"\nmeasured = "yes"',
     "field 'scheduler.0.measured': must be true or false"),
    ('policy = "flow"', 'policy = "flow"\nmeasured_clock = "sun"',
     "field 'scheduler.0.measured_clock': str 'sun' is not one of cpu, wall"),
    ("block_size = 0.25,", 'block_size = 0.25, placement = "rack",',
     "field 'workload.0.input.placement': str 'rack' is not one of hdfs, random"),
    ('reads = "task"', 'reads = "machine"',
     "field 'workload.0.input.reads': str 'machine' is not one of task, job"),
    ("blocks_per_task = 2", "blocks_per_task = 1.5",
     "field 'workload.0.input.blocks_per_task': must be a whole number"),
    ("blocks_per_task = 2", "blocks = 2", "field 'workload.0.input.blocks': unknown field"),
    ('scheduler = "flow"', 'scheduler = "nobody"',
     "field 'prefill.scheduler': 'nobody' is not a [[scheduler]] of this experiment"),
    ("rack_size = 40", "rack_size = 0", "field 'cell.rack_size': must be positive"),
    ('file = "locality.png"', 'file = "locality.png"\nkind = "bar"',
     "field 'plot.0.kind': str 'bar' is not one of line, cdf"),
])
def test_bad_flow_experiment_names_line_and_field(tmp_path: Path, old: str, new: str,
                                                  expected: str) -> None:
    exp = tmp_path / "bad.toml"
    assert old in FIG15
    exp.write_text(FIG15.replace(old, new, 1))
    with pytest.raises(InputError) as e:
        load(exp)
    message = str(e.value)
    assert message.startswith(f"{exp}, line ")
    assert expected in message


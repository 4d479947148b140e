"""A sweep's committed data stands in for its uncommitted point files
(simulator/timed_data.py): a clone that adds a seed runs only that seed and writes the
same bytes as one sweep of every seed; a changed experiment file is run again."""

from __future__ import annotations

import csv
from pathlib import Path

import attrs
import pytest

from simulator.experiment import Experiment, load
from simulator.point import TimedResult, decode, run_timed
from simulator.sweep import POINTS, point_file
from simulator.timed_data import Restored, restore_points, write_timed

TINY = """\
name = "tiny"
architecture = "shared"
horizon = 600
seed = 3

[cell]
machines = 40

[prefill]
utilization = 0.5
tasks = 10

[[workload]]
name = "batch"
interarrival = {dist = "exponential", mean = MEAN}
tasks = {dist = "exponential", mean = 10}
duration = {dist = "exponential", mean = 60}

[[scheduler]]
name = "batch"
serves = ["batch"]

[[sweep]]
name = "t_job"
set = ["scheduler.batch.decision.default.t_job"]
values = [0.1, 3]

[[sweep]]
name = "seed"
set = ["seed"]
values = [1, 2]
"""
DATA = ("results.json", "results.csv", "timing.csv")


def _tiny(where: Path, mean: int = 5) -> Experiment:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "tiny.toml"
    path.write_text(TINY.replace("MEAN", str(mean)), encoding="utf-8")
    return load(path)


def _seed(exp: Experiment, seed: int) -> Experiment:
    return attrs.evolve(exp, runs=tuple(r for r in exp.runs if r.point["seed"] == seed))


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Experiment, list[TimedResult]]:
    exp = _tiny(tmp_path_factory.mktemp("tiny"))
    return exp, [run_timed(exp, i) for i in range(len(exp.runs))]


def _committed(exp: Experiment, results: list[TimedResult], dest: Path) -> None:
    """What a clone has: seed 1's data files, no points/."""
    write_timed(_seed(exp, 1), [r for r in results if r.result.point["seed"] == 1], dest)
    assert not (dest / POINTS).exists()


def test_a_clone_adding_a_seed_runs_only_it_and_writes_what_one_sweep_writes(
        swept: tuple[Experiment, list[TimedResult]], tmp_path: Path) -> None:
    exp, results = swept
    clone, whole = tmp_path / "clone", tmp_path / "whole"
    _committed(exp, results, clone)

    assert restore_points(exp, clone) == Restored(points=2, unchecked=0)
    seed1 = [i for i, r in enumerate(exp.runs) if r.point["seed"] == 1]
    assert sorted(p.name for p in (clone / POINTS).iterdir()) == sorted(
        point_file(exp, i) for i in seed1)  # seed 2's points: still to run
    # The sweep then reads seed 1 from its files and runs seed 2.
    combined = [decode(run.point, (clone / POINTS / point_file(exp, i)).read_bytes())
                if i in seed1 else results[i] for i, run in enumerate(exp.runs)]
    write_timed(exp, combined, clone)
    write_timed(exp, results, whole)
    for name in DATA:
        assert (clone / name).read_bytes() == (whole / name).read_bytes(), name
    # The data now holds seed 2 as well (its files were the sweep's to write), then
    # every point has its file.
    assert restore_points(exp, clone) == Restored(points=2, unchecked=0)
    assert restore_points(exp, clone) == Restored()


def test_a_changed_experiment_file_is_not_taken_from_the_data(
        swept: tuple[Experiment, list[TimedResult]], tmp_path: Path) -> None:
    exp, results = swept
    _committed(exp, results, tmp_path / "clone")
    busier = _tiny(tmp_path / "busier", mean=4)  # same points, another workload
    assert restore_points(busier, tmp_path / "clone") == Restored()
    assert not (tmp_path / "clone" / POINTS).exists()


def test_data_written_before_the_digest_column_is_restored_and_counted_unchecked(
        swept: tuple[Experiment, list[TimedResult]], tmp_path: Path) -> None:
    exp, results = swept
    clone = tmp_path / "clone"
    _committed(exp, results, clone)
    timing = clone / "timing.csv"
    rows = list(csv.reader(timing.read_text(encoding="utf-8").splitlines()))
    assert rows[0][-1] == "config"
    timing.write_text("".join(",".join(r[:-1]) + "\n" for r in rows), encoding="utf-8")

    assert restore_points(exp, clone) == Restored(points=2, unchecked=2)


def test_nothing_is_restored_without_timing(
        swept: tuple[Experiment, list[TimedResult]], tmp_path: Path) -> None:
    exp, results = swept
    clone = tmp_path / "clone"
    _committed(exp, results, clone)
    (clone / "timing.csv").unlink()  # results.json alone has no CPU seconds
    assert restore_points(exp, clone) == Restored()
    assert restore_points(exp, tmp_path / "nothing") == Restored()

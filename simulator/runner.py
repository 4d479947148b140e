"""Running an experiment in this process, every point of its sweep in turn with a
progress bar in simulated seconds; and the data files and plots made from the results
(whether they were made here or by a sweep on Dask, ``simulator.sweep``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
from tqdm import tqdm

from simulator.experiment import Experiment
from simulator.output import read_jobs, with_speedups, write_data, write_plots
from simulator.point import RunResult, run_one

__all__ = ["RunResult", "finish", "replot", "run_experiment", "run_one", "with_seed"]


def with_seed(exp: Experiment, seed: int | None) -> Experiment:
    """The experiment with every run's seed set to ``seed`` (None: as the file says)."""
    if seed is None:
        return exp
    runs = tuple(attrs.evolve(r, config=attrs.evolve(r.config, seed=seed)) for r in exp.runs)
    return attrs.evolve(exp, runs=runs)


def run_experiment(exp: Experiment, out: Path, show: bool = True,
                   seed: int | None = None) -> list[RunResult]:
    exp = with_seed(exp, seed)
    total = sum(r.config.horizon + r.config.drain for r in exp.runs)
    bar = tqdm(total=round(total), unit="sim-s", desc=exp.name, disable=not show,
               file=sys.stderr, unit_scale=True, dynamic_ncols=True)
    results: list[RunResult] = []
    try:
        for i, run in enumerate(exp.runs):
            base = int(bar.n)

            def tick(now: float, base: int = base) -> None:
                bar.update(max(0, round(now) + base - int(bar.n)))

            bar.set_postfix_str(_label(run.point))
            results.append(run_one(run.point, i, exp, tick))
            bar.update(max(0, base + round(run.config.horizon + run.config.drain)
                           - int(bar.n)))
    finally:
        bar.close()
    return finish(exp, results, out)


def finish(exp: Experiment, results: Sequence[RunResult], out: Path) -> list[RunResult]:
    """The experiment's data files and plots in ``out``, from every run's result (in
    the experiment's run order)."""
    finished = with_speedups(exp, results)
    write_data(exp, finished, out)
    write_plots(exp, finished, out)
    return finished


def replot(exp: Experiment, out: Path) -> list[RunResult]:
    """Draw an experiment's plots again from its results.json (after editing only the
    [[plot]] tables, no need to run it again)."""
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    jobs = read_jobs(out / "jobs.csv", len(doc["runs"]))
    results = [RunResult(r["point"], r["metrics"], tuple(tuple(u) for u in r["utilization"]),
                         r.get("distributions", {}), r.get("series", {}), j)
               for r, j in zip(doc["runs"], jobs, strict=True)]
    write_plots(exp, results, out)
    return results


def _label(point: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())

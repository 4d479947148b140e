"""Running an experiment: every point of its sweep, sequentially or in worker
processes, with a progress bar; then its data files and plots."""

from __future__ import annotations

import concurrent.futures
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
from tqdm import tqdm

from cellstate.gc_tuning import tune_for_large_heap
from simulator.experiment import Experiment
from simulator.output import RunResult, read_jobs, with_speedups, write_data, write_plots
from simulator.sim import Simulation


def run_one(point: dict[str, object], config_index: int, exp: Experiment,
            progress: Callable[[float], None] | None = None,
            after_prefill: Callable[[], None] | None = None) -> RunResult:
    """One run; ``after_prefill`` is called once the cell is filled (e.g. to time it)."""
    run = exp.runs[config_index]
    sim = Simulation(run.config, base_dir=exp.path.parent)

    def prefilled() -> None:
        if after_prefill is not None:
            after_prefill()
        # A simulated cell is a few hundred thousand long-lived objects; the collector
        # scanning them again and again cost about a quarter of the run time.
        tune_for_large_heap()

    metrics = sim.run(progress, after_prefill=prefilled)
    return RunResult(point, metrics, tuple(sim.recorder.utilization),
                     sim.recorder.distributions(), sim.recorder.series(),
                     tuple(sim.recorder.outcomes.values()))


def _worker(exp: Experiment, index: int) -> tuple[int, RunResult, float]:
    started = time.perf_counter()
    result = run_one(exp.runs[index].point, index, exp)
    return index, result, time.perf_counter() - started


def run_experiment(exp: Experiment, out: Path, jobs: int = 1, show: bool = True,
                   seed: int | None = None) -> list[RunResult]:
    if seed is not None:
        runs = tuple(attrs.evolve(r, config=attrs.evolve(r.config, seed=seed)) for r in exp.runs)
        exp = attrs.evolve(exp, runs=runs)
    total = sum(r.config.horizon + r.config.drain for r in exp.runs)
    bar = tqdm(total=round(total), unit="sim-s", desc=exp.name, disable=not show,
               file=sys.stderr, unit_scale=True, dynamic_ncols=True)
    results: list[RunResult | None] = [None] * len(exp.runs)
    try:
        if jobs <= 1:
            for i, run in enumerate(exp.runs):
                base = int(bar.n)

                def tick(now: float, base: int = base) -> None:
                    bar.update(max(0, round(now) + base - int(bar.n)))

                bar.set_postfix_str(_label(run.point))
                results[i] = run_one(run.point, i, exp, tick)
                bar.update(max(0, base + round(run.config.horizon + run.config.drain)
                               - int(bar.n)))
        else:
            with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(_worker, exp, i) for i in range(len(exp.runs))]
                for f in concurrent.futures.as_completed(futures):
                    i, res, _wall = f.result()
                    results[i] = res
                    bar.update(round(exp.runs[i].config.horizon + exp.runs[i].config.drain))
    finally:
        bar.close()
    finished = with_speedups(exp, [r for r in results if r is not None])
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

"""One run of an experiment, and its result as a self-contained document.

Kept apart from ``simulator.runner`` so that a sweep's worker processes import only
the simulation, not the plotting (matplotlib costs about a second per process)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import attrs

from cellstate.gc_tuning import SweptCollector
from simulator.experiment import Experiment
from simulator.recorder import JobOutcome
from simulator.sim import Simulation


@attrs.frozen
class RunResult:
    point: dict[str, Any]
    metrics: dict[str, Any]
    utilization: tuple[tuple[float, float, float], ...]
    # CDFs: 101 quantiles (0, 1%, ..., 100%) of each distribution the run measured
    distributions: dict[str, list[float]] = attrs.field(factory=dict)
    # Effective and raw CPU utilization per time bucket ("t": the buckets' starts).
    series: dict[str, list[float]] = attrs.field(factory=dict)
    jobs: tuple[JobOutcome, ...] = ()  # every measured job's completion


def run_one(point: dict[str, object], config_index: int, exp: Experiment,
            progress: Callable[[float], None] | None = None,
            after_prefill: Callable[[], None] | None = None) -> RunResult:
    """One run; ``after_prefill`` is called once the cell is filled (e.g. to time it)."""
    run = exp.runs[config_index]
    sim = Simulation(run.config, base_dir=exp.path.parent)
    collector = SweptCollector()

    def prefilled() -> None:
        if after_prefill is not None:
            after_prefill()
        # A simulated cell is a few hundred thousand long-lived objects, and the main
        # loop makes and frees records at a high rate, none of them cyclic: the
        # collector's passes over them cost about a tenth of the run. It sweeps at each
        # progress step instead (200 per run), each object scanned at most once.
        collector.pause()

    def step(now: float) -> None:
        collector.sweep()
        if progress is not None:
            progress(now)

    try:
        metrics = sim.run(step, after_prefill=prefilled)
    finally:
        collector.resume()
    return RunResult(point, metrics, tuple(sim.recorder.utilization),
                     sim.recorder.distributions(), sim.recorder.series(),
                     tuple(sim.recorder.outcomes.values()))


@attrs.frozen
class TimedResult:
    """A run's result with the CPU seconds it took, and those of its prefill (a fixed
    cost per run that does not grow with the simulated time)."""

    result: RunResult
    cpu_s: float
    prefill_cpu_s: float


def run_timed(exp: Experiment, index: int) -> TimedResult:
    started = time.process_time()
    prefilled: list[float] = []
    res = run_one(exp.runs[index].point, index, exp,
                  after_prefill=lambda: prefilled.append(time.process_time()))
    end = time.process_time()
    return TimedResult(res, end - started, (prefilled or [end])[0] - started)


def encode(timed: TimedResult) -> bytes:
    """The document of a run's result: JSON (floats written as ``repr`` writes them, so
    they read back to the same value and the assembled results.json is byte-identical
    to one made in one process). The point is not in it: the experiment file has it."""
    r = timed.result
    doc = {"cpu_s": timed.cpu_s, "prefill_cpu_s": timed.prefill_cpu_s,
           "metrics": r.metrics, "utilization": [list(u) for u in r.utilization],
           "distributions": r.distributions, "series": r.series,
           "jobs": [attrs.astuple(j) for j in r.jobs]}
    return (json.dumps(doc, sort_keys=True) + "\n").encode("utf-8")


def decode(point: dict[str, Any], data: bytes) -> TimedResult:
    doc = json.loads(data)
    res = RunResult(point, doc["metrics"], tuple(tuple(u) for u in doc["utilization"]),
                    doc["distributions"], doc["series"],
                    tuple(JobOutcome(*j) for j in doc["jobs"]))
    return TimedResult(res, doc["cpu_s"], doc["prefill_cpu_s"])

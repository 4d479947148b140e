"""Clusters A, B, C of the lightweight Omega experiments: the committed experiment
files carry the calibration (experiments/omega/calibrate.py), and the calibration
meets its targets (docs/results/omega-clusters.md), on paper and in the simulator."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import attrs
import pytest

from simulator.config import SimConfig
from simulator.experiment import load
from simulator.prefill import steady_cpu
from simulator.sim import Simulation

ROOT = Path(__file__).resolve().parents[2]
OMEGA = ROOT / "experiments" / "omega"
FILES = ("fig5_6_single_path", "fig5_6_multi_path", "fig5_6_shared_state", "fig7_two_level",
         "fig8_batch_rate", "fig10_single_path", "fig10_multi_path", "fig10_two_level",
         "fig10_shared_state", "fig10_shared_coarse_gang", "semantics", "fig9_batch_schedulers",
         "fig14_conflict_modes")


def _calibrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate", OMEGA / "calibrate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = mod  # a dataclass looks its module up while being made
    spec.loader.exec_module(mod)
    return mod


CAL = _calibrate()
TARGETS = {c.name: c for c in CAL.CLUSTERS}


@pytest.mark.parametrize("name", FILES)
def test_experiment_file_carries_the_calibrated_clusters(name: str) -> None:
    doc = tomllib.loads((OMEGA / f"{name}.toml").read_text(encoding="utf-8"))
    axis = next(s for s in doc["sweep"] if s["name"] == "cluster")
    assert tuple(axis["set"]) == CAL.AXIS_PATHS
    assert axis["labels"], "no cluster"
    for label, values in zip(axis["labels"], axis["values"], strict=True):
        assert values == CAL.axis_values(TARGETS[label])


def _base_runs() -> dict[str, SimConfig]:
    """Cluster -> the 1x config of fig8_batch_rate.toml, seed 1."""
    exp = load(OMEGA / "fig8_batch_rate.toml")
    return {r.point["cluster"]: r.config for r in exp.runs
            if r.point["batch_rate"] == 1 and r.point["seed"] == 1}


@pytest.mark.parametrize("cluster", ["A", "B", "C"])
def test_calibration_meets_its_targets_on_paper(cluster: str) -> None:
    """From the committed file's distributions: one batch scheduler's busyness at 1x
    is 1 / the saturation multiple (within 1%), 90% of jobs are batch jobs, and the
    steady state holds 60% of the CPUs, the target share of it service's."""
    target = TARGETS[cluster]
    config = _base_runs()[cluster]
    batch, service = config.classes
    tasks = CAL.mean_ceil(batch.tasks.quantiles)
    busy = (CAL.T_JOB + CAL.T_TASK * tasks) / batch.interarrival.mean()
    assert busy * target.saturation == pytest.approx(1.0, rel=0.01)
    batch_rate, service_rate = 1 / batch.interarrival.mean(), 1 / service.interarrival.mean()
    assert batch_rate / (batch_rate + service_rate) == pytest.approx(target.batch_jobs)
    cpus = config.cell.machines * config.cell.cpu
    # steady_cpu uses the laws' means; the task counts are rounded up when sampled.
    held_b = steady_cpu(batch) * tasks / batch.tasks.mean()
    held_s = steady_cpu(service) * CAL.service_tasks_mean(target) / service.tasks.mean()
    assert (held_b + held_s) / cpus == pytest.approx(target.utilization, rel=0.01)
    assert held_s / (held_b + held_s) == pytest.approx(target.service_cpu, rel=0.01)
    # At the saturation multiple the cell still has room: Fig. 8 measures the scheduler.
    assert CAL.headroom(target) < 0.95


def test_tasks_per_job_has_fig4s_shape() -> None:
    for c in CAL.CLUSTERS:
        table = CAL.batch_table(c)
        assert table[55] == 1.0  # more than half the jobs have a single task
        assert table[-1] == CAL.MAX_TASKS
        assert all(b >= a for a, b in itertools.pairwise(table))
    # The mean after rounding up, as the simulator samples it (checked by drawing).
    import random

    from simulator.workload import Distribution

    table = CAL.batch_table(TARGETS["B"])
    rng = random.Random(7)
    law = Distribution.empirical(table)
    draws = [max(1, math.ceil(law.sample(rng))) for _ in range(200_000)]
    assert sum(draws) / len(draws) == pytest.approx(CAL.mean_ceil(table), rel=0.03)


# Simulated: one batch scheduler's busyness over 15 minutes at 1x, and the saturation
# multiple it implies (busyness grows linearly with the rate until it saturates). The
# tolerance covers 15 minutes' draws of a heavy-tailed job size (a few jobs of 5,000
# tasks move the mean by a tenth); fig8_batch_rate measures it over the whole sweep.
TOLERANCE = 0.2


@pytest.mark.parametrize("cluster", ["A", "B", "C"])
def test_simulated_busyness_gives_the_saturation_multiple(cluster: str) -> None:
    config = attrs.evolve(_base_runs()[cluster], horizon=900.0, day=900.0,
                          sample_interval=300.0)
    result = Simulation(config).run()
    implied = 1.0 / result["batch_busyness"]
    assert implied == pytest.approx(TARGETS[cluster].saturation, rel=TOLERANCE)

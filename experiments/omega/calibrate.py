"""Clusters A, B and C for the lightweight Omega experiments: workload parameters
fitted to what the Omega paper (seed 001) states, and the `cluster` sweep axis that
every figure's experiment file carries.

    python experiments/omega/calibrate.py          # the targets and what they give
    python experiments/omega/calibrate.py --axis   # the [[sweep]] table to paste
    python experiments/omega/calibrate.py --axis --only B

docs/results/omega-clusters.md says where each target comes from and what had to be
assumed; tests/simulator/test_omega_clusters.py checks that the committed experiment
files carry exactly this axis and that the clusters meet their targets.

The fit, per cluster:

* one batch scheduler saturates at ``saturation`` times the batch arrival rate (Fig. 8:
  2.5x, 6x, 9.5x): lambda_batch x E[t_decision] = 1 / saturation, with t_decision =
  t_job + t_task x tasks (0.1 s, 5 ms), which fixes the mean tasks per batch job once
  the batch interarrival time is chosen;
* batch jobs are ``batch_jobs`` of all jobs (§2.1: "most (>80%)"), which fixes the
  service interarrival time;
* the cell runs at ``utilization`` of its CPUs in steady state (§4: the prefill fills
  about 60%), ``service_cpu`` of it service work (Fig. 2), which fixes the mean
  durations (Little's law: CPUs held = rate x tasks x duration x CPU per task);
* the tasks-per-job law has Fig. 4's shape: more than half the jobs have one task,
  the 95th percentile is at about 100 tasks, the tail reaches thousands (at most
  5,000: a cluster that needs more tasks per job gets them in the body).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

T_JOB = 0.1  # Omega §4: t_job and t_task of every scheduler but the swept one
T_TASK = 0.005
CPU, MEM = 4.0, 16.0  # per machine: the released simulator's example cell
# Fig. 4's shape as (quantile, tasks - 1) anchors, interpolated in log space and
# scaled per cluster: 55% of jobs have one task, the tail goes to thousands.
SHAPE = ((0.55, 0.0), (0.8, 9.0), (0.9, 39.0), (0.95, 119.0), (0.99, 999.0), (1.0, 4999.0))
MAX_TASKS = 5000.0  # Fig. 4's tail: the largest jobs have thousands of tasks
QUANTILES = 101  # the empirical law's table: values at quantiles 0, 0.01, ..., 1


@dataclass(frozen=True)
class Cluster:
    name: str
    machines: int
    batch_gap: float  # mean batch interarrival time [s]
    saturation: float  # Fig. 8: batch rate multiple at which one scheduler saturates
    batch_jobs: float  # share of jobs that are batch jobs
    utilization: float  # steady-state share of the CPUs in use
    service_cpu: float  # share of the CPUs in use that service tasks hold
    service_tasks: float  # mean tasks per service job (exponential, rounded up)
    batch_cpu: float = 0.5  # per task
    batch_mem: float = 1.0
    service_cpu_per_task: float = 1.0
    service_mem: float = 4.0


CLUSTERS = (
    Cluster("A", machines=5_000, batch_gap=2.5, saturation=2.5, batch_jobs=0.9,
            utilization=0.6, service_cpu=0.65, service_tasks=10.0),
    Cluster("B", machines=15_000, batch_gap=3.0, saturation=6.0, batch_jobs=0.9,
            utilization=0.6, service_cpu=0.9, service_tasks=10.0),
    Cluster("C", machines=12_500, batch_gap=4.4, saturation=9.5, batch_jobs=0.9,
            utilization=0.6, service_cpu=0.94, service_tasks=10.0),
)


def shape_table(scale: float) -> list[float]:
    """Tasks per job at each quantile: 1 below 0.55, then 1 + scale x the shape."""
    out = []
    for i in range(QUANTILES):
        p = i / (QUANTILES - 1)
        if p <= SHAPE[0][0]:
            out.append(1.0)
            continue
        for (p0, v0), (p1, v1) in itertools.pairwise(SHAPE):
            if p <= p1 + 1e-12:
                f = (p - p0) / (p1 - p0)
                # Log-space between the anchors (linear from 0 at the first one).
                v = (v1 * f if v0 == 0 else math.exp(math.log(v0)
                                                      + f * (math.log(v1) - math.log(v0))))
                out.append(round(min(MAX_TASKS, 1.0 + scale * v), 3))
                break
    return out


def mean_ceil(table: Sequence[float], steps: int = 200) -> float:
    """E[ceil(X)] for X sampled as the simulator samples an empirical law (a uniform
    position between neighbouring quantiles, linearly interpolated), the integral
    taken exactly on each piece where ceil is constant."""
    total = 0.0
    pieces = len(table) - 1
    for lo, hi in itertools.pairwise(table):
        if hi == lo:
            total += max(1, math.ceil(lo))
            continue
        # Fraction of the piece at each whole value of ceil(X).
        acc = 0.0
        k = math.ceil(lo) if lo != math.ceil(lo) else int(lo) + 1
        prev = lo
        while prev < hi:
            nxt = min(float(k), hi)
            acc += (nxt - prev) / (hi - lo) * max(1, k)
            prev = nxt
            k += 1
        total += acc
    del steps
    return total / pieces


def batch_tasks_mean(c: Cluster) -> float:
    """Mean tasks per batch job that saturates one batch scheduler at c.saturation."""
    return (c.batch_gap / c.saturation - T_JOB) / T_TASK


def batch_table(c: Cluster) -> list[float]:
    """The tasks-per-job table whose mean (after rounding up) is batch_tasks_mean."""
    target = batch_tasks_mean(c)
    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_ceil(shape_table(mid)) < target:
            lo = mid
        else:
            hi = mid
    return shape_table((lo + hi) / 2)


def service_gap(c: Cluster) -> float:
    return c.batch_gap * c.batch_jobs / (1 - c.batch_jobs)


def service_tasks_mean(c: Cluster) -> float:
    """E[ceil(Exp(mean))]: the simulator rounds a sampled task count up."""
    return 1.0 / (1.0 - math.exp(-1.0 / c.service_tasks))


def durations(c: Cluster) -> tuple[float, float]:
    """Mean batch and service task durations [s] that hold c.utilization of the CPUs,
    c.service_cpu of it service's, at the unscaled rates."""
    used = c.utilization * c.machines * CPU
    batch_rate = mean_ceil(batch_table(c)) / c.batch_gap  # tasks per second
    service_rate = service_tasks_mean(c) / service_gap(c)
    batch = used * (1 - c.service_cpu) / (batch_rate * c.batch_cpu)
    service = used * c.service_cpu / (service_rate * c.service_cpu_per_task)
    return batch, service


def headroom(c: Cluster) -> float:
    """The CPUs in use at c.saturation times the batch rate (above 1: the cell fills
    before the scheduler saturates, and Fig. 8 would measure the cell)."""
    return c.utilization * (c.service_cpu + (1 - c.service_cpu) * c.saturation)


def axis_values(c: Cluster) -> list[object]:
    """The values the `cluster` axis sets, in the order of AXIS_PATHS."""
    batch_d, service_d = durations(c)
    return [c.machines,
            {"dist": "exponential", "mean": c.batch_gap},
            {"dist": "empirical", "quantiles": batch_table(c)},
            {"dist": "exponential", "mean": round(batch_d, 1)},
            c.batch_cpu, c.batch_mem,
            {"dist": "exponential", "mean": round(service_gap(c), 3)},
            {"dist": "exponential", "mean": c.service_tasks},
            {"dist": "exponential", "mean": round(service_d, 1)},
            c.service_cpu_per_task, c.service_mem]


AXIS_PATHS = ("cell.machines", "workload.batch.interarrival", "workload.batch.tasks",
              "workload.batch.duration", "workload.batch.cpu", "workload.batch.mem",
              "workload.service.interarrival", "workload.service.tasks",
              "workload.service.duration", "workload.service.cpu", "workload.service.mem")


def _toml(v: object) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def axis_toml(only: Sequence[str] = ()) -> str:
    """The `cluster` axis of every cluster, or of those named in ``only``."""
    chosen = [c for c in CLUSTERS if not only or c.name in only]
    paths = ", ".join(f'"{p}"' for p in AXIS_PATHS)
    rows = ",\n  ".join(_toml(axis_values(c)) for c in chosen)
    labels = ", ".join(f'"{c.name}"' for c in chosen)
    return (f"# Clusters A, B, C: generated by experiments/omega/calibrate.py --axis (see\n"
            f"# docs/results/omega-clusters.md); do not edit by hand.\n"
            f"[[sweep]]\nname = \"cluster\"\nset = [{paths}]\n"
            f"values = [\n  {rows}\n]\nlabels = [{labels}]\n")


def report() -> str:
    lines = ["cluster machines batch-gap tasks/batch-job E[t_dec] busy@1x service-gap "
             "batch-dur service-dur headroom@sat"]
    for c in CLUSTERS:
        t = mean_ceil(batch_table(c))
        bd, sd = durations(c)
        lines.append(f"{c.name} {c.machines} {c.batch_gap} {t:.1f} {T_JOB + T_TASK * t:.3f} "
                     f"{(T_JOB + T_TASK * t) / c.batch_gap:.3f} {service_gap(c):.1f} "
                     f"{bd:.0f} {sd:.0f} {headroom(c):.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--axis", action="store_true", help="print the cluster sweep axis")
    p.add_argument("--only", nargs="*", default=(), help="these clusters only (e.g. B)")
    args = p.parse_args()
    print(axis_toml(args.only) if args.axis else report(), end="" if args.axis else "\n")


if __name__ == "__main__":
    main()

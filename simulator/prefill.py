"""A prefill drawn from the experiment's own workload (Omega §4: the lightweight
simulator fills the cell to about 60% with jobs from the cluster's trace before it
starts, and those jobs end as their durations say).

Each prefill job is a job of one of the workload classes, drawn with that class's
distributions (tasks, duration, task shape). A class is picked in proportion to the
number of its jobs running in steady state (arrival rate x mean duration, Little's
law, at the class's unscaled rate; a running job's size is an arriving job's, as size
and duration are drawn independently), so that the cell starts out in the mix the
workload keeps it in: each class holds its steady-state share of the CPUs
(:func:`steady_cpu`). The duration is a fresh job's: for the exponential durations
the Omega experiments use, a running job's remaining time has that same law; for
other laws a running job's remaining time is longer on average (it was more likely
to be caught running), which this does not model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from cellstate.model import JobKind
from simulator.workload import JobClass, JobSpec, Prefill


def steady_cpu(cls: JobClass) -> float:
    """The CPUs a class's jobs hold on average once arrivals and ends balance
    (Little's law); 0 for classes without durations (MapReduce) or arrivals."""
    if cls.kind is JobKind.MAPREDUCE:
        return 0.0
    gap = cls.interarrival.mean()
    if gap <= 0:
        return 0.0
    tasks = cls.tasks.mean()
    return tasks * cls.duration.mean() * cls.cpu.mean() / gap


def steady_jobs(cls: JobClass) -> float:
    """The jobs of a class running on average in steady state (Little's law); 0 for
    classes without durations, arrivals or CPU."""
    if cls.kind is JobKind.MAPREDUCE or steady_cpu(cls) <= 0:
        return 0.0
    return cls.duration.mean() / cls.interarrival.mean()


def workload_jobs(prefill: Prefill, classes: Sequence[JobClass], total_cpu: float,
                  rng: random.Random) -> list[JobSpec]:
    """Jobs of the workload's classes until ``prefill.utilization`` of ``total_cpu`` is
    asked for (the last job trimmed to fit)."""
    # Picking a class per job by its share of the CPUs would over-draw the class with
    # the bigger jobs (a batch job brings ~20x a service job's CPUs): pick by the
    # share of running jobs instead.
    weighted = [(c, w) for c in classes if (w := steady_jobs(c)) > 0]
    if not weighted:
        raise ValueError("a prefill from the workload needs a class with arrivals, tasks "
                         "and durations")
    pool = [c for c, _ in weighted]
    weights = [w for _, w in weighted]
    target = prefill.utilization * total_cpu
    out: list[JobSpec] = []
    asked = 0.0
    while asked + 1e-9 < target:
        cls = rng.choices(pool, weights)[0]
        tasks = max(1, math.ceil(cls.tasks.sample(rng)))
        duration = cls.duration.sample(rng)
        cpu, mem = cls.cpu.sample(rng), cls.mem.sample(rng)
        if cpu <= 0:
            continue
        tasks = min(tasks, math.ceil((target - asked) / cpu - 1e-9))
        out.append(JobSpec(f"prefill-{len(out) + 1:06d}", "prefill", cls.kind, 0.0, tasks,
                           duration, cpu, mem))
        asked += tasks * cpu
    return out

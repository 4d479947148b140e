"""A stream of demo jobs for a running cell: batch jobs (many short tasks) and service
jobs (a few long, spread tasks at a higher precedence), at a Poisson rate.

The shape is the demo's, not a trace's (the simulator has the paper's workloads);
every job declares a duration so agents end its tasks and the cell keeps turning over.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import attrs

from cellstate.model import Constraints, Job, JobKind, Resources


@attrs.frozen
class WorkloadOptions:
    jobs_per_second: float = 4.0
    service_fraction: float = 0.2
    seed: int = 1
    prefix: str = ""  # job ids start with it (several generators on one cell)
    batch_scheduler: str = "batch"
    service_scheduler: str = "service"


def random_job(rng: random.Random, n: int, now: float, opts: WorkloadOptions) -> Job:
    service = rng.random() < opts.service_fraction
    return Job(
        f"{opts.prefix}{'svc' if service else 'batch'}-{n:06}",
        rng.choice(["alice", "bob", "carol"]),
        opts.service_scheduler if service else opts.batch_scheduler,
        rng.randint(2, 6) if service else rng.randint(1, 30),
        Resources.of(cpu=rng.choice([0.5, 1, 2]), mem=rng.choice([1, 2, 4])),
        kind=JobKind.SERVICE if service else JobKind.BATCH,
        precedence=5 if service else 1,
        constraints=Constraints(max_per_machine=1) if service else Constraints(),
        duration=round(rng.uniform(20, 60) if service else rng.uniform(2, 12), 3),
        submitted_at=now,
    )


def generate(submit: Callable[[Job], object], opts: WorkloadOptions, stop: threading.Event,
             clock: Callable[[], float] = time.time,
             on_submit: Callable[[Job], None] | None = None) -> int:
    """Submit jobs until ``stop`` is set; returns how many were submitted."""
    rng = random.Random(opts.seed)
    n = 0
    while not stop.wait(rng.expovariate(opts.jobs_per_second)):
        job = random_job(rng, n, clock(), opts)
        submit(job)
        n += 1
        if on_submit is not None:
            on_submit(job)
    return n

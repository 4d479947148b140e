"""A stream of demo jobs for a running cell: batch jobs (many short tasks), service
jobs (a few long, spread tasks at a higher precedence), flow jobs (for the flow
scheduler; half of them read input data stored on a few machines, which Quincy
places tasks near), MapReduce jobs (for the mapreduce scheduler, which grows them
into idle machines) and fair jobs (for the fair scheduler: its batch users' long jobs
and its interactive users' short ones), at a Poisson rate.

The shape is the demo's, not a trace's (the simulator has the paper's workloads);
every job declares a duration so agents end its tasks and the cell keeps turning over
(a MapReduce job's is its activities' work, which its workers do faster the more
there are).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

import attrs

from cellstate.model import Block, Constraints, Job, JobKind, MapReduceSpec, Resources


@attrs.frozen
class WorkloadOptions:
    jobs_per_second: float = 4.0
    service_fraction: float = 0.2
    flow_fraction: float = 0.2  # 0: no flow jobs (a cell without a flow scheduler)
    mapreduce_fraction: float = 0.1  # 0: no MapReduce jobs
    fair_fraction: float = 0.15  # 0: no jobs for the fair scheduler
    seed: int = 1
    prefix: str = ""  # job ids start with it (several generators on one cell)
    batch_scheduler: str = "batch"
    service_scheduler: str = "service"
    flow_scheduler: str = "flow"
    mapreduce_scheduler: str = "mapreduce"
    fair_scheduler: str = "fair"


# The other schedulers' jobs' owners.
USERS = ("alice", "bob", "carol")
# The fair scheduler's users: two run long batch jobs that fill its pool, three short
# interactive ones that take their share back by preemption (Cook's mix).
FAIR_BATCH_USERS = ("dana", "erin")
FAIR_INTERACTIVE_USERS = ("frank", "grace", "heidi")
# Every other job's owner.
USERS = ("alice", "bob", "carol")
# Every owner the generator names: a cell lists them for it in its servers' config
# ([auth.submitters] workload = [...]), as a submitter names only itself otherwise.
OWNERS = (*USERS, *FAIR_BATCH_USERS, *FAIR_INTERACTIVE_USERS)


def random_job(rng: random.Random, n: int, now: float, opts: WorkloadOptions,
               hosts: Sequence[str] = ()) -> Job:
    """Job ``n``; ``hosts``: machines a flow job's input data may be stored on (none:
    no flow job has input)."""
    draw = rng.random()
    if draw < opts.service_fraction:
        return Job(
            f"{opts.prefix}svc-{n:06}", rng.choice(USERS),
            opts.service_scheduler, rng.randint(2, 6),
            Resources.of(cpu=rng.choice([0.5, 1, 2]), mem=rng.choice([1, 2, 4])),
            kind=JobKind.SERVICE, precedence=5, constraints=Constraints(max_per_machine=1),
            duration=round(rng.uniform(20, 60), 3), submitted_at=now)
    if draw < opts.service_fraction + opts.flow_fraction:
        return _flow_job(rng, n, now, opts, hosts)
    if draw < opts.service_fraction + opts.flow_fraction + opts.mapreduce_fraction:
        return _mapreduce_job(rng, n, now, opts)
    if draw < (opts.service_fraction + opts.flow_fraction + opts.mapreduce_fraction
               + opts.fair_fraction):
        return _fair_job(rng, n, now, opts)
    return Job(
        f"{opts.prefix}batch-{n:06}", rng.choice(USERS),
        opts.batch_scheduler, rng.randint(1, 30),
        Resources.of(cpu=rng.choice([0.5, 1, 2]), mem=rng.choice([1, 2, 4])),
        kind=JobKind.BATCH, precedence=1, duration=round(rng.uniform(2, 12), 3),
        submitted_at=now)


def _flow_job(rng: random.Random, n: int, now: float, opts: WorkloadOptions,
              hosts: Sequence[str]) -> Job:
    data: tuple[tuple[str, float], ...] = ()
    blocks: tuple[tuple[Block, ...], ...] = ()
    tasks = rng.randint(1, 20)
    if hosts and rng.random() < 0.5:
        # A data set of a few blocks, each replicated on a few machines (GB there).
        where = rng.sample(list(hosts), min(len(hosts), rng.randint(1, 3)))
        data = tuple(sorted((m, float(rng.randint(1, 20))) for m in where))
        if rng.random() < 0.5:
            # Each task its own block, on one to three of the machines (Quincy gives
            # such a task a node of its own, with its own preferences).
            blocks = tuple((Block(1.0, tuple(rng.sample(where, rng.randint(1, len(where))))),)
                           for _ in range(tasks))
    return Job(
        f"{opts.prefix}flow-{n:06}", rng.choice(USERS),
        opts.flow_scheduler, tasks,
        Resources.of(cpu=rng.choice([0.5, 1]), mem=rng.choice([1, 2])),
        kind=JobKind.BATCH, precedence=1, duration=round(rng.uniform(4, 20), 3),
        submitted_at=now, input=data, task_input=blocks)


def _mapreduce_job(rng: random.Random, n: int, now: float, opts: WorkloadOptions) -> Job:
    """A few workers asked for, 5-10 map activities of 2-5 s per worker and one reduce
    per worker: 10-50 s with the workers asked for, a few seconds with every map at
    once (so growing it pays within a demo)."""
    workers = rng.choice([2, 3, 5])
    spec = MapReduceSpec(maps=workers * rng.randint(5, 10), reduces=workers,
                         map_seconds=round(rng.uniform(2, 5), 3),
                         reduce_seconds=round(rng.uniform(1, 3), 3), workers=workers,
                         max_workers=workers * 10)
    return Job(
        f"{opts.prefix}mr-{n:06}", rng.choice(USERS),
        opts.mapreduce_scheduler, workers, Resources.of(cpu=1, mem=rng.choice([1, 2])),
        kind=JobKind.MAPREDUCE, precedence=1, submitted_at=now, mapreduce=spec)


def _fair_job(rng: random.Random, n: int, now: float, opts: WorkloadOptions) -> Job:
    """One in four is a batch user's: 50-150 tasks of 2 cpus for 60-120 s (a few fill
    the demo's pool within seconds); the rest are interactive: 1-4 tasks of 3-10 s,
    ranked by their owners above the owners' earlier work."""
    if rng.random() < 0.25:
        return Job(
            f"{opts.prefix}fair-batch-{n:06}", rng.choice(FAIR_BATCH_USERS),
            opts.fair_scheduler, rng.randint(50, 150), Resources.of(cpu=2, mem=4),
            kind=JobKind.BATCH, precedence=1, duration=round(rng.uniform(60, 120), 3),
            submitted_at=now)
    return Job(
        f"{opts.prefix}fair-ia-{n:06}", rng.choice(FAIR_INTERACTIVE_USERS),
        opts.fair_scheduler, rng.randint(1, 4), Resources.of(cpu=1, mem=1),
        kind=JobKind.BATCH, precedence=1, duration=round(rng.uniform(3, 10), 3),
        submitted_at=now, priority=1)


def generate(submit: Callable[[Job], object], opts: WorkloadOptions, stop: threading.Event,
             clock: Callable[[], float] = time.time,
             on_submit: Callable[[Job], None] | None = None,
             hosts: Callable[[], Sequence[str]] = tuple) -> int:
    """Submit jobs until ``stop`` is set; returns how many were submitted. ``hosts``:
    the machines flow jobs' input may be stored on, asked before each job."""
    rng = random.Random(opts.seed)
    n = 0
    while not stop.wait(rng.expovariate(opts.jobs_per_second)):
        job = random_job(rng, n, clock(), opts, hosts())
        submit(job)
        n += 1
        if on_submit is not None:
            on_submit(job)
    return n


class CachedHosts:
    """Machine ids from ``fetch``, fetched again once ``ttl`` seconds old (a cell's
    machines register while the workload runs), or a second old while there are none."""

    def __init__(self, fetch: Callable[[], Sequence[str]], clock: Callable[[], float],
                 ttl: float = 10.0) -> None:
        self._fetch = fetch
        self._clock = clock
        self._ttl = ttl
        self._hosts: tuple[str, ...] = ()
        self._at: float | None = None

    def __call__(self) -> tuple[str, ...]:
        now = self._clock()
        age = now - self._at if self._at is not None else float("inf")
        if age >= (self._ttl if self._hosts else min(self._ttl, 1.0)):
            self._hosts = tuple(self._fetch())
            self._at = now
        return self._hosts

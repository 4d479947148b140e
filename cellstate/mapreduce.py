"""How long a MapReduce job runs: Omega §6.1's linear speedup model.

A job has ``maps`` map activities of ``map_seconds`` each and ``reduces`` reduce
activities of ``reduce_seconds`` each (means; ``cellstate.model.MapReduceSpec``). Its
workers run the map phase, then the reduce phase. With ``w`` workers a phase runs
``min(w, activities)`` activities at once, and its work (activities x seconds, in
worker-seconds) flows at that rate: an idealized linear speedup up to the point where
every activity of the phase runs in parallel, and none beyond. So with a constant
``w``::

    T(w) = maps x map_seconds / min(w, maps) + reduces x reduce_seconds / min(w, reduces)

When the number of workers changes while the job runs, the work left is what the
workers so far have not done (:class:`Progress`): workers added mid-run shorten the
rest of the job, workers taken away lengthen it. Work in flight on a worker that is
taken away is not lost (a fluid model, like the paper's). A job is done when its work
is; then all its workers end together.

Agents and the simulator run MapReduce jobs by this model (:class:`Tracker`), and the
elastic scheduler predicts with it which workers shorten jobs the most.
"""

from __future__ import annotations

import math

import attrs

from cellstate.model import MapReduceSpec

# Work left below this fraction of a phase's total is float residue, not work.
_DONE = 1e-9


def map_work(spec: MapReduceSpec) -> float:
    """Worker-seconds of the map phase."""
    return spec.maps * spec.map_seconds


def reduce_work(spec: MapReduceSpec) -> float:
    """Worker-seconds of the reduce phase."""
    return spec.reduces * spec.reduce_seconds


def job_seconds(spec: MapReduceSpec, workers: int) -> float:
    """T(w): how long the whole job takes with ``workers`` workers throughout."""
    return Progress.start(spec).seconds_left(spec, workers)


def speedup(spec: MapReduceSpec, workers: int) -> float:
    """How much sooner the job finishes with ``workers`` than with those it asked for."""
    return job_seconds(spec, spec.workers) / job_seconds(spec, workers)


def useful_workers(spec: MapReduceSpec) -> int:
    """Beyond this many workers no phase runs faster."""
    return max(spec.maps, spec.reduces)


@attrs.frozen
class Progress:
    """The work a job has left, in worker-seconds of each phase."""

    map_left: float
    reduce_left: float

    @classmethod
    def start(cls, spec: MapReduceSpec) -> Progress:
        return cls(map_work(spec), reduce_work(spec))

    def done(self, spec: MapReduceSpec) -> bool:
        return (self.map_left <= _DONE * max(map_work(spec), 1.0)
                and self.reduce_left <= _DONE * max(reduce_work(spec), 1.0))

    def seconds_left(self, spec: MapReduceSpec, workers: int) -> float:
        """How long the rest takes with ``workers`` workers (infinite with none)."""
        if self.done(spec):
            return 0.0
        if workers <= 0:
            return math.inf
        out = self.map_left / min(workers, spec.maps) if self.map_left > 0 else 0.0
        if self.reduce_left > 0:
            out += self.reduce_left / min(workers, spec.reduces)
        return out

    def after(self, spec: MapReduceSpec, workers: int, seconds: float) -> Progress:
        """The work left once ``workers`` workers have run for ``seconds``."""
        if workers <= 0 or seconds <= 0:
            return self
        map_left, reduce_left = self.map_left, self.reduce_left
        if map_left > 0:
            rate = min(workers, spec.maps)
            if map_left >= seconds * rate:
                return Progress(map_left - seconds * rate, reduce_left)
            seconds -= map_left / rate
            map_left = 0.0
        if reduce_left > 0:
            reduce_left = max(reduce_left - seconds * min(workers, spec.reduces), 0.0)
        return Progress(map_left, reduce_left)

    def fraction_done(self, spec: MapReduceSpec) -> float:
        total = map_work(spec) + reduce_work(spec)
        return 1.0 - (self.map_left + self.reduce_left) / total if total else 1.0


@attrs.define
class _Run:
    spec: MapReduceSpec
    progress: Progress
    workers: int
    since: float  # when ``progress`` was last brought up to date
    started: float  # when the job first had a worker


class Tracker:
    """Follows MapReduce jobs' running workers over time and says when each is done.

    Feed it every change of a job's worker count (:meth:`workers`, with the time it
    happened); it integrates the work done between changes. A job it first hears of
    starts with all its work left."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}

    def workers(self, job: str, spec: MapReduceSpec, count: int, now: float) -> None:
        """Job ``job`` runs ``count`` workers from ``now`` on."""
        run = self._runs.get(job)
        if run is None:
            if count <= 0:
                return
            self._runs[job] = _Run(spec, Progress.start(spec), count, now, now)
            return
        run.progress = run.progress.after(run.spec, run.workers, now - run.since)
        run.since = now
        run.workers = count

    def tracks(self, job: str) -> bool:
        return job in self._runs

    def running(self, job: str) -> int:
        run = self._runs.get(job)
        return run.workers if run is not None else 0

    def done_at(self, job: str) -> float:
        """When the job's work is done at its current number of workers (infinite
        while it has none)."""
        run = self._runs[job]
        return run.since + run.progress.seconds_left(run.spec, run.workers)

    def progress(self, job: str, now: float) -> Progress:
        run = self._runs[job]
        return run.progress.after(run.spec, run.workers, now - run.since)

    def started(self, job: str) -> float:
        return self._runs[job].started

    def forget(self, job: str) -> None:
        self._runs.pop(job, None)

    def jobs(self) -> list[str]:
        return list(self._runs)

"""MapReduce jobs in the simulator: they run by the linear speedup model.

A MapReduce job has no fixed duration. Whenever the number of its workers running
changes (a commit placed some, another scheduler evicted some), the job's work is
brought up to date (``cellstate.mapreduce.Tracker``, the model the node agents run
too) and its completion is scheduled again for when the work left is done at the new
count. At completion every worker still running ends FINISHED in one write.

Measured per job done (Omega §6.2): the speedup, the model's run time with the workers
it asked for over the time it took from its first worker's start to its end (1 for a
job that never had more or fewer workers than it asked for; below 1 when requested
workers waited); the most workers it had, over those it asked for.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from cellstate import mapreduce as model
from cellstate.mapreduce import Tracker
from cellstate.model import Job, TaskState, task_id
from simulator.cell import SimCell
from simulator.engine import END, Event, EventLoop
from simulator.recorder import Recorder, quantiles

# A job "benefits" when it finishes at least this much sooner than with what it asked.
BENEFIT = 1.01


class MapReduceRuns:
    """The running MapReduce jobs of one simulation. ``done(job, released)`` is called
    when a job completes, with the tasks its completion released."""

    def __init__(self, loop: EventLoop, cell: SimCell, recorder: Recorder,
                 done: Callable[[Job, list[str]], None]) -> None:
        self.loop = loop
        self.cell = cell
        self.recorder = recorder
        self.done = done
        self.tracker = Tracker()
        self._events: dict[str, Event] = {}
        self._peak: dict[str, int] = {}
        self.finished: set[str] = set()  # completed, not yet forgotten by the simulation
        self.speedups: list[float] = []
        self.grown = 0  # jobs done that had more workers than they asked for at some point

    def workers(self, job: Job, running: int) -> None:
        """Job ``job`` runs ``running`` workers from now on."""
        spec = job.mapreduce
        if spec is None or job.id in self.finished:
            return
        now = self.loop.now
        self.tracker.workers(job.id, spec, running, now)
        if not self.tracker.tracks(job.id):
            return
        self._peak[job.id] = max(self._peak.get(job.id, 0), running)
        old = self._events.pop(job.id, None)
        if old is not None:
            old.cancel()
        at = self.tracker.done_at(job.id)
        if at != float("inf"):
            self._events[job.id] = self.loop.at(max(at, now), END,
                                                lambda: self._complete(job))

    def _complete(self, job: Job) -> None:
        spec = job.mapreduce
        assert spec is not None
        self._events.pop(job.id, None)
        now = self.loop.now
        took = now - self.tracker.started(job.id)
        speedup = model.job_seconds(spec, spec.workers) / took if took > 0 else 1.0
        peak = self._peak.pop(job.id, spec.workers)
        self.tracker.forget(job.id)
        self.finished.add(job.id)
        self.speedups.append(speedup)
        self.recorder.value("mapreduce_speedup", speedup)
        self.recorder.value("mapreduce_workers_over_requested", peak / spec.workers)
        if peak > spec.workers:
            self.grown += 1
        current = self.cell.snapshot().jobs.get(job.id, job)  # grown since submitted
        tids = [task_id(job.id, i) for i in range(current.task_count)]
        released = self.cell.release_tasks(tids, TaskState.FINISHED)
        self.done(job, released)

    def forget(self, job_id: str) -> None:
        self.finished.discard(job_id)

    def summary(self, utilization: Sequence[tuple[float, float, float]]) -> dict[str, Any]:
        s = self.speedups
        q = quantiles(s)
        out: dict[str, Any] = {
            "mapreduce_jobs_done": len(s),
            "mapreduce_jobs_grown": self.grown,
            "mapreduce_benefit_fraction": sum(x >= BENEFIT for x in s) / len(s) if s else 0.0,
            "mapreduce_speedup_mean": statistics.fmean(s) if s else 0.0,
        }
        for p in (50, 80, 90):
            out[f"mapreduce_speedup_p{p}"] = q[p] if q else 0.0
        # How much utilization varies over the run (Fig. 16): the spread of the samples.
        for i, name in ((1, "cpu"), (2, "mem")):
            values = [u[i] for u in utilization]
            out[f"{name}_utilization_stdev"] = statistics.pstdev(values) if values else 0.0
        return out

"""Driving a real scheduler instance on virtual time.

An attempt is the runtime's ``decide()`` (snapshot and policy) at time t, then its
``finish()`` (commit and handle the result) at t + decision time, as in Omega's
simulator: the scheduler decides on a copy of the cell taken when it started, and
anything other schedulers commit meanwhile can conflict with its claims. An instance
decides one attempt at a time; between attempts it sleeps until its next retry is due
or until new work arrives (``poke``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from cellstate.model import CommitResult, Job
from schedulers.api import Plan
from schedulers.runtime import Attempt, SchedulerInstance
from simulator.config import SchedulerSpec
from simulator.engine import COMMIT, WAKE, Event, EventLoop
from simulator.recorder import Recorder

Committed = Callable[[Attempt, dict[str, CommitResult]], None]


def decision_cost(spec: SchedulerSpec) -> Callable[[Sequence[Job], Plan, float], float]:
    """The runtime's ``decision_cost`` hook for ``spec``: Omega's model
    t_job + t_task x tasks, where tasks are those the attempt tried to place (placed
    plus reported unplaced), or the measured time when the spec asks for it."""

    def cost(jobs: Sequence[Job], plan: Plan, measured: float) -> float:
        if spec.measured:
            return measured * spec.measured_scale
        total = 0.0
        for job in jobs:
            tasks = sum(1 for c in plan.claims if c.job == job.id)
            tasks += sum(u.tasks for u in plan.unplaced if u.job == job.id)
            total += spec.decision_for(job.kind).of(tasks)
        return total

    return cost


class InstanceDriver:
    def __init__(self, loop: EventLoop, recorder: Recorder, inst: SchedulerInstance,
                 committed: Committed) -> None:
        self.loop = loop
        self.recorder = recorder
        self.inst = inst
        self.committed = committed
        self.busy = False
        self._wake_event: Event | None = None

    @property
    def name(self) -> str:
        return self.inst.scheduler

    def poke(self) -> None:
        """New work may be there: decide now unless busy deciding."""
        if self.busy:
            return
        if self._wake_event is not None:
            if self._wake_event.time <= self.loop.now:
                return
            self._wake_event.cancel()
        self._wake_event = self.loop.at(self.loop.now, WAKE, self._wake)

    def _wake(self) -> None:
        self._wake_event = None
        if self.busy:
            # A poke during the attempt that is now committing (a preemption it made
            # woke its own scheduler): the commit decides next anyway.
            return
        result = self.inst.decide()
        if isinstance(result, Attempt):
            self.busy = True
            self.recorder.started(result.jobs, result.started_at)
            self.loop.after(result.cost, COMMIT, lambda: self._commit(result))
        elif math.isfinite(result):
            self._wake_event = self.loop.after(result, WAKE, self._wake)

    def _commit(self, attempt: Attempt) -> None:
        results = self.inst.finish(attempt)
        self.busy = False
        self.recorder.attempt(self.name, attempt.started_at, attempt.cost, results)
        self.committed(attempt, results)
        if self._wake_event is not None:
            # Poked by its own commit (it preempted its own tasks): it decides now anyway.
            self._wake_event.cancel()
            self._wake_event = None
        self._wake()

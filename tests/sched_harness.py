"""A single-threaded harness that steps scheduler instances over the memory store on a
virtual clock: deterministic, fast, and the same runtime code as in production."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import attrs

from cellstate.cell import CellSnapshot, task_view
from cellstate.kv.memory import MemoryKV
from cellstate.model import Job, JobState, TaskState
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.api import Policy
from schedulers.runtime import RuntimeConfig, SchedulerInstance


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, kv: MemoryKV | None = None, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.kv = kv or MemoryKV(clock=self.clock)
        self.admin = CellStore(self.kv)
        self.instances: list[SchedulerInstance] = []
        self._replicas: list[Replica] = []

    def add(self, policy: Policy, instance: str = "0", scheduler: str | None = None,
            config: RuntimeConfig | None = None, seed: int = 0) -> SchedulerInstance:
        replica = Replica(self.kv, clock=self.clock)
        replica.load()
        inst = SchedulerInstance(policy, CellStore(self.kv), replica, scheduler=scheduler,
                                 instance=instance, clock=self.clock,
                                 rng=random.Random(seed), config=config)
        inst.start()
        self.instances.append(inst)
        self._replicas.append(replica)
        return inst

    def attach(self, inst: SchedulerInstance, replica: Replica) -> None:
        """Step an instance built elsewhere (e.g. over a recording store)."""
        inst.start()
        self.instances.append(inst)
        self._replicas.append(replica)

    def remove(self, inst: SchedulerInstance) -> None:
        i = self.instances.index(inst)
        inst.stop()
        self.instances.pop(i)
        self._replicas.pop(i).stop()

    def submit(self, jobs: Iterable[Job]) -> None:
        """Submit now (jobs without a submission time get the virtual clock's)."""
        for j in jobs:
            stamped = j if j.submitted_at else attrs.evolve(j, submitted_at=self.clock())
            self.admin.submit_job(stamped)

    def pump(self) -> None:
        for r in self._replicas:
            while r.pump(timeout=0):
                pass

    def run(self, until: Callable[[CellSnapshot], bool], max_steps: int = 10_000,
            max_time: float = 100_000.0, each_step: Callable[[int], None] | None = None) -> int:
        """Step every instance in turn; advance the clock when all wait. Returns steps."""
        start = self.clock.now
        for n in range(max_steps):
            self.pump()
            snap = self.admin.read_snapshot()
            if until(snap):
                return n
            if each_step:
                each_step(n)
            delays = [inst.step() for inst in self.instances]
            if delays and min(delays) > 0:
                self.clock.now += min(delays)
            if self.clock.now - start > max_time:
                break
        raise AssertionError(f"not done after {max_steps} steps / {self.clock.now - start:.0f} s")


def settled(snap: CellSnapshot) -> bool:
    """Every job fully placed (or ended) or abandoned."""
    for job in snap.jobs.values():
        status = snap.statuses.get(job.id)
        if status is not None and status.state is JobState.ABANDONED:
            continue
        for i in range(job.task_count):
            if task_view(snap, f"{job.id}/{i}").state not in (
                    TaskState.RUNNING, TaskState.FINISHED, TaskState.FAILED):
                return False
    return True

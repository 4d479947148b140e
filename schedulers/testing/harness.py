"""Step scheduler instances over an in-memory cell on a virtual clock.

Single-threaded and deterministic: the real runtime (``SchedulerInstance``), the real
store and the real replica, over :class:`~cellstate.kv.memory.MemoryKV` (a full KV
backend with etcd's revision and watch semantics, not a mock). Each instance commits
through its own :class:`RecordingCommitter`, so a test can read what was sent and make
commits fail on demand.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import attrs

from cellstate.cell import CellSnapshot, task_view
from cellstate.kv.memory import MemoryKV
from cellstate.model import Job, JobState, TaskState, task_id
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.api import Policy
from schedulers.runtime import Committer, RuntimeConfig, SchedulerInstance, follow_source
from schedulers.testing.committer import RecordingCommitter


class Clock:
    """A clock that moves only when told (``clock.now += 5``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    """A cell in memory, the instances stepping over it, and one clock for all.

    ``admin`` is a store handle for the test's own writes (machines, jobs, claims of
    other schedulers); they reach the instances through their replicas, as in a real
    cell."""

    def __init__(self, kv: MemoryKV | None = None, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.kv = kv or MemoryKV(clock=self.clock)
        self.admin = CellStore(self.kv, clock=self.clock)
        self.instances: list[SchedulerInstance] = []
        self._replicas: list[Replica] = []

    def add(self, policy: Policy, instance: str = "0", scheduler: str | None = None,
            config: RuntimeConfig | None = None, seed: int = 0) -> SchedulerInstance:
        """Start an instance of ``policy`` (named ``scheduler``, by default the policy's
        name) committing through a new :class:`RecordingCommitter`."""
        replica = Replica(self.kv, clock=self.clock)
        replica.load()
        store = CellStore(self.kv, clock=self.clock)
        follow_source(store, replica)  # as the runtime does for a store of its own
        inst = SchedulerInstance(policy, RecordingCommitter(store), replica,
                                 scheduler=scheduler, instance=instance, clock=self.clock,
                                 rng=random.Random(seed), config=config)
        self.attach(inst, replica)
        return inst

    def attach(self, inst: SchedulerInstance, replica: Replica) -> None:
        """Step an instance built elsewhere (e.g. over a store of the test's own)."""
        inst.start()
        self.instances.append(inst)
        self._replicas.append(replica)

    def remove(self, inst: SchedulerInstance) -> None:
        """Stop an instance (its registration goes at once; the others take its jobs)."""
        i = self.instances.index(inst)
        inst.stop()
        self.instances.pop(i)
        self._replicas.pop(i).stop()

    @staticmethod
    def committer(inst: SchedulerInstance) -> RecordingCommitter:
        """The committer an instance made by :meth:`add` commits through."""
        store: Committer = inst.store
        if not isinstance(store, RecordingCommitter):
            raise TypeError(f"instance {inst.scheduler}/{inst.instance} commits through "
                            f"{type(store).__name__}, not the harness's RecordingCommitter")
        return store

    def submit(self, jobs: Iterable[Job]) -> None:
        """Submit now (jobs without a submission time get the virtual clock's)."""
        for j in jobs:
            stamped = j if j.submitted_at else attrs.evolve(j, submitted_at=self.clock())
            self.admin.submit_job(stamped)

    def pump(self) -> None:
        """Deliver every pending change to every replica."""
        for r in self._replicas:
            while r.pump(timeout=0):
                pass

    def snapshot(self) -> CellSnapshot:
        """The cell as the store has it now (read straight from the backend)."""
        return self.admin.read_snapshot()

    def machines_of(self, job_id: str) -> list[str]:
        """The machine of each of the job's tasks, in task order ("" where none)."""
        snap = self.snapshot()
        job = snap.jobs[job_id]
        return [task_view(snap, task_id(job_id, i)).machine for i in range(job.task_count)]

    def run(self, until: Callable[[CellSnapshot], bool], max_steps: int = 10_000,
            max_time: float = 100_000.0, each_step: Callable[[int], None] | None = None) -> int:
        """Step every instance in turn until ``until(snapshot)`` holds, moving the clock
        on to the earliest wake-up whenever every instance waits. Returns the steps
        taken; raises AssertionError when ``max_steps`` or ``max_time`` (virtual
        seconds) run out first."""
        start = self.clock.now
        for n in range(max_steps):
            self.pump()
            if until(self.snapshot()):
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
            if task_view(snap, task_id(job.id, i)).state not in (
                    TaskState.RUNNING, TaskState.FINISHED, TaskState.FAILED):
                return False
    return True

"""The local demo cluster: an embedded etcd, a cell of machines, a workload, and the
batch and service schedulers placing it through the store, with a live summary.

Today the schedulers run as threads of this process, each with its own replica and
store handle (exactly what a scheduler process has); the separate scheduler, server
and agent processes replace them as they land (README, "What works today"). Tasks
"run" for their job's declared duration and are then released, as an agent would.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TextIO

import attrs

from cellstate.cell import CellSnapshot, machine_used
from cellstate.etcd_launcher import LocalEtcd
from cellstate.gc_tuning import tune_for_large_heap
from cellstate.invariants import violations
from cellstate.kv.etcd import EtcdKV
from cellstate.model import (
    Constraints,
    Job,
    JobKind,
    Machine,
    Resources,
    TaskState,
)
from cellstate.replica import Replica
from cellstate.store import CellStore, StoreError
from schedulers.registry import Registry
from schedulers.runtime import RuntimeConfig, SchedulerInstance

CELL = "demo"


@attrs.frozen
class DemoOptions:
    duration: float = 30.0
    machines: int = 300
    batch_instances: int = 2
    jobs_per_second: float = 4.0
    seed: int = 1
    no_fsync: bool = False
    data_dir: str | None = None


@attrs.define
class DemoStats:
    jobs: int = 0
    finished: int = 0
    placed: int = 0
    conflicts: int = 0
    abandoned: int = 0


def demo_machines(n: int) -> list[Machine]:
    """Racks of 20 machines, failure domains of 5 racks, two machine shapes."""
    out = []
    for i in range(n):
        big = i % 4 == 0
        out.append(Machine(
            f"m{i:05}",
            Resources.of(cpu=32 if big else 16, mem=128 if big else 64),
            rack=f"r{i // 20:03}",
            failure_domain=f"fd{i // 100:02}",
        ))
    return out


def random_job(rng: random.Random, n: int, now: float) -> Job:
    service = rng.random() < 0.2
    return Job(
        f"{'svc' if service else 'batch'}-{n:06}",
        rng.choice(["alice", "bob", "carol"]),
        "service" if service else "batch",
        rng.randint(2, 6) if service else rng.randint(1, 30),
        Resources.of(cpu=rng.choice([0.5, 1, 2]), mem=rng.choice([1, 2, 4])),
        kind=JobKind.SERVICE if service else JobKind.BATCH,
        precedence=5 if service else 1,
        constraints=Constraints(max_per_machine=1) if service else Constraints(),
        duration=rng.uniform(20, 60) if service else rng.uniform(2, 12),
        submitted_at=now,
    )


class Demo:
    def __init__(self, opts: DemoOptions, out: TextIO, clock: Callable[[], float] = time.time):
        self.opts = opts
        self.out = out
        self.clock = clock
        self.stats = DemoStats()
        self.stop = threading.Event()
        self._closers: list[Callable[[], None]] = []

    def run(self) -> DemoStats:
        o = self.opts
        with LocalEtcd(o.data_dir, unsafe_no_fsync=o.no_fsync) as etcd:
            print(f"etcd {etcd.version} at {etcd.endpoint} ({etcd.binary})", file=self.out)
            try:
                return self._run(etcd.endpoint)
            finally:
                self.stop.set()
                for close in reversed(self._closers):
                    close()

    def _kv(self, endpoint: str) -> EtcdKV:
        kv = EtcdKV([endpoint])
        self._closers.append(kv.close)
        return kv

    def _replica(self, endpoint: str) -> Replica:
        replica = Replica(self._kv(endpoint), CELL).start()
        self._closers.append(replica.stop)
        return replica

    def _run(self, endpoint: str) -> DemoStats:
        o = self.opts
        admin = CellStore(self._kv(endpoint), CELL)
        admin.add_machines(demo_machines(o.machines))
        registry = Registry.from_entry_points()
        config = RuntimeConfig(retry_delay=0.5, max_retry_delay=5.0)
        instances: list[SchedulerInstance] = []
        plan = [("batch", f"b{i}") for i in range(o.batch_instances)] + [("service", "s0")]
        for n, (name, inst_id) in enumerate(plan):
            replica = self._replica(endpoint)
            inst = SchedulerInstance(registry.create(name), CellStore(self._kv(endpoint), CELL),
                                     replica, instance=inst_id, clock=self.clock,
                                     rng=random.Random(o.seed * 100 + n), config=config)
            inst.start()
            self._closers.append(inst.stop)
            instances.append(inst)
        watcher = self._replica(endpoint)
        tune_for_large_heap()
        threads = [threading.Thread(target=self._workload, args=(admin,), daemon=True),
                   threading.Thread(target=self._finisher,
                                    args=(CellStore(self._kv(endpoint), CELL), watcher),
                                    daemon=True)]
        threads += [threading.Thread(target=i.run, args=(self.stop,), daemon=True)
                    for i in instances]
        for t in threads:
            t.start()
        deadline = self.clock() + o.duration
        try:
            while self.clock() < deadline and not self.stop.is_set():
                self.stop.wait(1.0)
                self._print(watcher.snapshot(), instances)
        except KeyboardInterrupt:
            print("interrupted", file=self.out)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=10)
        final = admin.read_snapshot()
        self._tally(final, instances)
        problems = violations(final)
        s = self.stats
        print(f"done: {s.jobs} jobs, {s.placed} tasks placed, {s.conflicts} conflicted "
              f"transactions, {s.finished} finished, {s.abandoned} abandoned; invariants "
              f"{'hold' if not problems else 'BROKEN: ' + '; '.join(problems[:3])}",
              file=self.out)
        for inst in instances:
            m = inst.metrics.summary(self.clock())
            print(f"  {inst.scheduler}/{inst.instance}: {m['tasks_placed']} tasks placed, "
                  f"wait mean {m['wait_mean_s']:.2f} s (p90 {m['wait_p90_s']:.2f} s), "
                  f"busyness {100 * m['busyness']:.1f}%, conflict fraction "
                  f"{m['conflict_fraction']:.2f}", file=self.out)
        return s

    def _tally(self, snap: CellSnapshot, instances: list[SchedulerInstance]) -> None:
        self.stats.placed = sum(i.metrics.tasks_placed for i in instances)
        self.stats.conflicts = sum(i.metrics.conflicted for i in instances)
        self.stats.abandoned = len(snap.statuses)

    def _workload(self, store: CellStore) -> None:
        rng = random.Random(self.opts.seed)
        n = 0
        while not self.stop.wait(rng.expovariate(self.opts.jobs_per_second)):
            store.submit_job(random_job(rng, n, self.clock()))
            n += 1
            self.stats.jobs += 1

    def _finisher(self, store: CellStore, replica: Replica) -> None:
        """Stands in for node agents: a task ends when its job's duration has passed
        since it was first seen running."""
        started: dict[str, float] = {}
        while not self.stop.wait(0.2):
            snap = replica.snapshot()
            now = self.clock()
            for m in snap.machines.values():
                for a in m.allocations.values():
                    started.setdefault(a.task, now)
                    job = snap.jobs.get(a.job)
                    if job and job.duration is not None and now - started[a.task] >= job.duration:
                        try:
                            store.release_task(a.task, TaskState.FINISHED)
                            self.stats.finished += 1
                        except StoreError:
                            pass  # preempted or lost meanwhile
                        started.pop(a.task, None)

    def _print(self, snap: CellSnapshot, instances: list[SchedulerInstance]) -> None:
        cap = sum(m.capacity.get("cpu") for m in snap.machines.values()) or 1.0
        used = sum(machine_used(m, snap.gangs).get("cpu") for m in snap.machines.values())
        running = sum(len(m.allocations) for m in snap.machines.values())
        per = "  ".join(
            f"{i.scheduler}/{i.instance} {i.metrics.tasks_placed}p {i.metrics.conflicted}c "
            f"{100 * i.metrics.busyness(self.clock()):.0f}%b" for i in instances)
        print(f"[rev {snap.revision:>7}] jobs {self.stats.jobs:>5}  running {running:>5}  "
              f"finished {self.stats.finished:>6}  cpu {100 * used / cap:5.1f}%  | {per}",
              file=self.out, flush=True)


def run_demo(opts: DemoOptions, out: TextIO) -> DemoStats:
    return Demo(opts, out).run()

"""The local demo cluster: an embedded etcd, a cell of machines, a workload and
committers that place it through the store, with a live summary.

Today the committers are a built-in randomized first fit (Omega §4's batch policy) run
as threads; the scheduler runtime and the separate scheduler, server and agent
processes replace them as they land (see README, "What works today").
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Callable
from typing import TextIO

import attrs

from cellstate.cell import CellSnapshot, machine_used, task_view
from cellstate.etcd_launcher import LocalEtcd
from cellstate.invariants import violations
from cellstate.kv.etcd import EtcdKV
from cellstate.model import (
    Claim,
    Constraints,
    Job,
    JobKind,
    Machine,
    Resources,
    TaskState,
    Transaction,
)
from cellstate.replica import Replica
from cellstate.store import CellStore, StoreError


@attrs.frozen
class DemoOptions:
    duration: float = 30.0
    machines: int = 300
    committers: int = 2
    jobs_per_second: float = 4.0
    seed: int = 1
    no_fsync: bool = False
    data_dir: str | None = None


@attrs.define
class DemoStats:
    jobs: int = 0
    commits: int = 0
    placed: int = 0
    conflicts: int = 0
    finished: int = 0


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
        "demo",
        rng.randint(1, 5) if service else rng.randint(1, 30),
        Resources.of(cpu=rng.choice([0.5, 1, 2]), mem=rng.choice([1, 2, 4])),
        kind=JobKind.SERVICE if service else JobKind.BATCH,
        precedence=5 if service else 1,
        constraints=Constraints(max_per_machine=1) if service else Constraints(),
        duration=rng.uniform(20, 60) if service else rng.uniform(2, 12),
        submitted_at=now,
    )


def first_fit(snap: CellSnapshot, job: Job, rng: random.Random, limit: int = 50) -> list[Claim]:
    """Randomized first fit: start at a random machine, take each pending task to the
    first machine it fits on, counting this decision's earlier picks."""
    machines = list(snap.machines.values())
    if not machines:
        return []
    extra: dict[str, Resources] = {}
    per_machine: dict[str, int] = {}
    claims = []
    start = rng.randrange(len(machines))
    pending = [i for i in range(job.task_count)
               if task_view(snap, f"{job.id}/{i}").state in
               (TaskState.PENDING, TaskState.LOST, TaskState.PREEMPTED)][:limit]
    for index in pending:
        for k in range(len(machines)):
            m = machines[(start + k) % len(machines)]
            cap = job.constraints.max_per_machine
            if cap and (per_machine.get(m.id, 0) + sum(
                    1 for a in m.allocations.values() if a.job == job.id)) >= cap:
                continue
            used = machine_used(m, snap.gangs) + extra.get(m.id, Resources())
            if (used + job.task_resources).fits_in(m.capacity):
                claims.append(Claim(job.id, index, m.id, m.seq))
                extra[m.id] = extra.get(m.id, Resources()) + job.task_resources
                per_machine[m.id] = per_machine.get(m.id, 0) + 1
                start = (start + k) % len(machines)
                break
    return claims


class Demo:
    def __init__(self, opts: DemoOptions, out: TextIO, clock: Callable[[], float] = time.time):
        self.opts = opts
        self.out = out
        self.clock = clock
        self.stats = DemoStats()
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> DemoStats:
        o = self.opts
        with LocalEtcd(o.data_dir, unsafe_no_fsync=o.no_fsync) as etcd:
            print(f"etcd {etcd.version} at {etcd.endpoint} ({etcd.binary})", file=self.out)
            kvs = [EtcdKV([etcd.endpoint]) for _ in range(o.committers + 3)]
            try:
                return self._run(kvs)
            finally:
                self.stop.set()
                for kv in kvs:
                    kv.close()

    def _run(self, kvs: list[EtcdKV]) -> DemoStats:
        o = self.opts
        admin = CellStore(kvs[0], "demo")
        admin.add_machines(demo_machines(o.machines))
        replica = Replica(kvs[1], "demo").start()
        threads = [threading.Thread(target=self._workload, args=(admin,), daemon=True),
                   threading.Thread(target=self._finisher, args=(CellStore(kvs[2], "demo"),
                                                                 replica), daemon=True)]
        for n in range(o.committers):
            threads.append(threading.Thread(
                target=self._committer, args=(n, CellStore(kvs[3 + n], "demo"), replica),
                daemon=True))
        for t in threads:
            t.start()
        deadline = self.clock() + o.duration
        try:
            while self.clock() < deadline and not self.stop.is_set():
                self.stop.wait(1.0)
                self._print(replica.snapshot())
        except KeyboardInterrupt:
            print("interrupted", file=self.out)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=10)
            replica.stop()
        final = admin.read_snapshot()
        problems = violations(final)
        print(f"done: {self.stats.jobs} jobs, {self.stats.placed} tasks placed in "
              f"{self.stats.commits} commits, {self.stats.conflicts} conflicts, "
              f"{self.stats.finished} finished; invariants "
              f"{'hold' if not problems else 'BROKEN: ' + '; '.join(problems[:3])}",
              file=self.out)
        return self.stats

    def _workload(self, store: CellStore) -> None:
        rng = random.Random(self.opts.seed)
        n = 0
        while not self.stop.wait(rng.expovariate(self.opts.jobs_per_second)):
            store.submit_job(random_job(rng, n, self.clock()))
            n += 1
            with self._lock:
                self.stats.jobs += 1

    def _committer(self, n: int, store: CellStore, replica: Replica) -> None:
        rng = random.Random(self.opts.seed * 1000 + n)
        while not self.stop.is_set():
            snap = replica.snapshot()
            mine = [j for j in snap.jobs.values()
                    if zlib.crc32(j.id.encode()) % self.opts.committers == n]
            rng.shuffle(mine)
            did = False
            for job in mine[:20]:
                claims = first_fit(snap, job, rng)
                if not claims:
                    continue
                res = store.commit(Transaction("demo", tuple(claims)))
                did = True
                with self._lock:
                    self.stats.commits += 1
                    self.stats.placed += len(res.committed)
                    self.stats.conflicts += len(res.rejected)
                replica.wait_for(res.revision, timeout=2)
                snap = replica.snapshot()
            if not did:
                self.stop.wait(0.1)

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
                            with self._lock:
                                self.stats.finished += 1
                        except StoreError:
                            pass  # preempted or lost meanwhile
                        started.pop(a.task, None)

    def _print(self, snap: CellSnapshot) -> None:
        cap = sum(m.capacity.get("cpu") for m in snap.machines.values()) or 1.0
        used = sum(machine_used(m, snap.gangs).get("cpu") for m in snap.machines.values())
        running = sum(len(m.allocations) for m in snap.machines.values())
        s = self.stats
        print(f"[rev {snap.revision:>7}] jobs {s.jobs:>5}  running tasks {running:>5}  "
              f"finished {s.finished:>6}  cpu util {100 * used / cap:5.1f}%  commits "
              f"{s.commits:>6}  conflicts {s.conflicts:>4}", file=self.out, flush=True)


def run_demo(opts: DemoOptions, out: TextIO) -> DemoStats:
    return Demo(opts, out).run()

"""Cost of one growth round (``propose``) of the mapreduce scheduler (issue 12): 10,000
machines, 1,000 running MapReduce jobs.

The cell is Omega's example (MACHINES machines of 4 CPUs and 16 GB). Long-running
tasks of other schedulers fill BACKGROUND of it; then 1,000 MapReduce jobs run,
asking for 5, 11 or 200 workers (weights 50:48:2, the paper's common values below
1,000), each with 8 map activities per worker, and each already grown by up to as
many extra workers as it asked for (a cell the scheduler has been growing for a
while). What is left free is what a round can hand out.

Each round is the runtime's own: ``decide()`` (snapshot, the policy's ``propose``)
then ``finish()`` (the resizes and one incremental transaction per grown job through
``commit_many``), over the memory store (the store's real validation and commit code;
no etcd) with a replica following it. Round 1 is the instance's first look at the
cell (the runtime reads every job once); before each later round 2% of the running
workers end, as they would between rounds.

    python benchmarks/mapreduce_propose.py [--machines 10000] [--jobs 1000]
        [--background 0.4,0.5] [--policies max-parallel,global-cap,relative-size]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from cellstate.cell import task_view
from cellstate.gc_tuning import tune_for_large_heap
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Claim,
    Job,
    JobKind,
    Machine,
    MapReduceSpec,
    Resources,
    TaskState,
    Transaction,
)
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.mapreduce import MapReducePolicy
from schedulers.runtime import Attempt, RuntimeConfig, SchedulerInstance

CPU, MEM = 4, 16
WORKER = Resources.of(cpu=1, mem=2)


def build(machines: int, jobs: int, background: float, rng: random.Random
          ) -> tuple[CellStore, Replica, list[str]]:
    kv = MemoryKV()
    store = CellStore(kv)
    ids = [f"m{i:05}" for i in range(machines)]
    store.add_machines([Machine(mid, Resources.of(cpu=CPU, mem=MEM), rack=f"r{i // 40:03}")
                        for i, mid in enumerate(ids)])
    slots = [mid for _ in range(CPU) for mid in ids]  # one entry per free cpu, spread
    rng.shuffle(slots)
    at = 0
    # Background: long-running tasks of another scheduler, in jobs of 100.
    other = round(background * len(slots))
    txns: list[Transaction] = []
    for j in range(0, other, 100):
        n = min(100, other - j)
        job = Job(f"bg{j // 100:05}", "bench", "batch", n, WORKER)
        store.submit_job(job)
        txns.append(Transaction("batch", tuple(Claim(job.id, i, slots[at + i])
                                               for i in range(n)), job=job.id))
        at += n
    _commit(store, txns)
    txns = []
    running: list[str] = []
    for j in range(jobs):
        workers = rng.choices([5, 11, 200], [50, 48, 2])[0]
        extra = rng.randint(0, workers)
        if at + workers + extra > len(slots):
            break
        spec = MapReduceSpec(8 * workers, workers, 30.0, 60.0, workers, 8 * workers)
        job = Job(f"mr{j:05}", "bench", "mapreduce", workers, WORKER,
                  kind=JobKind.MAPREDUCE, mapreduce=spec)
        store.submit_job(job)
        if extra:
            store.resize_job(job.id, workers + extra)
        claims = tuple(Claim(job.id, i, slots[at + i]) for i in range(workers + extra))
        running.extend(c.task for c in claims)
        at += workers + extra
        txns.append(Transaction("mapreduce", claims, job=job.id))
        if len(txns) >= 200:
            _commit(store, txns)
            txns = []
    _commit(store, txns)
    replica = Replica(kv)
    replica.load()
    return store, replica, running


def _commit(store: CellStore, txns: list[Transaction]) -> None:
    if txns:
        for res in store.commit_many(txns):
            assert res.ok, res.rejected[:1]


def pump(replica: Replica) -> None:
    while replica.pump(timeout=0):
        pass


def run(machines: int, jobs: int, background: float, policy: str, rounds: int,
        seed: int = 7) -> list[dict[str, float]]:
    rng = random.Random(seed)
    store, replica, running = build(machines, jobs, background, rng)
    clock = [1000.0]
    inst = SchedulerInstance(MapReducePolicy(policy=policy, interval=10.0), store, replica,
                             scheduler="mapreduce", instance="bench", clock=lambda: clock[0],
                             rng=random.Random(seed), config=RuntimeConfig(lease_ttl=10**6))
    inst.start()
    pump(replica)
    out = []
    for r in range(rounds):
        if r:
            # Between rounds 2% of the running workers end (their jobs' work, say).
            rng.shuffle(running)
            n = len(running) // 50
            snap = replica.snapshot()
            for tid in running[:n]:
                if task_view(snap, tid).state is TaskState.RUNNING:
                    store.release_task(tid, TaskState.FAILED)
            del running[:n]
            pump(replica)
        clock[0] += 10.0
        t0 = time.perf_counter()
        attempt = inst.decide()
        t1 = time.perf_counter()
        assert isinstance(attempt, Attempt) and attempt.jobs == ()
        results = inst.finish(attempt)
        t2 = time.perf_counter()
        pump(replica)
        committed = sum(len(res.committed) for res in results.values())
        running.extend(c.task for res in results.values() for c in res.committed)
        report = inst.policy.report()
        out.append({"round": r + 1, "decide_ms": (t1 - t0) * 1000,
                    "propose_ms": float(report["last_round_ms"]),
                    "commit_ms": (t2 - t1) * 1000, "added": committed,
                    "resized": len(attempt.plan.resize), "jobs": report["jobs_running"],
                    "utilization": float(report["utilization"])})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machines", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=1_000)
    p.add_argument("--background", default="0.4,0.5")
    p.add_argument("--policies", default="max-parallel,global-cap,relative-size")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tune_for_large_heap()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| background | policy | round | decide ms (policy's propose) | commit ms | "
          "workers added | jobs resized | MR jobs | utilization after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for background in (float(b) for b in args.background.split(",")):
        for policy in args.policies.split(","):
            rows = run(args.machines, args.jobs, background, policy, args.rounds)
            for row in rows:
                print(f"| {background:.0%} | {policy} | {row['round']:.0f} | "
                      f"{row['decide_ms']:.0f} ({row['propose_ms']:.0f}) | "
                      f"{row['commit_ms']:.0f} | {row['added']:.0f} | {row['resized']:.0f} | "
                      f"{row['jobs']:.0f} | {row['utilization']:.1%} |")
            warm = [r["propose_ms"] for r in rows[1:]] or [rows[0]["propose_ms"]]
            print(f"|  | {policy} | median of later rounds |"
                  f" ({statistics.median(warm):.0f}) | | | | | |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

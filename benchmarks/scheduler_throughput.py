"""Placement rate of the batch scheduler on a 10,000-machine cell at 60% utilization.

In process: one batch instance over the memory store, stepped in a loop (no threads).
Through etcd: 1, 2 and 4 batch instances, each its own OS process with its own
replica and store handle, sharing the queue by rendezvous hashing.

The cell is Omega's example cell (10,000 machines x 4 CPU x 16 GB), prefilled to 60%
of its CPUs with 1-CPU tasks; then JOBS batch jobs of TASKS tasks (0.5 CPU, 1 GB) are
submitted at once and the clock runs until every task is placed.

    python benchmarks/scheduler_throughput.py [--machines 10000] [--jobs 200] [--tasks 20]
                                              [--instances 1,2,4] [--no-fsync]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import threading
import time
from typing import Any

from cellstate.cell import task_view
from cellstate.gc_tuning import tune_for_large_heap
from cellstate.invariants import violations
from cellstate.kv.base import KV
from cellstate.kv.etcd import EtcdKV
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Job, Machine, Resources, TaskState, Transaction
from cellstate.replica import Replica
from cellstate.store import CellStore
from omega.etcd_launcher import LocalEtcd
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig, SchedulerInstance

CELL = "bench"
CONFIG = RuntimeConfig(retry_delay=0.2, max_retry_delay=1.0)


def prefill(store: CellStore, machines: int, utilization: float) -> None:
    """Fill the cell to ``utilization`` of its CPUs with 1-CPU tasks of an idle
    scheduler, as Omega's simulator does before it starts the clock."""
    store.add_machines([Machine(f"m{i:05}", Resources.of(cpu=4, mem=16), rack=f"r{i // 40}")
                        for i in range(machines)])
    per_machine = round(4 * utilization)
    total = machines * per_machine
    store.submit_job(Job("prefill", "bench", "prefill", total, Resources.of(cpu=1, mem=2)))
    claims = [Claim("prefill", i * per_machine + k, f"m{i:05}")
              for i in range(machines) for k in range(per_machine)]
    for start in range(0, total, 2000):
        res = store.commit(Transaction("prefill", tuple(claims[start:start + 2000])))
        assert res.ok, res.rejected[:1]


def submit(store: CellStore, jobs: int, tasks: int) -> None:
    now = time.time()
    for j in range(jobs):
        store.submit_job(Job(f"b{j:04}", "bench", "batch", tasks,
                             Resources.of(cpu=0.5, mem=1), submitted_at=now))


def all_placed(snap: Any, jobs: int, tasks: int) -> bool:
    return all(task_view(snap, f"b{j:04}/{i}").state is TaskState.RUNNING
               for j in range(jobs) for i in range(tasks))


def in_process(machines: int, jobs: int, tasks: int) -> dict[str, float]:
    kv = MemoryKV()
    admin = CellStore(kv, CELL)
    prefill(admin, machines, 0.6)
    replica = Replica(kv, CELL)
    replica.load()
    inst = SchedulerInstance(BatchPolicy(), CellStore(kv, CELL), replica, instance="0",
                             config=CONFIG, rng=random.Random(1))
    inst.start()
    tune_for_large_heap()
    submit(admin, jobs, tasks)
    t0 = time.perf_counter()
    while True:
        while replica.pump(timeout=0):
            pass
        if inst.queued() == [] and all_placed(replica.snapshot(), jobs, tasks):
            break
        delay = inst.step()
        if delay > 0:
            time.sleep(min(delay, 0.01))
    elapsed = time.perf_counter() - t0
    assert violations(replica.snapshot()) == []
    s = inst.metrics.summary(time.time())
    return {"tasks_per_s": jobs * tasks / elapsed,
            "decisions_per_s": len(inst.metrics.decision_times) / elapsed,
            "conflict_fraction": s["conflict_fraction"], "seconds": elapsed}


def _instance_main(endpoint: str, name: str, ready: Any, stop: Any, out: Any) -> None:
    kv = EtcdKV([endpoint])
    replica = Replica(EtcdKV([endpoint]), CELL).start()
    inst = SchedulerInstance(BatchPolicy(), CellStore(kv, CELL), replica, instance=name,
                             config=CONFIG, rng=random.Random(name))
    inst.start()
    tune_for_large_heap()
    ready.set()
    halt = threading.Event()
    runner = threading.Thread(target=inst.run, args=(halt,), daemon=True)
    runner.start()
    stop.wait()
    halt.set()
    runner.join(timeout=10)
    inst.stop()
    replica.stop()
    m = inst.metrics
    out.put({"decisions": len(m.decision_times), "placed": m.tasks_placed,
             "conflicted": m.conflicted, "successful": m.successful})


def through_etcd(endpoint: str, n: int, machines: int, jobs: int,
                 tasks: int) -> dict[str, float]:
    kv: KV = EtcdKV([endpoint])
    try:
        kv.txn([], [])
        from cellstate.kv.base import Delete
        kv.txn([], [Delete(b"\x00", b"\x00")])  # a fresh cell for each run
        admin = CellStore(kv, CELL)
        prefill(admin, machines, 0.6)
        ctx = mp.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        readies = [ctx.Event() for _ in range(n)]
        procs = [ctx.Process(target=_instance_main, args=(endpoint, f"i{k}", readies[k], stop,
                                                          out), daemon=True) for k in range(n)]
        try:
            for p in procs:
                p.start()
            for r in readies:
                r.wait(timeout=120)
            watcher = Replica(EtcdKV([endpoint]), CELL).start()
            time.sleep(0.5)  # every instance sees every other before the jobs arrive
            t0 = time.perf_counter()
            submit(admin, jobs, tasks)
            while not all_placed(watcher.snapshot(), jobs, tasks):
                time.sleep(0.02)
            elapsed = time.perf_counter() - t0
            assert violations(watcher.snapshot()) == []
            watcher.stop()
            stop.set()
            stats = [out.get(timeout=60) for _ in procs]
        finally:
            stop.set()
            for p in procs:
                p.join(timeout=20)
                if p.is_alive():
                    p.kill()
        decisions = sum(s["decisions"] for s in stats)
        succ = sum(s["successful"] for s in stats)
        conf = sum(s["conflicted"] for s in stats)
        return {"tasks_per_s": jobs * tasks / elapsed, "decisions_per_s": decisions / elapsed,
                "conflict_fraction": conf / succ if succ else float(conf), "seconds": elapsed}
    finally:
        kv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machines", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--instances", default="1,2,4")
    ap.add_argument("--no-fsync", action="store_true")
    args = ap.parse_args()
    rows = [("in-process, memory store, 1 instance",
             in_process(args.machines, args.jobs, args.tasks))]
    with LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True) as etcd:
        for n in (int(x) for x in args.instances.split(",")):
            rows.append((f"etcd {etcd.version}, {n} instance(s)",
                         through_etcd(etcd.endpoint, n, args.machines, args.jobs, args.tasks)))
    print(f"batch scheduler, {args.machines} machines at 60% CPU, {args.jobs} jobs x "
          f"{args.tasks} tasks (fsync {'off' if args.no_fsync else 'on'})")
    print(f"{'setup':<40}{'tasks/s':>10}{'decisions/s':>13}{'conflict frac':>15}{'s':>7}")
    for name, r in rows:
        print(f"{name:<40}{r['tasks_per_s']:>10.0f}{r['decisions_per_s']:>13.1f}"
              f"{r['conflict_fraction']:>15.3f}{r['seconds']:>7.1f}")


if __name__ == "__main__":
    main()

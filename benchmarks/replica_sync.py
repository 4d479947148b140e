"""How cheap are a replica's snapshots, and how fast does it follow a busy cell?

For a 10,000-machine cell on both backends: time to load the cell, cost of one
snapshot() (what a scheduler pays per decision), and while another store commits
batches of claims: events applied per second and the delay from a commit's return to
the replica having applied it (p50/p99).

    python benchmarks/replica_sync.py [--machines 10000] [--commits 300] [--no-fsync]
    python benchmarks/replica_sync.py --apply-cost [--machines 2000] [--commits 400]

``--apply-cost`` measures instead what following costs a process: commits of 50 claims
on machines picked at random (as commit_throughput's committers pick them) go into a
memory backend, twice ``--commits`` of them; the replica applies the first half (so
machines already hold tasks), the garbage collector is tuned as processes tune it
(``cellstate.gc_tuning``), then the replica applies the second half in one thread and
the CPU time it took is printed per commit of 50 claims (three keys each: the task's
record, its allocation, its machine's record).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from cellstate.gc_tuning import tune_for_large_heap
from cellstate.kv.base import KV
from cellstate.kv.etcd import EtcdKV
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Job, Machine, Resources, Transaction
from cellstate.replica import Replica
from cellstate.store import CellStore
from omega.etcd_launcher import LocalEtcd


def build(kv: KV, machines: int) -> CellStore:
    store = CellStore(kv, "bench")
    store.add_machines([Machine(f"m{i:05}", Resources.of(cpu=32, mem=128), rack=f"r{i // 40}")
                        for i in range(machines)])
    store.submit_job(Job("load", "bench", "batch", 1_000_000, Resources.of(cpu=0.01, mem=0.01)))
    return store


def run(name: str, kv: KV, reader_kv: KV, machines: int, commits: int) -> dict[str, float]:
    store = build(kv, machines)
    store.load()
    replica = Replica(reader_kv, "bench")
    t0 = time.perf_counter()
    replica.load()
    load_s = time.perf_counter() - t0
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        replica.snapshot()
    snap_ns = (time.perf_counter() - t0) / n * 1e9
    replica.start()
    delays: list[float] = []
    applied = threading.Event()
    task = 0
    t_start = time.perf_counter()
    for c in range(commits):
        claims = tuple(Claim("load", task + k, f"m{(c * 50 + k * 7) % machines:05}")
                       for k in range(50))
        task += 50
        res = store.commit(Transaction("batch", claims))
        done = time.perf_counter()
        replica.wait_for(res.revision, timeout=30)
        delays.append(time.perf_counter() - done)
    elapsed = time.perf_counter() - t_start
    applied.set()
    replica.stop()
    delays.sort()
    return {
        "load_ms": load_s * 1e3,
        "snapshot_ns": snap_ns,
        "machine_updates_per_s": commits * 50 / elapsed,
        "visible_p50_ms": statistics.median(delays) * 1e3,
        "visible_p99_ms": delays[int(0.99 * (len(delays) - 1))] * 1e3,
    }


def apply_cost(machines: int, commits: int, seed: int = 1) -> float:
    """CPU seconds per commit of 50 claims that a replica takes to apply (see the
    module's docstring)."""
    kv = MemoryKV()
    store = build(kv, machines)
    store.load()
    replica = Replica(kv, "bench")
    replica.load()
    rng = random.Random(seed)
    mids = sorted(store.view.machines)
    task = 0

    def commit_some(n: int) -> None:
        nonlocal task
        for _ in range(n):
            claims = tuple(Claim("load", task + k, mid, store.view.machines[mid].seq)
                           for k, mid in enumerate(rng.choices(mids, k=50)))
            task += 50
            store.commit(Transaction("batch", claims))

    commit_some(commits)
    while replica.pump():
        pass
    tune_for_large_heap()
    commit_some(commits)
    t0 = time.process_time()
    while replica.pump():
        pass
    return (time.process_time() - t0) / commits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machines", type=int, default=None,
                    help="10,000 (2,000 with --apply-cost)")
    ap.add_argument("--commits", type=int, default=None, help="300 (400 with --apply-cost)")
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--apply-cost", action="store_true",
                    help="CPU a replica spends applying commits (memory backend)")
    args = ap.parse_args()
    if args.apply_cost:
        machines = args.machines or 2_000
        commits = args.commits or 400
        if machines < 1 or commits < 1:
            ap.error("--machines and --commits must be at least 1")
        cost = apply_cost(machines, commits)
        print(f"replica of a {machines}-machine cell applying {commits} commits of 50 claims "
              f"(after {commits} applied before): {cost * 1e3:.2f} ms of CPU per commit, "
              f"{cost / 50 * 1e6:.1f} us per claim")
        return
    args.machines = args.machines or 10_000
    args.commits = args.commits or 300
    if args.machines < 1 or args.commits < 1:
        ap.error("--machines and --commits must be at least 1")
    rows = []
    mem = MemoryKV()
    rows.append(("memory", run("memory", mem, mem, args.machines, args.commits)))
    with LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True) as etcd:
        a, b = EtcdKV([etcd.endpoint]), EtcdKV([etcd.endpoint])
        try:
            rows.append((f"etcd {etcd.version}", run("etcd", a, b, args.machines, args.commits)))
        finally:
            a.close()
            b.close()
    print(f"replica of a {args.machines}-machine cell; {args.commits} commits of 50 claims "
          f"(fsync {'off' if args.no_fsync else 'on'})")
    print(f"{'backend':<12}{'load ms':>10}{'snapshot ns':>13}{'claims/s applied':>18}"
          f"{'visible p50 ms':>16}{'p99 ms':>9}")
    for name, r in rows:
        print(f"{name:<12}{r['load_ms']:>10.0f}{r['snapshot_ns']:>13.0f}"
              f"{r['machine_updates_per_s']:>18.0f}{r['visible_p50_ms']:>16.2f}"
              f"{r['visible_p99_ms']:>9.2f}")


if __name__ == "__main__":
    main()

"""How cheap are a replica's snapshots, and how fast does it follow a busy cell?

For a 10,000-machine cell on both backends: time to load the cell, cost of one
snapshot() (what a scheduler pays per decision), and while another store commits
batches of claims: events applied per second and the delay from a commit's return to
the replica having applied it (p50/p99).

    python benchmarks/replica_sync.py [--machines 10000] [--commits 300] [--no-fsync]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machines", type=int, default=10_000)
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--no-fsync", action="store_true")
    args = ap.parse_args()
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

"""How long do status calls take on a cell with one huge job?

Builds a cell (in-memory KV by default, or a local etcd) with ``--machines`` machines,
one job of ``--tasks`` tasks of which ``--placed`` are placed, and ``--small-jobs``
small jobs of 10 tasks; starts a cellstate server in this process and times, over real
gRPC, GetStatus, ListJobs, GetJob of a small job and GetJob of the huge one (which
lists every task, so it is O(that job's tasks) by its nature). Prints the median and
the worst of ``--repeat`` calls each, and how long the server took to start. Then
what keeping the status index costs the replica's thread: CPU time of its listener
per placement while ``--follow`` more placements are applied.

    python benchmarks/status_calls.py [--tasks 1000000] [--placed 20000] [--etcd]

Only public APIs are used, so the same script times an older checkout too (run it with
that checkout first on PYTHONPATH): docs/performance.md has both.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from cellstate.api.client import CellClient
from cellstate.api.config import ServerConfig
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Job, Machine, Resources, Transaction
from cellstate.store import CellStore


def build(kv: KV, machines: int, tasks: int, placed: int, small_jobs: int) -> None:
    store = CellStore(kv)
    store.add_machines([Machine(f"m{i:05}", Resources.of(cpu=64, mem=256), rack=f"r{i // 40}")
                        for i in range(machines)])
    store.submit_job(Job("huge", "bench", "batch", tasks, Resources.of(cpu=0.01, mem=0.01),
                         submitted_at=1.0))
    for j in range(small_jobs):
        store.submit_job(Job(f"small{j:04}", "bench", "batch", 10,
                             Resources.of(cpu=0.01, mem=0.01), submitted_at=2.0 + j))
    step = 100
    for start in range(0, placed, step):
        claims = tuple(Claim("huge", t, f"m{t % machines:05}")
                       for t in range(start, min(start + step, placed)))
        res = store.commit(Transaction("batch", claims))
        assert not res.rejected, res.rejected[:1]


def index_cost(kv: KV, machines: int, first: int, placements: int) -> None:
    """CPU seconds the status index spends per placement on the replica's thread."""
    try:
        from cellstate.jobinfo import StatusIndex
    except ImportError:
        print("index cost: no StatusIndex in this checkout")
        return
    from cellstate.replica import Replica

    replica = Replica(kv)
    index = StatusIndex(replica)
    spent = 0.0
    listener = index._changed

    def timed_listener(*args: Any) -> None:
        nonlocal spent
        t0 = time.process_time()
        listener(*args)
        spent += time.process_time() - t0

    replica._change_listeners = [timed_listener]  # measure it alone
    replica.load()
    spent = 0.0  # not the rebuild at load
    store = CellStore(kv)
    for start in range(first, first + placements, 50):
        store.commit(Transaction("batch", tuple(
            Claim("huge", t, f"m{(t * 7) % machines:05}") for t in range(start, start + 50))))
    target = kv.range(b"\x00", b"\x00").revision
    t0 = time.process_time()
    while replica.revision < target:
        replica.pump(timeout=1.0)
    following = time.process_time() - t0
    replica.stop()
    print(f"index cost on the replica thread: {spent / placements * 1e6:.1f} us CPU per "
          f"placement, of {following / placements * 1e6:.1f} us for following it all "
          f"({placements:,} placements in batches of 50)")


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", type=int, default=2_000)
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--placed", type=int, default=20_000)
    ap.add_argument("--small-jobs", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--follow", type=int, default=15_000)
    ap.add_argument("--etcd", action="store_true", help="a local etcd instead of memory")
    args = ap.parse_args()

    etcd = None
    if args.etcd:
        from cellstate.kv.etcd import EtcdKV
        from omega.etcd_launcher import LocalEtcd

        etcd = LocalEtcd(unsafe_no_fsync=True, quiet_version_warning=True)
        etcd.start()
        kv: KV = EtcdKV([etcd.endpoint])
    else:
        kv = MemoryKV()
    try:
        t0 = time.perf_counter()
        build(kv, args.machines, args.tasks, args.placed, args.small_jobs)
        print(f"cell: {args.machines} machines, a {args.tasks:,}-task job with "
              f"{args.placed:,} placed, {args.small_jobs} small jobs "
              f"({'etcd' if etcd else 'memory'}; built in {time.perf_counter() - t0:.1f} s)")
        t0 = time.perf_counter()
        server = CellStateServer(kv, ServerConfig(listen="127.0.0.1:0"))
        server.start()
        print(f"server start (load + indexes): {time.perf_counter() - t0:.2f} s")
        try:
            with CellClient([f"127.0.0.1:{server.port}"], timeout=120) as client:
                calls: list[tuple[str, Callable[[], Any]]] = [
                    ("GetStatus", client.status),
                    ("ListJobs", client.list_jobs),
                    ("GetJob small", lambda: client.get_job("small0000")),
                    (f"GetJob huge ({args.tasks:,} tasks listed)",
                     lambda: client.get_job("huge")),
                ]
                for name, call in calls:
                    median, worst = timed(call, args.repeat)
                    print(f"{name:<40} median {median * 1000:9.1f} ms   "
                          f"max {worst * 1000:9.1f} ms")
        finally:
            server.stop(grace=0)
        index_cost(kv, args.machines, args.placed, args.follow)
    finally:
        kv.close()
        if etcd is not None:
            etcd.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Committer CPU per commit, measured without a race for the cores.

    python benchmarks/commit_cpu.py [--committers N] [--commits N] [--batch B]
        [--profile OUT.prof] [--split-etcd]

``commit_throughput.py`` measures placements per second, which on a shared 2-core
machine depends on whatever else runs. This measures what the committers' code costs,
which does not: N stores (each with its own view, as N committer processes would have)
take turns in one process, each committing a transaction of B claims on machines
picked at random (as ``commit_throughput``'s committers pick them, incremental, fine),
against a real etcd started here. Between two commits of one store the others commit,
so its view is as stale as a busy committer's and its guards fail as they would.

Printed per store count: the committers' CPU (``time.process_time`` of this process,
which runs no etcd) per commit, etcd Txns per commit, the fraction of write Txns whose
guards failed, and the shape of the committed Txns. ``--profile`` writes a cProfile
(CPU time) of the commits.

``--split-etcd`` also says which requests etcd's CPU goes to: etcd's process CPU is read
before and after every request (the stores take turns, so no other request is in
flight; etcd's background work lands on whichever request is running), split into
read-only requests and writes, with how many allocation keys etcd went through to
answer the reads of changed allocations beside how many it returned (the same since
allocation keys name the sequence they were written at and the read is a range from the
held one on, cellstate/keys.py; before, a ``min_mod_revision`` filter made etcd read the
machine's every allocation), and the share of the machines read whose allocations had
changed. Reading /proc
per request costs this process CPU, so the committer figure of such a run is not
comparable with one without it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# Runnable as a plain script from anywhere: the repository root holds the package, and
# the cell set-up comes from the commit benchmark next to this file.
_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from commit_throughput import (  # noqa: E402
    CountingKV,
    delete_prefix,
    job_id,
    scheduler_name,
    setup_cell,
)

from cellstate.gc_tuning import tune_for_large_heap  # noqa: E402
from cellstate.kv.base import Compare, Get, GetChanged, Op, RangeResult, TxnResult  # noqa: E402
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from cellstate.model import Claim, Detection, Transaction, TxnMode  # noqa: E402
from cellstate.store import CellStore  # noqa: E402
from omega.etcd_launcher import LocalEtcd  # noqa: E402


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` used so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


class SplitKV(CountingKV):
    """A CountingKV that also measures etcd's CPU per request, read-only or writing,
    and the allocation keys etcd scanned and returned for reads of changed allocations
    (ranges from a held sequence on, or ``GetChanged``)."""

    def __init__(self, inner: EtcdKV, etcd_pid: int) -> None:
        super().__init__(inner)
        self.etcd_pid = etcd_pid

    def reset(self) -> None:
        super().reset()
        self.cpu = {"read": 0.0, "write": 0.0}
        self.calls = {"read": 0, "write": 0}
        self.scanned = self.returned = 0
        self.ranges = self.changed = 0  # changed-allocation reads, and those with changes

    def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
            ) -> TxnResult:
        kind = ("read" if not compares and not failure
                and all(type(op) in (Get, GetChanged) for op in success) else "write")
        before = process_cpu_s(self.etcd_pid)
        res = super().txn(compares, success, failure)
        self.cpu[kind] += process_cpu_s(self.etcd_pid) - before
        self.calls[kind] += 1
        for op, r in zip(success, res.responses, strict=True) if kind == "read" else ():
            if isinstance(r, RangeResult):  # GetChanged: etcd reads the whole range
                self.scanned += r.count
                self.returned += len(r.kvs)
                self.ranges += 1
                self.changed += bool(r.kvs)
            elif (type(op) is Get and op.range_end is not None and b"/allocs/" in op.key
                  and not op.key.endswith(b"/") and isinstance(r, tuple)):
                # From a held sequence on: the range spans what it returns.
                self.scanned += len(r)
                self.returned += len(r)
                self.ranges += 1
                self.changed += bool(r)
        return res


def run(kv: EtcdKV, etcd_pid: int, cell: str, committers: int, commits: int, batch: int,
        machines: int, seed: int, profile: str | None, tune_gc: bool,
        split: bool = False) -> dict[str, float]:
    setup_cell(kv, cell, machines, committers)
    countings = [SplitKV(kv, etcd_pid) if split else CountingKV(kv) for _ in range(committers)]
    stores = [CellStore(c, cell) for c in countings]
    for s in stores:
        s.load()
    rngs = [random.Random(seed + i) for i in range(committers)]
    mids = sorted(stores[0].view.machines)
    index = [0] * committers
    for c in countings:
        c.reset()
    if tune_gc:
        tune_for_large_heap()
    prof = cProfile.Profile(time.process_time) if profile else None
    attempts = committed = 0
    cpu0 = time.process_time()
    etcd0 = process_cpu_s(etcd_pid)
    if prof is not None:
        prof.enable()
    for n in range(commits * committers):
        i = n % committers
        store, view = stores[i], stores[i].view.machines
        chosen = rngs[i].choices(mids, k=batch)
        claims = tuple(Claim(job_id(i), index[i] + j, mid, view[mid].seq)
                       for j, mid in enumerate(chosen))
        index[i] += batch
        res = store.commit(Transaction(scheduler_name(i), claims, TxnMode.INCREMENTAL,
                                       Detection.FINE))
        attempts += res.attempts
        committed += len(res.committed)
    if prof is not None and profile:
        prof.disable()
        prof.dump_stats(profile)
    cpu = time.process_time() - cpu0
    etcd_cpu = process_cpu_s(etcd_pid) - etcd0
    total = commits * committers
    writes = sum(c.write_txns for c in countings)
    ok = writes - sum(c.failed_write_txns for c in countings)
    delete_prefix(kv, stores[0].keys.root)
    splits = [c for c in countings if isinstance(c, SplitKV)]
    split_figures = {
        f"etcd_{k}_ms_per_commit": 1e3 * sum(c.cpu[k] for c in splits) / total
        for k in ("read", "write")} | {
        f"etcd_ms_per_{k}": 1e3 * sum(c.cpu[k] for c in splits)
        / max(1, sum(c.calls[k] for c in splits)) for k in ("read", "write")} | {
        "scanned_per_commit": sum(c.scanned for c in splits) / total,
        "returned_per_commit": sum(c.returned for c in splits) / total,
        "changed_fraction": sum(c.changed for c in splits) / max(1, sum(c.ranges for c in splits)),
    } if splits else {}
    return split_figures | {
        "cpu_ms_per_commit": 1e3 * cpu / total,
        "etcd_ms_per_commit": 1e3 * etcd_cpu / total,
        "txns_per_commit": attempts / total,
        "write_txns_per_commit": writes / total,
        "fetch_txns_per_commit": sum(c.read_txns for c in countings) / total,
        "failed_fraction": (writes - ok) / max(1, writes),
        "placed_fraction": committed / (total * batch),
        "compares": sum(c.ok_compares for c in countings) / max(1, ok),
        "puts": sum(c.ok_puts for c in countings) / max(1, ok),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--committers", default="1,4", help="comma-separated store counts")
    ap.add_argument("--commits", type=int, default=200, help="commits per store")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--machines", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", metavar="OUT", help="cProfile (CPU time) into OUT-<n>.prof")
    ap.add_argument("--split-etcd", action="store_true",
                    help="split etcd's CPU into read-only and write requests (see above)")
    ap.add_argument("--default-gc", action="store_true",
                    help="leave the garbage collector as it is (by default it is tuned as "
                         "scheduler and server processes tune it: gc_tuning)")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.committers.split(",") if n.strip()]
    print(f"{'stores':>6} {'cpu ms/commit':>13} {'etcd ms/c':>9} {'txn/c':>6} {'writes/c':>8} "
          f"{'fetch/c':>7} {'failed%':>7} {'placed%':>7} {'cmp/Txn':>7} {'put/Txn':>7}")
    with LocalEtcd(unsafe_no_fsync=True, quiet_version_warning=True) as server:
        kv = EtcdKV([server.endpoint])
        try:
            for k, n in enumerate(counts):
                assert server.pid is not None
                r = run(kv, server.pid, f"cpu-{k}", n, args.commits, args.batch, args.machines,
                        args.seed, f"{args.profile}-{n}.prof" if args.profile else None,
                        not args.default_gc, args.split_etcd)
                print(f"{n:>6} {r['cpu_ms_per_commit']:>13.2f} {r['etcd_ms_per_commit']:>9.2f} "
                      f"{r['txns_per_commit']:>6.2f} "
                      f"{r['write_txns_per_commit']:>8.2f} {r['fetch_txns_per_commit']:>7.2f} "
                      f"{100 * r['failed_fraction']:>7.1f} {100 * r['placed_fraction']:>7.1f} "
                      f"{r['compares']:>7.0f} {r['puts']:>7.0f}", flush=True)
                if args.split_etcd:
                    print(f"{'':>6} etcd: reads {r['etcd_read_ms_per_commit']:.2f} ms/commit "
                          f"({r['etcd_ms_per_read']:.2f} per read), writes "
                          f"{r['etcd_write_ms_per_commit']:.2f} ms/commit "
                          f"({r['etcd_ms_per_write']:.2f} per write); allocation keys "
                          f"etcd went through for changed-allocation reads "
                          f"{r['scanned_per_commit']:.0f}/commit, returned "
                          f"{r['returned_per_commit']:.0f}; machines read with changed "
                          f"allocations {100 * r['changed_fraction']:.0f}%", flush=True)
        finally:
            kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

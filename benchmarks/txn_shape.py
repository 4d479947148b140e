#!/usr/bin/env python
"""What each part of the store's commit transaction costs etcd.

    python benchmarks/txn_shape.py [--seconds 6] [--rounds 2] [--no-fsync]

``commit_throughput.py`` compares the store with the raw baseline: the smallest etcd
transaction Omega's semantics need for B claims (per machine a compare of its key's
mod_revision and a put of its small record, per task a put of its record). The
store's committed transaction has two more parts: a compare per task (its record must
still be absent: two instances must not place one task) and a put per task of its
allocation key (``cellstate/keys.py``: what a reader of the machine learns its
allocations from). This sends, from one process to an etcd started here, transactions
of four shapes in turn, each on 2,000 machine keys of its own picked as the
benchmark's committers pick them (B=50 at random), and prints each shape's rate and
etcd's CPU per transaction (process CPU from /proc): raw, raw plus the task compares,
raw plus the allocation puts, and both (the store's shape). The values are the
store's encodings of this benchmark's records. The shapes alternate over ``--rounds``
so that a VM whose speed drifts shows as a spread, not as a difference.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from commit_cpu import process_cpu_s  # noqa: E402
from commit_throughput import (  # noqa: E402
    MACHINES,
    TASK_CPU,
    TASK_MEM,
    job_id,
    minimal_values,
    scheduler_name,
)

from cellstate import codec  # noqa: E402
from cellstate.keys import Keyspace  # noqa: E402
from cellstate.kv.base import Compare, Put  # noqa: E402
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from cellstate.model import Allocation, Resources  # noqa: E402
from omega.etcd_launcher import DEFAULT_MAX_TXN_OPS, LocalEtcd  # noqa: E402

BATCH = 50
SHAPES = ("raw", "raw + task compares", "raw + allocation puts", "store's shape")


def run_shape(kv: EtcdKV, etcd_pid: int, keys: Keyspace, shape: str, seconds: float,
              seed: int) -> tuple[float, float, int, int]:
    """Commits of one shape for ``seconds`` in a cell of its own (``keys``, the
    store's layout): (Txn/s, etcd CPU ms per Txn, compares and puts of the last Txn)."""
    machine_value, task_value = minimal_values()
    alloc_value = codec.encode_alloc(Allocation(
        "", job_id(0), scheduler_name(0), 0, Resources.of(cpu=TASK_CPU, mem=TASK_MEM)))
    mids = [f"m{i:05d}" for i in range(MACHINES)]
    pool = [keys.machine(mid) for mid in mids]
    revs: dict[bytes, int] = {}
    for i in range(0, len(pool), 100):
        chunk = pool[i : i + 100]
        res = kv.txn([], [Put(k, machine_value) for k in chunk])
        revs.update(dict.fromkeys(chunk, res.revision))
    task_compares = shape in (SHAPES[1], SHAPES[3])
    alloc_puts = shape in (SHAPES[2], SHAPES[3])
    rng = random.Random(seed)
    task = 0
    commits = 0
    compares: list[Compare] = []
    puts: list[Put] = []
    cpu0, t0 = process_cpu_s(etcd_pid), time.monotonic()
    while time.monotonic() - t0 < seconds:
        picked = rng.choices(range(MACHINES), k=BATCH)
        chosen = [pool[i] for i in picked]
        machines = list(dict.fromkeys(chosen))
        compares = [Compare.mod_revision_is(k, revs[k]) for k in machines]
        puts = [Put(k, machine_value) for k in machines]
        task_keys = [keys.task(job_id(0), task + j) for j in range(BATCH)]
        if task_compares:
            compares += [Compare.absent(k) for k in task_keys]
        puts += [Put(k, task_value) for k in task_keys]
        if alloc_puts:
            puts += [Put(keys.alloc(mids[i], revs[pool[i]], f"{job_id(0)}/{task + j}"),
                         alloc_value) for j, i in enumerate(picked)]
        task += BATCH
        res = kv.txn(compares, puts)
        if not res.succeeded:
            raise RuntimeError(f"{shape}: a transaction failed its compares (keys shared?)")
        for k in machines:
            revs[k] = res.revision
        commits += 1
    cpu1, t1 = process_cpu_s(etcd_pid), time.monotonic()
    return commits / (t1 - t0), 1000 * (cpu1 - cpu0) / max(commits, 1), len(compares), len(puts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="per shape and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-fsync", action="store_true")
    args = ap.parse_args(argv)
    if not args.seconds > 0 or args.rounds < 1:
        ap.error("--seconds must be above 0 and --rounds at least 1")
    load = os.getloadavg()
    print(f"B={BATCH} claims on {MACHINES} machines per Txn, one process, "
          f"fsync {'off' if args.no_fsync else 'on'}; load average {load[0]:.2f} at the start")
    print(f"{'round':>5} {'shape':<22} {'Txn/s':>6} {'etcd ms/Txn':>11} {'compares':>8} "
          f"{'puts':>5}")
    with LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True,
                   max_txn_ops=DEFAULT_MAX_TXN_OPS) as server:
        kv = EtcdKV([server.endpoint], max_txn_ops=DEFAULT_MAX_TXN_OPS)
        assert server.pid is not None
        try:
            for r in range(args.rounds):
                for i, shape in enumerate(SHAPES):
                    rate, cpu_ms, ncmp, nput = run_shape(
                        kv, server.pid, Keyspace(f"shape-{r}-{i}"), shape, args.seconds, r)
                    print(f"{r:>5} {shape:<22} {rate:>6.0f} {cpu_ms:>11.2f} {ncmp:>8} "
                          f"{nput:>5}", flush=True)
        finally:
            kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

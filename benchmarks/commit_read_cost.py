#!/usr/bin/env python
"""etcd's CPU for the store's read before a write, by what the read asks for.

    python benchmarks/commit_read_cost.py [--machines N] [--reads N] [--per-read N]
        [--allocs 0,10,20,50]

Under contention a store reads the machines a commit claims again before writing
(``StoreOptions.refresh_when_contended``): per machine its key, and its allocation keys
written since the sequence the store holds. Before the allocation keys named that
sequence (``allocs/<m>/<seq>/<task>``, cellstate/keys.py), the store read the machine's
whole allocation range filtered by ``min_mod_revision`` (``GetChanged``); etcd 3.5
answers such a range by reading every key of the range from its backend and dropping
the older ones afterwards (``applierV3backend.Range`` sets the limit to 0 when a
revision filter is given; ``rangeKeys`` reads each key's value), so that read cost etcd
time in proportion to the allocations the machine holds, not to those that changed.
The store now reads the range from the held sequence on, which spans only the keys
written since.

This starts an etcd (``--unsafe-no-fsync``: only reads are timed), fills ``--machines``
machine keys, each with N allocation keys for every N of ``--allocs``, and sends
``--reads`` read-only Txns of ``--per-read`` random machines in four shapes:

* ``machines``: the machine keys only;
* ``changed-none``: each machine key and its allocations changed since the current
  revision by ``min_mod_revision`` (the read before; none: etcd reads them all and
  returns none);
* ``since-none``: each machine key and its allocation keys from the current sequence
  on (the read now; none);
* ``all-allocs``: each machine key and all its allocations (all returned).

It prints etcd's CPU (process time from /proc) and this process's CPU per Txn. The keys
are shaped like the store's (``machines/<m>``, ``allocs/<m>/<seq>/<task>``, values of about the
encoded sizes) but written directly, without a store.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from commit_cpu import process_cpu_s  # noqa: E402

from cellstate.kv.base import Get, GetChanged, Op, Put, prefix_end  # noqa: E402
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from omega.etcd_launcher import LocalEtcd  # noqa: E402

_MACHINE_VALUE = b"m" * 90  # an encoded machine record without allocations, roughly
_ALLOC_VALUE = b"a" * 60  # an encoded allocation, roughly
SHAPES = ("machines", "changed-none", "since-none", "all-allocs")
_SEQ = 1  # the sequence the filled allocation keys name (any below the reads')


def fill(kv: EtcdKV, root: bytes, machines: int, allocs: int) -> int:
    """Write the machines and their allocations; returns the revision after."""
    ops: list[Op] = []
    rev = 0
    for m in range(machines):
        ops.append(Put(root + b"machines/m%d" % m, _MACHINE_VALUE))
        ops.extend(Put(root + b"allocs/m%d/%016x/j/%d" % (m, _SEQ, t), _ALLOC_VALUE)
                   for t in range(allocs))
        if len(ops) >= 100:
            rev = kv.txn([], ops).revision
            ops = []
    if ops:
        rev = kv.txn([], ops).revision
    return rev


def read_ops(root: bytes, shape: str, mids: Sequence[int], since: int) -> list[Op]:
    ops: list[Op] = []
    for m in mids:
        ops.append(Get(root + b"machines/m%d" % m))
        prefix = root + b"allocs/m%d/" % m
        if shape == "changed-none":
            ops.append(GetChanged(prefix, prefix_end(prefix), since))
        elif shape == "since-none":
            ops.append(Get(prefix + b"%016x" % since, prefix_end(prefix)))
        elif shape == "all-allocs":
            ops.append(Get(prefix, prefix_end(prefix)))
    return ops


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--machines", type=int, default=2000)
    ap.add_argument("--reads", type=int, default=200, help="read Txns per shape")
    ap.add_argument("--per-read", type=int, default=50, help="machines per read Txn")
    ap.add_argument("--allocs", default="0,10,20,50",
                    help="comma-separated allocation counts per machine")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.allocs.split(",") if n.strip()]
    rng = random.Random(args.seed)
    print(f"{'allocs/machine':>14} {'shape':>13} {'etcd ms/Txn':>11} {'client ms/Txn':>13} "
          f"{'keys returned/Txn':>17}")
    with LocalEtcd(unsafe_no_fsync=True, quiet_version_warning=True) as server:
        assert server.pid is not None
        kv = EtcdKV([server.endpoint])
        try:
            for n in counts:
                root = b"/read-cost/%d/" % n
                since = fill(kv, root, args.machines, n) + 1
                for shape in SHAPES:
                    returned = 0
                    etcd0, cpu0 = process_cpu_s(server.pid), time.process_time()
                    for _ in range(args.reads):
                        mids = rng.sample(range(args.machines), args.per_read)
                        res = kv.txn([], read_ops(root, shape, mids, since))
                        for r in res.responses:
                            returned += len(r) if isinstance(r, tuple) else len(
                                getattr(r, "kvs", ()))
                    etcd = process_cpu_s(server.pid) - etcd0
                    cpu = time.process_time() - cpu0
                    print(f"{n:>14} {shape:>13} {1e3 * etcd / args.reads:>11.2f} "
                          f"{1e3 * cpu / args.reads:>13.2f} {returned / args.reads:>17.0f}",
                          flush=True)
        finally:
            kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

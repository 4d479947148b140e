#!/usr/bin/env python
"""What one etcd holds of a cell: bytes per machine and per placed task in etcd's
database, measured, and how large a cell fits under a space quota.

    python benchmarks/etcd_footprint.py [--machines 1000] [--tasks 20000] [--batch 50]
        [--quota-gib 8] [--json out.json]

A fresh etcd (fsync off: only sizes are measured) takes, in this order, the machines
(as ``commit_throughput.setup_cell`` writes them), then ``--tasks`` placements committed
through ``CellStore.commit`` in transactions of B claims (tasks of one job, machines at
random). After each phase etcd's history is compacted and the member defragmented, and
the database's size in use is read (``Maintenance.Status``): the growth over the empty
database, divided by the machines (then by the tasks), is bytes per machine and per
task, etcd's own index and page overhead included. The keys and values written (what a
client sends) are shown beside it.

Then: the largest cell of T tasks per machine (1, 10, 50) that fits under the quota
(``--quota-gib``, 8 GiB: etcd's suggested maximum), with a quarter left free for the
history written between compactions and for fragmentation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from commit_throughput import job_id, scheduler_name, setup_cell  # noqa: E402

from cellstate.keys import Keyspace  # noqa: E402
from cellstate.kv.base import range_all  # noqa: E402
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from cellstate.model import Claim, Detection, Transaction, TxnMode  # noqa: E402
from cellstate.store import CellStore  # noqa: E402
from omega.etcd_launcher import LocalEtcd  # noqa: E402

CELL = "footprint"
HEADROOM = 0.25  # of the quota kept free for history between compactions and free pages
TASKS_PER_MACHINE = (1, 10, 50)


def settled_size(kv: EtcdKV, endpoint: str) -> tuple[int, int]:
    """(database size in use after compaction and defragmentation, keys + values)."""
    rev = kv.range(b"\x00").revision
    kv.compact(rev, physical=True, timeout=600.0)
    kv.defragment(endpoint)
    used = kv.member_status(endpoint).db_size_in_use
    res = range_all(kv, Keyspace(CELL).root)
    return used, sum(len(x.key) + len(x.value) for x in res.kvs)


def place(store: CellStore, machines: Sequence[str], tasks: int, batch: int,
          seed: int) -> int:
    rng = random.Random(seed)
    placed = index = 0
    while placed < tasks:
        n = min(batch, tasks - placed)
        claims = tuple(Claim(job_id(0), index + i, rng.choice(machines)) for i in range(n))
        index += n
        res = store.commit(Transaction(scheduler_name(0), claims, TxnMode.INCREMENTAL,
                                       Detection.FINE))
        placed += len(res.committed)
    return placed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=50, help="claims per transaction")
    ap.add_argument("--quota-gib", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    if args.machines < 1 or args.tasks < 1 or args.batch < 1 or args.quota_gib <= 0:
        ap.error("--machines, --tasks, --batch and --quota-gib must be positive")

    etcd = LocalEtcd(unsafe_no_fsync=True, quiet_version_warning=True)
    etcd.start()
    kv = EtcdKV([etcd.endpoint])
    started = time.monotonic()
    try:
        empty, _ = settled_size(kv, etcd.endpoint)
        setup_cell(kv, CELL, args.machines, 1)
        with_machines, machine_kv = settled_size(kv, etcd.endpoint)
        store = CellStore(kv, CELL)
        store.load()
        placed = place(store, sorted(store.view.machines), args.tasks, args.batch, args.seed)
        with_tasks, task_kv = settled_size(kv, etcd.endpoint)
    finally:
        kv.close()
        etcd.stop()

    per_machine = (with_machines - empty) / args.machines
    per_task = (with_tasks - with_machines) / placed
    quota = args.quota_gib * 2**30 * (1 - HEADROOM)
    out: dict[str, Any] = {
        "benchmark": "etcd_footprint", "etcd_version": etcd.version,
        "machines": args.machines, "tasks": placed,
        "db_bytes_per_machine": round(per_machine), "db_bytes_per_task": round(per_task),
        "kv_bytes_per_machine": round(machine_kv / args.machines),
        "kv_bytes_per_task": round((task_kv - machine_kv) / placed),
        "quota_gib": args.quota_gib, "headroom": HEADROOM, "fits": {},
    }
    print(f"etcd {etcd.version}: {args.machines} machines, {placed} tasks placed "
          f"(B={args.batch}); database size in use after compaction and defragmentation")
    print(f"per machine: {per_machine:,.0f} bytes in etcd's database "
          f"({out['kv_bytes_per_machine']:,} bytes of keys and values)")
    print(f"per placed task: {per_task:,.0f} bytes in etcd's database "
          f"({out['kv_bytes_per_task']:,} bytes of keys and values: its record, its "
          "allocation, its share of the machine's record)")
    print(f"under a {args.quota_gib:g} GiB quota, {100 * HEADROOM:.0f}% kept free:")
    for t in TASKS_PER_MACHINE:
        machines = int(quota / (per_machine + t * per_task))
        out["fits"][t] = machines
        print(f"  {t:>3} tasks per machine: {machines:>12,} machines, "
              f"{machines * t:>14,} tasks")
    print(f"total time {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

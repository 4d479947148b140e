"""A committer process for the concurrency tests: commits random claims for its own job
through etcd and reports what the store said it committed and released."""

from __future__ import annotations

import json
import random
import sys

from cellstate.cell import task_view
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim, Detection, TaskState, Transaction, TxnMode
from cellstate.store import CellStore, StoreError


def main(endpoint: str, cell: str, scheduler: str, job: str, seed: int, rounds: int,
         mode: str, detection: str, out: str) -> None:
    rng = random.Random(seed)
    kv = EtcdKV([endpoint])
    store = CellStore(kv, cell)
    committed: list[str] = []
    released: list[str] = []
    evicted: list[str] = []
    conflicts = 0
    for _ in range(rounds):
        snap = store.read_snapshot()
        spec = snap.jobs[job]
        pending = [i for i in range(spec.task_count)
                   if task_view(snap, f"{job}/{i}").state in
                   (TaskState.PENDING, TaskState.LOST, TaskState.PREEMPTED)]
        running = [f"{job}/{i}" for i in range(spec.task_count)
                   if task_view(snap, f"{job}/{i}").state is TaskState.RUNNING]
        if running and rng.random() < 0.3:
            tid = rng.choice(running)
            try:
                store.release_task(tid, TaskState.FINISHED)
                released.append(tid)
            except StoreError:
                pass  # preempted by another process since the snapshot: nothing to release
            continue
        if not pending:
            continue
        machines = sorted(snap.machines)
        picked = rng.sample(pending, min(len(pending), rng.randint(1, 6)))
        claims = []
        for i in picked:
            mid = rng.choice(machines)
            m = snap.machines[mid]
            victims = tuple(
                a.task for a in m.allocations.values()
                if a.precedence < spec.precedence and rng.random() < 0.5
            )[:1]
            claims.append(Claim(job, i, mid, m.seq, victims))
        res = store.commit(Transaction(scheduler, tuple(claims), TxnMode(mode),
                                       Detection(detection)))
        committed.extend(c.task for c in res.committed)
        evicted.extend(res.evicted)
        conflicts += len(res.rejected)
    kv.close()
    with open(out, "w") as f:
        json.dump({"committed": committed, "released": released, "evicted": evicted,
                   "conflicts": conflicts}, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]), a[6], a[7], a[8])

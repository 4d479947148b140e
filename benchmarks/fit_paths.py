"""The fit rules' hot paths, timed in process on a snapshot (no store, no etcd).

The cell is Omega's example cell (MACHINES x 4 CPU x 16 GB), 60% of its CPUs held by
1-CPU tasks; ``--anti`` of the machines also run a task of a job with an anti-affinity
rule (so a newcomer there cannot skip the neighbour scan). Timed:

* validate: ``validate()`` of a 100-claim transaction of 0.5-CPU tasks on random
  machines (the commit hot path), in microseconds per claim;
* batch: a batch policy decision for a 20-task job (fits at once);
* batch, full cell: the same on a cell with no free CPU, so the policy looks at every
  machine and (since issue 9) tallies why each was excluded;
* service: a service policy decision for a 5-task job (scores every machine per task).

Only public interfaces that predate the fit module are used, so the same script times
an older tree: run it with each tree first on PYTHONPATH, alternately, on a quiet
machine, and compare within one session (the figures move with the machine's load).

    python benchmarks/fit_paths.py [--machines 10000] [--anti 0.1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import immutables

from cellstate.cell import CellSnapshot
from cellstate.gc_tuning import tune_for_large_heap
from cellstate.model import (
    Allocation,
    CellConfig,
    Claim,
    Constraints,
    Job,
    JobKind,
    Machine,
    Requirement,
    Resources,
    SelectorOp,
    Transaction,
)
from cellstate.validation import validate
from schedulers.api import CellView, Context
from schedulers.batch import BatchPolicy
from schedulers.service import ServicePolicy

ONE = Resources.of(cpu=1, mem=2)
HALF = Resources.of(cpu=0.5, mem=1)


def build(machines: int, per_machine: int, anti: float, seed: int = 1) -> CellSnapshot:
    rng = random.Random(seed)
    keep_off = Constraints(anti_affinity=(Requirement("tier", SelectorOp.IN, ("noisy",)),))
    jobs = {
        "prefill": Job("prefill", "bench", "prefill", machines * per_machine, ONE),
        "quiet": Job("quiet", "bench", "prefill", machines, ONE, constraints=keep_off),
        "batch": Job("batch", "bench", "batch", 100, HALF),
        "wide": Job("wide", "bench", "batch", 20, HALF),
        "svc": Job("svc", "bench", "service", 5, HALF, kind=JobKind.SERVICE),
    }
    out = {}
    for i in range(machines):
        mid = f"m{i:05}"
        allocs = {}
        for k in range(per_machine):
            tid = f"prefill/{i * per_machine + k}"
            allocs[tid] = Allocation(tid, "prefill", "prefill", 0, ONE)
        if rng.random() < anti and allocs:
            tid = next(iter(allocs))
            allocs[f"quiet/{i}"] = Allocation(f"quiet/{i}", "quiet", "prefill", 0, ONE)
            del allocs[tid]
        out[mid] = Machine(mid, Resources.of(cpu=4, mem=16), rack=f"r{i // 40}",
                           allocations=allocs, seq=1)
    empty: immutables.Map = immutables.Map()  # type: ignore[type-arg]
    return CellSnapshot(1, CellConfig(), immutables.Map(out), immutables.Map(jobs), empty,
                        empty, empty, empty, empty, empty, empty)


def timed(fn: Callable[[], object], repeat: int) -> float:
    """The least CPU time of ``fn`` over ``repeat`` runs, in seconds: CPU time, not wall
    time, and the least, because other work on a shared machine only adds to it."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machines", type=int, default=10_000)
    p.add_argument("--anti", type=float, default=0.1,
                   help="fraction of machines running a job with an anti-affinity rule")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    snap = build(args.machines, 2, args.anti)  # 2 of 4 CPUs + 4 of 16 GB: room for 0.5 CPU
    full = build(args.machines, 4, args.anti)
    tune_for_large_heap()  # as every process holding a cell does once it is loaded
    rng = random.Random(2)
    mids = list(snap.machines)
    txn = Transaction("batch", tuple(Claim("batch", i, rng.choice(mids)) for i in range(100)))

    def decide(policy: BatchPolicy | ServicePolicy, cell: CellSnapshot, job: str,
               scheduler: str) -> Callable[[], object]:
        return lambda: policy.schedule_job(
            Context(CellView(cell, scheduler), 0.0, random.Random(3), scheduler, "0"),
            cell.jobs[job])

    rows = [
        ("validate, 100 claims (us/claim)", 1e6 / 100,
         lambda: validate(snap, txn)),
        ("batch, 20 tasks (ms/decision)", 1e3, decide(BatchPolicy(), snap, "wide", "batch")),
        ("batch, full cell (ms/decision)", 1e3, decide(BatchPolicy(), full, "wide", "batch")),
        ("service, 5 tasks (ms/decision)", 1e3,
         decide(ServicePolicy(), snap, "svc", "service")),
    ]
    for name, scale, fn in rows:
        print(f"{name:<36}{timed(fn, args.repeat) * scale:>10.2f}")


if __name__ == "__main__":
    main()

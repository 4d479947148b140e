"""The flow round's extraction on the big-job round (issue 33): claiming plain jobs'
arrivals in bulk against checking every arrival on its own, on the same solved
network in the same process.

The cell is ``flow_round.py``'s (MACHINES machines of 12 slots at 90% slot use, Quincy
with a node per task); one job of 3,000 tasks waits, a first round places it, 1% of
the running tasks end and a second job of 3,000 tasks arrives: the round
``flow_round.py`` prints as "first round alone". That round's network is updated and
solved once; then ``extract`` runs CALLS times each way, alternating, each on a fresh
view of the same snapshot, the cyclic collector off during the calls (its pauses are
the round's, not the extraction's), and the claims of both ways are checked equal.
Times are CPU times of this process.

    python benchmarks/flow_extract.py [--machines 12500] [--calls 12]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time

import flow_round as fr

from cellstate.gc_tuning import tune_for_large_heap
from schedulers.api import CellView
from schedulers.flow.costs import make_cost_model
from schedulers.flow.extract import Extraction, extract
from schedulers.flow.graph import GraphManager
from schedulers.flow.mcf import FirmamentSolver


def _claims(ex: Extraction) -> list[tuple[str, str, tuple[str, ...], str]]:
    return [(c.task, c.machine, c.evict, c.moves_from) for c in ex.claims]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=12500)
    ap.add_argument("--calls", type=int, default=12)
    args = ap.parse_args()
    if args.machines < 1 or args.calls < 1:
        ap.error("--machines and --calls must be at least 1")
    tune_for_large_heap()
    print(f"load average {os.getloadavg()[0]:.2f}")
    rng = random.Random(7)
    cell = fr.Cell(args.machines, "quincy-task", rng)
    now = 1000.0
    cell.fill(0.9, now)
    cell.store.submit_job(cell.job(3000, now))
    graph = GraphManager(make_cost_model("quincy"), fr.SCHED, move_guard=60.0)
    solver = FirmamentSolver("auto")
    fr.round_(cell, graph, now, solver, False)
    now += 1.0
    fr.absorb(cell, graph, now)
    cell.end(0.01)
    fr.absorb(cell, graph, now)
    cell.store.submit_job(cell.job(3000, now))
    changes = cell.take_changes()
    snap = cell.replica.snapshot()
    graph.update(snap, changes, now)
    net = graph.net.arrays(compact=False)
    flow = solver.solve(net).flow
    gc.collect()
    gc.freeze()
    times: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, Extraction] = {}
    for call in range(args.calls):
        for per_unit in (False, True) if call % 2 == 0 else (True, False):
            view = CellView(snap, fr.SCHED)
            gc.disable()
            t0 = time.process_time()
            outs[per_unit] = extract(graph, net, flow, view, snap, per_unit=per_unit)
            times[per_unit].append(time.process_time() - t0)
            gc.enable()
    if _claims(outs[False]) != _claims(outs[True]):
        raise SystemExit("the bulk and the per-unit extraction gave different claims")
    ex = outs[False]
    bulk, unit = (statistics.median(times[k]) for k in (False, True))
    print(f"{args.machines} machines 90%, a 3,000-task job arriving: {len(ex.claims)} claims "
          f"({ex.bulk} in bulk, {ex.proven} of them on machines proven on arrays) on "
          f"{len({c.machine for c in ex.claims})} machines")
    print(f"extraction, median of {args.calls}: bulk {1000 * bulk:.1f} ms, per unit "
          f"{1000 * unit:.1f} ms: {bulk / unit:.2f} of it (min {1000 * min(times[False]):.1f} "
          f"/ {1000 * min(times[True]):.1f} ms)")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

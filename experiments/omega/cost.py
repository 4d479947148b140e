"""What one run of an Omega experiment costs: the prefill's CPU time apart from the
main loop's, tasks placed and decisions per CPU second, and the queue as it grows.

    python experiments/omega/cost.py fig8_batch_rate cluster=B seed=1 batch_rate=10 \\
        --horizon 3600 --chunk 600 [--profile]

The point is picked by its axis values (the first run matching them); the run lasts
``--horizon`` simulated seconds. ``--chunk`` prints the main loop's CPU time per
chunk of simulated time and the schedulers' queue length; ``--profile`` prints the
main loop's cProfile (process time), sorted by own time.
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import pstats
import sys
import time
from pathlib import Path

import attrs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from cellstate.gc_tuning import SweptCollector  # noqa: E402
from simulator.drivers import InstanceDriver  # noqa: E402
from simulator.engine import SAMPLE  # noqa: E402
from simulator.experiment import load  # noqa: E402
from simulator.sim import Simulation  # noqa: E402


def _value(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a label (cluster=B, variant=Fine/Incr.)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", help="experiment file name or path")
    p.add_argument("point", nargs="*", help="axis=value, e.g. cluster=B batch_rate=10")
    p.add_argument("--horizon", type=float, default=1200.0, help="simulated seconds")
    p.add_argument("--chunk", type=float, default=0.0, help="report every this many")
    p.add_argument("--profile", action="store_true", help="cProfile the main loop")
    args = p.parse_args()
    path = Path(args.experiment)
    if not path.exists():
        path = HERE / f"{args.experiment}.toml"
    want = {k: _value(v) for k, v in (a.split("=", 1) for a in args.point)}
    exp = load(path)
    runs = [r for r in exp.runs if all(r.point.get(k) == v for k, v in want.items())]
    if not runs:
        sys.exit(f"{path}: no run at {want}; axes: {[a.name for a in exp.axes]}")
    run, h = runs[0], args.horizon
    cfg = attrs.evolve(run.config, horizon=h, day=h / 3,
                       sample_interval=min(run.config.sample_interval, h / 10))
    sim = Simulation(cfg, base_dir=exp.path.parent)
    t0 = time.process_time()
    sim._prefill()
    t1 = time.process_time()
    prefilled = sim.cell.used("cpu")
    collector = SweptCollector()  # as an experiment's run has it (simulator/point.py)
    collector.pause()
    sim._add_schedulers()
    sim._schedule_arrival(sim._arrivals())
    sim.loop.at(0.0, SAMPLE, sim._sample)

    def queue() -> int:
        return sum(d.inst.queue_depth() for d in sim._drivers.values()
                   if isinstance(d, InstanceDriver))

    prof = cProfile.Profile(time.process_time) if args.profile else None
    if prof is not None:
        prof.enable()
    now, last, chunk = 0.0, t1, args.chunk or h
    while now < h:
        now = min(now + chunk, h)
        sim.loop.run(now, lambda _: collector.sweep())
        if args.chunk:
            t = time.process_time()
            print(f"  t={now:.0f} s: {t - last:.2f} s CPU, queue {queue()}", flush=True)
            last = t
    if prof is not None:
        prof.disable()
    t2 = time.process_time()
    collector.resume()
    m = sim.summary()
    placed = sum(v for k, v in m.items() if k.endswith("_tasks_placed"))
    decisions = sum(v for k, v in m.items() if k.endswith("_attempts"))
    main_s = t2 - t1
    print(f"{exp.name} {run.point}, {h:.0f} simulated s\n"
          f"  prefill: {t1 - t0:.2f} s CPU ({prefilled:,.0f} CPUs filled)\n"
          f"  main loop: {main_s:.2f} s CPU, {h / main_s:,.0f} simulated s per CPU s\n"
          f"  tasks placed: {placed:,} ({placed / h:.1f} per simulated s, "
          f"{placed / main_s:,.0f} per CPU s)\n"
          f"  decisions: {decisions:,} ({main_s / max(decisions, 1) * 1e3:.2f} ms CPU each), "
          f"queue at the end {queue():,}")
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()

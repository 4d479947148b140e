"""Run every high-fidelity experiment and summarize them: one command.

    PYTHONPATH=. nice -n 10 python experiments/omega_hifi/regenerate.py [--jobs 2]
        [--scheduler tcp://HOST:8786] [--hours H] [--seeds N] [--out DIR]

As committed (no options) this makes docs/results/omega-high-fidelity. ``--hours``
sets every run's horizon (busyness periods stay a sixth of it; 168 is the paper's
7 days), ``--seeds N`` runs seeds 1..N wherever an experiment sweeps seeds: the
same experiments at a larger scale (fig14_fine_more_seeds, seeds 5-10 of Fig. 14's
fine-detection points, is then left out). The cell and workload stay as in the files.
The points run on Dask as `omega simulate` runs a sweep (docs/simulator.md): kept in
OUT/<name>/points/ as they finish, so the same command run again runs only what is
missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from simulator.cli import add_cluster_arguments, cluster_argument_error
from simulator.experiment import Experiment, Run, load
from simulator.runner import finish
from simulator.sweep import SweepError, cluster, run_sweep

HERE = Path(__file__).resolve().parent
ORDER = ("fig14_conflict_modes", "fig14_fine_more_seeds", "fig12_scaling",
         "fig13_batch_schedulers", "fig11_service_busyness", "fig11_measured")
# Seeds 5-10 of Fig. 14's fine-detection points; with --seeds the main file has them.
EXTRA_SEEDS = "fig14_fine_more_seeds"


def scaled(exp: Experiment, hours: float | None, seeds: int | None) -> Experiment:
    runs = list(exp.runs)
    if hours is not None:
        horizon = hours * 3600
        runs = [attrs.evolve(r, config=attrs.evolve(r.config, horizon=horizon,
                                                    day=horizon / 6)) for r in runs]
    if seeds is not None and any(a.name == "seed" for a in exp.axes):
        first = [r for r in runs if r.point["seed"] == runs[0].point["seed"]]
        runs = [Run({**r.point, "seed": s}, attrs.evolve(r.config, seed=s))
                for r in first for s in range(1, seeds + 1)]
    return attrs.evolve(exp, runs=tuple(runs))


def _positive(kind: type[float] | type[int]) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = kind(raw)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive number, got {raw!r}")
        return value
    return parse


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_arguments(p)
    p.add_argument("--hours", type=_positive(float), default=None,
                   help="simulated hours per run (default: the files')")
    p.add_argument("--seeds", type=_positive(int), default=None,
                   help="seeds 1..N per run (default: the files')")
    p.add_argument("--out", type=Path, default=Path("docs/results/omega-high-fidelity"))
    args = p.parse_args(argv)
    if (wrong := cluster_argument_error(args)) is not None:
        p.error(wrong)
    names = [n for n in ORDER if args.seeds is None or n != EXTRA_SEEDS]
    exps = [scaled(load(HERE / f"{name}.toml"), args.hours, args.seeds) for name in names]
    try:
        with cluster(args.scheduler, args.jobs) as client:
            for exp in exps:
                started = time.perf_counter()
                outcome = run_sweep(exp, args.out / exp.name, client, show=False)
                if not outcome.complete:
                    print(f"{exp.name}: {len(outcome.failed)} point(s) failed (above); "
                          "run the same command again to retry them", file=sys.stderr)
                    return 1
                finish(exp, [r.result for r in outcome.results if r is not None],
                       args.out / exp.name)
                print(f"{exp.name}: {len(exp.runs)} runs, "
                      f"{time.perf_counter() - started:.0f} s wall", flush=True)
    except SweepError as e:
        p.error(str(e))
    # This script's folder is on the path when it runs as a script.
    from summarize import main as summarize

    return summarize([str(args.out)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

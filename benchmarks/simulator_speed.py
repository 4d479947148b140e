"""Simulator speed: simulated seconds per CPU second per architecture, and a placed
task's cost against the code before issue 32, in the same run.

The cell is Omega's example cell (10,000 machines x 4 CPUs x 16 GB) prefilled to 60%
of its CPUs; the workload is the default batch and service workload (simulator/
config.py: batch jobs every 10 s of 100 tasks running 100 s, service jobs every 20 s
of 10 tasks running 500 s, all exponential, 1 CPU and 2 GB per task) with the
paper's decision times (t_job 0.1 s, t_task 5 ms). Each architecture runs HOURS
simulated hours after the prefill; the rate excludes the prefill, which is printed
on its own. The goal (issue 9) is 7 simulated days in at most 5 minutes, i.e. at
least 2,016 simulated seconds per second. The machine may be shared, so the rate per
CPU second of this process (``time.process_time``) is printed beside the wall rate,
and the load average at the start and end of the run.

    python benchmarks/simulator_speed.py [--hours 2] [--arch shared,...] [--seed 1]
        [--task-cost-hours 1] [--repeat 3] [--base 24db2ef] [--machines N]

Each architecture runs with the cyclic garbage collector as an experiment's run has it
(``cellstate.gc_tuning.SweptCollector``). Then the ratio of two-level's main-loop CPU
per simulated second to shared state's (issue 32's goal: at most 1.25); an architecture
named more than once in ``--arch`` counts with its least CPU time (on a shared machine,
name both several times, alternated).

**A placed task's cost, old and new** (issue 32's goal: at least twice as cheap): a run
of Omega's cluster B at 1x (``experiments/omega/fig8_batch_rate.toml``, seed 1,
``--task-cost-hours`` simulated hours) through ``simulator.point.run_one``, the path
every experiment's run takes, with this tree's code and with the code of commit
``--base`` (the tree before issue 32's speed work, extracted with ``git archive``), each
in a subprocess of its own, alternated ``--repeat`` times. It prints the main loop's
CPU microseconds per placed task of each (the least of the repeats: the machine is
shared, and other work only ever adds time), the ratio, and whether the two runs'
result documents are byte-identical. ``--task-cost-hours 0`` skips it.

``--profile FILE`` profiles the run after the prefill (cProfile, with the process's
CPU time as its clock, so other processes on the machine do not skew it), writes the
statistics to FILE (``FILE.<architecture>`` for several) and prints the top entries.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from cellstate.gc_tuning import SweptCollector
from simulator.config import Architecture, CellSpec, SimConfig, monolithic, shared_state
from simulator.sim import Simulation

GOAL = 7 * 86_400 / 300  # simulated seconds per wall second
EXAMPLE_MACHINES = CellSpec().machines  # Omega's example cell
ROOT = Path(__file__).resolve().parents[1]
# The code before issue 32's speed work (main when it started).
BASE = "24db2ef738d05e8d2d1e6d9d60663c4bed214df1"

ARCHITECTURES = {
    "monolithic-single-path": (Architecture.MONOLITHIC, monolithic(0.1, multi_path=False)),
    "monolithic-multi-path": (Architecture.MONOLITHIC, monolithic(0.1, multi_path=True)),
    "two-level": (Architecture.TWO_LEVEL, shared_state()),
    "shared-state": (Architecture.SHARED, shared_state()),
}


def measure(name: str, hours: float, seed: int, profile: cProfile.Profile | None = None,
            machines: int = EXAMPLE_MACHINES) -> tuple[float, float, float, float, int]:
    """(prefill wall s, run wall s, run CPU s, simulated s, tasks placed) on a cell of
    ``machines``; ``profile`` is enabled for the run after the prefill."""
    arch, schedulers = ARCHITECTURES[name]
    horizon = hours * 3600
    sim = Simulation(SimConfig(arch, schedulers, cell=CellSpec(machines=machines),
                               horizon=horizon, day=horizon, seed=seed))
    marks: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]
    collector = SweptCollector()

    def loaded() -> None:
        collector.pause()
        marks.append((time.perf_counter(), time.process_time()))
        if profile is not None:
            profile.enable()

    try:
        sim.run(lambda _: collector.sweep(), after_prefill=loaded)
    finally:
        collector.resume()
    if profile is not None:
        profile.disable()
    end, end_cpu = time.perf_counter(), time.process_time()
    placed = sum(s.tasks_placed for s in sim.recorder.schedulers.values())
    return (marks[1][0] - marks[0][0], end - marks[1][0], end_cpu - marks[1][1], horizon,
            placed)


# Run in a subprocess with PYTHONPATH at a tree (this one or the base commit's): only
# what both trees have (load, run_one, encode), so the same script times either.
TASK_COST_SCRIPT = """
import hashlib, json, sys, time
from pathlib import Path
import attrs
from simulator.experiment import load
from simulator import point
hours, tree, machines = float(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
exp = load(tree / "experiments/omega/fig8_batch_rate.toml")
want = {"cluster": "B", "seed": 1, "batch_rate": 1}
i = next(i for i, r in enumerate(exp.runs) if all(r.point.get(k) == v for k, v in want.items()))
h = hours * 3600
run = exp.runs[i]
cell = attrs.evolve(run.config.cell, machines=machines) if machines else run.config.cell
cfg = attrs.evolve(run.config, horizon=h, day=h / 3, cell=cell,
                   sample_interval=min(run.config.sample_interval, h / 10))
exp = attrs.evolve(exp, runs=[attrs.evolve(r, config=cfg) if j == i else r
                              for j, r in enumerate(exp.runs)])
marks = []
res = point.run_one(run.point, i, exp, after_prefill=lambda: marks.append(time.process_time()))
cpu = time.process_time() - marks[0]
placed = sum(v for k, v in res.metrics.items() if k.endswith("_tasks_placed"))
doc = point.encode(point.TimedResult(res, 0.0, 0.0))
print(json.dumps({"cpu": cpu, "placed": placed, "sha1": hashlib.sha1(doc).hexdigest()}))
"""


def task_cost(tree: Path, hours: float, machines: int | None) -> dict[str, float | str]:
    """One cluster-B run with the code of ``tree``, in a subprocess (on ``machines``
    machines, or cluster B's own number)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", TASK_COST_SCRIPT, str(hours), str(tree),
                          str(machines or 0)],
                         env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"cluster-B run with the code of {tree} failed:\n{out.stderr}")
    result: dict[str, float | str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def extract(commit: str, into: Path) -> Path:
    """The tree of ``commit`` (this repository's), unpacked into ``into``."""
    archive = into / "base.tar"
    with archive.open("wb") as f:
        done = subprocess.run(["git", "-C", str(ROOT), "archive", commit], stdout=f,
                              stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise SystemExit(f"--base {commit}: git archive failed: "
                         f"{done.stderr.decode(errors='replace').strip()}")
    tree = into / "tree"
    with tarfile.open(archive) as t:
        t.extractall(tree, filter="data")
    return tree


def compare_task_cost(base: str, hours: float, repeat: int, machines: int | None) -> None:
    size = f" on {machines:,} machines" if machines else ""
    print(f"\nA placed task's cost: cluster B{size} at 1x, {hours:g} simulated h, main loop, "
          f"{repeat} alternated runs each; old = {base[:10]}, new = this tree")
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = extract(base, Path(tmp))
        runs: dict[str, list[dict[str, float | str]]] = {"old": [], "new": []}
        for i in range(repeat):
            for name, tree in (("old", old_tree), ("new", ROOT)):
                r = task_cost(tree, hours, machines)
                runs[name].append(r)
                us = float(r["cpu"]) / float(r["placed"]) * 1e6
                print(f"  run {i + 1} {name}: {float(r['cpu']):6.2f} CPU s, "
                      f"{int(r['placed']):,} tasks, {us:6.1f} us per task  ({load()})",
                      flush=True)
    best = {n: min(float(r["cpu"]) / float(r["placed"]) for r in rs) for n, rs in runs.items()}
    digests = {str(r["sha1"]) for rs in runs.values() for r in rs}
    print(f"  old: {best['old'] * 1e6:.1f} us per placed task ({1 / best['old']:,.0f} per "
          f"CPU s); new: {best['new'] * 1e6:.1f} us ({1 / best['new']:,.0f} per CPU s)")
    print(f"  old / new: {best['old'] / best['new']:.2f}x  (goal >= 2)")
    print(f"  result documents: {'byte-identical' if len(digests) == 1 else 'DIFFERENT'} "
          f"({', '.join(sorted(d[:12] for d in digests))})")


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hours", type=float, default=2.0,
                   help="simulated hours per architecture's run (0: skip them)")
    p.add_argument("--arch", default=",".join(ARCHITECTURES),
                   help="comma-separated: " + ", ".join(ARCHITECTURES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", metavar="FILE", help="profile the runs (CPU time) into FILE")
    p.add_argument("--task-cost-hours", type=float, default=1.0,
                   help="simulated hours of the old/new cluster-B runs (0: skip them)")
    p.add_argument("--repeat", type=int, default=3, help="old/new runs of each")
    p.add_argument("--base", default=BASE, help="the old code's commit")
    p.add_argument("--machines", type=int, default=None,
                   help=f"machines in every run's cell (default: {EXAMPLE_MACHINES:,} for the "
                   "architectures, cluster B's own for the placed task's cost); fewer make "
                   "a quick check, whose rates the goals do not speak of")
    args = p.parse_args()
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.machines is not None and args.machines < 1:
        p.error(f"--machines must be at least 1, got {args.machines}")
    for flag, value in (("--hours", args.hours), ("--task-cost-hours", args.task_cost_hours)):
        if not value >= 0:  # NaN too
            p.error(f"{flag} must be 0 (skip) or more, got {value}")
    names = [n.strip() for n in args.arch.split(",")] if args.hours > 0 else []
    unknown = sorted(set(names) - ARCHITECTURES.keys())
    if unknown:
        p.error(f"--arch: no architecture {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(ARCHITECTURES)}")
    print(f"start: {load()}")
    print(f"{'architecture':24} {'prefill s':>9} {'run s':>8} {'cpu s':>7} {'sim-s/s':>9} "
          f"{'sim-s/cpu-s':>11} {'tasks/s':>8} {'7 days':>9}  goal >= {GOAL:,.0f} sim-s/s")
    profiles: dict[str, cProfile.Profile | None] = {}
    cpu_per_sim_s: dict[str, float] = {}
    for name in names:
        prof = profiles[name] = cProfile.Profile(time.process_time) if args.profile else None
        prefill, wall, cpu, horizon, placed = measure(
            name, args.hours, args.seed, prof, args.machines or EXAMPLE_MACHINES)
        rate = horizon / wall
        cpu_rate = horizon / cpu
        # An architecture named twice: the least (other work on the machine only adds).
        cpu_per_sim_s[name] = min(cpu / horizon, cpu_per_sim_s.get(name, float("inf")))
        week = 7 * 86_400 / rate
        print(f"{name:24} {prefill:9.1f} {wall:8.1f} {cpu:7.1f} {rate:9.0f} {cpu_rate:11.0f} "
              f"{placed / wall:8.0f} {week / 60:7.1f} m  {'met' if rate >= GOAL else 'missed'}",
              flush=True)
    if {"two-level", "shared-state"} <= cpu_per_sim_s.keys():
        ratio = cpu_per_sim_s["two-level"] / cpu_per_sim_s["shared-state"]
        print(f"two-level / shared-state, CPU per simulated second: {ratio:.2f}  "
              "(goal <= 1.25)")
    print(f"end: {load()}")
    if args.task_cost_hours > 0:
        compare_task_cost(args.base, args.task_cost_hours, args.repeat, args.machines)
    for name, prof in profiles.items():
        if prof is None:
            continue
        path = args.profile if len(names) == 1 else f"{args.profile}.{name}"
        prof.dump_stats(path)
        print(f"\n{name}: profile of the run after the prefill (CPU seconds) in {path}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()

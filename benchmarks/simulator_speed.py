"""Simulator speed: simulated seconds per wall-clock second, per architecture.

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

``--profile FILE`` profiles the run after the prefill (cProfile, with the process's
CPU time as its clock, so other processes on the machine do not skew it), writes the
statistics to FILE (``FILE.<architecture>`` for several) and prints the top entries.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

from cellstate.gc_tuning import tune_for_large_heap
from simulator.config import Architecture, SimConfig, monolithic, shared_state
from simulator.sim import Simulation

GOAL = 7 * 86_400 / 300  # simulated seconds per wall second

ARCHITECTURES = {
    "monolithic-single-path": (Architecture.MONOLITHIC, monolithic(0.1, multi_path=False)),
    "monolithic-multi-path": (Architecture.MONOLITHIC, monolithic(0.1, multi_path=True)),
    "two-level": (Architecture.TWO_LEVEL, shared_state()),
    "shared-state": (Architecture.SHARED, shared_state()),
}


def measure(name: str, hours: float, seed: int, profile: cProfile.Profile | None = None
            ) -> tuple[float, float, float, float, int]:
    """(prefill wall s, run wall s, run CPU s, simulated s, tasks placed); ``profile``
    is enabled for the run after the prefill."""
    arch, schedulers = ARCHITECTURES[name]
    horizon = hours * 3600
    sim = Simulation(SimConfig(arch, schedulers, horizon=horizon, day=horizon, seed=seed))
    marks: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]

    def loaded() -> None:
        tune_for_large_heap()
        marks.append((time.perf_counter(), time.process_time()))
        if profile is not None:
            profile.enable()

    sim.run(after_prefill=loaded)
    if profile is not None:
        profile.disable()
    end, end_cpu = time.perf_counter(), time.process_time()
    placed = sum(s.tasks_placed for s in sim.recorder.schedulers.values())
    return (marks[1][0] - marks[0][0], end - marks[1][0], end_cpu - marks[1][1], horizon,
            placed)


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hours", type=float, default=2.0, help="simulated hours per run")
    p.add_argument("--arch", default=",".join(ARCHITECTURES),
                   help="comma-separated: " + ", ".join(ARCHITECTURES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", metavar="FILE", help="profile the runs (CPU time) into FILE")
    args = p.parse_args()
    names = [n.strip() for n in args.arch.split(",")]
    print(f"start: {load()}")
    print(f"{'architecture':24} {'prefill s':>9} {'run s':>8} {'cpu s':>7} {'sim-s/s':>9} "
          f"{'sim-s/cpu-s':>11} {'tasks/s':>8} {'7 days':>9}  goal >= {GOAL:,.0f} sim-s/s")
    profiles: dict[str, cProfile.Profile | None] = {}
    for name in names:
        prof = profiles[name] = cProfile.Profile(time.process_time) if args.profile else None
        prefill, wall, cpu, horizon, placed = measure(name, args.hours, args.seed, prof)
        rate = horizon / wall
        cpu_rate = horizon / cpu
        week = 7 * 86_400 / rate
        print(f"{name:24} {prefill:9.1f} {wall:8.1f} {cpu:7.1f} {rate:9.0f} {cpu_rate:11.0f} "
              f"{placed / wall:8.0f} {week / 60:7.1f} m  {'met' if rate >= GOAL else 'missed'}",
              flush=True)
    print(f"end: {load()}")
    for name, prof in profiles.items():
        if prof is None:
            continue
        path = args.profile if len(names) == 1 else f"{args.profile}.{name}"
        prof.dump_stats(path)
        print(f"\n{name}: profile of the run after the prefill (CPU seconds) in {path}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()

"""python -m simulator.aladdin EXPERIMENT.toml --out DIR [--scale S] [--load L]
[--only a,b] [--budget SECONDS]: run the Aladdin+H placement experiment, one scheduler after
another, and write DIR/results.json and DIR/results.csv."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from simulator.aladdin.run import Run
from simulator.aladdin.workload import ExperimentError, jobs, load_experiment, machines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.aladdin")
    p.add_argument("experiment", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--scale", type=float, help="override the file's scale")
    p.add_argument("--load", type=float, help="override the file's load")
    p.add_argument("--only", help="comma-separated scheduler names to run")
    p.add_argument("--budget", type=float, default=600.0,
                   help="wall-clock seconds per run (default 600)")
    args = p.parse_args(argv)
    try:
        exp = load_experiment(args.experiment)
    except ExperimentError as e:
        print(f"python -m simulator.aladdin: {e}", file=sys.stderr)
        return 2
    if args.scale is not None:
        if not 0 < args.scale <= 1:
            print("python -m simulator.aladdin: --scale must be in (0, 1]", file=sys.stderr)
            return 2
        exp = attrs.evolve(exp, scale=args.scale)
    if args.load is not None:
        if not 0 < args.load <= 1:
            print("python -m simulator.aladdin: --load must be in (0, 1]", file=sys.stderr)
            return 2
        exp = attrs.evolve(exp, load=args.load)
    if not args.budget > 0:
        print(f"python -m simulator.aladdin: --budget must be a positive number of seconds, "
              f"got {args.budget:g}", file=sys.stderr)
        return 2
    only = set(args.only.split(",")) if args.only else None
    unknown = sorted(only - {spec.name for spec in exp.schedulers}) if only else []
    if unknown:
        print(f"python -m simulator.aladdin: --only names no scheduler of {exp.name}: "
              f"{', '.join(unknown)} (it has {', '.join(s.name for s in exp.schedulers)})",
              file=sys.stderr)
        return 2
    cell = machines(exp)
    apps = jobs(exp, sum(m.capacity.get("cpu") for m in cell))
    tasks = sum(a.job.task_count for a in apps)
    print(f"{exp.name}: {len(cell):,} machines, {len(apps):,} applications, {tasks:,} tasks",
          flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in exp.schedulers:
        if only is not None and spec.name not in only:
            continue
        t0 = time.perf_counter()
        res = Run(spec, cell, apps, budget=args.budget, seed=exp.seed).run()
        rows.append(res.row())
        print(f"  {spec.name:<12} used {res.machines_used:>6,} unplaced {res.unplaced:>6,} "
              f"refused {res.refused:>5,} audit {res.audit} moved {res.moved:>4} "
              f"cpu {100 * res.cpu_eff:5.1f}% mem {100 * res.mem_eff:5.1f}% "
              f"median {res.latency_median_s:7.2f}s stream {res.stream_median_ms:8.1f}ms "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)
        (args.out / "results.json").write_text(json.dumps(
            {"experiment": exp.name, "scale": exp.scale, "load": exp.load,
             "machines": len(cell),
             "applications": len(apps), "tasks": tasks, "runs": rows}, indent=1))
    if rows:
        with (args.out / "results.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        (args.out / "results.md").write_text(table(rows))
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    """The runs as a markdown table (docs/results/aladdin.md quotes it)."""
    head = ("| scheduler | machines used | rs cpu (cores/machine) | rs RAM (GiB/machine) | "
            "cpu eff. | RAM eff. | unplaced | refused (rule) | audit | moved | "
            "latency median / p99 (s) | Eq. 12 (ms/task) | one app median / p99 (ms) (placed) |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | ---: |\n")
    out = []
    for r in rows:
        done = "" if r["finished"] else " (budget spent)"
        out.append(
            f"| {r['scheduler']}{done} | {r['machines_used']:,} | {r['rs_cpu']:.1f} | "
            f"{r['rs_mem']:.1f} | {100 * float(r['cpu_eff']):.1f}% | "
            f"{100 * float(r['mem_eff']):.1f}% | {r['unplaced']:,} | "
            f"{r['refused']:,} | {r['audit']} | {r['moved']:,} | "
            f"{r['latency_median_s']:.2f} / {r['latency_p99_s']:.2f} | {r['eq12_ms']:.2f} | "
            f"{r['stream_median_ms']:.0f} / {r['stream_p99_ms']:.0f} ({r['streamed']}) |")
    return head + "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

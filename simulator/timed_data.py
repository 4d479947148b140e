"""A sweep's data with its CPU record, and the way back from them to point files.

``OUT/<name>/`` holds results.json and results.csv (simulator/output.py) and
timing.csv: per run, its axis values, simulated length, CPU seconds, prefill CPU
seconds, and the digest of its configuration (simulator/sweep.py's, the one in its
point file's name). The point files (``points/``) are not committed, so a clone has
only these; ``restore_points`` rebuilds from them the point files of the runs an
experiment still has, so that a sweep adding seeds or points to committed data runs
only what is new and writes results.json over all of it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import attrs

from simulator.experiment import Experiment
from simulator.output import read_jobs, write_data
from simulator.point import RunResult, TimedResult, encode
from simulator.sweep import POINTS, config_digest, point_file, write_atomically

TIMING = "timing.csv"


def write_timed(exp: Experiment, results: list[TimedResult], dest: Path) -> None:
    """results.json, results.csv (and jobs.csv) and timing.csv, the runs in exp's order."""
    write_data(exp, [r.result for r in results], dest)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    axes = [a.name for a in exp.axes]
    w.writerow([*axes, "horizon_s", "cpu_s", "prefill_cpu_s", "config"])
    for i, (r, spec) in enumerate(zip(results, exp.runs, strict=True)):
        w.writerow([*(r.result.point.get(a) for a in axes), spec.config.horizon,
                    f"{r.cpu_s:.1f}", f"{r.prefill_cpu_s:.1f}", config_digest(exp, i)])
    (dest / TIMING).write_text(buf.getvalue(), encoding="utf-8")


@attrs.frozen
class Restored:
    """Point files rebuilt, and how many of them from rows without a configuration
    digest (timing.csv written before it had one: the experiment file is taken as
    unchanged since)."""

    points: int = 0
    unchecked: int = 0


def restore_points(exp: Experiment, dest: Path) -> Restored:
    """The point files ``dest/points`` lacks for runs of ``exp`` that dest's
    results.json and timing.csv hold (same point, same simulated length, same
    configuration digest where timing.csv has one), rebuilt from them. Rewriting the
    data from the rebuilt files gives the same bytes (CPU seconds as timing.csv
    rounds them). Nothing is rebuilt without both files, nor for an experiment that
    pairs jobs (speedups) when jobs.csv is missing."""
    doc_path, timing_path = dest / "results.json", dest / TIMING
    if not (doc_path.exists() and timing_path.exists()):
        return Restored()
    runs: list[dict[str, Any]] = json.loads(doc_path.read_text(encoding="utf-8"))["runs"]
    rows = list(csv.DictReader(timing_path.read_text(encoding="utf-8").splitlines()))
    if len(rows) != len(runs):  # not written together: no way to pair them
        return Restored()
    jobs_path = dest / "jobs.csv"
    if exp.speedup is not None and not jobs_path.exists():
        return Restored()
    jobs = read_jobs(jobs_path, len(runs))
    points = dest / POINTS
    made = unchecked = 0
    for i, run in enumerate(exp.runs):
        path = points / point_file(exp, i)
        if path.exists():
            continue
        digest = config_digest(exp, i)
        for k, (doc, row) in enumerate(zip(runs, rows, strict=True)):
            if (doc["point"] != run.point or not row.get("prefill_cpu_s")
                    or float(row["horizon_s"]) != run.config.horizon
                    or row.get("config") not in (None, "", digest)):
                continue
            result = RunResult(run.point, doc["metrics"],
                               tuple(tuple(u) for u in doc["utilization"]),
                               doc["distributions"], doc["series"], jobs[k])
            timed = TimedResult(result, float(row["cpu_s"]), float(row["prefill_cpu_s"]))
            points.mkdir(parents=True, exist_ok=True)
            write_atomically(path, encode(timed))
            made += 1
            unchecked += not row.get("config")
            break
    return Restored(made, unchecked)

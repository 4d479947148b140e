"""Results as data (results.json, results.csv) and plots (PNG) in an output folder.

The data files hold only what the simulation computed (no wall-clock times, no
paths), written in a fixed key order, so the same experiment and seed give
byte-identical files."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from simulator.experiment import Experiment, PlotSpec
from simulator.point import RunResult
from simulator.recorder import JobOutcome, quantiles
from simulator.speedup import Speedup, pair_jobs, pairs, summarize


@attrs.frozen
class Paired:
    """A run's per-job speedups over its baseline run (``[speedup]``)."""

    run: int
    baseline: int
    speedups: tuple[Speedup, ...]
    summary: dict[str, Any]


def paired(exp: Experiment, results: Sequence[RunResult]) -> list[Paired]:
    spec = exp.speedup
    if spec is None:
        return []
    out = []
    for i, b in pairs([r.point for r in results], spec.axis, spec.baseline):
        speedups, unpaired = pair_jobs(results[i].jobs, results[b].jobs)
        out.append(Paired(i, b, tuple(speedups), summarize(speedups, unpaired,
                                                           spec.tolerance)))
    return out


def with_speedups(exp: Experiment, results: Sequence[RunResult]) -> list[RunResult]:
    """The results, each paired run's metrics with its speedup summary added (so that
    results.csv and line plots have them)."""
    extra = {p.run: p.summary for p in paired(exp, results)}
    return [attrs.evolve(r, metrics={**r.metrics, **extra[i]}) if i in extra else r
            for i, r in enumerate(results)]


JOB_COLUMNS = ("run", "job", "class", "owner", "submitted", "completion", "preempted")


def write_data(exp: Experiment, results: Sequence[RunResult], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    matched = paired(exp, results)
    doc: dict[str, Any] = {
        "experiment": exp.name,
        "description": exp.description,
        "fidelity": exp.runs[0].config.fidelity if exp.runs else "lightweight",
        "axes": [a.name for a in exp.axes],
        "runs": [{"point": r.point, "metrics": r.metrics,
                  "utilization": [list(u) for u in r.utilization],
                  "distributions": r.distributions, "series": r.series}
                 for r in results],
    }
    if matched:
        doc["speedup"] = [{"point": results[p.run].point,
                           "baseline": results[p.baseline].point, "summary": p.summary,
                           "ranked": quantiles([s.ratio for s in p.speedups], 201)}
                          for p in matched]
    json_path = out / "results.json"
    json_path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    axes = [a.name for a in exp.axes]
    metrics = sorted({k for r in results for k in r.metrics})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*axes, *metrics])
    for r in results:
        w.writerow([*(r.point.get(a) for a in axes), *(r.metrics.get(m, "") for m in metrics)])
    csv_path = out / "results.csv"
    csv_path.write_text(buf.getvalue(), encoding="utf-8")
    paths = [json_path, csv_path]
    if exp.speedup is not None:  # the per-job data the pairing needs
        paths.append(_write_jobs(results, out / "jobs.csv"))
    return paths


def _write_jobs(results: Sequence[RunResult], path: Path) -> Path:
    """Every run's jobs (run: the run's index in results.json), for pairing again."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(JOB_COLUMNS)
    for i, r in enumerate(results):
        for o in r.jobs:
            w.writerow([i, o.job, o.cls, o.owner, repr(o.submitted),
                        "" if o.completion is None else repr(o.completion), o.preempted])
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def read_jobs(path: Path, runs: int) -> list[tuple[JobOutcome, ...]]:
    """The jobs of each of ``runs`` runs from a jobs.csv (none if it is absent)."""
    out: list[list[JobOutcome]] = [[] for _ in range(runs)]
    if path.exists():
        for row in csv.DictReader(path.read_text(encoding="utf-8").splitlines()):
            done = row["completion"]
            out[int(row["run"])].append(JobOutcome(
                row["job"], row["class"], row["owner"], float(row["submitted"]),
                float(done) if done else None, int(row["preempted"])))
    return [tuple(j) for j in out]


def write_plots(exp: Experiment, results: Sequence[RunResult], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    matched = paired(exp, results) if any(p.kind == "speedup" for p in exp.plots) else []
    paths = [_speedup(exp, spec, results, matched, out) if spec.kind == "speedup"
             else _plot(exp, spec, results, out) for spec in exp.plots]
    paths.append(_utilization(exp, results, out))
    return paths


def _plot(exp: Experiment, spec: PlotSpec, results: Sequence[RunResult], out: Path) -> Path:
    if spec.kind == "cdf":
        return _cdf(exp, spec, results, out)
    if spec.kind == "utilization":
        return _panels(exp, spec, results, out)
    if spec.kind == "effective":
        return _effective(exp, spec, results, out)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    groups: dict[Any, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.point.get(spec.series) if spec.series else None, []).append(r)
    for group, runs in groups.items():
        runs = sorted(runs, key=lambda r: _sortable(r.point.get(spec.x)))
        xs: list[Any] = [r.point.get(spec.x) for r in runs]
        for y in spec.y:
            # A series value of 0 is a value, not "no series": only None means none.
            label = " ".join(str(p) for p in (group, y if len(spec.y) > 1 or group is None
                                              else "") if p not in (None, ""))
            ys = [r.metrics.get(y, float("nan")) for r in runs]
            if all(f"{y}_mad" in r.metrics for r in runs):
                # Busyness comes with its median absolute deviation: the paper's error bars.
                ax.errorbar(xs, ys, yerr=[r.metrics[f"{y}_mad"] for r in runs], marker="o",
                            capsize=3, label=label or y)
            else:
                ax.plot(xs, ys, marker="o", label=label or y)
    ax.set_xlabel(spec.x)
    ax.set_ylabel(spec.ylabel or ", ".join(spec.y))
    if spec.logx:
        ax.set_xscale("log")
    if spec.logy:
        ax.set_yscale("log")
    ax.set_title(spec.title or exp.name)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / spec.file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _cdf(exp: Experiment, spec: PlotSpec, results: Sequence[RunResult], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in results:
        for y in spec.y:
            qs = r.distributions.get(y, [])
            if not qs:
                continue
            run = (str(r.point.get(spec.series)) if spec.series
                   else ", ".join(f"{k}={v}" for k, v in r.point.items()))
            label = " ".join(p for p in (run, y if len(spec.y) > 1 else "") if p)
            fractions = [i / (len(qs) - 1) for i in range(len(qs))]
            ax.plot(qs, fractions, label=label or y)
    ax.set_xlabel(spec.ylabel or ", ".join(spec.y))
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1)
    if spec.logx:
        ax.set_xscale("log")
    ax.set_title(spec.title or exp.name)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / spec.file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


_SAMPLED = {"cpu": 1, "mem": 2}  # resource -> its column in a utilization sample


def _panels(exp: Experiment, spec: PlotSpec, results: Sequence[RunResult], out: Path) -> Path:
    """Utilization over time, one panel per run (Omega's Fig. 16)."""
    fig, axes = plt.subplots(len(results), 1, figsize=(6.4, 2.2 * len(results) + 0.6),
                             sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        hours = [u[0] / 3600 for u in r.utilization]
        for y in spec.y:
            ax.plot(hours, [u[_SAMPLED[y]] for u in r.utilization], linewidth=0.8,
                    label=y.upper() if y == "cpu" else "RAM")
        ax.set_ylim(0, 1)
        ax.set_ylabel(spec.ylabel or "utilization")
        ax.set_title(str(r.point.get(spec.series)) if spec.series
                     else ", ".join(f"{k}={v}" for k, v in r.point.items()), fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("simulated hours")
    fig.suptitle(spec.title or exp.name, fontsize=10)
    fig.tight_layout()
    path = out / spec.file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _run_label(spec: PlotSpec, r: RunResult) -> str:
    return (str(r.point.get(spec.series)) if spec.series
            else ", ".join(f"{k}={v}" for k, v in r.point.items()))


_CLASS_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def _speedup(exp: Experiment, spec: PlotSpec, results: Sequence[RunResult],
             matched: Sequence[Paired], out: Path) -> Path:
    """Cook's Figure 1: every job's speedup, ranked; with one pair, coloured by class."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in matched:
        ranked = sorted(p.speedups, key=lambda s: (s.ratio, s.job))
        if not ranked:
            continue
        xs = [(i + 0.5) / len(ranked) for i in range(len(ranked))]
        label = _run_label(spec, results[p.run])
        if len(matched) == 1:
            classes = sorted({s.cls for s in ranked})
            for k, cls in enumerate(classes):
                pts = [(x, s.ratio) for x, s in zip(xs, ranked, strict=True) if s.cls == cls]
                ax.scatter([x for x, _ in pts], [y for _, y in pts], s=4,
                           color=_CLASS_COLOURS[k % len(_CLASS_COLOURS)],
                           label=f"{cls} ({len(pts)} jobs)")
        else:
            ax.plot(xs, [s.ratio for s in ranked], linewidth=1.0, label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yscale("log")
    ax.set_xlim(0, 1)
    ax.set_xlabel("jobs, ranked by speedup (fraction)")
    ax.set_ylabel(spec.ylabel or "speedup: time with / time without (below 1: faster)")
    ax.set_title(spec.title or exp.name, fontsize=10)
    ax.grid(True, alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    path = out / spec.file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _effective(exp: Experiment, spec: PlotSpec, results: Sequence[RunResult],
               out: Path) -> Path:
    """Cook's Figure 2: CPU utilization over time, effective (and raw) per run."""
    fig, ax = plt.subplots(figsize=(9.0, 3.8))
    styles = {"effective": "-", "raw": ":"}
    for r in results:
        hours = [t / 3600 for t in r.series.get("t", [])]
        for y in spec.y:
            values = r.series.get(y, [])
            if values:
                ax.plot(hours, values, styles.get(y, "-"), linewidth=0.9,
                        label=f"{_run_label(spec, r)} {y}")
    ax.set_xlabel("simulated hours")
    ax.set_ylabel(spec.ylabel or "CPU utilization")
    ax.set_ylim(0, 1.02)
    for d in range(1, int(max((t for r in results for t in r.series.get("t", [0.0])),
                              default=0.0) // 86400) + 1):
        ax.axvline(24 * d, color="grey", linewidth=0.5, alpha=0.5)
    ax.set_title(spec.title or exp.name, fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / spec.file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def time_unit(seconds: float) -> tuple[float, str]:
    """The unit a time axis spanning ``seconds`` reads best in: (seconds per unit, its
    name). A 240 s run in hours reads 0.00-0.07 (issue 34)."""
    if seconds <= 2 * 60:
        return 1.0, "seconds"
    if seconds <= 2 * 3600:
        return 60.0, "minutes"
    if seconds <= 3 * 86400:
        return 3600.0, "hours"
    return 86400.0, "days"


# Runs often follow each other closely: each gets its own dash pattern, so that lines
# drawn over each other stay told apart.
_DASHES = ("-", "--", "-.", ":")


def _utilization(exp: Experiment, results: Sequence[RunResult], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    span = max((u[0] for r in results for u in r.utilization), default=0.0)
    scale, unit = time_unit(span)
    for i, r in enumerate(results):
        if r.utilization:
            ax.plot([u[0] / scale for u in r.utilization], [u[1] for u in r.utilization],
                    _DASHES[i % len(_DASHES)], linewidth=1.0, alpha=0.85,
                    label=", ".join(f"{k}={v}" for k, v in r.point.items()))
    ax.set_xlabel(f"simulated {unit}")
    ax.set_ylabel("CPU utilization")
    ax.set_ylim(0, 1)
    ax.set_title(f"{exp.name}: utilization over time")
    if 1 < len(results) <= 12:
        ax.legend(fontsize=6)
    fig.tight_layout()
    path = out / "utilization.png"
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _sortable(v: Any) -> tuple[int, Any]:
    return (0, v) if isinstance(v, int | float) else (1, str(v))

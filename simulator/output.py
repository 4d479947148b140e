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


@attrs.frozen
class RunResult:
    point: dict[str, Any]
    metrics: dict[str, Any]
    utilization: tuple[tuple[float, float, float], ...]
    # CDFs: 101 quantiles (0, 1%, ..., 100%) of each distribution the run measured
    distributions: dict[str, list[float]] = attrs.field(factory=dict)


def write_data(exp: Experiment, results: Sequence[RunResult], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "experiment": exp.name,
        "description": exp.description,
        "axes": [a.name for a in exp.axes],
        "runs": [{"point": r.point, "metrics": r.metrics,
                  "utilization": [list(u) for u in r.utilization],
                  "distributions": r.distributions} for r in results],
    }
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
    return [json_path, csv_path]


def write_plots(exp: Experiment, results: Sequence[RunResult], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [_plot(exp, spec, results, out) for spec in exp.plots]
    paths.append(_utilization(exp, results, out))
    return paths


def _plot(exp: Experiment, spec: PlotSpec, results: Sequence[RunResult], out: Path) -> Path:
    if spec.kind == "cdf":
        return _cdf(exp, spec, results, out)
    if spec.kind == "utilization":
        return _panels(exp, spec, results, out)
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


def _utilization(exp: Experiment, results: Sequence[RunResult], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for r in results:
        if r.utilization:
            ax.plot([u[0] / 3600 for u in r.utilization], [u[1] for u in r.utilization],
                    linewidth=0.8, label=", ".join(f"{k}={v}" for k, v in r.point.items()))
    ax.set_xlabel("simulated hours")
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

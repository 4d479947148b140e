"""The lightweight Omega figures drawn as the paper draws them: three clusters to a
plot (A, B, C; solid lines batch, dashed service), the mean over seeds with the
spread over seeds as error bars (one seed: the busyness's MAD over its periods).
Also writes tables.md, the numbers docs/results/omega.md quotes.

    python experiments/omega/figures.py [OUT]      # default docs/results/omega
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"A": "tab:blue", "B": "tab:orange", "C": "tab:green"}
Runs = list[dict[str, Any]]


def _load(out: Path, name: str) -> Runs | None:
    path = out / name / "results.json"
    if not path.exists():
        return None
    runs: Runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    # Data made before the clusters (no cluster axis) is not drawn here.
    return runs if runs and all("cluster" in r["point"] for r in runs) else None


def _points(runs: Runs, x: str, **fixed: Any) -> list[Any]:
    return sorted({r["point"][x] for r in runs
                   if all(r["point"].get(k) == v for k, v in fixed.items())})


def _seeds(runs: Runs, **fixed: Any) -> list[dict[str, Any]]:
    return [r["metrics"] for r in runs if all(r["point"].get(k) == v for k, v in fixed.items())]


def stat(runs: Runs, metric: str | Callable[[dict[str, Any]], float], **fixed: Any
         ) -> tuple[float, float, float, int]:
    """Mean over the seeds at this point, the lowest and highest, and the seed count
    (NaN when no run matches)."""
    ms = _seeds(runs, **fixed)
    vals = [metric(m) if callable(metric) else float(m.get(metric, float("nan"))) for m in ms]
    if not vals:
        return float("nan"), float("nan"), float("nan"), 0
    return statistics.fmean(vals), min(vals), max(vals), len(vals)


def _line(ax: Any, runs: Runs, x: str, metric: str, cluster: str, style: str,
          label: str, **fixed: Any) -> None:
    xs = _points(runs, x, cluster=cluster, **fixed)
    if not xs:
        return
    mean, lo, hi = [], [], []
    for v in xs:
        m, a, b, n = stat(runs, metric, cluster=cluster, **{x: v}, **fixed)
        if n == 1 and metric.endswith("_busyness"):
            mad = stat(runs, metric + "_mad", cluster=cluster, **{x: v}, **fixed)[0]
            a, b = m - mad, m + mad
        mean.append(m)
        lo.append(m - a)
        hi.append(b - m)
    ax.errorbar(xs, mean, yerr=[lo, hi], fmt=style, color=COLORS.get(cluster, "k"),
                capsize=2, marker="o", markersize=3, label=label)


def _finish(ax: Any, xlabel: str, ylabel: str, title: str, logx: bool = True,
            logy: bool = False) -> None:
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("symlog", linthresh=0.1)  # log, with 0 on the axis
        ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def _clusters(runs: Runs) -> list[str]:
    return sorted({r["point"]["cluster"] for r in runs})


def fig5_6(out: Path) -> list[Path]:
    panels = [("fig5_6_single_path", "t_job", "(a) single-path", ["monolithic"]),
              ("fig5_6_multi_path", "t_job_service", "(b) multi-path", ["monolithic"]),
              ("fig5_6_shared_state", "t_job_service", "(c) shared state",
               ["batch", "service"])]
    data = [(_load(out, n), x, t, s) for n, x, t, s in panels]
    if any(d[0] is None for d in data):
        return []
    wait, waxes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    busy, baxes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for (runs, x, title, scheds), wa, ba in zip(data, waxes, baxes, strict=True):
        assert runs is not None
        for c in _clusters(runs):
            _line(wa, runs, x, "batch_wait_mean_s", c, "-", f"{c} batch")
            _line(wa, runs, x, "service_wait_mean_s", c, "--", f"{c} service")
            for s in scheds:
                _line(ba, runs, x, f"{s}_busyness", c, "--" if s == "service" else "-",
                      f"{c} {s}")
        wa.axhline(30, color="grey", lw=3, alpha=0.4)  # the 30 s SLO
        _finish(wa, f"{x} [s]", "mean job wait time [s]", title, logy=True)
        ba.set_ylim(0, 1.05)
        _finish(ba, f"{x} [s]", "scheduler busyness", title)
    return [_save(wait, out / "fig5_wait.png"), _save(busy, out / "fig6_busyness.png")]


def _batch_and_service(ax: Any, runs: Runs, x: str, metric: str, cluster: str) -> None:
    """One cluster's batch (solid) and service (dashed) lines of ``metric``."""
    for sched, style in (("batch", "-"), ("service", "--")):
        _line(ax, runs, x, f"{sched}_{metric}", cluster, style, f"{cluster} {sched}")


def fig7(out: Path) -> list[Path]:
    runs = _load(out, "fig7_two_level")
    if runs is None:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    x = "t_job_service"
    for c in _clusters(runs):
        for ax, metric in zip(axes, ("wait_mean_s", "busyness", "abandoned"), strict=True):
            _batch_and_service(ax, runs, x, metric, c)
    axes[0].axhline(30, color="grey", lw=3, alpha=0.4)
    _finish(axes[0], f"{x} [s]", "mean job wait time [s]", "(a) job wait time", logy=True)
    axes[1].set_ylim(0, 1.05)
    _finish(axes[1], f"{x} [s]", "scheduler busyness", "(b) scheduler busyness")
    axes[2].set_ylim(0, max(10.0, axes[2].get_ylim()[1]))
    _finish(axes[2], f"{x} [s]", "jobs abandoned", "(c) jobs abandoned")
    return [_save(fig, out / "fig7_two_level.png")]


def saturation(runs: Runs, cluster: str, metric: str = "batch_busyness") -> float:
    """The batch-rate multiple at which the scheduler saturates: where the line
    through the origin fitted to the points below 0.8 busy reaches 1 (busyness grows
    linearly with the arrival rate until then)."""
    xs = _points(runs, "batch_rate", cluster=cluster)
    pts = [(x, stat(runs, metric, cluster=cluster, batch_rate=x)[0]) for x in xs]
    pts = [(x, y) for x, y in pts if y < 0.8]
    if not pts:
        return float("nan")
    slope = sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)
    return 1.0 / slope if slope > 0 else float("inf")


def fig8(out: Path) -> list[Path]:
    runs = _load(out, "fig8_batch_rate")
    if runs is None:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = "batch_rate"
    for c in _clusters(runs):
        for ax, metric in zip(axes, ("wait_mean_s", "busyness"), strict=True):
            _batch_and_service(ax, runs, x, metric, c)
        sat = saturation(runs, c)
        for ax in axes:
            ax.axvline(sat, color=COLORS[c], ls=":", lw=1)
    _finish(axes[0], "relative batch arrival rate", "mean job wait time [s]",
            "(a) job wait time", logx=False, logy=True)
    axes[1].set_ylim(0, 1.05)
    _finish(axes[1], "relative batch arrival rate", "scheduler busyness",
            "(b) scheduler busyness (dotted: saturation, linear fit)", logx=False)
    return [_save(fig, out / "fig8_batch_rate.png")]


def _series_line(ax: Any, runs: Runs, x: str, series: str, value: Any, metric: str,
                 cluster: str, color: Any) -> None:
    """One line of ``metric`` over ``x`` at ``series`` = value: the mean over seeds,
    the lowest and highest seed as error bars."""
    xs = _points(runs, x, cluster=cluster, **{series: value})
    if not xs:
        return
    st = [stat(runs, metric, cluster=cluster, **{series: value, x: v}) for v in xs]
    ax.errorbar(xs, [m for m, *_ in st], yerr=[[m - lo for m, lo, _, _ in st],
                                                [hi - m for m, _, hi, _ in st]],
                color=color, capsize=2, marker="o", markersize=3, label=str(value))


def _grid(out: Path, name: str, x: str, series: str,
          panels: Sequence[tuple[str, str, bool]], xlabel: str, logx: bool) -> list[Path]:
    """One row per cluster, one panel per (metric, label, log y), a line per value of
    ``series``."""
    runs = _load(out, name)
    if runs is None:
        return []
    clusters = _clusters(runs)
    values = _points(runs, series)
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(clusters), len(panels), squeeze=False,
                             figsize=(4.3 * len(panels), 3.3 * len(clusters)))
    for row, c in zip(axes, clusters, strict=True):
        for ax, (metric, label, logy) in zip(row, panels, strict=True):
            for i, v in enumerate(values):
                _series_line(ax, runs, x, series, v, metric, c,
                             cmap(i / max(len(values) - 1, 1)))
            _finish(ax, xlabel, label, f"cluster {c}", logx=logx, logy=logy)
    return [_save(fig, out / f"{name}.png")]


def fig9(out: Path) -> list[Path]:
    return _grid(out, "fig9_batch_schedulers", "batch_rate", "batch_schedulers",
                 [("batch_conflict_fraction", "(a) mean conflict fraction (batch)", False),
                  ("batch_busyness", "(b) mean busyness per batch scheduler", False),
                  ("batch_wait_mean_s", "batch job wait time [s]", True)],
                 "relative batch arrival rate", logx=False)


def fig14(out: Path) -> list[Path]:
    return _grid(out, "fig14_conflict_modes", "t_job_service", "variant",
                 [("service_conflict_fraction", "(a) conflict fraction (service)", True),
                  ("service_busyness", "(b) service scheduler busyness", False),
                  ("batch_conflict_fraction", "conflict fraction (batch)", False)],
                 "t_job(service) [s]", logx=True)


def poisson_interval(count: float, z: float = 1.96) -> tuple[float, float]:
    """A 95% interval for the mean of a Poisson count (Garwood's exact interval, by
    the Wilson-Hilferty approximation, good to a few percent down to one count)."""
    lo = 0.0 if count <= 0 else count * (1 - 1 / (9 * count) - z / (3 * math.sqrt(count))) ** 3
    n = count + 1
    return max(lo, 0.0), n * (1 - 1 / (9 * n) + z / (3 * math.sqrt(n))) ** 3


def conflict_cell(runs: Runs, sched: str, **fixed: Any) -> str:
    """Conflicts / successful transactions summed over the seeds at this point, the
    fraction and its 95% interval (conflicts as a Poisson count over the successes)."""
    ms = _seeds(runs, **fixed)
    if not ms:
        return "-"
    c = sum(float(m.get(f"{sched}_conflicted", 0)) for m in ms)
    ok = sum(float(m.get(f"{sched}_successful", 0)) for m in ms)
    if ok == 0:
        return f"{c:.0f} / 0"
    lo, hi = poisson_interval(c)
    return f"{c:.0f} / {ok:.0f} = {_fmt(c / ok)} [{_fmt(lo / ok)}-{_fmt(hi / ok)}]"


FIG10 = (("fig10_single_path", "(a) single-path", "monolithic", "t_job_service"),
         ("fig10_multi_path", "(b) multi-path", "monolithic", "t_job_service"),
         ("fig10_two_level", "(c) two-level", "service", "t_job_service"),
         ("fig10_shared_state", "(d) shared state", "service", "t_job_service"),
         ("fig10_shared_coarse_gang", "(e) shared, coarse, gang", "service",
          "t_job_service"))


def _busiest(sched: str) -> Callable[[dict[str, Any]], float]:
    """The busyness Fig. 10 shows: the one scheduler's, or the busier of batch and
    service (a slow service scheduler, or a batch scheduler redoing conflicted work)."""
    if sched == "monolithic":
        return lambda m: float(m["monolithic_busyness"])
    return lambda m: max(float(m["batch_busyness"]), float(m["service_busyness"]))


def left_over(m: dict[str, Any]) -> float:
    """Jobs abandoned or still waiting at the end, as a share of the jobs submitted."""
    jobs = m.get("batch_jobs", 0) + m.get("service_jobs", 0)
    rest = sum(m.get(f"{k}_{w}", 0) for k in ("batch", "service")
               for w in ("abandoned", "unscheduled"))
    return rest / jobs if jobs else 0.0


def fig10(out: Path) -> list[Path]:
    data = [(_load(out, n), t, s, x) for n, t, s, x in FIG10]
    if all(d[0] is None for d in data):
        return []
    fig, axes = plt.subplots(1, 5, figsize=(17, 3.6))
    for (runs, title, sched, x), ax in zip(data, axes, strict=True):
        if runs is None:
            ax.set_title(f"{title}: not run", fontsize=9)
            continue
        jobs_ = _points(runs, x)
        tasks = _points(runs, "t_task_service")
        grid = [[stat(runs, _busiest(sched), **{x: j, "t_task_service": t})[0]
                 for j in jobs_] for t in tasks]
        ax.imshow(grid, origin="lower", vmin=0, vmax=1, cmap="Greys", aspect="auto")
        for i, t in enumerate(tasks):
            for j, jv in enumerate(jobs_):
                share = stat(runs, left_over, **{x: jv, "t_task_service": t})[0]
                bad = share > LEFT_OVER
                ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center", fontsize=8,
                        color="red" if bad else ("white" if grid[i][j] > 0.5 else "black"),
                        fontweight="bold" if bad else "normal")
        ax.set_xticks(range(len(jobs_)), [str(j) for j in jobs_])
        ax.set_yticks(range(len(tasks)), [str(t) for t in tasks])
        ax.set_xlabel(f"{x} [s]")
        ax.set_ylabel("t_task(service) [s]")
        ax.set_title(f"{title}: busiest scheduler", fontsize=9)
    return [_save(fig, out / "fig10_busyness.png")]


FILE_ORDER = ("fig5_6_single_path", "fig5_6_multi_path", "fig5_6_shared_state",
              "fig7_two_level", "fig8_batch_rate", "fig10_single_path", "fig10_multi_path",
              "fig10_two_level", "fig10_shared_state", "fig10_shared_coarse_gang",
              "semantics", "fig14_conflict_modes", "fig9_batch_schedulers")
LEFT_OVER = 0.02  # Fig. 10's red: more than 2% of the jobs abandoned or left waiting


# -- tables -------------------------------------------------------------------------


def _fmt(v: float) -> str:
    if v != v:  # NaN
        return "-"
    if v == int(v) and abs(v) < 1e9:  # counts
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _cell(runs: Runs, metric: str, **fixed: Any) -> str:
    m, lo, hi, n = stat(runs, metric, **fixed)
    if n > 1 and hi > lo:
        return f"{_fmt(m)} ({_fmt(lo)}-{_fmt(hi)})"
    return _fmt(m)


def tables(out: Path, reference: Path | None = None) -> Path:
    """tables.md in OUT; ``reference``: another profile's OUT that prices the points
    OUT has not run (timing)."""
    lines: list[str] = ["# Numbers behind the lightweight figures (generated by "
                        "experiments/omega/figures.py)", ""]
    for name, x, metrics in (
            ("fig5_6_single_path", "t_job", ["batch_wait_mean_s", "service_wait_mean_s",
                                             "monolithic_busyness", "batch_unscheduled",
                                             "service_unscheduled"]),
            ("fig5_6_multi_path", "t_job_service", ["batch_wait_mean_s",
                                                    "service_wait_mean_s",
                                                    "monolithic_busyness",
                                                    "batch_unscheduled",
                                                    "service_unscheduled"]),
            ("fig5_6_shared_state", "t_job_service", ["batch_wait_mean_s",
                                                      "service_wait_mean_s",
                                                      "batch_busyness", "service_busyness",
                                                      "service_conflict_fraction",
                                                      "batch_unscheduled",
                                                      "service_unscheduled"]),
            ("fig7_two_level", "t_job_service", ["batch_wait_mean_s", "service_wait_mean_s",
                                                 "batch_busyness", "service_busyness",
                                                 "batch_abandoned", "service_abandoned",
                                                 "batch_unscheduled", "service_unscheduled",
                                                 "batch_jobs"]),
            ("fig8_batch_rate", "batch_rate", ["batch_wait_mean_s", "service_wait_mean_s",
                                               "batch_busyness", "service_busyness",
                                               "batch_conflict_fraction",
                                               "service_conflict_fraction",
                                               "batch_unscheduled", "cpu_utilization_mean"])):
        runs = _load(out, name)
        if runs is None:
            continue
        lines += [f"## {name}", "", "| cluster | " + x + " | seeds | " + " | ".join(metrics)
                  + " |", "| --- " * (len(metrics) + 3) + "|"]
        for c in _clusters(runs):
            for v in _points(runs, x, cluster=c):
                n = stat(runs, metrics[0], cluster=c, **{x: v})[3]
                lines.append(f"| {c} | {v} | {n} | " + " | ".join(
                    _cell(runs, m, cluster=c, **{x: v}) for m in metrics) + " |")
        if name == "fig8_batch_rate":
            lines += ["", "Saturation multiple (linear fit of batch busyness below 0.8): "
                      + ", ".join(f"{c} {saturation(runs, c):.2f}x" for c in _clusters(runs))]
        lines.append("")
    for name, _, sched, x in FIG10:
        runs = _load(out, name)
        if runs is None:
            continue
        which = "" if sched == "monolithic" else ": batch / service"
        lines += [f"## {name} (scheduler busyness{which}; "
                  f"* = more than {LEFT_OVER:.0%} of jobs abandoned or left waiting)", "",
                  "| t_task \\ " + x + " | " + " | ".join(
                      str(j) for j in _points(runs, x)) + " |",
                  "| --- " * (len(_points(runs, x)) + 1) + "|"]
        for t in _points(runs, "t_task_service"):
            row = []
            for j in _points(runs, x):
                at = {x: j, "t_task_service": t}
                if sched == "monolithic":
                    b = _fmt(stat(runs, "monolithic_busyness", **at)[0])
                else:
                    b = (f"{_fmt(stat(runs, 'batch_busyness', **at)[0])} / "
                         f"{_fmt(stat(runs, 'service_busyness', **at)[0])}")
                star = "*" if stat(runs, left_over, **at)[0] > LEFT_OVER else ""
                row.append(b + star)
            lines.append(f"| {t} | " + " | ".join(row) + " |")
        lines.append("")
    lines += _conflict_tables(out)
    sem = _load(out, "semantics")
    if sem is not None:
        metrics = ["batch_wait_mean_s", "service_wait_mean_s", "batch_busyness",
                   "service_busyness", "batch_abandoned", "service_abandoned",
                   "batch_unscheduled", "service_unscheduled", "cpu_utilization_mean"]
        lines += ["## semantics (cluster B, two-level)", "",
                  "| t_job_service | retry_order | prefill | " + " | ".join(metrics) + " |",
                  "| --- " * (len(metrics) + 3) + "|"]
        for r in sorted(sem, key=lambda r: (r["point"]["t_job_service"],
                                            r["point"]["retry_order"],
                                            r["point"]["prefill"])):
            p = r["point"]
            lines.append(f"| {p['t_job_service']} | {p['retry_order']} | {p['prefill']} | "
                         + " | ".join(_fmt(float(r["metrics"].get(m, float("nan"))))
                                      for m in metrics) + " |")
        lines.append("")
    lines += ["## CPU time", "", "| experiment | runs here | CPU s here | prefill CPU s "
              "per run | runs at paper length | CPU hours at paper length |",
              "| --- | --- | --- | --- | --- | --- |",
              *timing(out, FILE_ORDER, reference)]
    path = out / "tables.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _conflict_tables(out: Path) -> list[str]:
    """Fig. 9 and 14: the mean over seeds (lowest-highest), and the conflicts behind
    each conflict fraction with its 95% interval."""
    lines: list[str] = []
    for name, axes_, metrics, scheds in (
            ("fig9_batch_schedulers", ("batch_schedulers", "batch_rate"),
             ["batch_busyness", "batch_wait_mean_s", "batch_unscheduled",
              "service_busyness"], ("batch",)),
            ("fig14_conflict_modes", ("variant", "t_job_service"),
             ["service_busyness", "service_busyness_wasted", "batch_busyness",
              "service_unscheduled"], ("service", "batch"))):
        runs = _load(out, name)
        if runs is None:
            continue
        conf = [f"{s_} conflicts / successes = fraction [95%]" for s_ in scheds]
        lines += [f"## {name}", "", "| cluster | " + " | ".join(axes_) + " | seeds | "
                  + " | ".join(conf + metrics) + " |",
                  "| --- " * (len(axes_) + len(conf) + len(metrics) + 2) + "|"]
        for c in _clusters(runs):
            keys = sorted({tuple(r["point"][a] for a in axes_) for r in runs
                           if r["point"]["cluster"] == c},
                          key=lambda k: tuple(str(v) if isinstance(v, str) else f"{v:012.3f}"
                                              for v in k))
            for k in keys:
                at = dict(zip(axes_, k, strict=True))
                n = stat(runs, metrics[0], cluster=c, **at)[3]
                lines.append(f"| {c} | " + " | ".join(str(v) for v in k) + f" | {n} | "
                             + " | ".join([conflict_cell(runs, s_, cluster=c, **at)
                                           for s_ in scheds]
                                          + [_cell(runs, m, cluster=c, **at)
                                             for m in metrics]) + " |")
        lines.append("")
    return lines


# The prefill's CPU seconds per cluster, for runs timed before run.py timed it apart
# (experiments/omega/cost.py and run.py's timing.csv, load average 11-17 on 2 cores).
PREFILL_CPU = {"A": 1.3, "B": 3.8, "C": 2.9}


# The short profile's data (run.py --short): it spreads over every file's axes, so it
# prices the points a longer profile has not run.
SHORT_OUT = Path(__file__).resolve().parents[2] / "docs/results/omega"


@attrs.frozen
class Costs:
    """CPU per simulated second after the prefill, of one file's runs in one OUT: per
    point (its axis values but the seed) and per cluster; and each run's prefill."""

    point: dict[tuple[tuple[str, str], ...], list[float]]
    cluster: dict[str, list[float]]
    prefill: list[float]
    done: list[dict[str, str]]

    @staticmethod
    def read(out: Path, name: str) -> Costs | None:
        import csv

        path = out / name / "timing.csv"
        if not path.exists():
            return None
        done = list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))
        split = all(r.get("prefill_cpu_s") for r in done)
        pre = [float(r["prefill_cpu_s"]) if split else
               PREFILL_CPU.get(r.get("cluster", ""), 0.0) for r in done]
        costs = Costs({}, {}, pre, done)
        for r, p in zip(done, pre, strict=True):
            rate = max(float(r["cpu_s"]) - p, 0.0) / float(r["horizon_s"])
            costs.point.setdefault(_key(r), []).append(rate)
            costs.cluster.setdefault(r.get("cluster", ""), []).append(rate)
        return costs

    @property
    def split(self) -> bool:
        return all(r.get("prefill_cpu_s") for r in self.done)


def _key(point: Any) -> tuple[tuple[str, str], ...]:
    """A point's axis values but the seed, as timing.csv writes them (strings)."""
    skip = {"seed", "horizon_s", "cpu_s", "prefill_cpu_s", "config"}
    return tuple(sorted((k, str(v)) for k, v in point.items() if k not in skip))


def timing(out: Path, names: Sequence[str], reference: Path | None = None) -> list[str]:
    """Table rows: the CPU seconds each file's runs took here, and what its full
    length (every point, every seed, the file's horizon) would take: each run's
    prefill (a fixed cost, the mean here) plus its horizon at a CPU per simulated
    second after the prefill measured for it, the first there is of: its point's runs
    here; its point's runs in ``reference`` (another profile's OUT); the mean of its
    cluster's runs in ``reference``; of its cluster's runs here; of the file's runs
    here. A point's cost moves with its axes (a saturated batch rate costs several
    times 1x per simulated second), so a profile that runs few of a file's points
    prices the rest from one that spreads over them. Runs timed before the prefill
    was timed apart are taken to have spent their cluster's PREFILL_CPU on it
    (marked *)."""
    from simulator.experiment import load

    rows: list[str] = []
    guessed: list[str] = []
    total_here = total_full = 0.0
    for name in names:
        here = Costs.read(out, name)
        if here is None:
            continue
        ref = Costs.read(reference, name) if reference is not None else None
        anywhere = statistics.fmean(x for v in here.cluster.values() for x in v)

        def rate(point: dict[str, Any], here: Costs = here, ref: Costs | None = ref,
                 anywhere: float = anywhere) -> tuple[float, bool]:
            """The CPU per simulated second, and whether it is the point's own."""
            c = str(point.get("cluster", ""))
            for own, found in ((True, here.point.get(_key(point))),
                               (True, ref and ref.point.get(_key(point))),
                               (False, ref and ref.cluster.get(c)),
                               (False, here.cluster.get(c))):
                if found:
                    return statistics.fmean(found), own
            return anywhere, False

        full = load(Path(__file__).resolve().parent / f"{name}.toml")
        priced = [rate(r.point) for r in full.runs]
        full_cpu = sum(statistics.fmean(here.prefill) + r.config.horizon * x
                       for r, (x, _) in zip(full.runs, priced, strict=True))
        if unpriced := sum(not own for _, own in priced):
            guessed.append(f"{name} {unpriced} of {len(full.runs)}")
        cpu = sum(float(r["cpu_s"]) for r in here.done)
        total_here += cpu
        total_full += full_cpu
        # Points of one file may run at different lengths (run.py's LONG, Fig. 8).
        lengths = Counter(float(r["horizon_s"]) for r in here.done)
        ran = " + ".join(f"{n} x {h:.0f} s" for h, n in sorted(lengths.items()))
        rows.append(f"| {name} | {ran} | "
                    f"{cpu:.0f} | {statistics.fmean(here.prefill):.1f} | {len(full.runs)} x "
                    f"{full.runs[0].config.horizon:.0f} s | {full_cpu / 3600:,.1f}"
                    f"{'' if here.split else '*'} |")
    rows.append(f"| total | | {total_here:.0f} | | | {total_full / 3600:,.0f} |")
    source = "" if reference is None else (
        f", else in {os.path.relpath(reference, out)}/ (another profile's runs of the "
        "same point), else at the mean of its cluster's runs there")
    rows += ["", "Each run at paper length is priced at the CPU per simulated second "
             f"measured for its point here{source}, else at the mean of its cluster's "
             "runs here (of the file's runs here for a cluster not run)."
             + (" Runs at paper length priced by a mean, not by their point's own runs: "
                + ", ".join(guessed) + "." if guessed else "")]
    return rows


def make_all(out: Path) -> list[Path]:
    reference = SHORT_OUT if out.resolve() != SHORT_OUT.resolve() else None
    paths = [*fig5_6(out), *fig7(out), *fig8(out), *fig9(out), *fig10(out), *fig14(out),
             tables(out, reference)]
    return paths


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's simulator
    for p in make_all(Path(sys.argv[1]) if len(sys.argv) > 1 else
                      Path(__file__).resolve().parents[2] / "docs/results/omega"):
        print(p)

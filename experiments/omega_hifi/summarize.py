"""Tables and plots of the high-fidelity runs, several seeds per point as means with
95% confidence intervals (simulator/seeds.py).

    python experiments/omega_hifi/summarize.py [RESULTS]

RESULTS defaults to docs/results/omega-high-fidelity.

Reads RESULTS/<experiment>/results.csv and writes RESULTS/summary.md and the
``ci_*.png`` plots beside each experiment's own plots.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from simulator.seeds import Estimate, by_point, estimate

Row = Mapping[str, Any]


def rows(path: Path) -> list[Row]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def num(row: Row, key: str) -> float:
    return float(row[key]) if row.get(key, "") != "" else float("nan")


def est(group: Sequence[Row], key: str) -> Estimate:
    return estimate([num(r, key) for r in group])


def total(group: Sequence[Row], key: str) -> int:
    return sum(round(num(r, key)) for r in group)


def table(head: Sequence[str], body: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(lines)


def ci_plot(out: Path, groups: Mapping[tuple[Any, ...], Sequence[Row]], x_at: int,
            series_at: int | None, ys: Sequence[str], ylabel: str, title: str,
            logy: bool = False, symlog: bool = False) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lines: dict[tuple[Any, str], list[tuple[float, Estimate]]] = {}
    for key, group in groups.items():
        for y in ys:
            s = key[series_at] if series_at is not None else ""
            lines.setdefault((s, y), []).append((float(key[x_at]), est(group, y)))
    for (s, y), pts in lines.items():
        pts.sort()
        label = " ".join(p for p in (str(s), y if len(ys) > 1 else "") if p)
        # Every metric here is >= 0: the interval's lower arm stops at 0.
        lower = [min(p[1].half, max(p[1].mean, 0.0)) for p in pts]
        ax.errorbar([p[0] for p in pts], [p[1].mean for p in pts],
                    yerr=[lower, [p[1].half for p in pts]], marker="o", capsize=3,
                    label=label or y)
    ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if symlog:  # from 0 (no conflicts) to above 10 on one axis
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(bottom=0)
    ax.set_xlabel("t_job (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    plt.close(fig)


def fig11(res: Path) -> str:
    data = rows(res / "fig11_service_busyness" / "results.csv")
    tasks = sorted({r["t_task_service"] for r in data}, key=float)
    jobs = sorted({r["t_job_service"] for r in data}, key=float)
    cell = {(r["t_job_service"], r["t_task_service"]): r for r in data}
    body = [[j, *(f"{num(cell[(j, t)], 'service_busyness'):.3f}" for t in tasks)]
            for j in jobs]
    out = ("### Fig. 11: service busyness (seed 1)\n\n"
           + table(["t_job(service) \\ t_task(service)", *tasks], body))
    measured = res / "fig11_measured" / "results.csv"
    if measured.exists():
        body = [[r["measured_scale"], f"{num(r, 'service_busyness'):.3f}",
                 f"{num(r, 'batch_busyness'):.3f}",
                 f"{num(r, 'service_decision_measured_per_task_s') * 1e3:.2f}",
                 f"{num(r, 'service_decision_measured_mean_s') * 1e3:.1f}",
                 f"{num(r, 'batch_decision_measured_per_task_s') * 1e3:.3f}",
                 f"{num(r, 'service_conflict_fraction'):.3f}"] for r in rows(measured)]
        out += ("\n\n### Fig. 11 companion: measured decision times charged\n\n"
                + table(["scale", "service busyness", "batch busyness",
                         "service ms/task (measured, unscaled)",
                         "service ms/attempt (unscaled)", "batch ms/task (unscaled)",
                         "service conflict fraction"], body))
    return out


def fig12(res: Path) -> str:
    path = res / "fig12_scaling"
    data = rows(path / "results.csv")
    groups = by_point(data, ["t_job_service", "seed"])
    body = []
    for (tj,), g in groups.items():
        busy, free = est(g, "service_busyness"), est(g, "service_busyness_no_conflict")
        body.append([tj, est(g, "batch_wait_mean_s"), est(g, "service_wait_mean_s"),
                     est(g, "service_wait_p90_s"), est(g, "batch_conflict_fraction"),
                     est(g, "service_conflict_fraction"), total(g, "service_conflicted"),
                     est(g, "batch_busyness"), busy, free,
                     f"{busy.mean / free.mean:.2f}" if free.mean else "-",
                     total(g, "service_preemptions")])
    ci_plot(path / "ci_wait.png", groups, 0, None,
            ["batch_wait_mean_s", "batch_wait_p90_s", "service_wait_mean_s",
             "service_wait_p90_s"], "job wait time [s]",
            "Fig. 12a (high fidelity): wait, mean of seeds, 95% CI", logy=True)
    ci_plot(path / "ci_conflict_fraction.png", groups, 0, None,
            ["batch_conflict_fraction", "service_conflict_fraction"], "conflict fraction",
            "Fig. 12b (high fidelity): conflict fraction, 95% CI")
    ci_plot(path / "ci_busyness.png", groups, 0, None,
            ["batch_busyness", "service_busyness", "service_busyness_no_conflict"],
            "scheduler busyness", "Fig. 12c (high fidelity): busyness, 95% CI")
    n = len(next(iter(groups.values())))
    return (f"### Fig. 12 ({n} seeds; mean ± 95% CI half-width)\n\n"
            + table(["t_job(service)", "batch wait mean s", "service wait mean s",
                     "service wait p90 s", "batch conflict fr.", "service conflict fr.",
                     "service conflicts (sum)", "batch busyness", "service busyness",
                     "service no-conflict busyness", "ratio", "preemptions (sum)"], body))


def fig13(res: Path) -> str:
    data = rows(res / "fig13_batch_schedulers" / "results.csv")
    body = [[r["batch_schedulers"], r["t_job_batch"], f"{num(r, 'batch_busyness'):.3f}",
             f"{num(r, 'service_busyness'):.3f}", f"{num(r, 'batch_wait_mean_s'):.3g}",
             f"{num(r, 'batch_wait_p90_s'):.3g}", f"{num(r, 'service_wait_mean_s'):.3g}",
             f"{num(r, 'batch_conflict_fraction'):.3f}", r["batch_conflicted"],
             r["batch_unscheduled"]] for r in data]
    return ("### Fig. 13 (seed 1)\n\n"
            + table(["batch schedulers", "t_job(batch)", "batch busyness (mean/instance)",
                     "service busyness", "batch wait mean s", "batch wait p90 s",
                     "service wait mean s", "batch conflict fr.", "batch conflicts",
                     "batch jobs unscheduled at end"], body))


def paired(groups: Mapping[tuple[Any, ...], Sequence[Row]], a: str, b: str, tj: str,
           key: str) -> Estimate | None:
    """Per seed, variant ``a``'s ``key`` minus variant ``b``'s at ``tj`` (same seed,
    same jobs): the mean difference and its 95% interval."""
    ra = {r["seed"]: num(r, key) for r in groups.get((a, tj), [])}
    rb = {r["seed"]: num(r, key) for r in groups.get((b, tj), [])}
    common = sorted(set(ra) & set(rb), key=int)
    return estimate([ra[s] - rb[s] for s in common]) if len(common) > 1 else None


def pooled(group: Sequence[Row], who: str) -> str:
    """Conflicted over successful transactions, summed over the seeds."""
    ok = total(group, f"{who}_successful")
    return f"{total(group, f'{who}_conflicted') / ok:.3f}" if ok else "-"


def fig14(res: Path) -> str:
    path = res / "fig14_conflict_modes"
    data = rows(path / "results.csv")
    more = res / "fig14_fine_more_seeds" / "results.csv"
    if more.exists():
        data += rows(more)
    groups = by_point(data, ["variant", "t_job_service", "seed"])
    groups = dict(sorted(groups.items(), key=lambda kv: (kv[0][0], float(kv[0][1]))))
    body = [[v, tj, len(g), est(g, "service_conflict_fraction"), pooled(g, "service"),
             total(g, "service_conflicted"), total(g, "service_successful"),
             est(g, "service_busyness"), est(g, "batch_conflict_fraction"),
             total(g, "batch_conflicted"), est(g, "batch_busyness")]
            for (v, tj), g in groups.items()]
    ci_plot(path / "ci_conflict_fraction.png", groups, 1, 0, ["service_conflict_fraction"],
            "service conflict fraction (symlog)",
            "Fig. 14a (high fidelity): mean of seeds, 95% CI", symlog=True)
    ci_plot(path / "ci_busyness.png", groups, 1, 0, ["service_busyness"],
            "service busyness", "Fig. 14b (high fidelity): mean of seeds, 95% CI")
    pairs = [("Fine/Gang", "Fine/Incr."), ("Coarse/Incr.", "Fine/Incr."),
             ("Coarse/Gang", "Coarse/Incr.")]
    diff = []
    for a, b in pairs:
        for tj in sorted({k[1] for k in groups}, key=float):
            c = paired(groups, a, b, tj, "service_conflict_fraction")
            u = paired(groups, a, b, tj, "service_busyness") if c is not None else None
            if c is not None:
                diff.append([f"{a} - {b}", tj, c.n, c, u])
    return ("### Fig. 14 (mean ± 95% CI half-width over seeds; counts summed over seeds)"
            "\n\n" + table(["variant", "t_job(service)", "seeds", "service conflict fr.",
                            "pooled (sum conflicted / sum successful)", "service conflicts",
                            "service successful txns", "service busyness",
                            "batch conflict fr.", "batch conflicts", "batch busyness"], body)
            + "\n\nPaired by seed (the same jobs in both variants): mean difference ± 95% "
            "CI half-width\n\n" + table(["variants", "t_job(service)", "seeds",
                                          "service conflict fr. difference",
                                          "service busyness difference"], diff))


def main(argv: Sequence[str]) -> int:
    res = Path(argv[0]) if argv else Path("docs/results/omega-high-fidelity")
    parts: list[str] = ["# High-fidelity runs: summary (made by "
                        "experiments/omega_hifi/summarize.py)"]
    makers: list[tuple[str, Callable[[Path], str]]] = [
        ("fig11_service_busyness", fig11), ("fig12_scaling", fig12),
        ("fig13_batch_schedulers", fig13), ("fig14_conflict_modes", fig14)]
    for name, make in makers:
        if (res / name / "results.csv").exists():
            parts.append(make(res))
    (res / "summary.md").write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    print(f"wrote {res / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

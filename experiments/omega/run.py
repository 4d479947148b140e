"""Regenerate the lightweight Omega figures (docs/results/omega.md) in one command.

    python experiments/omega/run.py                     # paper length: every point,
                                                        # 3 seeds, 7 days (Mesos: 1)
    python experiments/omega/run.py --short --jobs 2    # what this session ran
    python experiments/omega/run.py --long --jobs 1 --out docs/results/omega-long
                                                        # each claim at a day or a week
    python experiments/omega/run.py --day --jobs 1 --out docs/results/omega-long/day
                                                        # a day of what LONG has shorter
    python experiments/omega/run.py --scheduler tcp://HOST:8786   # on a Dask cluster

The points run on Dask (simulator/sweep.py): an embedded local cluster of --jobs
worker processes (default one per CPU), or the cluster whose scheduler --scheduler
names. Each finished point is kept in OUT/<name>/points/, so running the same command
again after it was stopped runs only what is missing. Each experiment file's data goes
to OUT/<name>/ (results.json, results.csv, and timing.csv: the CPU seconds each run
took, for estimating the full length, and its configuration's digest), then
figures.py draws the paper's figures, three clusters to a plot, from all of them.
points/ is not committed: in a clone, the points that OUT's results.json and
timing.csv hold are taken from them (a run with more seeds runs only the new ones),
and ``--no-run`` draws from results.json alone.
``--short`` keeps the points, seeds and length listed in SHORT below, ``--long`` those
of LONG (a day or a week of each figure's main claim), ``--day`` those of DAY (a day
of points LONG runs shorter); ``--seeds`` replaces the profile's seeds; ``--only NAME``
(repeatable) runs the named files only (the figures are drawn from whatever data OUT
holds); ``--list`` prints what would run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from simulator.cli import add_cluster_arguments, cluster_argument_error  # noqa: E402
from simulator.experiment import Experiment, load  # noqa: E402
from simulator.sweep import SweepError, cluster, run_sweep  # noqa: E402
from simulator.timed_data import restore_points, write_timed  # noqa: E402

# In the order they run (the most telling first, for runs cut short).
FILES = ("fig8_batch_rate", "fig7_two_level", "semantics", "fig5_6_single_path",
         "fig5_6_multi_path", "fig5_6_shared_state", "fig10_single_path", "fig10_multi_path",
         "fig10_two_level", "fig10_shared_state", "fig10_shared_coarse_gang",
         "fig14_conflict_modes", "fig9_batch_schedulers")

# The short profile: simulated seconds, and the axis values kept (axes not named keep
# every value; a list of such tables keeps the runs any of them keeps). What
# docs/results/omega.md reports was made with exactly this.
Keep = dict[str, list[Any]]
_T5: Keep = {"seed": [1], "t_job": [0.1, 10, 100], "t_job_service": [0.1, 10, 100]}
_T10: Keep = {"seed": [1], "t_job_service": [0.1, 100],
        "t_task_service": [0.001, 0.1]}
SHORT: dict[str, tuple[float, Keep | list[Keep]]] = {
    "fig8_batch_rate": (1200, {"seed": [1], "batch_rate": [1, 2, 4, 6, 8, 10]}),
    "fig7_two_level": (600, {"seed": [1], "t_job_service": [0.1, 10, 100]}),
    "semantics": (600, {"seed": [1], "t_job_service": [100]}),
    "fig5_6_single_path": (600, _T5),
    "fig5_6_multi_path": (600, _T5),
    "fig5_6_shared_state": (600, _T5),
    "fig10_single_path": (600, _T10),
    "fig10_multi_path": (600, _T10),
    "fig10_two_level": (600, _T10),
    "fig10_shared_state": (600, _T10),
    "fig10_shared_coarse_gang": (600, _T10),
    # Fig. 14 on the paper's cluster (C) with two seeds, A and B at t_job(service) =
    # 10 s with one; Fig. 9 on the paper's cluster (B) with two seeds at 1x and 10x.
    "fig14_conflict_modes": (1200, [{"cluster": ["C"], "seed": [1, 2]},
                                    {"cluster": ["A", "B"], "seed": [1],
                                     "t_job_service": [10]}]),
    "fig9_batch_schedulers": (600, [
        {"cluster": ["B"], "seed": [1, 2], "batch_schedulers": [1, 4, 32],
         "batch_rate": [1, 10]},
        {"cluster": ["B"], "seed": [1], "batch_schedulers": [1, 4, 32], "batch_rate": [4]},
        {"cluster": ["A", "C"], "seed": [1], "batch_schedulers": [1, 32],
         "batch_rate": [10]}]),
}

# The long profile: what this machine runs of each figure's main claim at a length that
# can show it (issue 32), most telling first: docs/results/omega.md says per figure
# what of it has been run (length and seeds) and what has not.
_DAY = 86_400.0
_WEEK = 7 * _DAY
# A file's entry is (horizon, points) or a list of them: points of one file run at
# different lengths (Fig. 8: a week at 1x, saturated rates as long as the budget allowed).
Profile = tuple[float, Keep | list[Keep]]
LONG: dict[str, Profile | list[Profile]] = {
    # Fig. 5/6: shared state on cluster B, t_job(service) from fast to the paper's
    # slowest, then the other four of its seven values.
    "fig5_6_shared_state": [(_DAY, {"cluster": ["B"], "seed": [1], "t_job_service": t})
                            for t in ([0.1, 10, 100], [1, 3, 30, 0.01])],
    # Fig. 5/6: single and multi-path, first at the t_job where single path saturates
    # and multi-path shows head-of-line blocking, then the saturated values (cheap: few
    # decisions), then the fast one (multi-path at 0.1 s is single path at 0.1 s: every
    # job decides in 0.1 s; the short profile's numbers are the same), then single
    # path's last unsaturated values (between 0.1 s and 3 s it saturates) and
    # multi-path's below 10 s, then its fastest.
    "fig5_6_single_path": [(_DAY, {"cluster": ["B"], "seed": [1], "t_job": t})
                           for t in ([10], [100, 30, 3], [0.1], [1, 0.01])],
    "fig5_6_multi_path": [(_DAY, {"cluster": ["B"], "seed": [1], "t_job_service": t})
                          for t in ([10], [100, 30], [3, 1], [0.01])],
    # Fig. 8: cluster B at 1x for the paper's week; at B's saturation multiple (6x) for
    # 3 hours, what the budget allowed (a saturated point costs about 6 times the CPU
    # of 1x per simulated second; 10x: Fig. 9's one scheduler); cluster C (the paper's
    # 9.5x) at 1x for the week; cluster A (the paper's 2.5x) at 1x for a day (its week
    # would be about 1.4 CPU-hours: A places the most tasks per simulated second).
    "fig8_batch_rate": [(_WEEK, {"cluster": ["B"], "seed": [1], "batch_rate": [1]}),
                        (3 * 3600.0, {"cluster": ["B"], "seed": [1], "batch_rate": [6]}),
                        (_WEEK, {"cluster": ["C"], "seed": [1], "batch_rate": [1]}),
                        (_DAY, {"cluster": ["A"], "seed": [1], "batch_rate": [1]})],
    # Fig. 7c: abandoned jobs at a slow service scheduler (the paper's ~200 a day at
    # 100 s; a day of two-level on B costs about 500-1,000 CPU s), then at 10 s.
    "fig7_two_level": [(_DAY, {"cluster": ["B"], "seed": [1], "t_job_service": t})
                       for t in ([100], [10])],
    # Fig. 14 and 9: conflict comparisons, 3 seeds, at the length this machine's
    # budget allowed (issue 32: about 1.5 CPU-hours for the pass that ran them; a day
    # each is the paper set's job, --scheduler). Fig. 14 on cluster B, not the paper's
    # C: C's lightweight cell meets no fine-grained conflict to compare at t_job 10 s
    # (docs/results/omega.md, Fig. 14), B's does.
    "fig14_conflict_modes": (4 * 3600.0, {"cluster": ["B"], "seed": [1, 2, 3],
                                          "t_job_service": [10]}),
    "fig9_batch_schedulers": (1800.0, {"cluster": ["B"], "seed": [1, 2, 3],
                                       "batch_schedulers": [1, 32], "batch_rate": [10]}),
}

# A day of points that LONG runs shorter: Fig. 14's four modes with LONG's 3 seeds
# (LONG: 4 hours). Its own OUT (docs/results/omega-long/day): the same points at two
# lengths in one file would be taken for seeds of one point.
DAY: dict[str, Profile | list[Profile]] = {
    "fig14_conflict_modes": (_DAY, {"cluster": ["B"], "seed": [1, 2, 3],
                                    "t_job_service": [10]}),
}


def shorten(exp: Experiment, horizon: float, keep: Keep | list[Keep]) -> Experiment:
    """The runs whose every axis value is kept (by one of the tables, if a list), run
    for ``horizon`` simulated seconds with busyness over thirds of it (so that a median
    and its MAD exist), or over days when it holds three or more (the paper's)."""
    tables = keep if isinstance(keep, list) else [keep]
    runs = []
    for r in exp.runs:
        if any(all(r.point.get(k) in v for k, v in t.items() if k in r.point)
               for t in tables):
            cfg = attrs.evolve(r.config, horizon=horizon, day=min(horizon / 3, _DAY),
                               sample_interval=min(r.config.sample_interval, horizon / 10))
            runs.append(attrs.evolve(r, config=cfg))
    return attrs.evolve(exp, runs=tuple(runs))


def with_seeds(keep: Keep | list[Keep], seeds: list[int]) -> list[Keep]:
    """The tables with ``seeds`` in place of theirs (a point's file does not depend on
    which other seeds run, so seeds run apart fill one OUT as if run together)."""
    tables = keep if isinstance(keep, list) else [keep]
    return [{**t, "seed": list(seeds)} for t in tables]


def run(exp: Experiment, out: Path, client: Any) -> bool:
    """The experiment's points on the client's cluster, then its data files; False if
    a point failed (the others are kept in OUT/<name>/points for the next run). Points
    that OUT/<name>'s data files hold but points/ does not (a clone: points/ is not
    committed) are taken from the data files, not run again."""
    restored = restore_points(exp, out / exp.name)
    if restored.points:
        unchecked = (f"; {restored.unchecked} from a timing.csv without configuration "
                     "digests, taken as made from the experiment file as it is now"
                     if restored.unchecked else "")
        print(f"{exp.name}: {restored.points} points taken from results.json and "
              f"timing.csv{unchecked}", file=sys.stderr)
    outcome = run_sweep(exp, out / exp.name, client)
    for f in outcome.failed:
        print(f"{exp.name}: point {f.point} failed: {f.error}", file=sys.stderr)
    if not outcome.complete:
        return False
    write_timed(exp, [r for r in outcome.results if r is not None], out / exp.name)
    return True


def selected(args: argparse.Namespace) -> list[Experiment]:
    """The experiments the flags name (each once, in the order named), cut to the
    profile's points and length."""
    exps = []
    for name in dict.fromkeys(args.only or FILES):
        exp = load(HERE / f"{name}.toml")
        if args.long or args.day:
            profile = LONG if args.long else DAY
            if name not in profile:
                continue
            entry = profile[name]
            entries = entry if isinstance(entry, list) else [entry]
            if args.seeds:
                entries = [(h, with_seeds(k, args.seeds)) for h, k in entries]
            parts = [shorten(exp, *p) for p in entries]
            exp = attrs.evolve(exp, runs=tuple(r for part in parts for r in part.runs))
        elif args.short:
            horizon, keep = SHORT[name]
            if args.seeds:
                keep = with_seeds(keep, args.seeds)
            exp = shorten(exp, horizon, keep)
        exps.append(exp)
    return exps


def no_data(out: Path, names: list[str] | tuple[str, ...]) -> str | None:
    """Why --no-run has nothing to draw in OUT, or None: the figures are drawn from
    each file's OUT/<name>/results.json alone (committed; points/ is not needed)."""
    if any((out / name / "results.json").exists() for name in names):
        return None
    where = "does not exist" if not out.is_dir() else "holds no <name>/results.json"
    unfinished = [n for n in names if (out / n / "points").is_dir()]
    hint = (f" ({', '.join(unfinished)}: points/ of a sweep not finished; run without "
            "--no-run to finish it)" if unfinished else "; run without --no-run first")
    return f"argument --no-run: nothing to draw: {out} {where}{hint}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = p.add_mutually_exclusive_group()
    length.add_argument("--short", action="store_true", help="the short profile (SHORT)")
    length.add_argument("--long", action="store_true",
                        help="the long profile (LONG): each figure's main claim, a day or "
                        "a week; files it has no entry for are skipped")
    length.add_argument("--day", action="store_true",
                        help="the day profile (DAY): a day of points --long runs shorter; "
                        "files it has no entry for are skipped")
    add_cluster_arguments(p)
    p.add_argument("--out", type=Path, default=ROOT / "docs/results/omega")
    # extend: "--only a --only b" and "--only a b" both run a and b (argparse's default
    # store action would keep only the last occurrence).
    p.add_argument("--only", nargs="+", action="extend", choices=FILES, metavar="NAME",
                   help="experiment names to run, in this order (repeatable): "
                   + ", ".join(FILES))
    p.add_argument("--list", action="store_true",
                   help="print the experiments and points that would run, and stop")
    p.add_argument("--no-run", action="store_true", help="only draw the figures")
    p.add_argument("--seeds", type=int, nargs="*",
                   help="these seeds instead of the profile's (--short, --long or --day)")
    args = p.parse_args()
    if (wrong := cluster_argument_error(args)) is not None:
        p.error(wrong)
    if args.list:
        for exp in selected(args):
            print(f"{exp.name}: {len(exp.runs)} points")
            for r in exp.runs:
                print(f"  {r.point} horizon {r.config.horizon:g} s")
        return
    if args.no_run:
        if (missing := no_data(args.out, args.only or FILES)) is not None:
            p.error(missing)
    else:
        exps = selected(args)
        try:
            with cluster(args.scheduler, args.jobs) as client:
                failed = [e.name for e in exps if not run(e, args.out, client)]
        except SweepError as e:
            p.error(str(e))
        if failed:
            sys.exit(f"points failed in {', '.join(failed)}; run the same command again "
                     "to retry them")
    from figures import make_all  # experiments/omega/figures.py

    for path in make_all(args.out):
        print(f"figure: {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()

"""``omega simulate`` (and ``python -m simulator``): run experiment files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``simulate`` subcommand; its handler is ``args.func(args) -> int``."""
    p = subparsers.add_parser(
        "simulate", help="run simulator experiment files (docs/simulator.md)",
        description="Run one or more experiment files; each writes results.json, "
                    "results.csv and PNG plots into OUT/<experiment name>/.")
    add_arguments(p)
    p.set_defaults(func=run_command, prog=p.prog)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiments", nargs="+", type=Path, help="experiment files (.toml)")
    p.add_argument("--out", type=Path, default=Path("sim-results"),
                   help="output folder (default: sim-results)")
    p.add_argument("--jobs", type=worker_count, default=1,
                   help="runs in parallel worker processes, at least 1 (default 1)")
    p.add_argument("--seed", type=int, default=None, help="override every run's seed")
    p.add_argument("--check", action="store_true",
                   help="only read and check the files, run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--replot", action="store_true",
                   help="only draw the plots again from OUT/<name>/results.json")


def worker_count(raw: str) -> int:
    """An argparse type: a number of worker processes, at least 1."""
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {raw!r}")
    return n


def run_command(args: argparse.Namespace) -> int:
    # Imported here: every `omega` command builds this parser, and the runner pulls in
    # matplotlib (about a second) which only `omega simulate` needs.
    from simulator.experiment import load
    from simulator.runner import replot, run_experiment
    from simulator.workload import InputError

    try:
        exps = [load(path) for path in args.experiments]
    except InputError as e:
        # Said as argparse says a bad flag: "<program>: error: ..." (exit 2).
        print(f"{getattr(args, 'prog', 'omega simulate')}: error: {e}", file=sys.stderr)
        return 2
    for exp in exps:
        if args.check:
            print(f"{exp.path}: ok, {len(exp.runs)} run(s)")
            continue
        out = args.out / exp.name
        if args.replot:
            replot(exp, out)
            print(f"{exp.name}: plots -> {out}")
            continue
        run_experiment(exp, out, jobs=args.jobs, show=not args.no_progress, seed=args.seed)
        print(f"{exp.name}: {len(exp.runs)} run(s) -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator", description=__doc__)
    add_arguments(p)
    p.set_defaults(prog=p.prog)
    return run_command(p.parse_args(argv))

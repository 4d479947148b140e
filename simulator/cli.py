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
    add_cluster_arguments(p)
    p.add_argument("--seed", type=int, default=None, help="override every run's seed")
    p.add_argument("--check", action="store_true",
                   help="only read and check the files, run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--replot", action="store_true",
                   help="only draw the plots again from OUT/<name>/results.json")


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """``--scheduler`` and ``--jobs``: where a sweep's points run (simulator.sweep)."""
    p.add_argument("--scheduler", type=scheduler_address, default=None, metavar="ADDRESS",
                   help="run a sweep's points on the Dask cluster whose scheduler is at "
                        "ADDRESS (tcp://HOST:PORT); default: an embedded local cluster")
    p.add_argument("--jobs", type=worker_count, default=None,
                   help="worker processes of the embedded local cluster, at least 1 "
                        "(default: one per CPU)")


def cluster_argument_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the two flags together, if anything."""
    if args.scheduler is not None and args.jobs is not None:
        return ("argument --jobs: sizes the embedded local cluster; with --scheduler the "
                "cluster's own workers run the points (start more `dask worker`s instead)")
    return None


def scheduler_address(raw: str) -> str:
    """An argparse type: a Dask scheduler's address, ``[tcp://]HOST:PORT``."""
    address = raw if "://" in raw else f"tcp://{raw}"
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("tcp", "tls") or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"must be a Dask scheduler address such as tcp://10.0.0.5:8786, got {raw!r}")
    return address


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
    from simulator.runner import finish, replot, run_experiment, with_seed
    from simulator.sweep import SweepError, cluster, run_sweep
    from simulator.workload import InputError

    prog = getattr(args, "prog", "omega simulate")
    if (wrong := cluster_argument_error(args)) is not None:
        print(f"{prog}: error: {wrong}", file=sys.stderr)
        return 2
    try:
        exps = [with_seed(load(path), args.seed) for path in args.experiments]
    except InputError as e:
        # Said as argparse says a bad flag: "<program>: error: ..." (exit 2).
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if args.check or args.replot:
        for exp in exps:
            if args.check:
                print(f"{exp.path}: ok, {len(exp.runs)} run(s)")
            else:
                replot(exp, args.out / exp.name)
                print(f"{exp.name}: plots -> {args.out / exp.name}")
        return 0
    # A single run needs no cluster (its bar counts simulated seconds as it goes); a
    # sweep, or any run sent to a named scheduler, runs on Dask.
    sweeps = [e for e in exps if len(e.runs) > 1 or args.scheduler is not None]
    for exp in exps:
        if exp not in sweeps:
            run_experiment(exp, args.out / exp.name, show=not args.no_progress)
            print(f"{exp.name}: {len(exp.runs)} run(s) -> {args.out / exp.name}")
    if not sweeps:
        return 0
    status = 0
    try:
        with cluster(args.scheduler, args.jobs) as client:
            for exp in sweeps:
                out = args.out / exp.name
                outcome = run_sweep(exp, out, client, show=not args.no_progress)
                if not outcome.complete:
                    for f in outcome.failed:
                        print(f"{prog}: {exp.name}: point {f.point} failed: {f.error}",
                              file=sys.stderr)
                    print(f"{exp.name}: {len(outcome.failed)} of {len(exp.runs)} point(s) "
                          "failed, no results written; run again to retry them",
                          file=sys.stderr)
                    status = 1
                    continue
                finish(exp, [r.result for r in outcome.results if r is not None], out)
                print(f"{exp.name}: {len(exp.runs)} run(s) -> {out}")
    except SweepError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator", description=__doc__)
    add_arguments(p)
    p.set_defaults(prog=p.prog)
    return run_command(p.parse_args(argv))

"""The `omega` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from cellstate.cell import machine_used, task_view
from cellstate.invariants import violations
from cellstate.model import ModelError


def _positive(kind: type[float] | type[int]):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omega", description="Omega-style shared-state cell.")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the local demo cluster on an embedded etcd")
    d.add_argument("--duration", type=_positive(float), default=30.0, help="seconds (default 30)")
    d.add_argument("--machines", type=_positive(int), default=300)
    d.add_argument("--batch-instances", type=_positive(int), default=2,
                   help="instances of the batch scheduler sharing its queue (default 2)")
    d.add_argument("--jobs-per-second", type=_positive(float), default=4.0)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--no-fsync", action="store_true", help="etcd --unsafe-no-fsync (faster)")
    d.add_argument("--data-dir", help="keep etcd's data here (default: a temp dir)")

    e = sub.add_parser("etcd", help="run a local etcd in the foreground")
    e.add_argument("--data-dir")
    e.add_argument("--no-fsync", action="store_true")

    for name, text in (("status", "show a cell's machines, tasks and utilization"),
                       ("check", "check a cell's invariants (exit 1 if broken)"),
                       ("recover", "finish what crashed committers left behind")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--etcd", required=True, help="etcd endpoint(s), comma-separated")
        c.add_argument("--cell", default="default")
        c.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except (ModelError, OSError, RuntimeError) as e:
        print(f"omega {args.command}: {e}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from cellstate.demo import DemoOptions, run_demo

        stats = run_demo(DemoOptions(args.duration, args.machines, args.batch_instances,
                                     args.jobs_per_second, args.seed, args.no_fsync,
                                     args.data_dir), sys.stdout)
        return 0 if stats.placed > 0 else 1
    if args.command == "etcd":
        from cellstate.etcd_launcher import main as etcd_main

        return etcd_main([*(["--data-dir", args.data_dir] if args.data_dir else []),
                          *(["--unsafe-no-fsync"] if args.no_fsync else [])])
    from cellstate.kv.etcd import EtcdKV
    from cellstate.store import CellStore

    kv = EtcdKV([e.strip() for e in args.etcd.split(",") if e.strip()])
    try:
        store = CellStore(kv, args.cell)
        if args.command == "recover":
            touched = store.recover()
            _emit(args, {"gangs": touched}, f"settled or cleared {len(touched)} gang(s)")
            return 0
        snap = store.read_snapshot()
        if args.command == "check":
            problems = violations(snap)
            _emit(args, {"revision": snap.revision, "violations": problems},
                  "\n".join(problems) or f"cell {args.cell} at revision {snap.revision}: ok")
            return 1 if problems else 0
        states: dict[str, int] = {}
        for j in snap.jobs.values():
            for i in range(j.task_count):
                s = task_view(snap, f"{j.id}/{i}").state.value
                states[s] = states.get(s, 0) + 1
        cap = sum(m.capacity.get("cpu") for m in snap.machines.values())
        used = sum(machine_used(m, snap.gangs).get("cpu") for m in snap.machines.values())
        doc = {"revision": snap.revision, "machines": len(snap.machines),
               "jobs": len(snap.jobs), "tasks": states,
               "cpu_utilization": used / cap if cap else 0.0}
        _emit(args, doc, "\n".join(f"{k}: {v}" for k, v in doc.items()))
        return 0
    finally:
        kv.close()


def _emit(args: argparse.Namespace, doc: object, text: str) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else text)


if __name__ == "__main__":
    sys.exit(main())

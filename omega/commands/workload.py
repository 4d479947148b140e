"""``omega workload``: a stream of demo jobs."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import Any

from omega.commands.common import cellstate_flag, endpoints, fraction, positive
from omega.security import tls_from_args

ORDER = 16


def register(sub: Any) -> None:
    w = sub.add_parser("workload", help="submit a stream of demo jobs")
    cellstate_flag(w)
    w.add_argument("--jobs-per-second", type=positive(float), default=4.0,
                   help="jobs submitted per second, on average (default 4)")
    w.add_argument("--duration", type=positive(float), help="seconds (default: until stopped)")
    w.add_argument("--seed", type=int, default=1,
                   help="random seed (default 1; the same seed submits the same jobs)")
    w.add_argument("--prefix", default="", help="prefix of the job ids")
    w.add_argument("--flow-fraction", type=fraction, default=0.2,
                   help="the share of jobs for the flow scheduler (default 0.2; 0 where "
                        "none runs)")
    w.add_argument("--mapreduce-fraction", type=fraction, default=0.1,
                   help="the share of MapReduce jobs, for the mapreduce scheduler (default "
                        "0.1; 0 where none runs)")
    w.add_argument("--fair-fraction", type=fraction, default=0.15,
                   help="the share of jobs for the fair scheduler, from its batch and "
                        "interactive users (default 0.15; 0 where none runs)")
    w.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cellstate.api.client import CellClient
    from cellstate.model import Job
    from cellstate.store import StoreError
    from omega.signals import stop_event_on_signals
    from omega.workload import CachedHosts, WorkloadOptions, generate

    if args.flow_fraction + args.mapreduce_fraction + args.fair_fraction > 0.8:
        raise ValueError(f"--flow-fraction ({args.flow_fraction:g}), --mapreduce-fraction "
                         f"({args.mapreduce_fraction:g}) and --fair-fraction "
                         f"({args.fair_fraction:g}) together must be at most 0.8 (the "
                         "service scheduler's 0.2 comes first)")
    stop = stop_event_on_signals()
    if args.duration:
        threading.Timer(args.duration, stop.set).start()
    with CellClient(endpoints(args.cellstate), tls=tls_from_args(args)) as client:
        opts = WorkloadOptions(args.jobs_per_second, flow_fraction=args.flow_fraction,
                               mapreduce_fraction=args.mapreduce_fraction,
                               fair_fraction=args.fair_fraction, seed=args.seed,
                               prefix=args.prefix)
        hosts = CachedHosts(lambda: [m["id"] for m in client.list_machines()], time.monotonic)
        refused: list[str] = []

        def submit(job: Job) -> None:
            try:
                client.submit_job(job)
            except StoreError as e:  # refused (say, its scheduler is not up yet): go on
                refused.append(job.id)
                logging.getLogger("omega.workload").warning("%s", e)

        n = generate(submit, opts, stop, hosts=hosts)
    from omega.logfmt import announce

    announce("submitted %d jobs (%d refused)", n - len(refused), len(refused))
    return 0

"""``omega demo``: the local demo cluster, every part a process (omega/demo.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from omega.commands.common import non_negative_float, positive

ORDER = 10
TLS = False  # makes its own certificates (or runs --insecure)


def register(sub: Any) -> None:
    d = sub.add_parser("demo", help="run the local demo cluster (etcd, server, agents, "
                                    "schedulers, workload) as processes")
    d.add_argument("--duration", type=positive(float), default=30.0,
                   help="seconds (default 30)")
    d.add_argument("--spec", default=None,
                   help="cell spec of the machines: a file, or a shipped one by name "
                        "(default: demo)")
    d.add_argument("--agents", type=positive(int), default=2,
                   help="agent processes sharing the spec's machines (default 2)")
    d.add_argument("--servers", type=positive(int), default=1,
                   help="cellstate server replicas (default 1)")
    d.add_argument("--batch-instances", type=positive(int), default=2,
                   help="instances of the batch scheduler sharing its queue (default 2)")
    d.add_argument("--jobs-per-second", type=positive(float), default=4.0,
                   help="jobs the workload submits per second, on average (default 4)")
    d.add_argument("--flow-policy", default="quincy",
                   help="the flow scheduler's cost model: quincy (default), load-spread, "
                        "network, trivial or aladdin (Aladdin+H, e.g. with --spec alibaba)")
    d.add_argument("--mapreduce-policy", default="max-parallel",
                   help="the mapreduce scheduler's policy: max-parallel (default), "
                        "global-cap or relative-size")
    d.add_argument("--jobs", help="a job file (JSON or TOML, as omega submit --file) to "
                                  "submit once the schedulers run; the demo checks at the "
                                  "end that their placement rules hold")
    d.add_argument("--settle", type=non_negative_float, default=60.0,
                   help="with --jobs: after --duration, seconds to wait at most for the "
                        "job file's tasks to be placed before the final check (default 60)")
    d.add_argument("--seed", type=int, default=1,
                   help="random seed of the workload and schedulers (default 1; the same "
                        "seed submits the same jobs)")
    d.add_argument("--no-fsync", action="store_true", help="etcd --unsafe-no-fsync (faster)")
    d.add_argument("--data-dir", help="keep etcd's data and the processes' logs here "
                                      "(default: a temp dir)")
    d.add_argument("--insecure", action="store_true",
                   help="run every process over plaintext gRPC, without identities "
                        "(default: mutual TLS with certificates made in the data dir)")
    d.add_argument("--contention", choices=["low", "high"], default="low",
                   help="low (default), or high: at least 4 batch instances with "
                        "coarse-grained conflict detection and 3x the jobs, so schedulers "
                        "visibly conflict and retry")
    d.add_argument("--keep-going", action="store_true",
                   help="when a process dies (kill a scheduler, agent or server to see "
                        "failover), report it and go on (default: stop the demo)")
    d.add_argument("--no-dashboard", action="store_true",
                   help="do not start the web dashboard (default: `omega dashboard` on a "
                        "free port; the demo prints its address)")
    d.add_argument("--allow-commands", action="store_true",
                   help="agents run the commands of the demo's users and of your shell's "
                        "omega submit (sleep, echo, sh, cat, date, true, false, python3), "
                        "logging their output for omega logs")
    d.add_argument("--no-metrics", action="store_true",
                   help="do not serve Prometheus metrics (default: every server, scheduler "
                        "and agent serves them; the demo prints where)")
    d.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega import logfmt
    from omega.demo import DemoOptions, run_demo

    stats = run_demo(DemoOptions(
        duration=args.duration, spec=args.spec, agents=args.agents, servers=args.servers,
        batch_instances=args.batch_instances, jobs_per_second=args.jobs_per_second,
        seed=args.seed, no_fsync=args.no_fsync, data_dir=args.data_dir,
        flow_policy=args.flow_policy, mapreduce_policy=args.mapreduce_policy,
        jobs=args.jobs, settle=args.settle, insecure=args.insecure, contention=args.contention,
        keep_going=args.keep_going, metrics=not args.no_metrics,
        dashboard=not args.no_dashboard, allow_commands=args.allow_commands,
        log_format=logfmt.log_format(args.log_format)), sys.stdout)
    return stats.exit_code

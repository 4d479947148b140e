"""``omega scheduler``: one scheduler instance of any registered policy."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from omega.commands.common import DEFAULT_CELLSTATE, cert_name, option, options_from_flags
from omega.security import tls_from_args

if TYPE_CHECKING:
    from schedulers.process import SchedulerProcessConfig

ORDER = 15


def register(sub: Any) -> None:
    c = sub.add_parser(
        "scheduler", help="run one scheduler instance",
        description="Run one scheduler instance: `omega scheduler flow --policy quincy`, "
                    "or (the older form) `omega scheduler --name batch`.")
    c.add_argument("scheduler", nargs="?", metavar="SCHEDULER",
                   help="the registered policy to run (batch, service, flow or a plugin's); "
                        "also the scheduler's name unless --name or the file gives one")
    c.add_argument("--cellstate", help="cellstate server address(es), comma-separated "
                                       "(default: the config file's, $OMEGA_CELLSTATE or "
                                       f"{DEFAULT_CELLSTATE})")
    c.add_argument("--config", help="TOML file (see schedulers/process.py); flags override it")
    c.add_argument("--name", help="scheduler name (jobs name it)")
    c.add_argument("--policy",
                   help="with SCHEDULER: the policy's own `policy` option (flow: its cost "
                        "model, quincy, load-spread, network or trivial); without: the "
                        "registered policy (default: the name)")
    c.add_argument("--option", action="append", type=option, default=[], metavar="KEY=VALUE",
                   help="an option of the policy, over the file's [options] (repeatable; "
                        "numbers, true and false are typed, anything else is a string; "
                        "costs.migrate_cost=100 sets one entry of the costs table)")
    c.add_argument("--instance", help="instance id (default host-pid)")
    c.add_argument("--cell", help="cell name (default 'default')")
    c.add_argument("--mode", choices=["incremental", "gang"],
                   help="how transactions commit: incremental (default: what fits) or gang "
                        "(all claims or none)")
    c.add_argument("--detection", choices=["fine", "coarse"],
                   help="conflict detection: fine (default: only claims that no longer "
                        "fit) or coarse (any change to the machine)")
    c.add_argument("--seed", type=int, help="random seed of the policy (default: random)")
    c.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)")
    c.set_defaults(func=run)


def scheduler_process_config(args: argparse.Namespace) -> SchedulerProcessConfig:
    """The scheduler process's configuration from ``omega scheduler``'s arguments and
    its config file. Two forms: ``omega scheduler SCHEDULER [--policy P]`` runs the
    registered policy SCHEDULER (named SCHEDULER unless --name or the file names it)
    and hands P to it as its ``policy`` option; without SCHEDULER, ``--policy`` is the
    registered policy, as it always was."""
    from cellstate.api.config import read_toml
    from schedulers.process import scheduler_config

    doc = read_toml(args.config) if args.config else {}
    section = doc.get("scheduler")
    in_file = set(section) if isinstance(section, dict) else set()
    options = options_from_flags(args.option)
    name, policy = args.name, args.policy
    if args.scheduler:
        if policy is not None:
            if "policy" in options:
                raise ValueError("give the policy's `policy` option once: --policy or "
                                 "--option policy=..., not both")
            options["policy"] = policy
        policy = args.scheduler
        if name is None and "name" not in in_file:
            name = args.scheduler
    elif policy is not None:
        _hint_flow_form(policy)
    overrides = {"name": name, "policy": policy, "instance": args.instance,
                 "cell": args.cell, "mode": args.mode, "detection": args.detection,
                 "seed": args.seed}
    from omega.clientconfig import default

    overrides["cellstate"] = args.cellstate or (
        None if "cellstate" in in_file else default("cellstate", DEFAULT_CELLSTATE))
    return scheduler_config(doc, overrides, args.config or "", options)


def _scheduler_tls(args: argparse.Namespace, config: SchedulerProcessConfig,
                   ) -> SchedulerProcessConfig:
    """The scheduler's TLS files; its certificate must name it (``scheduler:NAME``)."""
    import attrs

    tls = tls_from_args(args)
    name = cert_name(tls, "scheduler")
    if tls is not None and name != config.name:
        raise ValueError(f"--cert {tls.cert} names scheduler {name!r}, not {config.name!r}: "
                         "the server would refuse every call")
    return attrs.evolve(config, tls=tls)


def _hint_flow_form(policy: str) -> None:
    """`--policy quincy` without SCHEDULER names a registered policy; a flow cost model
    there is the newer form mistyped: say which command was meant."""
    from schedulers.registry import Registry

    if policy in Registry.from_entry_points().names():
        return
    from schedulers.flow.costs import COST_MODELS

    if policy in COST_MODELS:
        raise ValueError(f"no scheduler policy named {policy!r}; {policy} is a cost model of "
                         f"the flow scheduler: omega scheduler flow --policy {policy}")


def run(args: argparse.Namespace) -> int:
    import attrs

    from omega.signals import stop_event_on_signals
    from schedulers.process import make_policy, run_scheduler
    from schedulers.registry import Registry

    config = scheduler_process_config(args)
    # The policy before the certificate: `omega scheduler nosuch` with a certificate
    # of another scheduler is a policy that does not exist, and says so.
    make_policy(Registry.from_entry_points(), config)
    config = attrs.evolve(_scheduler_tls(args, config), metrics=args.metrics)
    run_scheduler(config, stop_event_on_signals())  # bad options stop it before it connects
    return 0

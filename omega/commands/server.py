"""``omega server``: a cellstate server replica."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from cellstate.model import check_name
from omega.security import add_etcd_flags, etcd_access_from_args, tls_from_args

ORDER = 13


def register(sub: Any) -> None:
    s = sub.add_parser("server", help="run a cellstate server replica")
    s.add_argument("--config", help="TOML file (see docs/operations.md); flags override it")
    s.add_argument("--listen", help="host:port to serve gRPC on (default 127.0.0.1:7070)")
    s.add_argument("--etcd", help="etcd endpoint(s), comma-separated")
    s.add_argument("--cell", help="cell name (default 'default'; one etcd holds several)")
    s.add_argument("--name", help="this replica's name in status output")
    s.add_argument("--commit-leader", action=argparse.BooleanOptionalAction, default=None,
                   help="commit through one elected commit leader (the default), or "
                   "--no-commit-leader: every server commits straight to etcd")
    s.add_argument("--commit-pipeline", action=argparse.BooleanOptionalAction, default=None,
                   help="the commit leader decides the next batch while the previous one's "
                   "write is in flight, or --no-commit-pipeline (the default): one batch at "
                   "a time")
    s.add_argument("--leader-ttl", type=int, default=None, metavar="SECONDS",
                   help="the commit leader's lease (default 5): a crashed leader is "
                   "replaced within it")
    s.add_argument("--advertise", metavar="HOST:PORT",
                   help="where the other servers reach this one to forward commits when it "
                   "leads (default: --listen's host and port; a wildcard host becomes this "
                   "host's name)")
    add_etcd_flags(s)
    s.add_argument("--metrics", default="", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import attrs

    from cellstate.api.config import address, addresses, read_toml, server_config
    from cellstate.api.server import CellStateServer
    from cellstate.gc_tuning import tune_for_large_heap
    from omega.proc import seconds_since_exec
    from omega.signals import stop_event_on_signals

    imported = seconds_since_exec()  # the interpreter and the imports so far
    doc = read_toml(args.config) if args.config else {}
    config = server_config(doc, args.config or "")
    if args.listen:
        listen = address(args.listen, "--listen", listen=True)
        config = attrs.evolve(config, listen=listen,
                              name=config.name if doc.get("name") else listen)
    if args.etcd:
        config = attrs.evolve(config, etcd=addresses(args.etcd, "--etcd"))
    if args.cell:
        config = attrs.evolve(config, cell=check_name(args.cell, "--cell"))
    if args.name:
        config = attrs.evolve(config, name=args.name)
    if args.advertise:
        config = attrs.evolve(config, advertise=address(args.advertise, "--advertise"))
    if args.commit_leader is not None:
        config = attrs.evolve(config, commit_leader=args.commit_leader)
    if args.commit_pipeline is not None:
        config = attrs.evolve(config, commit_pipeline=args.commit_pipeline)
    if args.leader_ttl is not None:
        if not 1 <= args.leader_ttl <= 60:
            raise ValueError(f"--leader-ttl: {args.leader_ttl} is not between 1 and 60 seconds")
        config = attrs.evolve(config, leader_ttl=args.leader_ttl)
    if args.cert or args.insecure or config.tls is None:
        if args.insecure and config.tls is not None:
            raise ValueError(f"--insecure, but {args.config} has a [tls] table: give one")
        config = attrs.evolve(config, tls=tls_from_args(args))
    config = attrs.evolve(config, etcd_access=etcd_access_from_args(args, config.etcd_access))
    if config.etcd_access.anonymous:
        print(f"WARNING: omega server: etcd without credentials "
              f"({config.etcd_access.describe()}): whoever reaches etcd owns the cell; "
              "lock it down (docs/security.md, --etcd-cert or [etcd] cert)",
              file=sys.stderr, flush=True)
    from omega.cliglobal import check_listen, start_server
    from omega.logfmt import announce

    check_listen(config.listen)  # before loading the cell: a taken port fails at once
    stop = stop_event_on_signals()
    kv = config.etcd_access.connect(config.etcd, config.cell)
    try:
        server = CellStateServer(kv, config)
        exporter = contextlib.ExitStack()
        if args.metrics:
            from cellstate.api.metrics import CellCollector, ServerMetrics, serving

            registry = exporter.enter_context(serving(args.metrics,
                                                      CellCollector(server.service)))
            server.service.metrics = ServerMetrics(registry)
        exporter.enter_context(contextlib.closing(_Stopper(server)))
        port = start_server(server, config.listen)
        tune_for_large_heap()  # the cell is loaded: keep the collector off it
        since = seconds_since_exec()
        announce("cellstate %s serving cell %s on port %d (etcd %s, %s; %s); %s",
                 config.name, config.cell, port, ",".join(config.etcd),
                 config.etcd_access.describe(),
                 "mutual TLS" if config.tls else "PLAINTEXT, --insecure",
                 _startup_text(since, imported, server.startup))
        with exporter:
            stop.wait()
    finally:
        kv.close()
    return 0


def _startup_text(since: float | None, imported: float | None,
                  phases: dict[str, float]) -> str:
    """Where a server's start went: from exec to serving, and its phases."""
    parts = [f"imports {imported:.2f} s"] if imported is not None else []
    parts += [f"{k.removesuffix('_s')} {v:.2f} s" for k, v in phases.items()]
    total = f"serving {since:.2f} s after exec" if since is not None else "serving"
    return f"{total} ({', '.join(parts)})"


class _Stopper:
    """``server.stop()`` as a ``close()`` for an exit stack."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def close(self) -> None:
        self.server.stop()

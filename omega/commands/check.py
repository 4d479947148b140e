"""``omega check`` and ``omega recover``: administration straight on etcd."""

from __future__ import annotations

import argparse
from typing import Any

from omega.commands.common import emit
from omega.security import add_etcd_flags, etcd_access_from_args

ORDER = 50
TLS = False  # talks to no cellstate server


def register(sub: Any) -> None:
    for name, text in (("check", "check a cell's invariants on etcd (exit 1 if broken)"),
                       ("recover", "finish what crashed committers left behind, on etcd")):
        x = sub.add_parser(name, help=text)
        x.add_argument("--etcd", required=True, help="etcd endpoint(s), comma-separated")
        x.add_argument("--cell", default="default", help="cell name (default 'default')")
        add_etcd_flags(x)
        x.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cellstate.api.config import addresses
    from cellstate.invariants import layout_violations, violations
    from cellstate.kv.base import range_all
    from cellstate.replica import snapshot_from_kvs
    from cellstate.store import CellStore

    kv = etcd_access_from_args(args).connect(addresses(args.etcd, "--etcd"), args.cell)
    try:
        store = CellStore(kv, args.cell)
        if args.command == "recover":
            touched = store.recover()
            emit(args, {"gangs": touched}, f"settled or cleared {len(touched)} gang(s)")
            return 0
        res = range_all(kv, store.keys.root)
        snap = snapshot_from_kvs(store.keys, res.kvs, res.revision)
        problems = violations(snap) + layout_violations(store.keys, res.kvs)
        emit(args, {"revision": snap.revision, "violations": problems},
              "\n".join(problems) or f"cell {args.cell} at revision {snap.revision}: ok")
        return 1 if problems else 0
    finally:
        kv.close()

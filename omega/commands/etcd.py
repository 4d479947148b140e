"""``omega etcd``: a local single-member etcd in the foreground."""

from __future__ import annotations

import argparse
from typing import Any

ORDER = 12
TLS = False  # talks to no cellstate server


def register(sub: Any) -> None:
    e = sub.add_parser("etcd", help="run a local single-member etcd in the foreground")
    e.add_argument("--data-dir", help="keep its data here (default: a temporary folder)")
    e.add_argument("--no-fsync", action="store_true",
                   help="etcd --unsafe-no-fsync (faster; for tests and demos)")
    e.add_argument("--listen", metavar="127.0.0.1:PORT",
                   help="the client address (loopback only: a local etcd; default: a free "
                        "port, printed)")
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.etcd_launcher import main as etcd_main

    return etcd_main([*(["--data-dir", args.data_dir] if args.data_dir else []),
                      *(["--unsafe-no-fsync"] if args.no_fsync else []),
                      *(["--port", str(_etcd_port(args.listen))] if args.listen else [])])


def _etcd_port(listen: str) -> int:
    """``omega etcd --listen``'s port: the local etcd serves on loopback only."""
    from cellstate.api.config import address
    from omega.cliglobal import check_listen

    host, _, port = address(listen, "--listen", listen=True).rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"--listen {listen}: omega etcd serves on 127.0.0.1 only (a local "
                         "etcd for one machine); run an etcd cluster for other hosts")
    check_listen(f"127.0.0.1:{port}")
    return int(port)

"""``omega etcd-auth``: lock etcd down for a cell."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omega.security import add_etcd_flags, etcd_access_from_args

ORDER = 51
TLS = False  # talks to no cellstate server


def register(sub: Any) -> None:
    ea = sub.add_parser("etcd-auth", help="lock etcd down for a cell: a root user, a role "
                                          "per kind of process, users, auth on")
    ea.add_argument("--etcd", required=True, help="etcd endpoint(s), comma-separated")
    ea.add_argument("--cell", default="default", help="cell name (default 'default')")
    ea.add_argument("--server", action="append", default=[], metavar="USER[=PASSWORD_FILE]",
                    help="an etcd user with the cell's server role (read-write on the "
                         "cell's keys): a certificate's common name, or a user with the "
                         "password in PASSWORD_FILE (repeatable)")
    ea.add_argument("--reader", action="append", default=[], metavar="USER[=PASSWORD_FILE]",
                    help="an etcd user with the cell's reader role (omega check; "
                         "repeatable)")
    ea.add_argument("--root-password-file",
                    help="the root user's password (default: none, root authenticates by "
                         "a certificate whose common name is root only)")
    add_etcd_flags(ea)
    ea.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cellstate.api.config import addresses
    from cellstate.etcd_auth import RoleKind, lock_down

    users = [_etcd_user(spec, RoleKind.SERVER) for spec in args.server]
    users += [_etcd_user(spec, RoleKind.READER) for spec in args.reader]
    root = (_password(Path(args.root_password_file), "--root-password-file")
            if args.root_password_file else None)
    access = etcd_access_from_args(args)
    kv = access.connect(addresses(args.etcd, "--etcd"), args.cell)
    try:
        made = lock_down(kv, args.cell, users, root)
    finally:
        kv.close()
    print(f"etcd auth on for cell {args.cell}: "
          f"{'made ' + ', '.join(made) if made else 'everything was there already'}")
    return 0


def _etcd_user(spec: str, kind: str) -> Any:
    from cellstate.etcd_auth import EtcdUser

    name, _, password_file = spec.partition("=")
    if not name:
        raise ValueError(f"--{kind} {spec!r}: no user name")
    password = _password(Path(password_file), f"--{kind} {name}") if password_file else None
    return EtcdUser(name, kind, password)


def _password(path: Path, where: str) -> str:
    password = path.read_text().strip()
    if not password:
        raise ValueError(f"{where}: {path} is empty")
    return password

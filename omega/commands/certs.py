"""``omega certs DIR``: a development CA and certificates for a cell."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omega.commands.common import positive

ORDER = 11
TLS = False  # talks to no cellstate server


def register(sub: Any) -> None:
    cs = sub.add_parser("certs", help="make a development CA and certificates for a cell")
    cs.add_argument("dir", metavar="DIR", help="folder of the CA and the certificates "
                                               "(the CA is made once and reused)")
    cs.add_argument("identities", nargs="*", metavar="KIND:NAME",
                    help="identities to issue (operator, user, scheduler, agent or server "
                         ":NAME); default: every process of the demo or compose cell")
    cs.add_argument("--host", action="append", default=[],
                    help="a name or address clients dial servers by (repeatable; default "
                         "localhost, 127.0.0.1 and cellstate-0..2)")
    cs.add_argument("--agents", type=positive(int), default=2,
                    help="agents of the default set (agent-0...; default 2)")
    cs.add_argument("--days", type=positive(int), default=365,
                    help="days the certificates are valid (default 365)")
    cs.add_argument("--etcd-member", action="append", default=[], metavar="NAME",
                    help="also an etcd member's certificate (client and peer TLS, for the "
                         "host NAME; etcd-member-NAME.pem) and, with it, one for etcd's "
                         "root user (etcd-root.pem); repeatable")
    cs.add_argument("--keep", action="store_true",
                    help="issue only certificates that do not exist yet (a restart of "
                         "compose's certs service rotates nothing)")
    cs.add_argument("--revoke", action="store_true",
                    help="revoke the current certificates of the identities given instead "
                         "of issuing (DIR/crl.pem; servers with [auth] crl refuse them)")
    cs.add_argument("--ca-key", metavar="FILE",
                    help="the CA's private key (default DIR/ca.key): elsewhere, DIR can be "
                         "given to every process without the key that signs for all")
    cs.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cellstate.api.auth import parse_identity
    from omega.certs import DEFAULT_HOSTS, DevCA, cell_identities
    from schedulers.registry import Registry

    who = ([parse_identity(i, "KIND:NAME") for i in args.identities] if args.identities else
           cell_identities(sorted(Registry.from_entry_points().names()), args.agents))
    hosts = args.host or [*DEFAULT_HOSTS, "cellstate-0", "cellstate-1", "cellstate-2"]
    ca = DevCA(Path(args.dir), Path(args.ca_key) if args.ca_key else None)
    if args.revoke:
        if not args.identities:
            raise ValueError("--revoke: name the identities (KIND:NAME) to revoke")
        for identity in who:
            print(f"{identity}: certificate {ca.revoke(identity):x} revoked "
                  f"({ca.crl_path})")
        return 0
    if not ca.crl_path.exists():
        ca.write_crl()  # an empty list, for servers to be pointed at from the start
    for identity in who:
        files = ca.files(identity)
        if not (args.keep and files.cert.exists() and files.key.exists()):
            files = ca.issue(identity, hosts, args.days)
        print(f"{identity}: {files.cert} {files.key}")
    for member in args.etcd_member:
        files = ca.issue_etcd_member(member, DEFAULT_HOSTS, keep=args.keep)
        print(f"etcd member {member}: {files.cert} {files.key}")
    if args.etcd_member:
        files = ca.issue_etcd_root(keep=args.keep)
        print(f"etcd root user: {files.cert} {files.key}")
    print(f"CA: {ca.ca_path} (its key {ca.key_path} signs new "
          "certificates: keep it private)")
    return 0

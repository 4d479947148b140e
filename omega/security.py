"""TLS on the command line, the same for every kind of process.

Every ``omega`` command that talks to (or is) a cellstate server takes ``--ca``,
``--cert``, ``--key`` (or $OMEGA_CA, $OMEGA_CERT, $OMEGA_KEY) and ``--insecure`` (or
$OMEGA_INSECURE=1). :func:`add_tls_flags` adds them to a subcommand and
:func:`tls_from_args` turns them into the :class:`~cellstate.api.tls.TlsFiles` that
the server, :class:`~cellstate.api.client.CellClient` and every process config take.
Plaintext is never a default: without credentials a command stops and says what to
give; with ``--insecure`` it runs and says loudly, on stderr, what that gives up.

:func:`process_identity` tells which identity a process started with an ``omega``
command line runs as (the demo and the end-to-end tests issue its certificate), read
from the flags that name it, so a new scheduler (``omega scheduler fair``) is covered
without a list kept here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cellstate.api.auth import Identity, Kind
from cellstate.api.tls import TlsFiles
from cellstate.errors import ConfigError

if TYPE_CHECKING:
    from cellstate.etcd_auth import EtcdAccess

NO_CREDENTIALS = ("no TLS credentials: give --ca, --cert and --key (or $OMEGA_CA, "
                  "$OMEGA_CERT, $OMEGA_KEY; `omega certs` makes them), or --insecure for "
                  "plaintext without identities")


def add_tls_flags(p: argparse.ArgumentParser) -> None:
    from omega.clientconfig import default

    g = p.add_argument_group("TLS (docs/security.md)")
    g.add_argument("--ca", default=default("ca"),
                   help="the cell's CA certificate (default $OMEGA_CA or the config file's)")
    g.add_argument("--cert", default=default("cert"),
                   help="this process's certificate; its common name is the identity "
                        "(default $OMEGA_CERT or the config file's)")
    g.add_argument("--key", default=default("key"),
                   help="the certificate's private key (default $OMEGA_KEY, the config "
                        "file's, else the certificate's path with .key for .pem)")
    g.add_argument("--insecure", action="store_true", default=default("insecure", False),
                   help="plaintext gRPC: no encryption, no identities, anyone who can "
                        "reach a server may do anything (default $OMEGA_INSECURE or the "
                        "config file's)")


def tls_from_args(args: argparse.Namespace) -> TlsFiles | None:
    """The TLS files the flags name, or None with --insecure (warned about on stderr)."""
    if args.insecure:
        if args.cert:
            raise ConfigError("--insecure and --cert: give one (unset $OMEGA_CERT or "
                              "$OMEGA_INSECURE)")
        print(f"WARNING: omega {args.command}: --insecure: PLAINTEXT gRPC, no identities; "
              "anyone who can reach the cellstate server may do anything, including "
              "running commands on agents that allow it", file=sys.stderr, flush=True)
        return None
    if not args.cert:
        raise ConfigError(NO_CREDENTIALS)
    if not args.ca:
        raise ConfigError("--cert without --ca: give the cell's CA certificate too")
    cert = Path(args.cert)
    key = Path(args.key) if args.key else cert.with_suffix(".key")
    return TlsFiles(Path(args.ca), cert, key)


def process_identity(argv: Sequence[str]) -> Identity:
    """The identity of the process ``omega ARGV`` starts: ``server:<--name>``,
    ``agent:<--id>``, ``scheduler:<its name>`` (``--name``, else the policy given first,
    else its config file's), ``submitter:workload`` for the workload generator (it
    submits jobs on behalf of many owners, and may do nothing else), else
    ``operator:admin``. (Read here, not with the CLI's parser, which imports the
    demo that calls this.)"""
    command = argv[0] if argv else ""
    if command == "server":
        return Identity(Kind.SERVER, _flag(argv, "--name") or "cellstate")
    if command == "agent":
        agent = _flag(argv, "--id")
        if not agent:
            raise ConfigError("an agent with TLS needs --id (its certificate's name)")
        return Identity(Kind.AGENT, agent)
    if command == "scheduler":
        name = _flag(argv, "--name")
        if not name and len(argv) > 1 and not argv[1].startswith("-"):
            name = argv[1]
        config = _flag(argv, "--config")
        if not name and config:
            from cellstate.api.config import read_toml

            section = read_toml(config).get("scheduler")
            name = str(section.get("name", "")) if isinstance(section, dict) else ""
        if not name:
            raise ConfigError(f"cannot tell the scheduler's name from {' '.join(argv)}")
        return Identity(Kind.SCHEDULER, name)
    if command == "workload":
        return Identity(Kind.SUBMITTER, "workload")
    if command == "dashboard":
        return Identity(Kind.USER, "dashboard")  # it only reads
    return Identity(Kind.OPERATOR, "admin")


def _flag(argv: Sequence[str], flag: str) -> str:
    """The value of ``flag`` (``--flag V`` or ``--flag=V``; the last one wins), or ""."""
    value = ""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def tls_argv(tls: TlsFiles | None) -> list[str]:
    """The flags that hand ``tls`` to an ``omega`` command (``--insecure`` for None)."""
    if tls is None:
        return ["--insecure"]
    return ["--ca", str(tls.ca), "--cert", str(tls.cert), "--key", str(tls.key)]


def certificate_identity(path: Path) -> Identity:
    """The identity a certificate file names (its common name)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from cellstate.api.auth import parse_identity

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable PEM certificate ({e})") from None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ConfigError(f"{path}: the certificate has no common name")
    return parse_identity(str(names[0].value), f"{path}: common name")


class CellCredentials:
    """A local cell's development CA (``omega certs``' kind) and the TLS flags of each
    ``omega`` process started in it: the demo's and the end-to-end tests' cells.

    With TLS, only the schedulers the cell's configuration lists have any rights, so
    its servers get a configuration (``server.toml`` beside the certificates) listing
    ``schedulers``, without limits.

    With ``lock_etcd`` the cell's etcd is locked down too (cellstate/etcd_auth.py):
    :attr:`etcd_server` is etcd's own certificate, :attr:`etcd_root` the one of its
    root user, and each server reaches etcd with its own certificate (its common name
    its etcd user)."""

    def __init__(self, folder: Path, schedulers: Sequence[str],
                 limits: Mapping[str, Mapping[str, float]] | None = None,
                 *, lock_etcd: bool = False) -> None:
        from omega.certs import DevCA

        self.ca = DevCA(folder)
        # Revoked certificates (`omega certs DIR --revoke`), refused by every server.
        self.crl = self.ca.crl_path if self.ca.crl_path.exists() else self.ca.write_crl()
        self.lock_etcd = lock_etcd
        self.schedulers = list(schedulers)
        self.server_config = folder / "server.toml"
        self.limit(limits or {})

    def limit(self, pools: Mapping[str, Mapping[str, float]]) -> None:
        """Give schedulers resource limits in the servers' configuration (servers
        started afterwards read it)."""
        self.server_config.write_text(limits_toml(self.schedulers, pools)
                                      + auth_toml(self.crl))

    @property
    def etcd_server(self) -> TlsFiles:
        """etcd's own certificate, for 127.0.0.1 and localhost."""
        return self.ca.issue_etcd_member("etcd", ["127.0.0.1", "localhost"], keep=True)

    @property
    def etcd_root(self) -> TlsFiles:
        """A client certificate of etcd's root user (common name ``root``)."""
        return self.ca.issue_etcd_root(keep=True)

    def files(self, identity: Identity) -> TlsFiles:
        return self.ca.ensure(identity)

    @property
    def operator(self) -> TlsFiles:
        return self.files(Identity(Kind.OPERATOR, "admin"))

    def argv(self, args: Sequence[str]) -> list[str]:
        """``omega ARGS`` with the TLS flags of the identity it runs as (and, for a
        server, the configuration that lists the cell's schedulers)."""
        files = self.files(process_identity(args))
        extra = tls_argv(files)
        args = list(args)
        if args and args[0] == "server":
            if "--config" in args:
                # A configuration of the caller's own: the cell's schedulers it does not
                # list are added (with no limits), so they keep their rights.
                at = args.index("--config") + 1
                args[at] = str(self._with_schedulers(Path(args[at])))
            else:
                extra += ["--config", str(self.server_config)]
            if self.lock_etcd:
                extra += etcd_argv(files)
        return [*args, *extra]

    def _with_schedulers(self, config: Path) -> Path:
        import tomllib

        text = config.read_text()
        doc = tomllib.loads(text)
        listed = doc.get("limits", {})
        missing = [n for n in sorted(self.schedulers) if n not in listed]
        out = self.server_config.with_name(f"server-{config.stem}.toml")
        out.write_text(text + ("\n" if text and not text.endswith("\n") else "")
                       + "".join(f"[limits.{n}]\n" for n in missing)
                       + ("" if "auth" in doc else auth_toml(self.crl)))
        return out


def etcd_argv(files: TlsFiles) -> list[str]:
    """The flags that reach etcd with ``files``' certificate (its etcd user)."""
    return ["--etcd-ca", str(files.ca), "--etcd-cert", str(files.cert),
            "--etcd-key", str(files.key)]


def limits_toml(schedulers: Sequence[str], pools: Mapping[str, Mapping[str, float]]) -> str:
    """A server configuration listing ``schedulers`` (with TLS, only listed ones have
    rights), each limited to its pool in ``pools`` (resource -> amount), if any."""
    out = []
    for name in sorted(set(schedulers) | set(pools)):
        out.append(f"[limits.{name}]\n")
        pool = pools.get(name)
        if pool:
            amounts = ", ".join(f"{d} = {a:g}" for d, a in sorted(pool.items()))
            out.append(f"max_resources = {{ {amounts} }}\n")
    return "".join(out)


def auth_toml(crl: Path) -> str:
    """The servers' ``[auth]`` table of a local cell: its revocation list, and the
    owners the workload generator (``submitter:workload``) may name (a submitter names
    only itself unless listed)."""
    from omega.workload import OWNERS

    return (f"[auth]\ncrl = {str(crl)!r}\n[auth.submitters]\nworkload = ["
            + ", ".join(f'"{o}"' for o in OWNERS) + "]\n")


def insecure_argv(args: Sequence[str]) -> list[str]:
    return [*args, "--insecure"]


def add_etcd_flags(p: argparse.ArgumentParser) -> None:
    """How a command that talks to etcd itself (the server, ``omega check``, ``omega
    recover``, ``omega etcd-auth``) reaches it: cellstate/etcd_auth.py."""
    env = os.environ.get
    g = p.add_argument_group("etcd access (docs/security.md, \"etcd locked down\")")
    g.add_argument("--etcd-ca", default=env("OMEGA_ETCD_CA"),
                   help="CA certificate that signed etcd's (TLS to etcd; default "
                        "$OMEGA_ETCD_CA)")
    g.add_argument("--etcd-cert", default=env("OMEGA_ETCD_CERT"),
                   help="client certificate for etcd; with --client-cert-auth its common "
                        "name is the etcd user (default $OMEGA_ETCD_CERT)")
    g.add_argument("--etcd-key", default=env("OMEGA_ETCD_KEY"),
                   help="its key (default $OMEGA_ETCD_KEY, else the certificate's path "
                        "with .key)")
    g.add_argument("--etcd-user", default=env("OMEGA_ETCD_USER"),
                   help="etcd user for password auth (default $OMEGA_ETCD_USER)")
    g.add_argument("--etcd-password-file", default=env("OMEGA_ETCD_PASSWORD_FILE"),
                   help="file holding that user's password (default "
                        "$OMEGA_ETCD_PASSWORD_FILE)")
    g.add_argument("--etcd-timeout", type=float, metavar="SECONDS",
                   help="seconds one etcd request may take, its retries on the other "
                        "endpoints included; an unreachable etcd is reported after about "
                        "this long (default 10)")
    g.add_argument("--etcd-attempt-timeout", type=float, metavar="SECONDS",
                   help="with several endpoints: seconds one attempt may go unanswered "
                        "before the request moves to the next endpoint (a stalled "
                        "member), doubling each round (default 2)")


def etcd_access_from_args(args: argparse.Namespace,
                          base: EtcdAccess | None = None) -> EtcdAccess:
    """``base`` (the config file's ``[etcd]`` credentials) with what the flags give
    instead; a flag replaces the file's setting of the same name."""
    from cellstate.etcd_auth import EtcdAccess

    base = base or EtcdAccess()

    def path(flag: str | None, current: Path | None) -> Path | None:
        return Path(flag) if flag else current

    timeout, attempt = args.etcd_timeout, args.etcd_attempt_timeout
    return EtcdAccess(path(args.etcd_ca, base.ca), path(args.etcd_cert, base.cert),
                      path(args.etcd_key, base.key), args.etcd_user or base.user,
                      path(args.etcd_password_file, base.password_file),
                      base.timeout if timeout is None else timeout,
                      base.attempt_timeout if attempt is None else attempt)

"""etcd locked down: how a process reaches etcd, and the roles a cell's processes get.

Whoever can write etcd owns the cell, so etcd takes no anonymous client: its client
port speaks TLS, every client presents a certificate the cell's CA signed
(``--client-cert-auth``), and with etcd's authentication on each client is an etcd
user whose roles say which keys it may touch. A client is that user either by its
certificate (etcd takes the certificate's common name as the user name: the demo's
and compose's way, no secret beyond the key) or by a user name and a password (read
from a file, never from a command line).

:class:`EtcdAccess` is one process's way in (the ``[etcd]`` table of the server's
configuration, or the ``--etcd-*`` flags); :func:`lock_down` makes the roles and
users of a cell and turns authentication on. Roles, one per kind of process that
talks to etcd, each limited to the cell's keys:

* ``omega-<cell>-server``: read and write the cell (``/omega/<cell>/``), its scheduler
  instances' metrics and pending reports (``/omega-metrics/<cell>/``,
  ``/omega-pending/<cell>/``), the maintenance lock and the commit leader's election
  key (``/omega-leader/<cell>``): the cellstate servers, and
  ``omega recover`` (which finishes a crashed server's commits);
* ``omega-<cell>-reader``: read the cell, its metrics and pending reports: ``omega
  check``, the demo's last check, monitoring.

Nothing else gets a role: schedulers, agents and users reach the cell only through a
cellstate server. The root user (etcd's administrator: users, roles, and the
maintenance operations defragment and alarm disarm) is for operators only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from cellstate.errors import ConfigError
from cellstate.keys import Keyspace, leader_key, metrics_prefix, pending_prefix
from cellstate.kv.base import prefix_end
from cellstate.kv.etcd import DEFAULT_ATTEMPT_TIMEOUT, EtcdKV
from cellstate.maintenance import LOCK_KEY

ROOT: Final = "root"
# Read to learn etcd's --max-txn-ops (EtcdKV probes with reads, writes nothing): a key
# inside the cell's prefix, since a role limited to the prefix may read nothing else.
_PROBE: Final = b"\x00max-txn-ops-probe"


class RoleKind:
    SERVER: Final = "server"
    READER: Final = "reader"


KINDS: Final = (RoleKind.SERVER, RoleKind.READER)


def role_name(cell: str, kind: str) -> str:
    return f"omega-{cell}-{kind}"


def cell_permissions(cell: str, kind: str) -> list[tuple[bytes, bytes | None, bool]]:
    """``kind``'s permissions in ``cell``: (key, range end or None for one key, write)."""
    prefixes = (Keyspace(cell).root, metrics_prefix(cell), pending_prefix(cell))
    if kind == RoleKind.SERVER:
        return [*((p, prefix_end(p), True) for p in prefixes), (LOCK_KEY, None, True),
                (leader_key(cell), None, True)]
    if kind == RoleKind.READER:
        return [(p, prefix_end(p), False) for p in prefixes]
    raise ValueError(f"no etcd role kind {kind!r}; one of {', '.join(KINDS)}")


def probe_key(cell: str) -> bytes:
    return Keyspace(cell).root + _PROBE


@attrs.frozen
class EtcdUser:
    """An etcd user to make: its name (with certificates, the common name of its
    certificate), the kind of role it gets, and its password (None: it authenticates
    by certificate only)."""

    name: str
    kind: str
    password: str | None = None


def lock_down(kv: EtcdKV, cell: str, users: Sequence[EtcdUser],
              root_password: str | None = None) -> list[str]:
    """Make ``cell``'s roles and ``users``, a root user (``root_password`` None: it
    authenticates by a certificate whose common name is ``root`` only) and turn etcd's
    authentication on. Idempotent: what exists is kept (a user's password is not
    changed), so it may run at every start of a cluster (once auth is on, ``kv`` must
    be root). Returns what it made, for the log."""
    made = []
    if kv.user_add(ROOT, root_password):
        made.append("user root")
    kv.user_grant_role(ROOT, ROOT)
    for kind in KINDS:
        role = role_name(cell, kind)
        if kv.role_add(role):
            made.append(f"role {role}")
        for key, end, write in cell_permissions(cell, kind):
            kv.role_grant_permission(role, key, end, write=write)
    for user in users:
        if kv.user_add(user.name, user.password):
            made.append(f"user {user.name}")
        kv.user_grant_role(user.name, role_name(cell, user.kind))
    kv.auth_enable()
    return made


@attrs.frozen
class EtcdAccess:
    """How one process reaches etcd: TLS files (``ca`` checks etcd's certificate;
    ``cert``/``key`` are the client's, and with ``--client-cert-auth`` its user) and
    password auth (``user`` and a ``password_file``). Everything None: plaintext,
    anonymous (an etcd without TLS and auth: tests, ``--insecure`` demos)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    user: str | None = None
    password_file: Path | None = None
    # Seconds one etcd request may take, its retries on other endpoints included: an
    # unreachable etcd is reported after about this long.
    timeout: float = 10.0
    # Seconds one attempt may go unanswered before the request moves to the next
    # endpoint (a stalled member), doubling each round (EtcdKV's attempt_timeout).
    attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"etcd timeout (--etcd-timeout): {self.timeout!r} is not a "
                              "number of seconds above 0")
        if not (math.isfinite(self.attempt_timeout) and self.attempt_timeout > 0):
            raise ConfigError(f"etcd attempt timeout (--etcd-attempt-timeout): "
                              f"{self.attempt_timeout!r} is not a number of seconds above 0")
        if self.cert is not None and self.ca is None:
            raise ConfigError("etcd.cert (--etcd-cert) without etcd.ca (--etcd-ca): give "
                              "the CA that signed etcd's certificate too")
        if self.key is not None and self.cert is None:
            raise ConfigError("etcd.key (--etcd-key) without etcd.cert (--etcd-cert)")
        if (self.user is None) != (self.password_file is None):
            raise ConfigError("etcd.user (--etcd-user) and etcd.password_file "
                              "(--etcd-password-file) go together: give both or neither")

    @property
    def anonymous(self) -> bool:
        return self.cert is None and self.user is None

    def describe(self) -> str:
        if self.cert is not None:
            return f"TLS, certificate {self.cert}"
        tls = "TLS" if self.ca is not None else "PLAINTEXT"
        return f"{tls}, user {self.user}" if self.user else f"{tls}, anonymous"

    def connect(self, endpoints: Sequence[str], cell: str, timeout: float | None = None,
                ) -> EtcdKV:
        """An :class:`EtcdKV` with these credentials; a missing or unreadable file is
        a :class:`ConfigError` naming it."""
        ca = _read(self.ca, "etcd.ca", pem=True) if self.ca else None
        cert = _read(self.cert, "etcd.cert", pem=True) if self.cert else None
        key = None
        if self.cert is not None:
            key_path = self.key or self.cert.with_suffix(".key")
            key = _read(key_path, "etcd.key", pem=True)
        password = None
        if self.password_file is not None:
            password = _read(self.password_file, "etcd.password_file").decode().strip()
            if not password:
                raise ConfigError(f"etcd.password_file: {self.password_file} is empty")
        return EtcdKV(list(endpoints), timeout=timeout or self.timeout,
                      attempt_timeout=self.attempt_timeout, username=self.user,
                      password=password,
                      ca_cert=ca, cert_chain=cert, private_key=key,
                      probe_key=probe_key(cell))


def _read(path: Path, what: str, *, pem: bool = False) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what}: {path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{what}: {path}: cannot read ({e.strerror})") from None
    if pem and b"-----BEGIN" not in data:
        raise ConfigError(f"{what}: {path}: not a PEM file")
    return data


def access_from_table(doc: Mapping[str, object], where: str, base: Path | None) -> EtcdAccess:
    """The credentials in an ``[etcd]`` table (``ca``, ``cert``, ``key``, ``user``,
    ``password_file``; relative paths from ``base``, the config file's folder). The
    caller has checked that every value is a string."""
    def path(name: str) -> Path | None:
        value = doc.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}.{name}: expected a file path")
        p = Path(value)
        return base / p if base is not None and not p.is_absolute() else p

    user = doc.get("user")
    if user is not None and (not isinstance(user, str) or not user):
        raise ConfigError(f"{where}.user: expected a user name")
    return EtcdAccess(path("ca"), path("cert"), path("key"), user, path("password_file"))

"""Configuration files of the processes (TOML), checked field by field.

A bad file stops the process before it does anything, with the file, the field and
what is wrong: ``server.toml: etcd.endpoints[1]: "localhost" is not host:port``.
Command-line flags override the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from cellstate import codec
from cellstate.api.auth import DEFAULT_USER_MAX_PRECEDENCE, AuthPolicy
from cellstate.api.tls import TlsFiles
from cellstate.errors import (
    ConfigError as ConfigError,
)
from cellstate.etcd_auth import EtcdAccess, access_from_table
from cellstate.model import CellConfig, ModelError, check_name


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror})") from None


def address(value: object, where: str, *, listen: bool = False) -> str:
    """A host:port with a port in range (port 0, any free port, only to listen on)."""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a \"host:port\" string, got {value!r}")
    host, sep, port = value.rpartition(":")
    low = 0 if listen else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) < 65536:
        raise ConfigError(f"{where}: {value!r} is not host:port")
    return value


def addresses(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of \"host:port\" strings")
    return tuple(address(v, f"{where}[{i}]") for i, v in enumerate(value))


class _Section:
    def __init__(self, doc: object, where: str) -> None:
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{where}: expected a table")
        self.doc = doc
        self.where = where
        self.seen: set[str] = set()

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.seen.add(name)
        value = self.doc.get(name, default)
        if value is default:
            return value
        if isinstance(value, bool) and kind is not bool:
            raise ConfigError(f"{self.path(name)}: expected {_kind_name(kind)}, got {value!r}")
        if not isinstance(value, kind):
            raise ConfigError(f"{self.path(name)}: expected {_kind_name(kind)}, got {value!r}")
        return value

    def no_unknown(self) -> None:
        extra = sorted(set(self.doc) - self.seen)
        if extra:
            raise ConfigError(f"{self.path(extra[0])}: unknown setting")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"str": "a string", "int": "an integer", "float": "a number",
                        "bool": "true or false", "dict": "a table", "list": "a list"}
                       .get(k.__name__, k.__name__) for k in kinds)


@attrs.frozen
class ServerConfig:
    listen: str = "127.0.0.1:7070"
    etcd: tuple[str, ...] = ("127.0.0.1:2379",)
    cell: str = "default"
    name: str = ""  # this replica's name in status output; default: the listen address
    # Per-scheduler limits written to the cell's config at start-up, if given.
    limits: CellConfig | None = None
    committers: int = 4  # concurrent commits (one store handle each)
    max_message_bytes: int = 4 * 1024 * 1024
    grace_seconds: float = 5.0
    # Mutual TLS, and with it identities and the authorization matrix; None: plaintext,
    # everybody may do anything (cellstate/api/auth.py).
    tls: TlsFiles | None = None
    user_max_precedence: int = DEFAULT_USER_MAX_PRECEDENCE
    # How this server reaches etcd (TLS, its etcd user): cellstate/etcd_auth.py.
    etcd_access: EtcdAccess = attrs.field(factory=EtcdAccess)
    # [auth.submitters]: submitter -> the owners it may name (AuthPolicy).
    submitter_owners: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # [auth] crl: the cell's certificate revocation list (cellstate/api/revocation.py).
    crl: Path | None = None
    # Commits go through one elected commit leader (cellstate/api/leader.py); false:
    # every server commits on its own, straight to etcd (the path before issue 35).
    commit_leader: bool = True
    leader_ttl: int = 5  # seconds: the leader's lease
    advertise: str = ""  # host:port peers forward commits to (default: from listen)
    # The leader decides the next batch while the previous one's write is in flight
    # (cellstate/api/leader.py); false (the default): one batch at a time, one flat Txn
    # per group. On the two shared cores measured the pipelined leader placed less
    # (it costs more CPU per commit, and the server is bound by CPU, not by etcd's
    # round trip: docs/scaling.md).
    commit_pipeline: bool = False

    @property
    def auth(self) -> AuthPolicy:
        return AuthPolicy(self.tls is not None, self.user_max_precedence,
                          self.submitter_owners)


def tls_files(doc: object, where: str, base: Path | None = None) -> TlsFiles:
    """A ``[tls]`` table: ``ca``, ``cert`` and ``key`` file paths (relative ones from
    ``base``, the config file's folder)."""
    sec = _Section(doc, where)
    paths = []
    for name in ("ca", "cert", "key"):
        value = sec.get(name, str, None)
        if not value:
            raise ConfigError(f"{sec.path(name)}: missing (a PEM file path)")
        path = Path(value)
        paths.append(base / path if base is not None and not path.is_absolute() else path)
    sec.no_unknown()
    return TlsFiles(*paths)


def server_config(doc: Mapping[str, Any], source: str = "") -> ServerConfig:
    """A server configuration from a parsed file (or {}): top-level ``listen``, ``cell``,
    ``name``, ``committers``, ``max_message_bytes``, ``grace_seconds``,
    ``commit_leader`` (bool), ``leader_ttl`` (seconds), ``advertise``,
    ``commit_pipeline`` (bool), an ``[etcd]``
    table with ``endpoints`` and the credentials (``ca``, ``cert``, ``key``, ``user``,
    ``password_file``: :class:`~cellstate.etcd_auth.EtcdAccess`), ``[limits.<scheduler>]``
    tables as in the cell config (``max_precedence``, ``max_resources``; with TLS, the
    schedulers listed are the cell's only ones), a ``[tls]`` table (``ca``, ``cert``,
    ``key``) and an ``[auth]`` table (``user_max_precedence``, and ``[auth.submitters]``: the
    owners each submitter may name; ``crl``, the cell's certificate revocation list)."""
    prefix = f"{source}: " if source else ""
    try:
        top = _Section(doc, "")
        listen = address(top.get("listen", str, "127.0.0.1:7070"), "listen", listen=True)
        cell = top.get("cell", str, "default")
        try:
            check_name(cell, "cell")
        except ModelError as e:
            raise ConfigError(str(e)) from None
        name = top.get("name", str, "")
        committers = top.get("committers", int, 4)
        if not 1 <= committers <= 64:
            raise ConfigError(f"committers: {committers} is not between 1 and 64")
        max_bytes = top.get("max_message_bytes", int, 4 * 1024 * 1024)
        if not 64 * 1024 <= max_bytes <= 64 * 1024 * 1024:
            raise ConfigError(f"max_message_bytes: {max_bytes} is not between 64 KiB and 64 MiB")
        grace = top.get("grace_seconds", (int, float), 5.0)
        if not 0 <= grace <= 600:
            raise ConfigError(f"grace_seconds: {grace} is not between 0 and 600")
        etcd_doc = top.get("etcd", dict, {})
        etcd_sec = _Section(etcd_doc, "etcd")
        endpoints = addresses(etcd_sec.get("endpoints", (list, str), ["127.0.0.1:2379"]),
                              "etcd.endpoints")
        base = Path(source).parent if source else None
        for setting in ("ca", "cert", "key", "user", "password_file"):
            etcd_sec.get(setting, str, None)
        etcd_sec.no_unknown()
        etcd_access = access_from_table(etcd_sec.doc, "etcd", base)
        limits_doc = top.get("limits", dict, None)
        limits = None
        if limits_doc is not None:
            try:
                limits = codec.parse_config({"limits": limits_doc}, "")
            except ModelError as e:
                raise ConfigError(str(e).lstrip(".")) from None
        tls_doc = top.get("tls", dict, None)
        tls = tls_files(tls_doc, "tls", base) if tls_doc is not None else None
        auth = _Section(top.get("auth", dict, {}), "auth")
        user_max = auth.get("user_max_precedence", int, DEFAULT_USER_MAX_PRECEDENCE)
        if not 0 <= user_max <= codec.MAX_PRECEDENCE:
            raise ConfigError(f"auth.user_max_precedence: {user_max} is not between 0 and "
                              f"{codec.MAX_PRECEDENCE}")
        submitters = _submitters(auth.get("submitters", dict, {}))
        crl_text = auth.get("crl", str, None)
        crl = None
        if crl_text:
            crl = Path(crl_text)
            crl = base / crl if base is not None and not crl.is_absolute() else crl
        auth.no_unknown()
        commit_leader = top.get("commit_leader", bool, True)
        leader_ttl = top.get("leader_ttl", int, 5)
        if not 1 <= leader_ttl <= 60:
            raise ConfigError(f"leader_ttl: {leader_ttl} is not between 1 and 60 seconds")
        advertise = top.get("advertise", str, "")
        if advertise:
            advertise = address(advertise, "advertise")
        commit_pipeline = top.get("commit_pipeline", bool, False)
        top.no_unknown()
    except ConfigError as e:
        raise ConfigError(prefix + str(e)) from None
    return ServerConfig(listen, endpoints, cell, name or listen, limits, committers, max_bytes,
                        float(grace), tls, user_max, etcd_access, submitters, crl,
                        commit_leader, leader_ttl, advertise, commit_pipeline)


def _submitters(doc: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``[auth.submitters]``: ``NAME = ["alice", "bob"]`` (or ``["*"]``, any owner)."""
    out = []
    for name, owners in sorted(doc.items()):
        where = f"auth.submitters.{name}"
        try:
            check_name(name, where)
            if (not isinstance(owners, list) or not owners
                    or not all(isinstance(o, str) for o in owners)):
                raise ConfigError(f"{where}: expected a non-empty list of owner names "
                                  '(or ["*"] for any owner)')
            out.append((name, tuple(o if o == "*" else check_name(o, f"{where}[{i}]")
                                    for i, o in enumerate(owners))))
        except ModelError as e:
            raise ConfigError(str(e)) from None
    return tuple(out)

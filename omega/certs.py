"""A development certificate authority for a cell: ``omega certs``.

Makes (once) a CA key and certificate in a folder, then one certificate per identity
signed by it, named ``<kind>-<name>.pem`` with its key beside it (``.key``, readable
by the owner only). The certificate's common name is the identity (``scheduler:batch``,
``agent:agent-0``, ``user:alice``...; cellstate/api/auth.py); a server's certificate
also names the host names and addresses clients dial (subject alternative names), as
TLS clients check them. Keys are ECDSA P-256: fast to make, and every gRPC build
speaks them.

This is a development CA: its key sits in a plain file next to the certificates. A
production cell keeps its CA key offline or in a secrets manager and issues the same
kind of certificates (docs/security.md says what the server checks).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cellstate.api.auth import Identity, Kind
from cellstate.api.tls import TlsFiles

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CRL = "crl.pem"  # the certificates this CA revoked (cellstate/api/revocation.py)
CRL_DAYS = 3650  # servers read the list as it is; its "next update" is not checked
CA_DAYS = 3650
DEFAULT_DAYS = 365
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
ROOT_USER = "root"  # etcd's administrator (cellstate/etcd_auth.py)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class DevCA:
    """The CA in ``folder`` (made on first use) and the certificates it issues there.
    ``key_path``: where the CA's key is kept (default ``folder/ca.key``); elsewhere, the
    folder can be handed to the cell's processes without the key that signs for all."""

    def __init__(self, folder: Path, key_path: Path | None = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca_path = folder / CA_CERT
        key_path = key_path if key_path is not None else folder / CA_KEY
        key_path.parent.mkdir(parents=True, exist_ok=True)
        self.key_path = key_path
        if self.ca_path.exists() and key_path.exists():
            loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(loaded, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{key_path}: not an EC key made by omega certs")
            self._key = loaded
            self._cert = x509.load_pem_x509_certificate(self.ca_path.read_bytes())
            return
        if self.ca_path.exists():
            # A new CA here would silently invalidate every certificate the old one signed.
            raise ValueError(f"{self.ca_path} exists but its key {key_path} does not: give "
                             "the CA's key (--ca-key), or remove the CA to start anew")
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"omega dev CA {folder.name}")])
        now = _now()
        self._cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        _write_key(key_path, self._key)
        _write_cert(self.ca_path, self._cert)

    @property
    def crl_path(self) -> Path:
        return self.folder / CRL

    def revoked(self) -> list[x509.RevokedCertificate]:
        if not self.crl_path.exists():
            return []
        return list(x509.load_pem_x509_crl(self.crl_path.read_bytes()))

    def write_crl(self, serials: Sequence[int] = ()) -> Path:
        """(Re)write ``crl.pem``: what it revoked already and ``serials``, signed by the
        CA. Servers given it (``[auth] crl``) refuse those certificates on every call."""
        now = _now()
        builder = (x509.CertificateRevocationListBuilder().issuer_name(self._cert.subject)
                   .last_update(now).next_update(now + datetime.timedelta(days=CRL_DAYS)))
        known = self.revoked()
        for r in known:
            builder = builder.add_revoked_certificate(r)
        for serial in sorted(set(serials) - {r.serial_number for r in known}):
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial)
                .revocation_date(now).build())
        crl = builder.sign(self._key, hashes.SHA256())
        tmp = self.crl_path.with_suffix(".tmp")
        tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
        tmp.replace(self.crl_path)  # servers re-read it: never half a file
        return self.crl_path

    def revoke(self, identity: Identity) -> int:
        """Revoke ``identity``'s current certificate (a stolen key, a retired process);
        returns its serial. Issue it a new one afterwards to give it rights again."""
        cert = self.files(identity).cert
        try:
            serial = x509.load_pem_x509_certificate(cert.read_bytes()).serial_number
        except FileNotFoundError:
            raise ValueError(f"{identity}: no certificate at {cert} to revoke") from None
        self.write_crl([serial])
        return serial

    def files(self, identity: Identity) -> TlsFiles:
        """Where ``identity``'s certificate is (or would be) kept."""
        stem = f"{identity.kind.value}-{identity.name}"
        return TlsFiles(self.ca_path, self.folder / f"{stem}.pem", self.folder / f"{stem}.key")

    def issue(self, identity: Identity, hosts: Sequence[str] = DEFAULT_HOSTS,
              days: int = DEFAULT_DAYS) -> TlsFiles:
        """A new key and certificate for ``identity`` (replacing an older one: that is
        how a certificate is rotated). ``hosts``: for a server, the names and addresses
        clients dial it by."""
        return self.issue_raw(str(identity), self.files(identity),
                              hosts if identity.kind is Kind.SERVER else None, days)

    def issue_raw(self, common_name: str, files: TlsFiles, hosts: Sequence[str] | None,
                  days: int = DEFAULT_DAYS) -> TlsFiles:
        """A certificate for any common name (tests make ones that name no identity);
        ``hosts`` not None makes a server certificate for them."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if hosts is not None:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        _write_key(files.key, key)
        _write_cert(files.cert, cert)
        return files

    def ensure(self, identity: Identity, hosts: Sequence[str] = DEFAULT_HOSTS) -> TlsFiles:
        """``identity``'s files, issued if there are none yet."""
        files = self.files(identity)
        if files.cert.exists() and files.key.exists():
            return files
        return self.issue(identity, hosts)


    def etcd_files(self, common_name: str) -> TlsFiles:
        """Where an etcd certificate is kept: a member's (``etcd-member-NAME``) or a
        client's whose common name is its etcd user (``etcd-root``)."""
        stem = f"etcd-{common_name}"
        return TlsFiles(self.ca_path, self.folder / f"{stem}.pem", self.folder / f"{stem}.key")

    def issue_etcd_member(self, name: str, hosts: Sequence[str] = (), *,
                          keep: bool = False) -> TlsFiles:
        """An etcd member's certificate, for its client port and its peers (both key
        usages: members are each other's clients), naming ``name`` and ``hosts``."""
        files = self.etcd_files(f"member-{name}")
        if keep and files.cert.exists() and files.key.exists():
            return files
        return self.issue_raw(name, files, [name, *hosts])

    def issue_etcd_root(self, *, keep: bool = False) -> TlsFiles:
        """A client certificate of etcd's root user (common name ``root``)."""
        files = self.etcd_files(ROOT_USER)
        if keep and files.cert.exists() and files.key.exists():
            return files
        return self.issue_raw(ROOT_USER, files, None)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def cell_identities(schedulers: Sequence[str], agents: int) -> list[Identity]:
    """Every identity a cell like the demo's needs: its server, each scheduler, each
    agent (``agent-0``...), the workload generator (a submitter: it submits for many
    owners and may do nothing else), the dashboard (a user: it only reads), an
    operator, and ``operator:check`` (etcd's reader role: ``omega check``)."""
    return [Identity(Kind.SERVER, "cellstate"),
            *(Identity(Kind.SCHEDULER, s) for s in schedulers),
            *(Identity(Kind.AGENT, f"agent-{i}") for i in range(agents)),
            Identity(Kind.SUBMITTER, "workload"), Identity(Kind.USER, "dashboard"),
            Identity(Kind.OPERATOR, "admin"),
            Identity(Kind.OPERATOR, "check")]

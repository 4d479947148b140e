"""Mutual TLS for the cellstate service: the files one process needs and the gRPC
credentials made from them.

Every process of a cell holds three files: the cell's CA certificate (``ca``), its
own certificate (``cert``), and that certificate's private key (``key``). The server
presents its certificate and requires one from every client, signed by the same CA;
the certificate's common name is the client's identity (see
:mod:`cellstate.api.auth`). One function makes the server's credentials and one a
client's, so every kind of process (server, agent, any scheduler, the CLI) gets TLS
the same way: build a :class:`TlsFiles` from its configuration and hand it on.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import grpc

from cellstate.errors import ConfigError


@attrs.frozen
class TlsFiles:
    """PEM files: the CA that signs the cell's certificates, this process's certificate
    and its private key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) bytes; a missing or unreadable file is a ConfigError naming it."""
        return _read(self.ca, "ca"), _read(self.cert, "cert"), _read(self.key, "key")


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"tls.{what}: {path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"tls.{what}: {path}: cannot read ({e.strerror})") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(f"tls.{what}: {path}: not a PEM file")
    return data


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """The server's side: present ``cert``, require a client certificate signed by
    ``ca`` (a client without one fails the handshake)."""
    ca, cert, key = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=True)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """A client's side: trust only servers whose certificate ``ca`` signed (and names
    the host dialled), and present ``cert`` as this process's identity."""
    ca, cert, key = tls.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                        certificate_chain=cert)

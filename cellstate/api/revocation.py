"""Revoked client certificates: a certificate revocation list (CRL) the cell's CA
signed, checked on every call.

The server's TLS handshake takes any certificate the CA signed; a certificate whose
key was stolen, or that was replaced, stays valid until it expires unless the server
also refuses its serial number. :class:`Revocations` holds the serials of one CRL file
(``[auth] crl`` in the server's configuration; ``omega certs DIR --revoke KIND:NAME``
writes it) and reads the file again when it changes, so a revocation takes effect
within a second on a running server, and on the calls of connections made before it
too (the check is per call, on the certificate the connection presented)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from cellstate.errors import ConfigError

log = logging.getLogger(__name__)

RECHECK_SECONDS = 1.0  # how often the file's change time is looked at, at most
_SERIAL_CACHE = 4096  # certificates' serials kept parsed (one per client, about)


def load_crl(path: Path, ca: Path) -> frozenset[int]:
    """The serials a CRL file revokes; raises ConfigError if it cannot be read or no
    CA certificate in ``ca`` signed it (anyone able to write the file must not be able
    to make one up, nor to cut a revocation out of it)."""
    try:
        data = path.read_bytes()
        authorities = x509.load_pem_x509_certificates(ca.read_bytes())
    except OSError as e:
        raise ConfigError(f"crl: cannot read {e.filename}: {e.strerror}") from None
    try:
        crl = x509.load_pem_x509_crl(data)
    except ValueError as e:
        raise ConfigError(f"crl: {path}: not a PEM certificate revocation list ({e})") from None
    signed = False
    for authority in authorities:
        try:
            signed = crl.issuer == authority.subject and crl.is_signature_valid(
                authority.public_key())  # type: ignore[arg-type]
        except (TypeError, ValueError):
            signed = False
        if signed:
            break
    if not signed:
        raise ConfigError(f"crl: {path}: not signed by the cell's CA ({ca})")
    return frozenset(r.serial_number for r in crl)


class Revocations:
    """The serials of ``path``'s CRL, reloaded when the file changes (a reload that
    fails keeps the last good list and logs why: a half-written file must not lift
    every revocation)."""

    def __init__(self, path: Path, ca: Path,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.ca = ca
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self.serials = load_crl(path, ca)  # at start a bad file stops the server
        self._checked = clock()
        self._serial_of: dict[bytes, int] = {}

    def _stat(self) -> tuple[float, int]:
        try:
            st = self.path.stat()
        except OSError:
            return (0.0, -1)
        return (st.st_mtime, st.st_size)

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked < RECHECK_SECONDS:
            return
        with self._lock:
            self._checked = now
            stamp = self._stat()
            if stamp == self._stamp:
                return
            try:
                self.serials = load_crl(self.path, self.ca)
                self._stamp = stamp
                log.info("crl %s: %d revoked certificate(s)", self.path, len(self.serials))
            except ConfigError as e:
                log.error("%s; keeping the %d revocations read before", e, len(self.serials))

    def serial(self, pem: bytes) -> int:
        found = self._serial_of.get(pem)
        if found is None:
            found = x509.load_pem_x509_certificate(pem).serial_number
            if len(self._serial_of) >= _SERIAL_CACHE:
                self._serial_of.clear()
            self._serial_of[pem] = found
        return found

    def revoked(self, pem: bytes) -> int | None:
        """The serial of the certificate ``pem`` if it is revoked, else None."""
        self._refresh()
        serial = self.serial(pem)
        return serial if serial in self.serials else None

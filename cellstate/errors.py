"""Every error the ``cellstate`` library raises, in one place.

Callers (the client, the runtime, the application) import errors from here rather
than from the module that happens to raise them. Expected outcomes of a commit are
not errors: a rejected claim is a value (``model.Rejection``). The layers above keep
their own few errors (``schedulers.registry``, ``simulator``, ``omega``): a library
must not know about them.

    ValueError
      ModelError          a value that cannot be part of the cell state
      TransactionError    a transaction malformed as a whole; nothing applied
      WireError           a gRPC message that cannot become a model object
      ConfigError         a server or client configuration that cannot be used
      ClientError         the service refused a request as malformed
        AccessDenied      the service refused the caller (PERMISSION_DENIED, UNAUTHENTICATED)
    StoreError            a store operation that cannot be done; nothing changed
      NotFoundError, AlreadyExistsError
      ContentionError     the records kept changing past the retry budget
    KVError               anything a KV backend (etcd, memory) raises
      CompactedError, FutureRevisionError, TxnTooLargeError, DuplicateKeyError,
      UnavailableError, LeaseNotFoundError, WatchDroppedError,
      AuthError (EtcdAuthError), ServiceUnavailable (no cellstate endpoint answered)
"""

from __future__ import annotations


class ModelError(ValueError):
    """A value that cannot be part of the cell state; the message says which and why."""


class TransactionError(ValueError):
    """A transaction that is malformed as a whole; nothing of it was applied."""


class WireError(ValueError):
    """A message that cannot be turned into a model object; says which field."""


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says where and why."""


class ClientError(ValueError):
    """The server refused a request as malformed (INVALID_ARGUMENT)."""


class AccessDenied(ClientError):
    """The service refused the caller: no identity it accepts (UNAUTHENTICATED), or an
    identity not allowed this operation (PERMISSION_DENIED). Retrying cannot help."""


class StoreError(Exception):
    """A store operation that cannot be done; the message says why. Nothing changed."""


class NotFoundError(StoreError):
    pass


class NotPermittedError(StoreError):
    """The store's own check of a caller's rights, made on what it reads from etcd in
    the guarded write (the server's copy may lag): PERMISSION_DENIED."""


class AlreadyExistsError(StoreError):
    pass


class ContentionError(StoreError):
    """The records an operation needs kept changing under it, past the retry budget."""


class FencedOut(StoreError):
    """A write carried a fencing token (the commit leader's) that etcd no longer holds:
    another server leads now, or the lease lapsed. Nothing was written; the caller
    retries through the current leader (UNAVAILABLE)."""


class ReplicaBehindError(StoreError):
    """A server's copy of the cell did not reach the revision a read must see (the
    caller's last write, or the server's own) in time: another server may have it."""


class KVError(Exception):
    """Base of every error a KV backend raises."""


class CompactedError(KVError):
    def __init__(self, compact_revision: int, message: str = "") -> None:
        super().__init__(
            message or f"required revision has been compacted (compacted at {compact_revision})"
        )
        self.compact_revision = compact_revision


class FutureRevisionError(KVError):
    """A read named a revision the store has not reached."""


class TxnTooLargeError(KVError):
    """Too many operations or too many bytes in one transaction (etcd INVALID_ARGUMENT)."""


class DuplicateKeyError(KVError):
    """The same key is written twice in one transaction branch."""


class UnavailableError(KVError):
    """No endpoint answered (after the backend's own retries)."""


class LeaseNotFoundError(KVError):
    pass


class WatchDroppedError(KVError):
    """The watch stream broke; re-watch from the last seen revision + 1."""


class AuthError(KVError):
    """The server refused the credentials or the operation for lack of permission."""


class EtcdAuthError(AuthError):
    """etcd refused the credentials, requires credentials that were not given, or denied
    permission for the key range."""


class ServiceUnavailable(KVError):
    """No cellstate endpoint answered within the retry budget."""

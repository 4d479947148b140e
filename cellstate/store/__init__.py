"""The cell-state store: applies decided writes to a KV backend (etcd or memory),
atomically, with optimistic concurrency over etcd revisions. How every write works is
in ``cellstate.store.base``; the modules beside it add the kinds of write."""

from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    NotFoundError as NotFoundError,
    StoreError as StoreError,
)
from cellstate.store.base import StoreOptions as StoreOptions
from cellstate.store.registration import Registration


class CellStore(Registration):
    """One committer's handle on a cell. Methods are thread-safe (one write at a time
    per handle); use one handle per thread for parallel commits.

    The methods live in this package's modules by the kind of write: ``base`` (the
    view, reads, guarded writes), ``claims`` (commit, commit_many), ``gangs`` (large
    gangs, recover), ``admin`` (jobs, machines, releases, config), ``registration``
    (instances, agents)."""

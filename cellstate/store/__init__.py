"""The cell-state store: applies validated decisions to a KV backend, atomically.

Every write follows one pattern (optimistic concurrency over etcd revisions):

1. make sure the working view knows every record the decision will read;
2. decide, with a pure function over the view (``validation.validate`` for claims);
3. send one etcd transaction: compares on the mod_revision of every record read,
   the new records as puts, and reads of the same keys as the failure branch;
4. on success remember what was written; on failure learn the fresh values that came
   back with the failure and go to 2.

So any number of stores in any number of processes can commit against one etcd, and a
machine is never over-committed: two commits that read the same machine cannot both
pass their compares. A transaction too big for one etcd transaction is split; an
incremental one commits group by group, a gang one goes through a staged protocol
whose commit point is one key (see docs/architecture.md, "Gangs larger than one etcd
txn").
"""

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

"""Commits one huge gang through etcd; the large-gang test kills it part way."""

from __future__ import annotations

import sys

from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim, Transaction, TxnMode
from cellstate.store import CellStore, StoreOptions


def gang_claims(machines: int, tasks: int, job: str) -> tuple[Claim, ...]:
    return tuple(Claim(job, i, f"m{i % machines:05}") for i in range(tasks))


def main(endpoint: str, cell: str, machines: int, tasks: int, ttl: int) -> None:
    store = CellStore(EtcdKV([endpoint]), cell, options=StoreOptions(gang_lease_ttl=ttl))
    store.load()
    res = store.commit(Transaction("batch", gang_claims(machines, tasks, "huge"), TxnMode.GANG))
    print("committed" if res.ok else f"rejected: {res.rejected[0].detail}", flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]))

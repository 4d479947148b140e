"""Small builders for cells, jobs and transactions used across tests."""

from __future__ import annotations

from collections.abc import Iterable

from cellstate.cell import CellSnapshot
from cellstate.kv.base import KV
from cellstate.model import (
    Claim,
    Constraints,
    Detection,
    Job,
    JobKind,
    Machine,
    Resources,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore

NO_CONSTRAINTS = Constraints()


def machine(mid: str, cpu: float = 4, mem: float = 16, **kw: object) -> Machine:
    return Machine(mid, Resources.of(cpu=cpu, mem=mem), **kw)  # type: ignore[arg-type]


def job(
    jid: str,
    tasks: int = 1,
    cpu: float = 1,
    mem: float = 1,
    scheduler: str = "batch",
    precedence: int = 0,
    constraints: Constraints = NO_CONSTRAINTS,
    labels: Iterable[tuple[str, str]] = (),
    gang: bool = False,
    kind: JobKind = JobKind.BATCH,
) -> Job:
    return Job(
        jid,
        "tester",
        scheduler,
        tasks,
        Resources.of(cpu=cpu, mem=mem),
        kind=kind,
        gang=gang,
        precedence=precedence,
        constraints=constraints,
        labels=tuple(sorted(labels)),
    )


def make_cell(
    kv: KV, machines: Iterable[Machine] = (), jobs: Iterable[Job] = (), cell: str = "default"
) -> CellStore:
    store = CellStore(kv, cell)
    for m in machines:
        store.add_machine(m)
    for j in jobs:
        store.submit_job(j)
    return store


def claims(
    snap: CellSnapshot, job_id: str, placements: Iterable[tuple[int, str]]
) -> tuple[Claim, ...]:
    return tuple(
        Claim(job_id, i, mid, snap.machines[mid].seq if mid in snap.machines else 0)
        for i, mid in placements
    )


def txn(
    cs: Iterable[Claim],
    scheduler: str = "batch",
    gang: bool = False,
    coarse: bool = False,
) -> Transaction:
    return Transaction(
        scheduler,
        tuple(cs),
        TxnMode.GANG if gang else TxnMode.INCREMENTAL,
        Detection.COARSE if coarse else Detection.FINE,
    )

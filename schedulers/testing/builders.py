"""Fluent builders for machines, jobs, cells and transactions.

Each builder wraps the frozen model record it makes and every method returns the
builder, so a test states only what matters to it::

    m = MachineBuilder("m0").cpu(8).mem(32).domain("fd1").build()
    j = JobBuilder("web").tasks(3).cpu(1).scheduler("least-loaded").spread().build()
    store = CellBuilder().machines(m).jobs(j).build(MemoryKV())

The short functions at the end (:func:`machine`, :func:`job`, ...) make the common
cases in one call. Resource amounts are checked as they are built (a negative or
misnamed amount raises ``ModelError`` naming the record); everything else the store
checks when the record is written, as it would for any client.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from cellstate.cell import CellSnapshot
from cellstate.kv.base import KV
from cellstate.model import (
    Claim,
    Constraints,
    Detection,
    Job,
    JobKind,
    Machine,
    MachineState,
    MapReduceSpec,
    Requirement,
    Resources,
    SelectorOp,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore

NO_CONSTRAINTS = Constraints()


class MachineBuilder:
    """A machine: 4 cpu and 16 GiB of memory, up, no labels, unless told otherwise."""

    def __init__(self, mid: str) -> None:
        self._m = Machine(mid, Resources.of(cpu=4, mem=16))
        self._amounts: dict[str, float] = {"cpu": 4, "mem": 16}

    def resource(self, name: str, amount: float) -> MachineBuilder:
        self._amounts[name] = amount
        return self

    def cpu(self, amount: float) -> MachineBuilder:
        return self.resource("cpu", amount)

    def mem(self, amount: float) -> MachineBuilder:
        return self.resource("mem", amount)

    def rack(self, rack: str) -> MachineBuilder:
        self._m = attrs.evolve(self._m, rack=rack)
        return self

    def domain(self, failure_domain: str) -> MachineBuilder:
        self._m = attrs.evolve(self._m, failure_domain=failure_domain)
        return self

    def label(self, key: str, value: str) -> MachineBuilder:
        labels = dict(self._m.labels)
        labels[key] = value
        self._m = attrs.evolve(self._m, labels=tuple(sorted(labels.items())))
        return self

    def state(self, state: MachineState) -> MachineBuilder:
        self._m = attrs.evolve(self._m, state=state)
        return self

    def down(self) -> MachineBuilder:
        return self.state(MachineState.DOWN)

    def build(self) -> Machine:
        return attrs.evolve(self._m, capacity=Resources.from_mapping(
            self._amounts, f"machine {self._m.id} capacity"))


class JobBuilder:
    """A batch job of one task needing 1 cpu and 1 GiB, for the ``batch`` scheduler,
    owned by ``tester``, precedence 0, no constraints, unless told otherwise."""

    def __init__(self, jid: str) -> None:
        self._j = Job(jid, "tester", "batch", 1, Resources())
        self._amounts: dict[str, float] = {"cpu": 1, "mem": 1}

    def _set(self, **fields: Any) -> JobBuilder:
        self._j = attrs.evolve(self._j, **fields)
        return self

    def tasks(self, count: int) -> JobBuilder:
        return self._set(task_count=count)

    def resource(self, name: str, amount: float) -> JobBuilder:
        """What each task needs of ``name``."""
        self._amounts[name] = amount
        return self

    def cpu(self, amount: float) -> JobBuilder:
        return self.resource("cpu", amount)

    def mem(self, amount: float) -> JobBuilder:
        return self.resource("mem", amount)

    def scheduler(self, name: str) -> JobBuilder:
        return self._set(scheduler=name)

    def owner(self, name: str) -> JobBuilder:
        return self._set(owner=name)

    def kind(self, kind: JobKind) -> JobBuilder:
        return self._set(kind=kind)

    def service(self) -> JobBuilder:
        return self.kind(JobKind.SERVICE)

    def precedence(self, value: int) -> JobBuilder:
        return self._set(precedence=value)

    def priority(self, value: int) -> JobBuilder:
        """Its rank among its owner's jobs (higher first), for a fair scheduler."""
        return self._set(priority=value)

    def gang(self, on: bool = True) -> JobBuilder:
        """All tasks commit together or none does."""
        return self._set(gang=on)

    def detection(self, detection: Detection) -> JobBuilder:
        return self._set(detection=detection)

    def label(self, key: str, value: str) -> JobBuilder:
        labels = dict(self._j.labels)
        labels[key] = value
        return self._set(labels=tuple(sorted(labels.items())))

    def duration(self, seconds: float) -> JobBuilder:
        return self._set(duration=seconds)

    def submitted_at(self, when: float) -> JobBuilder:
        return self._set(submitted_at=when)

    def constraints(self, constraints: Constraints) -> JobBuilder:
        return self._set(constraints=constraints)

    def _constrain(self, **fields: Any) -> JobBuilder:
        return self.constraints(attrs.evolve(self._j.constraints, **fields))

    def spread(self, per_machine: int = 1) -> JobBuilder:
        """At most ``per_machine`` of the job's tasks on one machine."""
        return self._constrain(max_per_machine=per_machine)

    def on_machines_with(self, key: str, *values: str) -> JobBuilder:
        """Only machines labelled ``key`` (with one of ``values``, if any)."""
        req = Requirement(key, SelectorOp.IN if values else SelectorOp.EXISTS, values)
        return self._constrain(machine_selector=(*self._j.constraints.machine_selector, req))

    def away_from(self, key: str, *values: str) -> JobBuilder:
        """Anti-affinity: never share a machine with a job labelled so."""
        req = Requirement(key, SelectorOp.IN if values else SelectorOp.EXISTS, values)
        return self._constrain(anti_affinity=(*self._j.constraints.anti_affinity, req))

    def next_to(self, key: str, *values: str) -> JobBuilder:
        """Affinity: only on machines already running a job labelled so."""
        req = Requirement(key, SelectorOp.IN if values else SelectorOp.EXISTS, values)
        return self._constrain(affinity=(*self._j.constraints.affinity, req))

    def mapreduce(self, maps: int, map_seconds: float, *, reduces: int = 0,
                  reduce_seconds: float = 0.0, workers: int = 1,
                  max_workers: int | None = None) -> JobBuilder:
        """A MapReduce job (kind mapreduce) asking for ``workers`` workers, which an
        elastic scheduler may grow to ``max_workers`` (default: until every activity
        of a phase runs at once)."""
        most = max(workers, maps, reduces) if max_workers is None else max_workers
        spec = MapReduceSpec(maps, reduces, float(map_seconds), float(reduce_seconds),
                             workers, most)
        return self._set(kind=JobKind.MAPREDUCE, mapreduce=spec, task_count=workers,
                         duration=None)

    def build(self) -> Job:
        return attrs.evolve(self._j, task_resources=Resources.from_mapping(
            self._amounts, f"job {self._j.id} task resources"))


class CellBuilder:
    """Machines and jobs written to a KV backend through a real :class:`CellStore`."""

    def __init__(self, cell: str = "default") -> None:
        self._cell = cell
        self._machines: list[Machine] = []
        self._jobs: list[Job] = []

    def machines(self, *machines: Machine | MachineBuilder) -> CellBuilder:
        self._machines.extend(m.build() if isinstance(m, MachineBuilder) else m
                              for m in machines)
        return self

    def jobs(self, *jobs: Job | JobBuilder) -> CellBuilder:
        self._jobs.extend(j.build() if isinstance(j, JobBuilder) else j for j in jobs)
        return self

    def build(self, kv: KV) -> CellStore:
        """Write everything (machines first) and return the store handle used."""
        store = CellStore(kv, self._cell)
        for m in self._machines:
            store.add_machine(m)
        for j in self._jobs:
            store.submit_job(j)
        return store


# -- one-call shorthands ---------------------------------------------------------------


def machine(mid: str, cpu: float = 4, mem: float = 16, *, rack: str = "",
            failure_domain: str = "", labels: Iterable[tuple[str, str]] = (),
            state: MachineState = MachineState.UP) -> Machine:
    m = MachineBuilder(mid).cpu(cpu).mem(mem).rack(rack).domain(failure_domain).state(state)
    for key, value in labels:
        m.label(key, value)
    return m.build()


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
    b = (JobBuilder(jid).tasks(tasks).cpu(cpu).mem(mem).scheduler(scheduler)
         .precedence(precedence).constraints(constraints).gang(gang).kind(kind))
    for key, value in labels:
        b.label(key, value)
    return b.build()


def make_cell(
    kv: KV, machines: Iterable[Machine] = (), jobs: Iterable[Job] = (), cell: str = "default"
) -> CellStore:
    return CellBuilder(cell).machines(*machines).jobs(*jobs).build(kv)


def claims(
    snap: CellSnapshot, job_id: str, placements: Iterable[tuple[int, str]]
) -> tuple[Claim, ...]:
    """Claims of ``job_id``'s tasks on machines, at the sequence numbers ``snap`` shows
    (0 for a machine it does not have)."""
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

"""Random small cells and flow checks shared by the flow scheduler's tests.

A random cell has 3-12 machines in 2-3 racks (some down, some labelled ``ssd``, with a
``net`` dimension when asked), jobs of the flow scheduler in a few shapes (some with
``input`` data locations, some with a machine selector, one now and then bigger than
every machine), jobs of another scheduler, and some tasks of both already running. It
is written through the real store, so it is a cell the store accepts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Block,
    Claim,
    Constraints,
    Job,
    Machine,
    MachineState,
    Requirement,
    SelectorOp,
    Transaction,
)
from cellstate.store import CellStore
from schedulers.flow.network import Arrays
from schedulers.testing import JobBuilder, MachineBuilder

FLOW = "flow"
OTHER = "batch"
NOW = 1000.0

#: (cpu, mem, net) of the task shapes the random cells use.
SHAPES = ((1.0, 2.0, 1.0), (2.0, 1.0, 2.0), (1.0, 4.0, 0.0))
SSD = Constraints(machine_selector=(Requirement("ssd", SelectorOp.EXISTS),))


def random_machines(rng: random.Random, net: bool) -> list[Machine]:
    n = rng.randint(3, 12)
    racks = rng.choice([2, 3])
    out = []
    for i in range(n):
        b = (MachineBuilder(f"m{i}").cpu(rng.choice([4, 6, 8])).mem(rng.choice([6, 8, 16]))
             .rack(f"r{i % racks}").domain(f"fd{i % 2}"))
        if net and rng.random() < 0.8:
            b.resource("net", rng.choice([2, 4, 10]))
        if rng.random() < 0.3:
            b.label("ssd", "yes")
        if rng.random() < 0.1:
            b.down()
        out.append(b.build())
    return out


def random_job(rng: random.Random, jid: str, machines: Sequence[Machine], *,
               scheduler: str = FLOW, net: bool = False, shapes: int = 3) -> Job:
    cpu, mem, bw = SHAPES[rng.randrange(shapes)]
    b = (JobBuilder(jid).tasks(rng.randint(1, 6)).cpu(cpu).mem(mem).scheduler(scheduler)
         .precedence(rng.choice([0, 0, 1, 3, 5])).submitted_at(NOW - rng.uniform(0, 300)))
    if net and bw:
        b.resource("net", bw)
    if rng.random() < 0.15:
        b.constraints(SSD)
    if rng.random() < 0.05:
        b.cpu(64)  # bigger than every machine
    job = b.build()
    if rng.random() < 0.5:
        # Data on a few machines, now and then on one the cell does not have.
        where = rng.sample([m.id for m in machines], k=min(len(machines), rng.randint(1, 4)))
        if rng.random() < 0.2:
            where.append("gone")
        job = attrs.evolve(job, input=tuple(sorted(
            (mid, float(rng.randint(1, 50))) for mid in where)))
        if rng.random() < 0.5:
            # Each task's own blocks (all tasks, or only the first few): Quincy gives
            # such a task a node of its own.
            job = attrs.evolve(job, task_input=tuple(
                random_blocks(rng, machines) for _ in range(rng.randint(1, job.task_count))))
    return job


def random_blocks(rng: random.Random, machines: Sequence[Machine]) -> tuple[Block, ...]:
    ids = [m.id for m in machines] + ["gone"]
    return tuple(Block(float(rng.choice([1, 2, 4])),
                       tuple(rng.sample(ids, k=rng.randint(1, min(3, len(ids))))))
                 for _ in range(rng.randint(1, 3)))


def place_some(store: CellStore, rng: random.Random, job: Job, machines: Sequence[Machine],
               share: float) -> None:
    """Claim about ``share`` of the job's tasks on random machines, as its own scheduler
    would (claims that do not fit are refused by the store and simply not made)."""
    for i in range(job.task_count):
        if rng.random() >= share:
            continue
        mid = rng.choice(machines).id
        seq = store.read_snapshot().machines[mid].seq
        store.commit(Transaction(job.scheduler, (Claim(job.id, i, mid, seq),)))


def random_cell(seed: int, *, net: bool = False, kv: MemoryKV | None = None
                ) -> CellStore:
    rng = random.Random(seed)
    store = CellStore(kv or MemoryKV())
    machines = random_machines(rng, net)
    store.add_machines(machines)
    up = [m for m in machines if m.state is MachineState.UP]
    for k in range(rng.randint(0, 3)):
        other = random_job(rng, f"o{k}", machines, scheduler=OTHER, net=net)
        store.submit_job(other)
        place_some(store, rng, other, up, 0.8)
    for k in range(rng.randint(2, 5)):
        job = random_job(rng, f"j{k}", machines, net=net)
        store.submit_job(job)
        place_some(store, rng, job, up, rng.choice([0.0, 0.3, 0.7]))
    return store


def check_feasible(net: Arrays, flow: npt.NDArray[np.int64], cost: int) -> None:
    """Flow is conserved at every node, within every arc's bounds, and costs ``cost``."""
    assert flow.shape == net.capacity.shape
    low = np.flatnonzero(flow < net.lower)
    assert not len(low), f"flow below the lower bound on arcs {low.tolist()}"
    high = np.flatnonzero(flow > net.capacity)
    assert not len(high), f"flow above the capacity on arcs {high.tolist()}"
    balance = net.supply.copy()
    np.add.at(balance, net.head, flow)
    np.subtract.at(balance, net.tail, flow)
    bad = np.flatnonzero(balance)
    assert not len(bad), f"flow not conserved at nodes {bad.tolist()}"
    assert int((flow * net.cost).sum()) == cost

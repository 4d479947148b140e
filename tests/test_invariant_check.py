"""The after-every-test invariant check (tests/invariant_check.py) itself: it notes the
cells a test opens, store handles and simulated cells alike, and finds what is broken
in them."""

from __future__ import annotations

import attrs
import pytest

from cellstate import codec
from cellstate.keys import Keyspace
from cellstate.kv.base import Put
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Resources, Transaction
from cellstate.store import CellStore
from schedulers.testing import job, machine, make_cell
from simulator.cell import SimCell
from tests.invariant_check import Touched


def _over_commit(kv: MemoryKV, cell: str) -> None:
    """Rewrite machine m0's record with half a GiB of memory under its task's 1 GiB,
    as no store write would."""
    m = CellStore(kv, cell).read_snapshot().machines["m0"]
    shrunk = attrs.evolve(m, capacity=Resources.of(cpu=4, mem=0.5))
    kv.txn([], [Put(Keyspace(cell).machine("m0"), codec.encode_machine(shrunk))])


# These tests break cells on purpose; the plugin around them would flag those too.
pytestmark = pytest.mark.broken_cell


def test_a_cell_opened_during_the_test_is_checked() -> None:
    touched = Touched()
    kv = MemoryKV()
    with touched.recording():
        store = make_cell(kv, [machine("m0", cpu=4, mem=16)], [job("j", tasks=2)], cell="c1")
        store.commit(Transaction("batch", (Claim("j", 0, "m0"),)))
        make_cell(MemoryKV(), [machine("m9")], cell="c2")
    assert touched.problems(None) == []
    _over_commit(kv, "c1")
    assert touched.problems(None) == [
        "cell 'c1' (memory): machine m0 over-committed in mem: 1 > 0.5"]


def test_a_stored_allocation_left_behind_is_found() -> None:
    touched = Touched()
    kv = MemoryKV()
    with touched.recording():
        store = make_cell(kv, [machine("m0", cpu=4, mem=16)], [job("j", tasks=2)], cell="c1")
        store.commit(Transaction("batch", (Claim("j", 0, "m0"),)))
    m = store.read_snapshot().machines["m0"]
    a = m.allocations["j/0"]
    # j/0's allocation again under the machine's current sequence, the old key kept: the
    # snapshot shows one allocation (so the cell's invariants hold), the keys two.
    kv.txn([], [Put(Keyspace("c1").alloc("m0", m.seq, "j/0"), codec.encode_alloc(a))])
    assert touched.problems(None) == [
        "cell 'c1' (memory): task j/0 has 2 allocation keys on m0",
        "cell 'c1' (memory): machine m0's record counts 1 allocation(s), 2 are stored"]


def test_cells_opened_outside_the_test_are_not_checked() -> None:
    touched = Touched()
    kv = MemoryKV()
    store = make_cell(kv, [machine("m0", cpu=4, mem=16)], [job("j", tasks=2)], cell="c1")
    store.commit(Transaction("batch", (Claim("j", 0, "m0"),)))
    with touched.recording():
        pass
    _over_commit(kv, "c1")
    assert touched.problems(None) == []


def test_a_simulated_cell_is_checked() -> None:
    touched = Touched()
    with touched.recording():
        sim = SimCell()
        sim.add_machines([machine("m0", cpu=1)])
        sim.submit_job(job("j", tasks=1))
        sim.commit(Transaction("batch", (Claim("j", 0, "m0"),)))
    assert touched.problems(None) == []
    snap = sim.snapshot()
    m0 = snap.machines["m0"]
    shrunk = attrs.evolve(m0, capacity=Resources.of(cpu=0.5, mem=16))
    object.__setattr__(shrunk, "allocations", m0.allocations)
    sim_broken = attrs.evolve(snap, machines=snap.machines.set("m0", shrunk))
    sim.snapshot = lambda: sim_broken  # type: ignore[method-assign]
    assert touched.problems(None) == [
        "simulated cell #0: machine m0 over-committed in cpu: 1 > 0.5"]

"""The graph manager's bulk paths give what its per-item paths give: whether a shape
could ever run on each machine of the layout worked out on arrays equals asking
machine by machine; the continuation arcs are written only where their cost moved.
(A round's task nodes added in bulk, priced in bulk, and the network after random
change sequences are pinned by tests/test_flow_task_prices.py, test_flow_quincy.py
and test_flow_graph.py.)"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from cellstate.keys import KeyKind
from cellstate.kv.memory import MemoryKV
from cellstate.model import Block, Claim, Job, Machine, Resources, TaskState, Transaction
from cellstate.store import CellStore
from schedulers.flow.costs import make_cost_model
from schedulers.flow.graph import GraphManager, Shape
from tests.flow_support import FLOW, NOW, SSD

# Amounts on both sides of the fit test's tolerance (0.1 + 0.2 is 0.30000000000000004),
# and at it (a capacity of 0.3 holds 0.3 + 1e-9, not more).
_AMOUNTS = [0.0, 0.3, 0.1 + 0.2, 1.0, 2.0, 4.0]
_NEEDS = [*_AMOUNTS, 0.3 + 1e-9, 0.3 + 2e-9, 1.0 + 1e-9]


@settings(max_examples=80, deadline=None)
@given(caps=st.lists(st.tuples(st.sampled_from(_AMOUNTS), st.sampled_from(_AMOUNTS)),
                     min_size=1, max_size=9),
       need=st.tuples(st.sampled_from(_NEEDS), st.sampled_from(_NEEDS)),
       forget=st.integers(0, 8))
def test_a_shapes_look_at_the_whole_layout_agrees_with_asking_machine_by_machine(
        caps: list[tuple[float, float]], need: tuple[float, float], forget: int) -> None:
    store = CellStore(MemoryKV())
    # Names that do not sort as they were added: positions are the layout's, by name.
    store.add_machines([Machine(f"m{(7 * i) % 10}", Resources.of(cpu=c, mem=m, disk=1),
                                rack=f"r{i % 3}") for i, (c, m) in enumerate(caps)])
    snap = store.read_snapshot()
    gm = GraphManager(make_cost_model("quincy"), FLOW)
    gm.rebuild(snap, NOW)
    names = gm._layout.index().machines
    shape = Shape(Resources.of(cpu=need[0], mem=need[1]), ())
    one_by_one = [int(gm._could_fit(shape, snap.machines[mid])) for mid in names]
    got = gm._could_layout(shape).tolist()
    if any(a > 0 for a in need):
        assert got == one_by_one
    else:
        assert got == [-1] * len(names)  # nothing to fit: asked machine by machine
    # A machine whose entry is made again is not known until asked again.
    gone = names[forget % len(names)]
    gm._forget_could(gone)
    again = gm._could_layout(shape).tolist()
    assert again[forget % len(names)] == -1
    assert [x for i, x in enumerate(again) if i != forget % len(names)] == \
        [x for i, x in enumerate(got) if i != forget % len(names)]
    # With a selector the labels decide: machine by machine.
    assert gm._could_layout(Shape(shape.resources, SSD.machine_selector)).tolist() == \
        [-1] * len(names)


def _cell() -> tuple[CellStore, GraphManager]:
    store = CellStore(MemoryKV())
    store.add_machines([Machine(f"m{i}", Resources.of(cpu=4, mem=8), rack=f"r{i % 2}")
                        for i in range(4)])
    blocks = tuple((Block(1.0, (f"m{i % 4}", f"m{(i + 1) % 4}")),) for i in range(3))
    store.submit_job(Job("j", "u", FLOW, 3, Resources.of(cpu=1, mem=1), submitted_at=NOW,
                         task_input=blocks))
    seq = store.read_snapshot().machines["m0"].seq
    store.commit(Transaction(FLOW, (Claim("j", 0, "m0", seq), Claim("j", 1, "m0", seq))))
    return store, GraphManager(make_cost_model("quincy"), FLOW)


def _continuation_slots(gm: GraphManager) -> list[int]:
    return sorted(int(s) for s in gm._runs._dense[0]) if gm._runs._dense is not None else []


def test_continuation_costs_are_written_only_where_they_moved() -> None:
    store, gm = _cell()
    snap = store.read_snapshot()
    gm.update(snap, None, NOW + 10)
    slots = _continuation_slots(gm)
    assert len(slots) == 2  # the two running tasks, each a node of its own
    net = gm.net
    version = net.arrays(compact=False).version
    before = net.costs(np.array(slots, dtype=np.int64)).tolist()
    # The same time again, nothing changed: no arc is stamped as changed.
    gm.update(snap, frozenset(), NOW + 10)
    a = net.arrays(compact=False)
    assert a.arc_version is not None
    assert a.arc_version[slots].max() <= version
    # A second later each costs the discount of a second more, and is stamped.
    gm.update(snap, frozenset(), NOW + 11)
    a = net.arrays(compact=False)
    assert a.arc_version is not None
    after = net.costs(np.array(slots, dtype=np.int64)).tolist()
    discount = gm.model.run_discounts(np.array([1.0]))[0]
    assert after == [c - discount for c in before]
    assert (a.arc_version[slots] > version).all()
    # As a network built at that time has them.
    fresh = GraphManager(make_cost_model("quincy"), FLOW)
    fresh.note_started(gm.started())
    fresh.rebuild(snap, NOW + 11)
    assert fresh.net.canonical() == net.canonical()


def _same_as_rebuilt(gm: GraphManager, store: CellStore, now: float) -> None:
    fresh = GraphManager(make_cost_model("quincy"), FLOW)
    fresh.note_started(gm.started())
    fresh.rebuild(store.read_snapshot(), now)
    assert gm.net.canonical() == fresh.net.canonical()


def test_a_task_starting_at_the_time_of_the_last_write_gets_its_continuation_cost() -> None:
    store, gm = _cell()
    gm.update(store.read_snapshot(), None, NOW + 10)
    seq = store.read_snapshot().machines["m1"].seq
    store.commit(Transaction(FLOW, (Claim("j", 2, "m1", seq),)))
    gm.update(store.read_snapshot(), frozenset({(KeyKind.TASK, "j/2"),
                                                (KeyKind.MACHINE, "m1")}), NOW + 10)
    assert len(_continuation_slots(gm)) == 3
    _same_as_rebuilt(gm, store, NOW + 10)


def test_a_running_task_priced_on_its_own_that_waits_again_gets_its_own_node() -> None:
    """Priced one by one while it ran (found running at the build), then lost: it
    waits again with a node of its own, not in its job's shared node."""
    store, gm = _cell()
    gm.update(store.read_snapshot(), None, NOW)
    store.release_task("j/0", TaskState.LOST, "m0")
    gm.update(store.read_snapshot(), frozenset({(KeyKind.TASK, "j/0"),
                                                (KeyKind.MACHINE, "m0")}), NOW)
    assert gm.net.has_node(("W", "j", 0))
    _same_as_rebuilt(gm, store, NOW)

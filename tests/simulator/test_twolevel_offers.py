"""The two-level framework's view of its offers (simulator/twolevel.py).

A framework's view reports the machines that came into its offer or left it since its
last one, so that its runtime's list of machine ids follows the offer. The view finds
them from the allocator's log of moves, not by comparing every machine offered; this
checks, on a cell small and busy enough that machines fill up and free again, that
what it reports is exactly the difference of the two offers' machines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from immutables import Map

from cellstate.keys import KeyKind
from cellstate.model import Machine, Resources
from simulator.config import Architecture, SimConfig, shared_state
from simulator.sim import Simulation
from simulator.twolevel import Offer, OfferedMachines, OfferView


def test_each_offer_reports_the_machines_that_entered_or_left_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shown: dict[int, frozenset[str]] = {}  # per view: the machines of its last offer
    reported: list[tuple[KeyKind, str]] = []
    checked = {"offers": 0, "moved": 0}
    show = OfferView.show

    def record(snap: Any, changes: Any) -> None:
        if isinstance(snap.machines, OfferedMachines):  # the view's, not the cell's
            reported.extend(changes)

    def checked_show(view: OfferView, offer: Offer) -> None:
        if id(view) not in shown:
            view.on_changes(record)
            shown[id(view)] = frozenset(view.cell.snapshot().machines.keys())
        now = frozenset(offer.locks)
        expected = shown[id(view)] ^ now
        reported.clear()
        show(view, offer)
        assert all(kind is KeyKind.MACHINE for kind, _ in reported)
        assert sorted(mid for _, mid in reported) == sorted(expected)
        shown[id(view)] = now
        checked["offers"] += 1
        checked["moved"] += len(expected)

    monkeypatch.setattr(OfferView, "show", checked_show)
    # 200 machines of 4 CPUs and 8 GB: four 1-CPU, 2-GB tasks fill one entirely, so
    # machines leave the offers and come back as tasks end.
    base = SimConfig(Architecture.TWO_LEVEL, shared_state(), horizon=600, day=600, seed=2)
    cfg = attrs.evolve(base, cell=attrs.evolve(base.cell, machines=200, mem=8.0))
    Simulation(cfg).run()
    assert checked["offers"] > 50
    assert checked["moved"] > 50  # the case under test happened, many times


def test_a_view_shows_what_it_was_offered_after_the_offer_is_answered() -> None:
    """A view keeps the locks it was shown: answering the offer hands its locks to the
    allocator, which merges what was freed meanwhile into them and drops the machines
    placed on, and the view still shows each machine as it was offered."""
    cap = Resources.of(cpu=4.0, mem=16.0)
    half = Resources.of(cpu=2.0, mem=8.0)
    machines = {"m1": Machine("m1", cap), "m2": Machine("m2", cap)}
    offer = Offer(1, "batch", Map({"m1": cap, "m2": half}))
    view: Mapping[str, Machine] = OfferedMachines(machines, offer, {})
    pool = offer.take().mutate()
    pool["m2"] = pool["m2"] + half
    del pool["m1"]
    assert pool.finish() == Map({"m2": cap}) and not offer.locks
    assert set(view) == {"m1", "m2"}
    assert "hidden/0" not in view["m1"].allocations  # all of it was offered
    assert view["m2"].allocations["hidden/0"].resources == half
    later: Mapping[str, Machine] = OfferedMachines(machines, offer, {})
    assert "m1" not in later and len(later) == 0

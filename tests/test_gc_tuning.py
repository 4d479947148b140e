"""The simulation's collector: paused between sweeps, cyclic garbage still freed, the
process's collector as it was afterwards."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from cellstate.gc_tuning import SweptCollector


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def collector_state() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_pause_stops_automatic_collection_and_resume_restores_it(collector_state: None) -> None:
    gc.enable()
    c = SweptCollector()
    c.pause()
    assert not gc.isenabled()
    c.resume()
    assert gc.isenabled()


def test_resume_leaves_a_disabled_collector_disabled(collector_state: None) -> None:
    gc.disable()
    c = SweptCollector()
    c.pause()
    c.resume()
    assert not gc.isenabled()


def test_a_due_sweep_frees_cycles_made_since_the_last(collector_state: None) -> None:
    c = SweptCollector(every=0.0)
    c.pause()
    ref = _cycle()
    assert ref() is not None  # paused: nothing collects it
    c.sweep()
    assert ref() is None


def test_a_sweep_before_its_time_collects_nothing(collector_state: None) -> None:
    c = SweptCollector(every=3600.0)
    c.pause()
    ref = _cycle()
    c.sweep()
    assert ref() is not None
    c.resume()
    gc.collect()
    assert ref() is None

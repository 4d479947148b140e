"""Cumulative Resource Share on small cells, computed by hand."""

from __future__ import annotations

import pytest

from cellstate.model import Resources
from schedulers.fair.shares import OrderKey, ShareBook, dominant_share

# Two machines of 4 cpu and 16 GiB: the cell has 8 cpu and 32 GiB.
CELL = Resources.of(cpu=8, mem=32)


def key(priority: int, job: str, index: int = 0) -> OrderKey:
    return (-priority, 0.0, 0.0, job, index)


def book(weights: dict[str, float] | None = None) -> ShareBook:
    b = ShareBook(CELL, weights)
    # alice: a1 before a2 in her own order (higher priority first).
    b.add("alice", key(1, "a1"), "a1/0", Resources.of(cpu=2, mem=2))
    b.add("alice", key(0, "a2"), "a2/0", Resources.of(cpu=2, mem=2))
    # bob holds little cpu but half the memory: memory is his dominant resource.
    b.add("bob", key(0, "b1"), "b1/0", Resources.of(cpu=1, mem=16))
    return b


def test_dominant_share_takes_the_largest_dimension() -> None:
    assert dominant_share({"cpu": 1, "mem": 16}, {"cpu": 8, "mem": 32}) == 0.5
    assert dominant_share({"cpu": 2, "mem": 2}, {"cpu": 8, "mem": 32}) == 0.25
    # A dimension the cell lacks counts nothing.
    assert dominant_share({"gpu": 1}, {"cpu": 8}) == 0.0


def test_crs_counts_the_owners_tasks_at_least_as_important() -> None:
    b = book()
    assert b.crs("a1/0") == 0.25  # 2 of 8 cpu
    assert b.crs("a2/0") == 0.5  # a1 and a2: 4 of 8 cpu
    assert b.crs("b1/0") == 0.5  # 16 of 32 GiB, whatever the cpu
    assert b.share("alice") == 0.5 and b.share("carol") == 0.0
    assert b.running("alice") == Resources.of(cpu=4, mem=4)


def test_a_waiting_task_counts_the_tasks_before_it_and_itself() -> None:
    b = book()
    need = Resources.of(cpu=2, mem=2)
    # Before a1 in alice's order: only itself.
    assert b.crs_waiting("alice", key(2, "a0"), need) == 0.25
    # Between a1 and a2: a1 and itself.
    assert b.crs_waiting("alice", key(0, "a15"), need) == 0.5  # "a15" sorts before "a2"
    # After both: 6 of 8 cpu.
    assert b.crs_waiting("alice", key(-1, "a9"), need) == 0.75
    assert b.crs_waiting("carol", key(0, "c1"), need) == 0.25


def test_weights_divide_the_share() -> None:
    b = book({"bob": 2.0, "alice": 0.5})
    assert b.crs("b1/0") == 0.25  # 0.5 / 2
    assert b.crs("a1/0") == 0.5  # 0.25 / 0.5
    assert b.crs("a2/0") == 1.0
    assert b.crs_waiting("bob", key(-1, "b2"), Resources.of(cpu=1, mem=8)) == pytest.approx(
        (24 / 32) / 2)


def test_removing_a_task_lowers_the_crs_of_those_after_it() -> None:
    b = book()
    b.remove("a1/0")
    assert b.crs("a2/0") == 0.25
    assert b.owner("a1/0") is None
    with pytest.raises(ValueError, match="already"):
        b.add("bob", key(0, "b1"), "b1/0", Resources.of(cpu=1))

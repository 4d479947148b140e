"""Utilization buckets (simulator/recorder.Usage) on widths that are not exact in
binary: a run spread over buckets ends, and adds up to its CPU-seconds."""

from __future__ import annotations

import pytest

from simulator.recorder import Usage


@pytest.mark.parametrize("width", [0.1, 0.3, 0.7, 0.75, 900.0])
def test_runs_starting_on_bucket_edges_are_counted_and_end(width: float) -> None:
    u = Usage(width, 400 * width)
    total = 0.0
    for k in range(1, 300):  # the old loop stalled on most of these starts
        start = k * width
        u.add(2.0, start, start + 3.3 * width, effective=k % 2 == 0)
        total += 2.0 * 3.3 * width
    assert sum(u.raw) == pytest.approx(total)
    assert sum(u.effective) == pytest.approx(sum(2.0 * 3.3 * width for k in range(1, 300)
                                                 if k % 2 == 0))


def test_a_run_past_the_end_fills_the_last_bucket_up_to_the_end() -> None:
    u = Usage(1.0, 3.0)
    u.add(1.0, 2.5, 10.0, effective=True)
    assert u.raw == [0.0, 0.0, 0.5]

"""Utilization buckets (simulator/recorder.Usage) on widths that are not exact in
binary: a run spread over buckets ends, and adds up to its CPU-seconds."""

from __future__ import annotations

import pytest

from simulator.recorder import Recorder, Usage


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


@pytest.mark.parametrize("width", [0.1, 0.7, 60.0])
@pytest.mark.parametrize("runs", [1, 2, 7, 100])
def test_runs_alike_added_at_once_give_the_same_floats_as_one_call_each(
        width: float, runs: int) -> None:
    """The tasks of one commit end together: adding them in one call (each bucket takes
    each run's amount in turn) gives exactly the floats of a call per run."""
    one, many = Usage(width, 50 * width), Usage(width, 50 * width)
    for k, (start, end) in enumerate([(0.3 * width, 7.9 * width), (2 * width, 60 * width),
                                      (0.0, 0.1 * width)]):
        for _ in range(runs):
            one.add(0.37, start, end, effective=k != 1)
        many.add(0.37, start, end, effective=k != 1, runs=runs)
    assert many.raw == one.raw and many.effective == one.effective


def test_add_runs_is_run_ended_of_each_run_in_order() -> None:
    runs = [(0.0, 1.0), (0.0, 1.0), (3.3, 0.5), (0.0, 1.0), (3.3, 0.5), (3.3, 0.5)]
    for finished in (True, False):
        each, together = Recorder(100.0, 100.0), Recorder(100.0, 100.0)
        each.track_usage(0.7, 10.0)
        together.track_usage(0.7, 10.0)
        for start, cpu in runs:
            each.run_ended("j", cpu, start, 77.7, "" if finished else "x")
        together.add_runs(runs, 77.7, finished)
        assert each.usage is not None and together.usage is not None
        assert together.usage.raw == each.usage.raw
        assert together.usage.effective == each.usage.effective

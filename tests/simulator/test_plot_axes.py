"""Plots label time in a unit that suits the run: a 240 s run read 0.00-0.07 "simulated
hours" in utilization.png (issue 34)."""

from __future__ import annotations

import pytest

from simulator.output import time_unit


@pytest.mark.parametrize(("span", "unit", "top"), [
    (90, "seconds", 90), (240, "minutes", 4), (7200, "minutes", 120),
    (36_000, "hours", 10), (7 * 86400, "days", 7)])
def test_a_time_axis_reads_in_a_unit_of_the_runs_length(span: float, unit: str,
                                                         top: float) -> None:
    scale, name = time_unit(span)
    assert name == unit and span / scale == top

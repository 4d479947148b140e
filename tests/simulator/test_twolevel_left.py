"""The two-level allocator's free-resource arithmetic (simulator/twolevel.py).

``_left(capacity, used, *locks)`` replaces ``_positive(capacity - used - lock ...)``
(one intermediate vector per term) on the allocator's hot path; the simulator's
outputs must stay byte-identical, so it must give exactly the same vector, for the
terms the allocator passes: usage and locks that are non-negative."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from cellstate.model import Resources
from simulator.twolevel import _left, _positive

AMOUNT = st.one_of(st.sampled_from([0.0, 1e-10, 5e-10, 1.0, 2.0, 4.0, 16.0, 0.1, 0.3]),
                   st.floats(min_value=0.0, max_value=20.0, allow_nan=False))


@st.composite
def vectors(draw: st.DrawFn) -> Resources:
    names = (["cpu", "mem"] if draw(st.integers(0, 3))
             else sorted(draw(st.sets(st.sampled_from(["cpu", "gpu", "mem"])))))
    return Resources.from_mapping({n: draw(AMOUNT) for n in names})


@settings(max_examples=500, deadline=None)
@given(vectors(), vectors(), st.lists(vectors(), max_size=3))
def test_left_is_the_positive_part_of_the_differences(capacity: Resources, used: Resources,
                                                      locks: list[Resources]) -> None:
    expected = capacity - used
    for lock in locks:
        expected = expected - lock
    assert _left(capacity, used, *locks).amounts == _positive(expected).amounts

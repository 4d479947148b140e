"""Resources arithmetic (cellstate/model.py) against an independent oracle.

``+``, ``-``, ``add_each``, ``sum_resources`` and ``exceeding_with`` have fast paths
for vectors over the same two dimensions (cpu and mem, nearly every vector a run adds);
the simulator's outputs must stay byte-identical, so each result must be exactly the
oracle's: the same dimensions and the same float bits (0.0 and -0.0 told apart), for
canonical vectors and for the uncanonical ones arithmetic can make (negative, tiny)."""

from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st

from cellstate.model import FIT_SLACK, Resources, add_each, sum_resources

DIMS = ("cpu", "disk", "gpu", "mem")
AMOUNTS = st.one_of(
    st.sampled_from([0.5, 1.0, 2.0, 4.0, 16.0, 1e-10, -1e-10, 3.0000000001, -0.0, 0.1, 0.2]),
    st.floats(min_value=-20, max_value=20, allow_nan=False),
)


@st.composite
def vectors(draw: st.DrawFn) -> Resources:
    # Mostly cpu and mem (the fast path), sometimes other or fewer dimensions.
    if draw(st.integers(0, 4)):
        names = ["cpu", "mem"]
    else:
        names = sorted(draw(st.sets(st.sampled_from(DIMS), max_size=4)))
    return Resources(tuple((n, draw(AMOUNTS)) for n in names))


def _bits(r: Resources) -> tuple[tuple[str, bytes], ...]:
    return tuple((n, struct.pack("<d", a)) for n, a in r.amounts)


def _combine(a: Resources, b: Resources, sign: float, keep: float) -> Resources:
    out = dict(a.amounts)
    for n, x in b.amounts:
        out[n] = out.get(n, 0.0) + x if sign > 0 else out.get(n, 0.0) - x
    return Resources(tuple(sorted((n, x) for n, x in out.items() if abs(x) > keep)))


def oracle_add(a: Resources, b: Resources) -> Resources:
    if not b.amounts:
        return a
    if not a.amounts:
        return b
    # Exact zeros are dropped from a sum.
    out = dict(a.amounts)
    for n, x in b.amounts:
        out[n] = out.get(n, 0.0) + x
    return Resources(tuple(sorted((n, x) for n, x in out.items() if x != 0.0)))


def oracle_sub(a: Resources, b: Resources) -> Resources:
    if not b.amounts:
        return a
    return _combine(a, b, -1.0, 1e-9)


def oracle_sum(items: list[Resources]) -> Resources:
    total: dict[str, float] = {}
    for r in items:
        for n, x in r.amounts:
            total[n] = total.get(n, 0.0) + x
    return Resources(tuple(sorted((n, x) for n, x in total.items() if abs(x) > 1e-9)))


def oracle_exceeding_with(used: Resources, extra: Resources, cap: Resources) -> str | None:
    total = dict(used.amounts)
    for n, x in extra.amounts:
        total[n] = total.get(n, 0.0) + x
    for n in sorted(total):
        c = cap.get(n)
        if total[n] > c + FIT_SLACK * max(c, 1.0):
            return n
    return None


@settings(max_examples=400, deadline=None)
@given(vectors(), vectors())
def test_add_and_sub_match_the_oracle_bit_for_bit(a: Resources, b: Resources) -> None:
    assert _bits(a + b) == _bits(oracle_add(a, b))
    assert _bits(a - b) == _bits(oracle_sub(a, b))


@settings(max_examples=400, deadline=None)
@given(st.lists(vectors(), max_size=8))
def test_sum_matches_the_oracle_bit_for_bit(items: list[Resources]) -> None:
    assert _bits(sum_resources(items)) == _bits(oracle_sum(items))
    assert _bits(sum_resources(iter(items))) == _bits(oracle_sum(items))


@settings(max_examples=400, deadline=None)
@given(vectors(), st.lists(vectors(), max_size=8))
def test_add_each_is_the_sums_one_at_a_time_bit_for_bit(start: Resources,
                                                        items: list[Resources]) -> None:
    want = start
    for r in items:
        want = oracle_add(want, r)
    assert _bits(add_each(start, items)) == _bits(want)
    assert _bits(add_each(start, iter(items))) == _bits(want)


def test_add_each_of_one_shape_many_times() -> None:
    # A commit's case: one task shape added once per placed task.
    task = Resources.of(cpu=0.1, mem=0.3)
    want = Resources()
    for _ in range(1000):
        want = want + task
    assert _bits(add_each(Resources(), [task] * 1000)) == _bits(want)
    assert add_each(task, []) is task


@settings(max_examples=400, deadline=None)
@given(vectors(), vectors(), vectors())
def test_exceeding_with_matches_the_oracle(used: Resources, extra: Resources,
                                           cap: Resources) -> None:
    assert used.exceeding_with(extra, cap) == oracle_exceeding_with(used, extra, cap)


def test_fast_results_are_ordinary_values() -> None:
    a = Resources.of(cpu=1, mem=2) + Resources.of(cpu=1, mem=2)
    assert a == Resources.of(cpu=2, mem=4)
    assert hash(a) == hash(Resources.of(cpu=2, mem=4))
    assert {a: 1}[Resources.of(cpu=2, mem=4)] == 1
    assert sum_resources([]) == Resources()
    assert Resources.of(cpu=1, mem=2) - Resources.of(cpu=1, mem=2) == Resources()


def loop_fit_times(used: Resources, extra: Resources, cap: Resources, most: int) -> int:
    """What ``fit_times`` promises: copies checked and added one at a time."""
    n = 0
    while n < most and used.exceeding_with(extra, cap) is None:
        used, n = used + extra, n + 1
    return n


@settings(max_examples=600, deadline=None)
@given(vectors(), vectors(), vectors(), st.integers(0, 12))
def test_fit_times_is_the_copy_by_copy_loop(used: Resources, extra: Resources,
                                            cap: Resources, most: int) -> None:
    assert used.fit_times(extra, cap, most) == loop_fit_times(used, extra, cap, most)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([0.1, 0.2, 0.3, 1.0 / 3, 0.7, 1e-10, 2.5]),
       st.sampled_from([0.1, 0.2, 1.0 / 3, 1.0, 1e-10]),
       st.integers(0, 40), st.integers(1, 60))
def test_fit_times_at_the_edge_of_the_slack(step: float, mem: float, held: int,
                                            most: int) -> None:
    # Capacities that k copies reach exactly, give or take a few ulps of float sums:
    # where the slack decides, the answer is the loop's all the same.
    used = sum_resources([Resources.of(cpu=step, mem=mem)] * held)
    for k in (held + 1, held + 3, held + most):
        cap = sum_resources([Resources.of(cpu=step, mem=mem)] * k)
        extra = Resources.of(cpu=step, mem=mem)
        assert used.fit_times(extra, cap, most) == loop_fit_times(used, extra, cap, most)

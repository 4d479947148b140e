"""Machine groups (K-means over log RAM-per-CPU), the preference costs of Eq. 7-8,
regrouping when the machine mix changes, and the aladdin cost model's options."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cellstate.model import Resources
from schedulers.flow import FlowPolicy
from schedulers.flow.aladdin.groups import (
    CLAMP,
    MAX_RANK,
    UNIT,
    features,
    group_machines,
    kmeans,
    rank_cost,
)
from schedulers.flow.aladdin.options import PlannerError, planner_options
from schedulers.flow.costs import COST_MODELS, make_cost_model
from schedulers.flow.planners import PLANNERS
from schedulers.flow.policy import FlowOptionError
from schedulers.testing import Harness, JobBuilder, MachineBuilder, settled


def r(cpu: float, mem: float, **more: float) -> Resources:
    return Resources.of(cpu=cpu, mem=mem, **more)


def test_features_are_log2_of_each_dimension_per_cpu_clamped() -> None:
    assert features(r(8, 32), ("mem",)).tolist() == [2.0]
    assert features(r(8, 4), ("mem",)).tolist() == [-1.0]
    assert features(r(8, 32), ("mem",), np.array([1.0])).tolist() == [1.0]
    # A dimension the task lacks lies far, but not infinitely far.
    assert features(r(4, 8), ("gpu", "mem")).tolist() == [-CLAMP, 1.0]
    assert features(Resources.of(mem=8), ("mem",)).tolist() == [CLAMP]


def test_the_unit_of_a_dimension_changes_no_group_or_rank() -> None:
    """Memory in GiB or in MB (Table 3's unit, 2^10 times more per cpu): features are
    taken relative to the machines' median, so groups and ranks are the same."""
    gib = [r(28, 78.5)] * 4 + [r(56, 156.3)] * 6 + [r(36, 503.7)] * 2 + [r(16, 62.8)] * 3
    mib = [r(c.get("cpu"), c.get("mem") * 1024) for c in gib]
    g, m = group_machines(gib, 2), group_machines(mib, 2)
    assert [g.of[c] for c in gib] == [m.of[c] for c in mib]
    assert g.ranks(r(8, 16)) == m.ranks(r(8, 16 * 1024))
    assert g.ranks(r(32, 211.7)) == m.ranks(r(32, 211.7 * 1024))


def test_kmeans_finds_separated_clusters_and_weights_pull_the_centre() -> None:
    pts = np.array([[0.0], [0.1], [3.0], [3.2]])
    centres, labels, error = kmeans(pts, np.array([1.0, 1.0, 1.0, 3.0]), 2)
    assert labels[0] == labels[1] != labels[2] == labels[3]
    assert sorted(round(float(c), 3) for c in centres[:, 0]) == [0.05, 3.15]
    assert error == pytest.approx(2 * 0.05**2 + 0.15**2 + 3 * 0.05**2)
    # k above the number of points: one group per point, no error.
    assert kmeans(pts, np.ones(4), 9)[0].shape == (4, 1)
    assert kmeans(pts, np.ones(4), 9)[2] == 0.0


def test_groups_are_deterministic_and_numbered_by_ratio() -> None:
    caps = [r(16, 16)] * 5 + [r(8, 16)] * 3 + [r(8, 64)] * 2 + [r(32, 32)] * 4
    g = group_machines(caps, 3)
    shuffled = caps[:]
    random.Random(3).shuffle(shuffled)
    h = group_machines(shuffled, 3)
    assert g.of == h.of and np.array_equal(g.centres, h.centres)
    assert g.k == 3
    # Ratio 1 (16/16 and 32/32 together), then 2, then 8.
    assert g.of[r(16, 16)] == g.of[r(32, 32)] == 0
    assert (g.of[r(8, 16)], g.of[r(8, 64)]) == (1, 2)


def test_eq_7_and_8_rank_groups_by_distance_costing_100_to_the_rank() -> None:
    g = group_machines([r(16, 16), r(8, 16), r(8, 64)], 3)
    # A task of ratio 2 is nearest group 1 (ratio 2), then 0 (ratio 1), then 2 (8).
    assert g.ranks(r(4, 8)) == [2, 1, 3]
    assert g.costs(r(4, 8)) == [100 * UNIT, UNIT, 100**2 * UNIT]
    assert rank_cost(MAX_RANK + 3) == rank_cost(MAX_RANK) < 2**40


def test_the_elbow_rule_picks_k_from_the_mix() -> None:
    two = [r(16, 16)] * 10 + [r(16, 17)] * 10 + [r(8, 64)] * 10
    assert group_machines(two, 0).k == 2
    one = [r(16, 16)] * 10 + [r(32, 32)] * 5
    assert group_machines(one, 0).k == 1


def test_groups_are_made_again_when_the_machine_mix_changes() -> None:
    h = Harness()
    h.admin.add_machines([MachineBuilder(f"a{i}").cpu(16).mem(16).build() for i in range(3)])
    pol = FlowPolicy(policy="aladdin")
    h.add(pol, scheduler="flow")
    h.submit([JobBuilder("j").cpu(1).mem(1).scheduler("flow").build()])
    h.run(settled, max_time=30)
    planner = pol.planner
    assert planner is not None
    first = planner.groups  # type: ignore[attr-defined]
    assert first.k == 1
    h.admin.add_machines([MachineBuilder("b0").cpu(8).mem(64).build()])
    h.submit([JobBuilder("k").cpu(1).mem(8).scheduler("flow").build()])
    h.run(settled, max_time=30)
    again = planner.groups  # type: ignore[attr-defined]
    assert again.k == 2 and again.of[r(8, 64)] != again.of[r(16, 16)]
    assert h.machines_of("k") == ["b0"]  # ratio 8 prefers the ratio-8 group
    # A machine of a shape already known changes no group.
    h.admin.add_machines([MachineBuilder("a9").cpu(16).mem(16).build()])
    h.submit([JobBuilder("l").cpu(1).mem(1).scheduler("flow").build()])
    h.run(settled, max_time=30)
    assert planner.groups.of == again.of  # type: ignore[attr-defined]


def test_aladdin_is_a_planner_with_checked_options() -> None:
    assert "aladdin" in PLANNERS and "aladdin" not in COST_MODELS
    assert planner_options({"groups": 8}, 60.0).groups == 8
    with pytest.raises(PlannerError, match="option srf must be 0 or 1, got 2"):
        planner_options({"srf": 2}, 60.0)
    with pytest.raises(PlannerError, match=r"option groups must be a whole number, got 2\.5"):
        planner_options({"groups": 2.5}, 60.0)
    with pytest.raises(PlannerError, match="option walk must be at least 1"):
        planner_options({"walk": 0}, 60.0)
    with pytest.raises(PlannerError, match="option pack must be 0 or 1"):
        planner_options({"pack": 0.5}, 60.0)
    with pytest.raises(PlannerError, match="option regroup_every must be a whole number"):
        planner_options({"regroup_every": 1.5}, 60.0)
    with pytest.raises(FlowOptionError, match="unknown option"):
        FlowPolicy(policy="aladdin", costs={"k": 4})
    assert FlowPolicy(policy="aladdin").planner is not None
    assert FlowPolicy(policy="aladdin").model is None
    assert FlowPolicy(policy="quincy").planner is None


@pytest.mark.parametrize(("name", "dims"), [("trivial-cpu", ("cpu",)), ("trivial-ram", ("mem",)),
                                            ("load-spread-cpu", ("cpu",)),
                                            ("load-spread-ram", ("mem",))])
def test_single_resource_models_count_room_in_one_dimension(name: str,
                                                           dims: tuple[str, ...]) -> None:
    """Firmament's one-resource policies: the network counts room in one dimension,
    and the repair step (the store's rules) still keeps the other from overflowing."""
    model = make_cost_model(name)
    assert model.dimensions == dims
    h = Harness()
    # m0 has cpu for 4 tasks but memory for 1; m1 has memory for 4 but cpu for 1.
    h.admin.add_machines([MachineBuilder("m0").cpu(4).mem(2).build(),
                          MachineBuilder("m1").cpu(1).mem(8).build()])
    h.add(FlowPolicy(policy=name), scheduler="flow")
    h.submit([JobBuilder("j").tasks(2).cpu(1).mem(2).scheduler("flow").build()])
    h.run(settled, max_time=60)
    assert sorted(h.machines_of("j")) == ["m0", "m1"]


@pytest.mark.parametrize("rule", [{"regroup_every": 1}, {"regroup_spread": 0.05}])
def test_groups_follow_what_machines_have_left(rule: dict[str, float]) -> None:
    """Three machines of RAM/CPU 1 (R1a-c) and two of ratio 2 (R2a-b), K = 2. Two
    tasks of ratio 1/3 fill R1a and R1b to (4 cpu, 12 GiB) left: ratio 3. With the
    groups following the cell, those two now group with the ratio-2 machines, away
    from R1c, and a ratio-3 task goes to one of them (the fuller machines of its
    group). Grouped by capacity, they stay with R1c and the task takes a ratio-2
    machine."""
    def run(costs: dict[str, float]) -> tuple[FlowPolicy, Harness]:
        h = Harness()
        h.admin.add_machines([MachineBuilder(m).cpu(16).mem(16).build()
                              for m in ("R1a", "R1b", "R1c")]
                             + [MachineBuilder(m).cpu(16).mem(32).build() for m in ("R2a", "R2b")])
        pol = FlowPolicy(policy="aladdin", costs={"groups": 2, **costs})
        h.add(pol, scheduler="flow")
        h.submit([JobBuilder("fill").tasks(2).cpu(12).mem(4).scheduler("flow")
                  .spread().build()])
        h.run(settled, max_time=30)
        assert sorted(h.machines_of("fill")) == ["R1a", "R1b"]
        h.submit([JobBuilder("probe").cpu(1).mem(3).scheduler("flow").build()])
        h.run(settled, max_time=30)
        return pol, h

    pol, h = run(rule)
    planner = pol.planner
    assert planner is not None
    groups = planner.groups  # type: ignore[attr-defined]
    g = groups.by_machine
    assert g["R1a"] == g["R1b"] == g["R2a"] == g["R2b"] != g["R1c"]
    assert planner.regroups >= 2  # type: ignore[attr-defined]
    assert h.machines_of("probe")[0] in ("R1a", "R1b")

    pol, h = run({})
    groups = pol.planner.groups  # type: ignore[union-attr]
    assert not groups.by_machine
    assert groups.of[r(16, 16)] != groups.of[r(16, 32)]
    assert h.machines_of("probe")[0] in ("R2a", "R2b")


def test_room_spread_grows_as_machines_fill_away_from_their_group() -> None:
    from schedulers.flow.aladdin.groups import group_by_room, room_spread

    mids = ["a", "b", "c"]
    cap = np.array([[16.0], [16.0], [32.0]])
    cpu = np.array([16.0, 16.0, 16.0])
    groups = group_by_room(mids, ("mem",), cpu, cap, cpu, cap, 2)
    assert room_spread(groups, mids, cpu, cap) == pytest.approx(0.0)
    # b has 12 cpu and 4 GiB taken: 4 cpu and 12 GiB left, ratio 3 (log2 1.58), in
    # the group centred on ratio 1 (0).
    left_cpu = np.array([16.0, 4.0, 16.0])
    left = np.array([[16.0], [12.0], [32.0]])
    assert room_spread(groups, mids, left_cpu, left) == pytest.approx(np.log2(3) ** 2 / 3, rel=1e-3)
    again = group_by_room(mids, ("mem",), left_cpu, left, cpu, cap, 2)
    assert again.by_machine["b"] == again.by_machine["c"] != again.by_machine["a"]
    # A machine with nothing left joins the group nearest its capacity.
    full = group_by_room(mids, ("mem",), np.array([0.0, 16.0, 16.0]),
                         np.array([[0.0], [16.0], [32.0]]), cpu, cap, 2)
    assert full.by_machine["a"] == full.by_machine["b"]

"""Cost models' batch pricing (``CostModel.machine_costs``) gives exactly what their
per-machine methods give, machine by machine, for every built-in model; a model that
overrides a per-machine method without a batch method of its own is priced machine by
machine."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from cellstate.model import Machine, Resources
from schedulers.flow.costs import (
    COST_MODELS,
    LoadSpreadingCostModel,
    MachineBatch,
    MachineLoad,
    make_cost_model,
)
from schedulers.flow.graph import GraphManager
from tests.flow_support import FLOW
from tests.test_flow_graph import Churn

#: Options that make rounding land on halves and the bandwidth share go past 1.
OPTIONS: dict[str, list[dict[str, float]]] = {
    "network": [{}, {"bandwidth_weight": 1}, {"bandwidth_weight": 5}, {"bandwidth_weight": 0}],
}


def random_batch(rng: random.Random, n: int) -> MachineBatch:
    machines = []
    free: list[dict[str, float]] = []
    for i in range(n):
        cap = {"cpu": float(rng.choice([4, 8, 12])), "mem": float(rng.choice([8, 48]))}
        if rng.random() < 0.7:
            cap["net"] = float(rng.choice([1, 2, 8, 10]))
        machines.append(Machine(f"m{i}", Resources.from_mapping(cap)))
        # What is free: anything from all of it to less than nothing (room held by
        # tasks outside the network may exceed capacity after a shrink), with float
        # residue now and then.
        f = {d: rng.choice([c, 0.0, c / 2, c - 1, -1.0, c * rng.random(), 1e-12])
             for d, c in cap.items() if rng.random() < 0.9}
        free.append(f)
    slots = np.array([rng.randint(0, 24) for _ in range(n)], dtype=np.int64)
    others = np.array([rng.choice([0.0, 0.25, 1.0, rng.random()]) for _ in range(n)])
    return MachineBatch(machines, slots, others, lambda: free)


@pytest.mark.parametrize("name", sorted(COST_MODELS))
def test_batch_pricing_equals_pricing_machine_by_machine(name: str) -> None:
    rng = random.Random(name)
    for options in OPTIONS.get(name, [{}]):
        model = make_cost_model(name, **options)
        for _ in range(30):
            batch = random_batch(rng, rng.randint(0, 12))
            priced = model.machine_costs(batch)
            assert priced is not None, f"{name} has no batch pricing"
            into, extra = priced
            loads = batch.loads()
            assert into.tolist() == [model.machine_arc(load) for load in loads]
            want = [model.reclaim(load) for load in loads]
            if extra is None:
                assert want == [None] * len(loads)
            else:
                assert extra.tolist() == want


def test_a_batch_sees_the_loads_the_per_machine_methods_see() -> None:
    m = Machine("m0", Resources.of(cpu=8, mem=16, net=4))
    batch = MachineBatch([m], np.array([5]), np.array([0.5]),
                         lambda: [{"cpu": 2.0, "mem": 16.0 - 1e-12}])
    assert batch.loads() == [MachineLoad(m, 5, 0.5, Resources.of(cpu=6, net=4))]
    assert batch.used("cpu").tolist() == [6.0]
    assert batch.used("mem").tolist() == [0.0]  # float residue is no usage
    assert batch.used("net").tolist() == [4.0]
    assert batch.capacity("gpu").tolist() == [0.0]


class Dearer(LoadSpreadingCostModel):
    """Overrides a per-machine method only: its inherited batch method would be wrong."""

    name = "dearer"

    def machine_arc(self, load: MachineLoad) -> int:
        return 7 * load.slots


def test_a_model_overriding_a_per_machine_method_is_priced_machine_by_machine() -> None:
    model = Dearer()
    assert model.machine_costs(random_batch(random.Random(1), 3)) is None
    churn = Churn(0, net=False)
    gm = GraphManager(model, FLOW)
    gm.update(*churn.take(), churn.now)
    costs: set[int] = set()
    for _ in range(15):
        churn.step(gm)
        assert gm.update(*churn.take(), churn.now).batched == 0
        costs.update(gm.net.arc(s).cost for owner in gm.net.owners() if owner[0] == "M"
                     for s in gm.net.arcs_of(owner))
    assert costs - {0}, "the override priced the arcs into machines"


def test_network_aware_tiers_make_each_further_task_dearer_by_bandwidth() -> None:
    """Firmament's network-aware policy: each further task on a machine in one round
    costs more (convex), from the bandwidth the tasks outside the network hold."""
    model = make_cost_model("network", tiers=4, bandwidth_weight=1000)
    m = Machine("m0", Resources.of(cpu=8, mem=8, net=10))
    spread_only = make_cost_model("load-spread", tiers=4)

    def tiers(outside_net: float) -> list[tuple[int, int]]:
        load = MachineLoad(m, 8, 0.0, Resources.of(net=outside_net),
                           Resources.of(net=outside_net))
        return list(model.sink_tiers(load))

    free = tiers(0.0)
    spread = list(spread_only.sink_tiers(MachineLoad(m, 8, 0.0, Resources())))
    # Bandwidth part: tier k full at k/4 of the bandwidth left: 250, 500, 750, 1000.
    assert [c - s for (_, c), (_, s) in zip(free, spread, strict=True)] == [250, 500, 750, 1000]
    half = tiers(5.0)  # others hold half of the link: 5/10 + k/4 of the rest
    assert [c - s for (_, c), (_, s) in zip(half, spread, strict=True)] == [625, 750, 875, 1000]
    steps = [b[1] - a[1] for a, b in itertools.pairwise(free)]
    assert all(x > 0 for x in steps) and steps == sorted(steps)  # rising, convex

"""The flow scheduler in the simulator: its network follows the cell through the change
sets the simulated store publishes, and the placement measures (latency, data
locality, load spread) count what they say."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from cellstate.cell import CellSnapshot
from cellstate.keys import KeyKind
from cellstate.model import JobKind
from schedulers.api import Context
from schedulers.flow import FlowPolicy
from schedulers.flow.graph import GraphManager, UpdateStats
from schedulers.registry import Registry
from simulator.config import Architecture, CellSpec, DecisionTime, SchedulerSpec, SimConfig
from simulator.recorder import Recorder
from simulator.sim import Simulation
from simulator.workload import Distribution, InputSpec, JobClass, Prefill, input_of
from tests.simulator.helpers import job, simulate


class CheckedGraph(GraphManager):
    """A graph manager that, after every update, compares its network with one built
    from scratch from the same snapshot (same flapping guards and blocks)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.incremental = 0
        self.changes_seen: set[KeyKind] = set()

    def update(self, snap: CellSnapshot, changes: Iterable[tuple[KeyKind, str]] | None,
               now: float) -> UpdateStats:
        changes = None if changes is None else list(changes)
        stats = super().update(snap, changes, now)
        twin = GraphManager(self.model, self.scheduler, self.instance,
                            move_guard=self.move_guard, preempt_below=self.preempt_below)
        twin._moved_at = dict(self._moved_at)
        twin._guards = list(self._guards)
        twin._blocked = dict(self._blocked)
        twin.note_started(self.started())
        twin.rebuild(snap, now)
        mine, theirs = self.net.canonical(), twin.net.canonical()
        if mine != theirs:
            extra = sorted(set(mine[1]) - set(theirs[1]))[:5]
            missing = sorted(set(theirs[1]) - set(mine[1]))[:5]
            raise AssertionError(f"at t={now}: the updated network differs from a rebuild: "
                                 f"supplies equal: {mine[0] == theirs[0]}; arcs only in "
                                 f"the updated one {extra}; only in the rebuild {missing}")
        if not stats.full:
            self.incremental += 1
            self.changes_seen.update(k for k, _ in changes or ())
        return stats


class CheckedFlow(FlowPolicy):
    def graph(self, ctx: Context) -> GraphManager:
        if self._graph is None:
            g = super().graph(ctx)
            self._graph = CheckedGraph(g.model, g.scheduler, g.instance,
                                       move_guard=g.move_guard, preempt_below=g.preempt_below)
        return self._graph


def _registry() -> Registry:
    reg = Registry()
    reg.register("flow", CheckedFlow)
    return reg


def _config(policy: str, **kw: Any) -> SimConfig:
    # A shape of their own (less memory than the prefill's tasks): the network gains
    # and loses a shape as jobs come and go.
    batch = JobClass("batch", JobKind.BATCH, Distribution.exponential(4.0),
                     Distribution.exponential(6.0), Distribution.exponential(40.0),
                     mem=Distribution.fixed(1.0), input=InputSpec(blocks_per_task=2))
    flow = SchedulerSpec("flow", ("batch",), policy="flow", instances=kw.pop("instances", 1),
                         default=DecisionTime(0.2, 0.001),
                         options={"policy": policy, "move_guard": 5.0, "interval": 2.0})
    return SimConfig(Architecture.SHARED, (flow,), (batch,), CellSpec(48, 4.0, 16.0, 8),
                     Prefill(0.5, 4, duration=60.0, scheduler="flow"), horizon=150.0,
                     seed=7, sample_interval=10.0, day=150.0, **kw)


@pytest.mark.parametrize("policy", ["quincy", "load-spread"])
def test_the_flow_network_equals_a_rebuild_after_every_update_of_a_run(policy: str) -> None:
    """Jobs arrive with input blocks and a shape the prefill does not have, prefilled
    tasks owned by the flow scheduler end and their jobs are forgotten, rounds
    migrate: after every incremental update the
    network equals one built from scratch, so the change sets the instance sees
    (Context.changes) name everything that changed."""
    sim = Simulation(_config(policy), registry=_registry())
    r = sim.run()
    policy_ = sim.policies[("flow", "0")]
    assert isinstance(policy_, CheckedFlow)
    graph = policy_._graph
    assert isinstance(graph, CheckedGraph)
    assert graph.incremental >= 20
    # Placements, ends and forgotten jobs all went through the change sets.
    assert {KeyKind.JOB, KeyKind.TASK} <= graph.changes_seen
    assert r["tasks_measured"] > 50
    assert r["flow_rounds"] >= 20


def test_two_flow_instances_share_the_jobs_and_keep_their_networks_right() -> None:
    sim = Simulation(_config("quincy", instances=2), registry=_registry())
    r = sim.run()
    graphs = [p._graph for p in sim.policies.values() if isinstance(p, CheckedFlow)]
    assert len(graphs) == 2
    assert all(isinstance(g, CheckedGraph) and g.incremental > 5 for g in graphs)
    assert r["tasks_measured"] > 50


def test_an_idle_flow_instance_still_proposes_rounds() -> None:
    """No job arrives, yet prefilled tasks end: the instance wakes every interval
    (the runtime's idle wait is infinite in the simulator) and its rounds see it."""
    config = _config("load-spread")
    quiet = JobClass("batch", JobKind.BATCH, Distribution.fixed(1e9), Distribution.fixed(1),
                     Distribution.fixed(1))
    sim = Simulation(SimConfig(config.architecture, config.schedulers, (quiet,), config.cell,
                               config.prefill, horizon=100.0, seed=1, day=100.0),
                     registry=_registry())
    r = sim.run()
    # One proposal every 2 s, from t=0 to 100 (rounds with no change solve nothing).
    assert r["flow_attempts"] == 51
    assert r["flow_rounds"] >= 2


# -- the measures ---------------------------------------------------------------------


def test_placement_latency_and_job_response_count_from_submission(tmp_path: Path) -> None:
    """Batch scheduler, t_job = 2 s: a job of 2 tasks submitted at 1 is decided from 1
    to 3 (latency 2 for both tasks) and runs 10 s: response 12. A second job at 2
    waits for the scheduler until 3, is decided until 5: latency 3, response 13."""
    spec = SchedulerSpec("batch", ("batch",), default=DecisionTime(2.0, 0.0))
    _, r = simulate(tmp_path, Architecture.SHARED, (spec,),
                    [job(1.0, "batch", tasks=2, duration=10.0),
                     job(2.0, "batch", duration=10.0)], machines=2)
    assert r["tasks_measured"] == 3
    assert r["placement_latency_mean_s"] == pytest.approx(7 / 3)
    assert r["placement_latency_max_s"] == 3.0
    assert r["jobs_measured"] == 2
    assert r["job_response_mean_s"] == 12.5


def test_warmup_leaves_early_jobs_out_of_the_measures(tmp_path: Path) -> None:
    spec = SchedulerSpec("batch", ("batch",), default=DecisionTime(2.0, 0.0))
    _, r = simulate(tmp_path, Architecture.SHARED, (spec,),
                    [job(1.0, "batch", tasks=2), job(2.0, "batch")], machines=2, warmup=1.5)
    assert r["tasks_measured"] == 1
    assert r["placement_latency_mean_s"] == 3.0


def test_load_spread_is_the_variation_of_machine_utilizations() -> None:
    rec = Recorder(100.0, 100.0, warmup=10.0)
    rec.spread(5.0, [1.0, 0.0])  # before the warmup: not counted
    rec.spread(10.0, [1.0, 0.0])  # mean 0.5, deviation 0.5
    rec.spread(20.0, [0.5, 0.5, 1.0, 0.0])  # mean 0.5, deviation sqrt(0.125)
    rec.spread(30.0, [0.0, 0.0])  # an empty cell has no spread
    r = rec.summary({})
    assert r["load_cv_mean"] == pytest.approx((1.0 + 0.125 ** 0.5 / 0.5) / 2)
    assert r["load_max_over_mean"] == pytest.approx(2.0)


def test_the_load_spreading_flow_spreads_one_job_evenly(tmp_path: Path) -> None:
    """Two machines of 4 CPUs, one job of 4 one-CPU tasks: two on each machine
    (utilization CV 0, max/mean 1), whichever machine the solver fills first."""
    spec = SchedulerSpec("s", ("batch",), policy="flow", default=DecisionTime(1.0, 0.0),
                         options={"policy": "load-spread"})
    _, r = simulate(tmp_path, Architecture.SHARED, (spec,), [job(0.5, "batch", tasks=4)],
                    machines=2, horizon=20.0)
    assert r["tasks_measured"] == 4
    assert r["load_cv_mean"] == pytest.approx(0.0)
    assert r["load_max_over_mean"] == pytest.approx(1.0)


def _locality_config(policy: str) -> SimConfig:
    """Single-task jobs reading one block stored once: the data is on one machine."""
    cls = JobClass("batch", JobKind.BATCH, Distribution.exponential(2.0),
                   Distribution.fixed(1), Distribution.fixed(20.0),
                   input=InputSpec(blocks_per_task=1, replicas=1, placement="random"))
    spec = SchedulerSpec("s", ("batch",), policy=policy, default=DecisionTime(0.1, 0.0),
                         options={"policy": "quincy"} if policy == "flow" else {})
    return SimConfig(Architecture.SHARED, (spec,), (cls,), CellSpec(40, 4.0, 16.0, 10),
                     None, horizon=300.0, seed=3, day=300.0)


def test_quincy_places_tasks_with_their_data_and_first_fit_does_not() -> None:
    """About 10 tasks run at once on 160 slots: every data-holding machine has room,
    so Quincy reads (nearly) all data locally; random first fit finds the one machine
    of 40 that holds it about 1 time in 40, and its rack (10 machines) 1 in 4."""
    quincy = Simulation(_locality_config("flow")).run()
    first_fit = Simulation(_locality_config("batch")).run()
    assert quincy["input_tasks"] > 100 and first_fit["input_tasks"] > 100
    assert quincy["data_local_fraction"] > 0.95
    assert first_fit["data_local_fraction"] < 0.15
    assert 0.1 < first_fit["data_rack_local_fraction"] < 0.45
    assert quincy["data_rack_local_fraction"] >= quincy["data_local_fraction"]
    # One copy of one block: the best machine holds all of a task's data.
    assert quincy["data_local_ceiling"] == first_fit["data_local_ceiling"] == 1.0


# -- input blocks -----------------------------------------------------------------------


def _cell(machines: int, rack_size: int) -> tuple[list[str], dict[str, str],
                                                   dict[str, list[str]]]:
    ids = [f"m{i}" for i in range(machines)]
    rack_of = {m: f"r{i // rack_size}" for i, m in enumerate(ids)}
    racks: dict[str, list[str]] = {}
    for m in ids:
        racks.setdefault(rack_of[m], []).append(m)
    return ids, rack_of, racks


def test_hdfs_placement_puts_three_copies_on_two_racks() -> None:
    ids, rack_of, racks = _cell(40, 8)
    blocks = InputSpec(blocks_per_task=3).blocks(5, random.Random(1), ids, rack_of, racks)
    assert len(blocks) == 15
    for copies in blocks:
        assert len(set(copies)) == 3
        assert rack_of[copies[0]] != rack_of[copies[1]] == rack_of[copies[2]]


def test_random_placement_and_more_copies_than_machines() -> None:
    ids, rack_of, racks = _cell(2, 1)
    blocks = InputSpec(replicas=3, placement="random").blocks(4, random.Random(2), ids,
                                                                rack_of, racks)
    assert all(sorted(c) == ["m0", "m1"] for c in blocks)
    assert input_of(blocks, 0.5) == (("m0", 4.0), ("m1", 4.0))


def test_the_solvers_kernels_are_loaded_before_the_first_measured_round() -> None:
    """A round's measured time is its decision time in the simulator, so a process's
    first solve must not carry the kernels' loading (hundreds of ms; a compile where
    numba's cache lacks them): a fresh process has none loaded until a flow
    scheduler is added to a simulation, which loads them all."""
    script = (
        "import attrs\n"
        "import schedulers.flow.mcf.kernels as K\n"
        "from schedulers.flow.graph import GraphManager\n"
        "from simulator.sim import Simulation\n"
        "from tests.simulator.test_flow_sim import _config, _registry\n"
        "kernels = [K.prepare, K.relax, K.cost_scaling, K.finish]\n"
        "print(sum(len(k.signatures) for k in kernels))\n"
        "seen = []\n"
        "update = GraphManager.update\n"
        "def first(self, *a, **k):\n"
        "    seen.append(min(len(k.signatures) for k in kernels))\n"
        "    return update(self, *a, **k)\n"
        "GraphManager.update = first\n"
        "Simulation(attrs.evolve(_config('quincy'), horizon=5.0),"
        " registry=_registry()).run()\n"
        "print(seen[0])\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    assert out == ["0", "1"]

"""Per-scheduler limits in the simulator (``[limits.NAME]``, Omega §3.4): the simulated
cell counts what a resource-limited scheduler holds as the store does
(tests/simulator/test_cell_equivalence.py), and the real runtime keeps its plans
within the limit: jobs past it wait for its tasks to end, none is given up on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cellstate.invariants import violations
from cellstate.model import CellConfig, JobKind, Resources, SchedulerLimits, TaskState
from simulator.config import Architecture, CellSpec, DecisionTime, SchedulerSpec, SimConfig
from simulator.engine import SAMPLE
from simulator.experiment import load
from simulator.sim import Simulation
from simulator.workload import Distribution, InputError, JobClass

F = Distribution.fixed
ZERO = DecisionTime(0.0, 0.0)
BATCH = JobClass("batch", JobKind.BATCH, F(10.0), F(1.0), F(100.0), cpu=F(1.0))
CPU2 = CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=2))})


def _running(sim: Simulation) -> int:
    return sum(1 for t in sim.cell.snapshot().tasks.values() if t.state is TaskState.RUNNING)


def run(tmp_path: Path, limits: CellConfig | None, trace: str,
        probe: tuple[tuple[float, Callable[[Simulation], None]], ...] = (),
        arch: Architecture = Architecture.SHARED) -> tuple[Simulation, dict[str, Any]]:
    path = tmp_path / "trace.jsonl"
    path.write_text(trace)
    config = SimConfig(arch, (SchedulerSpec("batch", ("batch",), default=ZERO),), (BATCH,),
                       CellSpec(1, 4.0, 16.0), prefill=None, horizon=300.0, day=300.0,
                       sample_interval=1.0, trace=str(path), limits=limits)
    sim = Simulation(config)
    for at, look in probe:
        sim.loop.at(at, SAMPLE, lambda look=look: look(sim))  # type: ignore[misc]
    return sim, sim.run()


THREE_TASKS = ('{"submit": 10, "class": "batch", "tasks": 3, "duration": 100, "cpu": 1, '
               '"mem": 2}\n')


@pytest.mark.parametrize("arch", [Architecture.SHARED, Architecture.MONOLITHIC,
                                  Architecture.TWO_LEVEL])
def test_a_task_past_the_limit_runs_when_the_first_ones_end(tmp_path: Path,
                                                            arch: Architecture) -> None:
    """One machine of 4 cpus, batch limited to 2: of three 1-cpu tasks of 100 s
    submitted at 10 s, two run at once and the third from 110 s (it has room on the
    machine all along); the job completes at 210 s, nothing conflicts or is given up."""
    seen: dict[float, tuple[int, float]] = {}

    def look(at: float) -> tuple[float, Callable[[Simulation], None]]:
        return at, lambda sim: seen.update(
            {at: (_running(sim), sim.cell.usage.get("batch", Resources()).get("cpu"))})

    _, r = run(tmp_path, CPU2, THREE_TASKS, (look(50.0), look(150.0), look(250.0)), arch)
    assert seen == {50.0: (2, 2.0), 150.0: (1, 1.0), 250.0: (0, 0.0)}
    assert r["batch_completed"] == 1 and r["batch_abandoned"] == 0
    # (Two-level: plus the offers' own delays.)
    assert 200.0 <= r["batch_completion_mean_s"] <= 202.0
    assert r["batch_conflicted"] == 0 and r["tasks_unplaced"] == 0
    assert r["batch_jobs_held"] == 1  # its retry found the limit full: held, not tried
    # The same without the limit: all three at once.
    _, free = run(tmp_path, None, THREE_TASKS, (), arch)
    assert "batch_jobs_held" not in free
    assert 100.0 <= free["batch_completion_mean_s"] <= 102.0


def test_the_prefill_counts_toward_the_limit(tmp_path: Path) -> None:
    """Limits apply once the prefill is placed: what the scheduler holds then counts."""
    path = tmp_path / "trace.jsonl"
    path.write_text('{"submit": 10, "class": "batch", "tasks": 1, "duration": 50, '
                    '"cpu": 1, "mem": 2}\n')
    from simulator.workload import Prefill
    config = SimConfig(Architecture.SHARED, (SchedulerSpec("batch", ("batch",), default=ZERO),),
                       (BATCH,), CellSpec(2, 4.0, 16.0),
                       prefill=Prefill(utilization=0.25, duration=40.0, scheduler="batch"),
                       horizon=300.0, day=300.0, sample_interval=1.0, trace=str(path),
                       limits=CPU2)
    sim = Simulation(config)
    r = sim.run()
    # The prefill holds 2 cpus until 40 s: the traced task waits for them.
    assert r["placement_latency_max_s"] == pytest.approx(30.0)
    assert violations(sim.cell.snapshot()) == []


def test_random_load_under_a_limit_stays_within_it_and_gives_up_on_nothing() -> None:
    cls = JobClass("batch", JobKind.BATCH, Distribution.exponential(5.0),
                   Distribution.exponential(4.0), Distribution.exponential(60.0),
                   cpu=F(1.0))
    limits = CellConfig({"batch": SchedulerLimits(max_resources=Resources.of(cpu=12))})
    config = SimConfig(Architecture.SHARED,
                       (SchedulerSpec("batch", ("batch",), instances=2, default=ZERO),),
                       (cls,), CellSpec(10, 4.0, 16.0), prefill=None, horizon=1800.0,
                       day=1800.0, sample_interval=1.0, limits=limits, seed=3)
    sim = Simulation(config)
    peak: list[float] = []
    for at in range(10, 1800, 10):
        sim.loop.at(float(at), SAMPLE, lambda: peak.append(
            sim.cell.usage.get("batch", Resources()).get("cpu")))
    r = sim.run()
    assert max(peak) == 12.0  # the limit was reached, never passed
    assert r["batch_abandoned"] == 0 and r["batch_conflicted"] == 0
    assert r["batch_jobs_held"] > 0
    assert violations(sim.cell.snapshot()) == []


EXPERIMENT = """{top}
architecture = "shared"
horizon = 60.0
[cell]
machines = 2
[[workload]]
name = "batch"
interarrival = 10.0
tasks = 1
duration = 5.0
[[scheduler]]
name = "batch"
serves = ["batch"]
{limits}
"""


def test_an_experiment_sets_limits(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text(EXPERIMENT.format(top="", limits="[limits.batch]\nmax_precedence = 3\n"
                                                     "max_resources = { cpu = 2.5 }\n"))
    config = load(path).runs[0].config
    assert config.limits is not None
    assert config.limits.limits_for("batch") == SchedulerLimits(
        3, Resources.of(cpu=2.5))


@pytest.mark.parametrize(("limits", "says"), [
    ("[limits.service]\nmax_precedence = 1\n",
     "field 'limits.service': 'service' is not a [[scheduler]] of this experiment (batch)"),
    ("[limits.batch]\nmax_resources = { cpu = -1 }\n",
     "line 14, field 'limits.batch': limits.batch.max_resources.cpu is negative (-1)"),
    ("[limits.batch]\nmax_precedence = 'high'\n",
     "line 14, field 'limits.batch': limits.batch.max_precedence must be an integer"),
    ("[limits.batch]\nmax_cpus = 4\n",
     "line 14, field 'limits.batch': limits.batch: unknown field(s) 'max_cpus'"),
    ("limits = 3", "field 'limits': "),
])
def test_bad_limits_are_named(tmp_path: Path, limits: str, says: str) -> None:
    path = tmp_path / "e.toml"
    top = limits if not limits.startswith("[") else ""
    path.write_text(EXPERIMENT.format(top=top, limits="" if top else limits))
    with pytest.raises(InputError) as e:
        load(path)
    assert says in str(e.value) and "e.toml" in str(e.value)


def test_the_committed_limits_experiment_loads() -> None:
    root = Path(__file__).resolve().parents[2]
    exp = load(root / "experiments" / "limits" / "quota_shared.toml")
    cpus = []
    for r in exp.runs:
        assert r.config.limits is not None
        lim = r.config.limits.limits_for("batch")
        assert lim is not None and lim.max_resources is not None
        cpus.append(lim.max_resources.get("cpu"))
    assert cpus == [40000, 3000, 2000, 1500, 1200, 1000]

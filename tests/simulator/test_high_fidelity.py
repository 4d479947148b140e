"""The simulator's high-fidelity mode (Omega §5): traces with precedence and placement
constraints, machine attributes, the real service policy's constraints and preemption
in a simulated run, and Fig. 12c's "no conflict" busyness."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from cellstate.model import (
    Claim,
    CommitResult,
    Constraints,
    JobKind,
    Reason,
    Rejection,
    Requirement,
    SelectorOp,
)
from simulator.config import Architecture, CellSpec, DecisionTime, SchedulerSpec, SimConfig
from simulator.constraints import (
    Attribute,
    ConstraintGen,
    format_constraints,
    parse_constraints,
)
from simulator.experiment import load
from simulator.recorder import Recorder
from simulator.seeds import by_point, estimate
from simulator.sim import Simulation
from simulator.workload import Distribution, InputError, JobClass, generate, load_trace
from tests.simulator.helpers import CLASSES, job, sched, simulate, trace

KINDS = {"batch": JobKind.BATCH, "service": JobKind.SERVICE}


# -- traces --------------------------------------------------------------------------


def test_trace_rows_with_constraints_and_precedence_parse(tmp_path: Path) -> None:
    path = trace(tmp_path, [
        job(0.0, "service", tasks=3, precedence=200,
            constraints="platform=p1|p2; kernel!=k2; max_per_machine=1"),
        job(1.0, "batch", precedence=0),
        job(2.0, "batch"),
    ])
    service, pinned, plain = load_trace(path, KINDS)
    assert service.precedence == 200
    assert service.constraints == Constraints(
        machine_selector=(Requirement("platform", SelectorOp.IN, ("p1", "p2")),
                          Requirement("kernel", SelectorOp.NOT_IN, ("k2",))),
        max_per_machine=1)
    assert service.job("service").constraints == service.constraints
    assert service.job("service").precedence == 200
    assert (pinned.precedence, pinned.constraints) == (0, Constraints())
    assert (plain.precedence, plain.constraints) == (0, Constraints())


def test_csv_trace_with_constraints_and_precedence(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit,class,tasks,duration,cpu,mem,precedence,constraints\n"
                    "0,service,2,100,1,2,150,platform=p3;max_per_machine=1\n"
                    "5,batch,4,10,0.5,1,,\n")
    service, batch = load_trace(path, KINDS)
    assert service.precedence == 150
    assert format_constraints(service.constraints) == "platform=p3;max_per_machine=1"
    assert (batch.precedence, batch.constraints) == (0, Constraints())


@pytest.mark.parametrize(("row", "field", "words"), [
    ({"precedence": 1.5}, "precedence", "whole number"),
    ({"precedence": -1}, "precedence", "below the minimum"),
    ({"precedence": "high"}, "precedence", "not a finite number"),
    ({"constraints": "platform"}, "constraints", "is not KEY=V1|V2"),
    ({"constraints": "platform=p1|"}, "constraints", "an empty value"),
    ({"constraints": "max_per_machine=two"}, "constraints", "whole number"),
    ({"constraints": "bad key!=x"}, "constraints", "not a valid name"),
    ({"constraints": {"platform": "p1"}}, "constraints", "must be a string"),
])
def test_bad_rows_are_refused_with_their_line(tmp_path: Path, row: dict[str, Any],
                                              field: str, words: str) -> None:
    path = trace(tmp_path, [job(0.0, "batch"), job(1.0, "batch", **row)])
    with pytest.raises(InputError) as err:
        load_trace(path, KINDS)
    message = str(err.value)
    assert f"{path}, line 2, field '{field}'" in message
    assert words in message


def test_bad_csv_row_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit,class,tasks,duration,cpu,mem,constraints\n"
                    "0,batch,1,10,1,1,platform=p1\n"
                    "1,batch,1,10,1,1,platform=\n")
    with pytest.raises(InputError, match=r"t\.csv, line 3, field 'constraints': term "):
        load_trace(path, KINDS)


def test_constraint_text_round_trips() -> None:
    c = parse_constraints("a=x|y;b!=z;max_per_machine=2")
    assert parse_constraints(format_constraints(c)) == c
    assert parse_constraints("") == Constraints()


# -- generators and experiment files -------------------------------------------------


def test_generated_jobs_draw_precedence_and_constraints() -> None:
    gen = ConstraintGen(pick=0.5, key="platform", values=("p1", "p2"), weights=(1, 1),
                        max_per_machine=Distribution.choice([0, 1], [1, 1]))
    cls = JobClass("service", JobKind.SERVICE, Distribution.fixed(1.0), Distribution.fixed(2),
                   Distribution.fixed(10), precedence=Distribution.choice([100, 200], [1, 1]),
                   constraints=gen)
    jobs = [s for s, _ in zip(generate(cls, random.Random(3)), range(400), strict=False)]
    assert {j.precedence for j in jobs} == {100, 200}
    picky = [j for j in jobs if j.constraints.machine_selector]
    # About half pick a platform (400 draws: 0.5 +- 5 standard deviations).
    assert 0.37 < len(picky) / len(jobs) < 0.63
    assert {j.constraints.machine_selector[0].values for j in picky} == {("p1",), ("p2",)}
    assert {j.constraints.max_per_machine for j in jobs} == {0, 1}


def test_classes_without_the_new_fields_draw_what_they_drew_before() -> None:
    plain = JobClass("b", JobKind.BATCH, Distribution.exponential(1.0),
                     Distribution.exponential(3.0), Distribution.exponential(5.0))
    a = [s for s, _ in zip(generate(plain, random.Random(1)), range(50), strict=False)]
    b = [s for s, _ in zip(generate(plain, random.Random(1)), range(50), strict=False)]
    assert a == b
    assert all(s.precedence == 0 and s.constraints == Constraints() for s in a)


def test_committed_high_fidelity_experiments_load() -> None:
    root = Path(__file__).resolve().parents[2] / "experiments" / "omega_hifi"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        exp = load(f)
        for run in exp.runs:
            assert run.config.fidelity == "high"
            assert {s.policy for s in run.config.schedulers} == {"batch", "service"}
            assert run.config.cell.attributes


def test_experiment_file_errors_name_the_field(tmp_path: Path) -> None:
    base = ('[[workload]]\nname = "batch"\ninterarrival = 1\ntasks = 1\nduration = 1\n'
            '{extra}\n[[scheduler]]\nname = "batch"\n')
    bad = {
        'constraints = {pick = 2, key = "p", values = ["a"]}': "above 1",
        'constraints = {pick = 0.5, values = ["a"]}': "field 'workload.0.constraints.key'",
        'constraints = {pick = 0.5, key = "p", values = []}': "needs a value",
        'precedence = "high"': "must be a table",
    }
    for extra, words in bad.items():
        path = tmp_path / "e.toml"
        path.write_text(base.format(extra=extra))
        with pytest.raises(InputError, match=words.replace(".", r"\.")):
            load(path)
    path = tmp_path / "e.toml"
    path.write_text('fidelity = "medium"\n' + base.format(extra=""))
    with pytest.raises(InputError, match="fidelity"):
        load(path)
    path.write_text('[cell]\nattributes = [{key = "p", values = ["a"], weights = [1, 2]}]\n'
                    + base.format(extra=""))
    with pytest.raises(InputError, match="as many weights"):
        load(path)


# -- the real policies in a simulated run ----------------------------------------------


def _hifi(tmp: Path, jobs: list[dict[str, object]], machines: int, cpu: float,
          attributes: tuple[Attribute, ...] = (), horizon: float = 100.0,
          ) -> tuple[Simulation, dict[str, Any]]:
    specs = (SchedulerSpec("batch", ("batch",), policy="batch", default=DecisionTime(1.0, 0.0)),
             SchedulerSpec("service", ("service",), policy="service",
                           default=DecisionTime(1.0, 0.0)))
    config = SimConfig(Architecture.SHARED, specs, CLASSES,
                       CellSpec(machines, cpu, 16.0, attributes=attributes), prefill=None,
                       horizon=horizon, day=horizon, trace=str(trace(tmp, jobs)),
                       sample_interval=10.0, fidelity="high")
    sim = Simulation(config)
    return sim, sim.run()


def test_service_policy_honours_a_constraint_in_a_simulated_run(tmp_path: Path) -> None:
    """Machines draw a platform; the service job may run only on p2, one task per
    machine. Its three tasks land on three distinct p2 machines, though p1 machines
    are as empty and the spreading policy would otherwise take any."""
    sim, r = _hifi(tmp_path, [job(0.0, "service", tasks=3, duration=1000.0,
                                  constraints="platform=p2;max_per_machine=1")],
                   machines=12, cpu=4.0,
                   attributes=(Attribute("platform", ("p1", "p2"), (3.0, 1.0)),))
    snap = sim.cell.snapshot()
    platform = {m.id: dict(m.labels)["platform"] for m in snap.machines.values()}
    assert sorted(set(platform.values())) == ["p1", "p2"]
    on = [t.machine for t in snap.tasks.values() if t.job.startswith("service")]
    assert len(on) == 3
    assert {platform[m] for m in on} == {"p2"}
    assert len(set(on)) == 3
    assert r["service_successful"] == 1


def test_service_policy_preempts_lower_precedence_in_a_simulated_run(tmp_path: Path) -> None:
    """Two machines of 4 CPUs, filled at 1 by eight 1-CPU batch tasks (precedence 0).
    A service job of precedence 100 and two 2-CPU tasks arrives at 10: no room, so the
    service policy evicts two batch tasks per service task; validate() lets it (higher
    precedence). The four batch tasks wait again, and their scheduler, woken by the
    eviction, finds no room for them."""
    sim, r = _hifi(tmp_path, [job(0.0, "batch", tasks=8, duration=1000.0, precedence=0),
                              job(10.0, "service", tasks=2, cpu=2.0, duration=1000.0,
                                  precedence=100)],
                   machines=2, cpu=4.0)
    assert r["service_preemptions"] == 4
    assert r["batch_preempted_runs"] == 4
    assert r["tasks_unplaced"] == 4
    snap = sim.cell.snapshot()
    service = [t for t in snap.tasks.values() if t.job.startswith("service")]
    assert len(service) == 2
    assert sim.cell.used("cpu") == 8.0
    # Woken by the eviction: the batch scheduler tried again after 11 (and fails).
    assert r["batch_attempts"] > 1


def test_a_lower_precedence_job_does_not_preempt(tmp_path: Path) -> None:
    """The same, but the service job's precedence is not above the batch tasks':
    nothing is evicted and its tasks wait."""
    _, r = _hifi(tmp_path, [job(0.0, "batch", tasks=8, duration=1000.0, precedence=100),
                            job(10.0, "service", tasks=2, cpu=2.0, duration=1000.0,
                                precedence=100)],
                 machines=2, cpu=4.0)
    assert r["service_preemptions"] == 0
    assert r["tasks_unplaced"] == 2


# -- Fig. 12c's no-conflict busyness ---------------------------------------------------


def test_no_conflict_busyness_hand_computed(tmp_path: Path) -> None:
    """The hand-computed conflict of tests/simulator/test_hand_computed.py: batch is
    busy 25 s of 100, 5 of them on the attempt that conflicted; without it, 20 s."""
    _, r = simulate(tmp_path, Architecture.SHARED,
                    (sched("batch", 5.0), sched("service", 2.0)),
                    [job(0.0, "batch"), job(0.0, "service", duration=20.0)], cpu=1.0)
    assert r["batch_busyness"] == 0.25
    assert r["batch_busyness_wasted"] == 0.05
    assert r["batch_busyness_no_conflict"] == 0.20
    assert r["service_busyness_no_conflict"] == r["service_busyness"] == 0.02


def _result(conflicted: bool) -> dict[str, CommitResult]:
    claim = Claim("j", 0, "m0", 1)
    rejected = (Rejection(claim, Reason.SEQUENCE_CHANGED, "changed"),) if conflicted else ()
    return {"j": CommitResult(() if conflicted else (claim,), rejected, 2)}


def test_no_conflict_busyness_per_day_median() -> None:
    """Days of 50 s. Day 0: attempts at 0 (10 s, clean), 20 (10 s, conflicted) and 45
    (10 s, conflicted, 5 s in each day); day 1: 60 (5 s, clean). Busy 25 and 10 s:
    0.5 and 0.2; conflicted 15 and 5 s; no-conflict 10 and 5 s: 0.2 and 0.1. Medians
    of two days: busyness 0.35, wasted 0.2, no conflict 0.15."""
    rec = Recorder(horizon=100.0, day=50.0)
    rec.scheduler("s", 1)
    for start, cost, conflicted in ((0, 10, False), (20, 10, True), (45, 10, True),
                                    (60, 5, False)):
        rec.attempt("s", float(start), float(cost), _result(conflicted))
    out = rec.summary({})
    assert rec.daily("s", no_conflict=True) == [0.2, 0.1]
    assert out["s_busyness"] == pytest.approx(0.35)
    assert out["s_busyness_wasted"] == pytest.approx(0.2)
    assert out["s_busyness_no_conflict"] == pytest.approx(0.15)


def test_measured_decision_times_recorded_beside_the_model(tmp_path: Path) -> None:
    """With measure_decisions, each scheduler reports the policy's measured time and
    the model's for the same attempts: here the model charges 1 s per attempt."""
    specs = (SchedulerSpec("batch", ("batch",), policy="batch", default=DecisionTime(1.0, 0.0)),
             SchedulerSpec("service", ("service",), policy="service",
                           default=DecisionTime(1.0, 0.0)))
    config = SimConfig(Architecture.SHARED, specs, CLASSES, CellSpec(4, 4.0, 16.0),
                       prefill=None, horizon=50.0, day=50.0,
                       trace=str(trace(tmp_path, [job(0.0, "batch", tasks=2),
                                                  job(0.0, "service", tasks=2)])),
                       measure_decisions=True)
    r = Simulation(config).run()
    assert r["service_decision_model_mean_s"] == 1.0
    assert r["service_decision_model_per_task_s"] == 0.5
    assert r["service_decision_measured_mean_s"] > 0.0
    assert r["batch_decision_measured_per_task_s"] > 0.0


def test_mean_and_confidence_interval_over_seeds() -> None:
    """1, 2, 3: mean 2, standard deviation 1, t(2 df) = 4.303: half-width 4.303/sqrt(3)."""
    e = estimate([1.0, 2.0, 3.0])
    assert (e.mean, e.n) == (2.0, 3)
    assert e.half == pytest.approx(4.303 / 3 ** 0.5)
    assert estimate([5.0]).half == 0.0
    rows = [{"v": "a", "seed": 1}, {"v": "b", "seed": 1}, {"v": "a", "seed": 2}]
    assert by_point(rows, ["v", "seed"]) == {("a",): [rows[0], rows[2]], ("b",): [rows[1]]}

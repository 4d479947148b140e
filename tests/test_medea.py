"""Medea (schedulers/medea.py), the ILP baseline of Aladdin+H's comparison, solved by
CP-SAT batch by batch: what it places passes the store's validation and every
placement rule, its program keeps jobs of one batch apart when their rules say so,
its objective uses as few machines as it can, and bad options are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from cellstate.cell import CellSnapshot
from cellstate.invariants import constraint_violations, violations
from cellstate.model import Constraints, Reason, Requirement, SelectorOp
from schedulers.medea import MedeaPolicy, medea_options
from schedulers.testing import Harness, JobBuilder, MachineBuilder, settled
from simulator.aladdin.run import Run
from simulator.aladdin.workload import SchedulerSpec, jobs, load_experiment, machines

pytest.importorskip("ortools")

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "experiments" / "aladdin" / "alibaba_placement.toml"
M = "medea"


def app(*names: str) -> tuple[Requirement, ...]:
    return (Requirement("app", SelectorOp.IN, names),)


def task(jid: str, cpu: float, mem: float, tasks: int = 1, **rules: Any) -> JobBuilder:
    b = JobBuilder(jid).tasks(tasks).cpu(cpu).mem(mem).scheduler(M).label("app", jid)
    if rules:
        b.constraints(Constraints(**rules))
    return b


def cell(*machines: tuple[str, float, float]) -> Harness:
    h = Harness()
    h.admin.add_machines([MachineBuilder(m).cpu(c).mem(r).build() for m, c, r in machines])
    return h


def rejected(h: Harness) -> list[Reason]:
    return [r.reason for inst in h.instances for rec in h.committer(inst).log
            if rec.result is not None for r in rec.result.rejected]


def test_the_alibaba_mix_passes_the_stores_validation_and_every_rule() -> None:
    """A hundredth of the experiment's cell, filled to 80% of its cores with the
    experiment's applications (affinity groups, anti-affinity within and between
    applications, the tier=heavy rule), placed by Medea through the real runtime and
    store: everything placed, no claim refused, and the final cell audited clean."""
    exp = attrs.evolve(load_experiment(FILE, ROOT), scale=0.01, load=0.8)
    cellm = machines(exp)
    apps = jobs(exp, sum(m.capacity.get("cpu") for m in cellm))
    assert {a.kind for a in apps} >= {"group", "spread", "spread+cross", "free"}
    run = Run(SchedulerSpec(M, policy="medea", options={"batch": 50, "time_limit": 2.0}),
              cellm, apps, budget=300)
    res = run.run()
    assert res.finished and res.unplaced == 0
    assert res.refused == 0 and res.audit == 0
    assert not [r for r in rejected(run.h)]  # nothing refused, for any reason
    snap = run.h.snapshot()
    assert violations(snap) == [] and constraint_violations(snap) == []


def test_jobs_of_one_batch_that_keep_apart_get_different_machines() -> None:
    """Two machines with room for both jobs; A's anti-affinity names B. Packing
    would put both on one machine (the objective's fewest machines); the program's
    both-ways rule keeps them apart, as the store would."""
    h = cell(("m1", 8, 8), ("m2", 8, 8))
    h.add(MedeaPolicy(), scheduler=M)
    h.submit([task("A", 2, 2, anti_affinity=app("B")).build(), task("B", 2, 2).build(),
              task("S", 1, 1, tasks=2, max_per_machine=1).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("A") != h.machines_of("B")
    assert sorted(h.machines_of("S")) == ["m1", "m2"]
    assert rejected(h) == []
    snap = h.snapshot()
    assert violations(snap) == [] and constraint_violations(snap) == []


def test_the_objective_uses_as_few_machines_as_it_can() -> None:
    """Four 1-cpu tasks, three empty 4-cpu machines: one machine holds them all."""
    h = cell(("m1", 4, 4), ("m2", 4, 4), ("m3", 4, 4))
    h.add(MedeaPolicy(), scheduler=M)
    h.submit([task("J", 1, 1, tasks=4).build()])
    h.run(settled, max_time=30)
    assert len(set(h.machines_of("J"))) == 1


def test_an_affinity_group_goes_whole_to_one_machine_in_small_batches() -> None:
    """batch = 1: each job is a program of its own; the group (self-affine gang)
    still lands whole on the one machine with room for all three."""
    h = cell(("m1", 4, 4), ("m2", 8, 8))
    h.add(MedeaPolicy(batch=1), scheduler=M)
    h.submit([task("G", 2, 2, tasks=3, affinity=app("G")).gang().build(),
              task("x", 1, 1).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("G") == ["m2", "m2", "m2"]
    assert rejected(h) == []


def run_noting_placements(h: Harness, at: dict[str, float], max_time: float) -> None:
    """Run until settled, noting the virtual time each job is first seen whole."""
    def until(snap: CellSnapshot) -> bool:
        for jid in snap.jobs:
            if jid not in at and all(h.machines_of(jid)):
                at[jid] = h.clock.now
        return settled(snap)

    h.run(until, max_time=max_time)


def test_with_a_window_the_arrivals_of_the_window_are_one_program() -> None:
    """window = 10: jobs arriving 3 s and 7 s after a periodic run wait (no claim, not
    abandoned) and are placed together by the next run, 10 s after the first, in one
    CP-SAT program."""
    h = cell(("m1", 8, 8), ("m2", 8, 8))
    policy = MedeaPolicy(window=10)
    inst = h.add(policy, scheduler=M)
    t0 = h.clock.now
    inst.step()  # the first periodic run: nothing waits
    assert inst.step() > 0
    before = policy.batches
    h.clock.now = t0 + 3
    h.submit([task("A", 2, 2).build()])
    h.run(lambda s: h.clock.now >= t0 + 7, max_time=10)
    assert h.machines_of("A") == [""]  # waits for the window
    h.submit([task("B", 2, 2, tasks=2).build()])
    at: dict[str, float] = {}
    run_noting_placements(h, at, 30)
    assert at["A"] == at["B"] == pytest.approx(t0 + 10)
    assert policy.batches == before + 1
    assert not h.snapshot().statuses  # nobody abandoned while waiting
    assert rejected(h) == []


def test_with_a_window_a_job_that_does_not_fit_waits_until_room_comes() -> None:
    """A job larger than the free room waits through many windows, never abandoned
    (waiting for its turn is not failing), and is placed once a machine is added."""
    h = cell(("m1", 4, 4))
    h.add(MedeaPolicy(window=5), scheduler=M)
    h.submit([task("big", 6, 6).build()])
    h.run(lambda s: h.clock.now >= 500, max_time=600, max_steps=100_000)
    assert h.machines_of("big") == [""] and not h.snapshot().statuses
    h.admin.add_machines([MachineBuilder("m2").cpu(8).mem(8).build()])
    h.run(settled, max_time=30)
    assert h.machines_of("big") == ["m2"]


@pytest.mark.parametrize(("options", "error"), [
    ({"batch": 0}, "option batch must be a whole number from 1"),
    ({"batch": 2.5}, "option batch must be a whole number"),
    ({"time_limit": -1}, "option time_limit must be a number from 0.001"),
    ({"w_machines": 2}, "option w_machines must be a number from 0 to 1, got 2"),
    ({"timelimit": 1}, r"unknown option\(s\) timelimit"),
    ({"cover": True}, "option cover must be a number"),
    ({"window": -1}, "option window must be a number from 0 to 86400, got -1"),
])
def test_bad_options_are_refused_by_name(options: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        medea_options(options)

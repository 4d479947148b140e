"""The fit rules (cellstate/fit.py): one table row per rule, the resource rule against an
independent oracle over every dimension, validation and the policies agreeing on random
machines and jobs, and the "why unplaced" tally."""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import example, given, settings, strategies as st

from cellstate import fit
from cellstate.cell import alloc_placed
from cellstate.fit import FitReport, FitTally, Misfit, Rule
from cellstate.model import (
    Allocation,
    Claim,
    Constraints,
    GangRecord,
    GangState,
    Job,
    JobState,
    Machine,
    MachineState,
    Reason,
    Requirement,
    Resources,
    SelectorOp,
    Transaction,
)
from cellstate.validation import validate
from schedulers.api import CellView, Context, Policy
from schedulers.batch import BatchPolicy
from schedulers.placement import calm, can_host, why_not
from schedulers.runtime import RuntimeConfig
from schedulers.service import ServicePolicy
from schedulers.testing import Harness, job, machine
from tests.test_validation import cell

APP_NOISY = (Requirement("app", SelectorOp.IN, ("noisy",)),)
APP_DB = (Requirement("app", SelectorOp.IN, ("db",)),)


def alloc(tid: str, cpu: float = 1, precedence: int = 0, **tags: str) -> Allocation:
    return Allocation(tid, tid.split("/")[0], "batch", precedence,
                      Resources.of(cpu=cpu, mem=1), **tags)


def on(m: Machine, *allocs: Allocation) -> Machine:
    return attrs.evolve(m, allocations={**m.allocations, **{a.task: a for a in allocs}})


NOISY = job("noisy", tasks=4, labels=[("app", "noisy")])
QUIET = job("quiet", tasks=4, constraints=Constraints(anti_affinity=APP_NOISY))
DB = job("db", tasks=4, labels=[("app", "db")])


@attrs.frozen
class Row:
    m: Machine
    job: Job
    others: Sequence[Job] = ()
    victims: Sequence[str] = ()
    gangs: Sequence[GangRecord] = ()
    # None: it fits; else (rule, label, detail, dimension)
    want: tuple[Rule, str, str, str] | None = None


def j(**kw: object) -> Job:
    return job("j", tasks=4, precedence=5, **kw)  # type: ignore[arg-type]


M = machine("m1", cpu=4, mem=16, rack="r1")
ROWS = {
    "idle machine": Row(M, j()),
    "draining": Row(attrs.evolve(M, state=MachineState.DRAINING), j(),
                    want=(Rule.MACHINE_STATE, "machine draining", "machine 'm1' is draining", "")),
    "down": Row(attrs.evolve(M, state=MachineState.DOWN), j(),
                want=(Rule.MACHINE_STATE, "machine down", "machine 'm1' is down", "")),
    "selector matches": Row(M, j(constraints=Constraints(machine_selector=(
        Requirement("rack", SelectorOp.IN, ("r1",)),)))),
    "selector mismatch": Row(M, j(constraints=Constraints(machine_selector=(
        Requirement("rack", SelectorOp.IN, ("r9",)),))),
        want=(Rule.SELECTOR, "selector mismatch", "machine 'm1' does not match the selector", "")),
    "max_per_machine under": Row(on(M, alloc("j/0")), j(constraints=Constraints(
        max_per_machine=2))),
    "max_per_machine reached": Row(
        on(M, alloc("j/0"), alloc("j/1")), j(constraints=Constraints(max_per_machine=2)),
        want=(Rule.MAX_PER_MACHINE, "max per machine",
              "machine 'm1' already runs 2 task(s) of job 'j' (max_per_machine 2)", "")),
    "anti-affinity, the job's": Row(
        on(M, alloc("noisy/0")), j(constraints=Constraints(anti_affinity=APP_NOISY)), [NOISY],
        want=(Rule.ANTI_AFFINITY, "anti-affinity", "anti-affinity: machine 'm1' runs job 'noisy'",
              "")),
    "anti-affinity, a neighbour's": Row(
        on(M, alloc("quiet/0")), j(labels=[("app", "noisy")]), [QUIET],
        want=(Rule.ANTI_AFFINITY, "anti-affinity",
              "anti-affinity: job 'quiet' on machine 'm1' keeps job 'j' off", "")),
    "anti-affinity, the neighbour leaves": Row(
        on(M, alloc("noisy/0")), j(constraints=Constraints(anti_affinity=APP_NOISY)), [NOISY],
        victims=["noisy/0"]),
    "anti-affinity, an aborted gang's hold is void": Row(
        on(M, alloc("quiet/0", gang="gone")), j(labels=[("app", "noisy")]), [QUIET]),
    "affinity met by a neighbour": Row(
        on(M, alloc("db/0")), j(constraints=Constraints(affinity=APP_DB)), [DB]),
    "affinity met by the job's own task": Row(
        on(M, alloc("j/0")), j(labels=[("app", "db")], constraints=Constraints(affinity=APP_DB))),
    "affinity unmet": Row(
        on(M, alloc("noisy/0")), j(constraints=Constraints(affinity=APP_DB)), [NOISY],
        want=(Rule.AFFINITY, "affinity unmet",
              "affinity: machine 'm1' runs no task of a matching job", "")),
    "cpu short": Row(on(M, alloc("noisy/0", cpu=3)), j(cpu=2), [NOISY],
                     want=(Rule.RESOURCES, "insufficient cpu",
                           "machine 'm1' has 1 cpu free, task needs 2", "cpu")),
    "mem short, cpu fine (not only the first dimension)": Row(
        M, j(cpu=1, mem=17),
        want=(Rule.RESOURCES, "insufficient mem", "machine 'm1' has 16 mem free, task needs 17",
              "mem")),
    "a dimension the machine lacks": Row(
        M, attrs.evolve(j(), task_resources=Resources.of(cpu=1, mem=1, gpu=1)),
        want=(Rule.RESOURCES, "insufficient gpu", "machine 'm1' has 0 gpu free, task needs 1",
              "gpu")),
    "fits once the victim leaves": Row(on(M, alloc("noisy/0", cpu=3)), j(cpu=2), [NOISY],
                                       victims=["noisy/0"]),
    "a preparing gang's hold counts": Row(
        on(M, alloc("noisy/0", cpu=3, gang="g1")), j(cpu=2), [NOISY],
        gangs=[GangRecord("g1", "batch", GangState.PREPARING, 1)],
        want=(Rule.RESOURCES, "insufficient cpu", "machine 'm1' has 1 cpu free, task needs 2",
              "cpu")),
    "exactly full fits": Row(on(M, alloc("noisy/0", cpu=3)), j(cpu=1), [NOISY]),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_each_rule(name: str) -> None:
    """The rule's verdict, and the store's validation and the policies' helper say the
    same: same reason, same detail."""
    row = ROWS[name]
    snap = cell([row.m], [row.job, *row.others], gangs=row.gangs)
    victims = [row.m.allocations[t] for t in row.victims]
    got = fit.misfit(row.job, row.m, snap.gangs, snap.jobs, victims)
    if row.want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.rule, got.label, got.detail, got.dimension) == row.want
    d = validate(snap, Transaction("batch", (Claim("j", 3, "m1", evict=tuple(row.victims)),)))
    if got is None:
        assert d.rejected == ()
    else:
        (r,) = d.rejected
        assert (r.reason, r.detail, r.dimension) == (got.reason, got.detail, got.dimension)
    view = CellView(snap, "batch")
    assert why_not(view, row.job, row.m, victims) == got


def test_reasons_of_the_rules() -> None:
    def reason(rule: Rule) -> Reason:
        return Misfit(rule, "", "", ()).reason

    assert reason(Rule.MACHINE_STATE) is Reason.MACHINE_DOWN
    assert reason(Rule.RESOURCES) is Reason.INSUFFICIENT_RESOURCES
    assert reason(Rule.QUOTA) is Reason.LIMIT_EXCEEDED
    assert {reason(r) for r in (Rule.SELECTOR, Rule.MAX_PER_MACHINE, Rule.ANTI_AFFINITY,
                                Rule.AFFINITY)} == {Reason.CONSTRAINT_VIOLATED}


# -- the resource rule, every dimension, against an oracle ------------------------------

DIMS = ("cpu", "disk", "gpu", "mem")
amounts = st.dictionaries(st.sampled_from(DIMS), st.integers(0, 8))


@settings(max_examples=400, deadline=None)
@given(cap=amounts, used=amounts, need=amounts, freed=amounts)
def test_resources_checks_every_dimension(cap: dict[str, int], used: dict[str, int],
                                          need: dict[str, int], freed: dict[str, int]) -> None:
    """Whole numbers, so the oracle needs no float slack: the task fits iff in every
    dimension used - freed + need <= capacity; else the first such dimension by name."""
    freed = {d: min(a, used.get(d, 0)) for d, a in freed.items()}  # victims held it
    m = Machine("m", Resources.from_mapping(cap))
    over = [d for d in DIMS
            if used.get(d, 0) - freed.get(d, 0) + need.get(d, 0) > cap.get(d, 0)]
    got = fit.resources(Resources.from_mapping(need), m, Resources.from_mapping(used),
                        Resources.from_mapping(freed))
    assert (got.dimension if got else None) == (over[0] if over else None)
    if got is not None:
        free = cap.get(got.dimension, 0) - used.get(got.dimension, 0) + freed.get(got.dimension, 0)
        assert got.detail == (f"machine 'm' has {max(free, 0):g} {got.dimension} free, task "
                              f"needs {need.get(got.dimension, 0):g}")


@settings(max_examples=400, deadline=None)
@given(limit=amounts, held=amounts, need=amounts)
def test_quota_limits_only_the_dimensions_named(limit: dict[str, int], held: dict[str, int],
                                                need: dict[str, int]) -> None:
    """The scheduler's rule: it may take ``need`` more iff in every dimension its limit
    names held + need <= limit (a dimension the limit does not name is free); else the
    first such dimension by name, with what it holds there and its limit."""
    over = [d for d in DIMS if d in limit and held.get(d, 0) + need.get(d, 0) > limit[d]]
    # A limit keeps the dimensions it names at 0 (as the config parser builds it).
    got = fit.quota(Resources.from_mapping(held), Resources.from_mapping(need),
                    Resources.from_mapping(limit, keep_zero=True), "batch")
    assert (got.dimension if got else None) == (over[0] if over else None)
    if got is not None:
        d = got.dimension
        assert got.rule is Rule.QUOTA and got.label == f"{d} quota"
        assert got.detail == (f"scheduler 'batch' holds {held.get(d, 0):g} {d}; this task "
                              f"would take it past its limit of {limit[d]:g}")


floats = st.dictionaries(st.sampled_from(DIMS), st.floats(0, 1e6, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(a=floats, b=floats, cap=floats)
def test_exceeding_with_is_exceeding_of_the_sum(a: dict[str, float], b: dict[str, float],
                                                cap: dict[str, float]) -> None:
    ra, rb, rc = (Resources.from_mapping(x) for x in (a, b, cap))
    assert ra.exceeding_with(rb, rc) == (ra + rb).exceeding(rc)


# -- validation and the policies agree ----------------------------------------------------

LABELS = st.sampled_from([(), (("app", "db"),), (("app", "noisy"),), (("app", "j"),)])
APP_J = (Requirement("app", SelectorOp.IN, ("j",)),)
SELECTORS = st.sampled_from([(), (), (), APP_DB, APP_NOISY, APP_J,
                             (Requirement("app", SelectorOp.NOT_EXISTS),)])
AFFINITIES = st.sampled_from([(), (), (), (), (), APP_DB, APP_NOISY, APP_J])
MACHINE_SELECTORS = st.sampled_from([(), (), (), (), (Requirement("zone", SelectorOp.IN, ("a",)),),
                                     (Requirement("zone", SelectorOp.EXISTS),),
                                     (Requirement("rack", SelectorOp.NOT_IN, ("r1",)),)])
small = st.dictionaries(st.sampled_from(DIMS), st.sampled_from([0.5, 1.0, 2.0, 3.0]),
                        min_size=1)


Scene = tuple[Machine, Job, list[Job], list[str], list[GangRecord]]


@st.composite
def scenes(draw: st.DrawFn) -> Scene:
    constraints = Constraints(draw(MACHINE_SELECTORS), draw(SELECTORS), draw(AFFINITIES),
                              draw(st.sampled_from([0, 0, 1, 2])))
    the_job = Job("j", "t", "batch", 8, Resources.from_mapping(draw(small)), precedence=3,
                  constraints=constraints, labels=draw(LABELS))
    others = [Job(f"n{i}", "t", "batch", 8, Resources.of(cpu=1), precedence=draw(
        st.integers(0, 4)), constraints=Constraints(anti_affinity=draw(SELECTORS)),
        labels=draw(LABELS)) for i in range(3)]
    gangs = [GangRecord("gp", "batch", GangState.PREPARING, 1),
             GangRecord("gc", "batch", GangState.COMMITTED, 1)]
    allocs: dict[str, Allocation] = {}
    for k in range(draw(st.integers(0, 5))):
        owner = draw(st.sampled_from([the_job, the_job, *others]))
        tid = f"{owner.id}/{k}"  # task 7 of j is the one claimed
        tags = draw(st.sampled_from([{}, {}, {"gang": "gp"}, {"gang": "gc"}, {"gang": "gone"},
                                     {"evicted_by": "gp"}, {"evicted_by": "gc"}]))
        allocs[tid] = Allocation(tid, owner.id, "batch", owner.precedence,
                                 Resources.from_mapping(draw(small)), **tags)
    # Mostly roomy and up, so that every later rule gets its turn to decide.
    cap = {d: draw(st.sampled_from([0.0, 2.0, 4.0, 8.0, 16.0, 16.0])) for d in DIMS}
    state = draw(st.sampled_from([MachineState.UP] * 8 + [MachineState.DRAINING,
                                                          MachineState.DOWN]))
    m = Machine("m1", Resources.from_mapping(cap), rack=draw(st.sampled_from(["r0", "r1"])),
                labels=draw(st.sampled_from([(), (("zone", "a"),), (("zone", "b"),)])),
                state=state, allocations=allocs, seq=5)
    evictable = [a.task for a in allocs.values() if a.precedence < the_job.precedence
                 and alloc_placed(a, {g.id: g for g in gangs}) and not a.evicted_by]
    victims = draw(st.lists(st.sampled_from(evictable), unique=True) if evictable
                   else st.just([]))
    return m, the_job, others, victims, gangs


# Drifts found before the rules were one copy, always tried: the policies refused a job
# whose affinity only its own task on the machine met, which the store accepts.
SELF_AFFINE = Job("j", "t", "batch", 8, Resources.of(cpu=1), precedence=3, labels=(
    ("app", "db"),), constraints=Constraints(affinity=APP_DB))
KNOWN_DRIFTS: list[Scene] = [
    (on(machine("m1"), Allocation("j/0", "j", "batch", 3, Resources.of(cpu=1))), SELF_AFFINE,
     [], [], []),
]


@settings(max_examples=600, deadline=None)
@given(scene=scenes())
@example(scene=KNOWN_DRIFTS[0])
def test_validation_and_policies_agree(scene: Scene) -> None:
    """For every machine and job: the policies' can_host is True iff validation accepts
    the claim on an otherwise idle cell, and a refusal has the same reason and detail."""
    m, the_job, others, victims, gangs = scene
    snap = cell([m], [the_job, *others], gangs=gangs)
    view = CellView(snap, "batch")
    leaving = [m.allocations[t] for t in victims]
    d = validate(snap, Transaction("batch", (Claim("j", 7, "m1", evict=tuple(victims)),)))
    assert can_host(view, the_job, m, leaving) == (d.rejected == ())
    miss = why_not(view, the_job, m, leaving)
    # A caller that asked once whether any job keeps others off gets the same answer.
    assert why_not(view, the_job, m, leaving, calm=calm(view)) == miss
    if miss is not None:
        (r,) = d.rejected
        assert (r.reason, r.detail, r.dimension) == (miss.reason, miss.detail, miss.dimension)


# -- why unplaced -------------------------------------------------------------------------


def test_tally_text_ranks_rules_by_machines_excluded() -> None:
    tally = FitTally()
    cpu = fit.resources(Resources.of(cpu=8), machine("m"), Resources())
    sel = fit.selector(job("j", constraints=Constraints(machine_selector=APP_DB)), machine("m"))
    mem = fit.resources(Resources.of(mem=99), machine("m"), Resources())
    for verdict in [cpu] * 200 + [sel] * 100 + [mem] * 1_500 + [None] * 2:
        tally.add(verdict)
    report = tally.report()
    assert report == FitReport(1_802, 2, (("insufficient mem", 1_500),
                                          ("insufficient cpu", 200), ("selector mismatch", 100)))
    assert str(report) == ("2/1,802 machines fit: 1,500 insufficient mem, 200 insufficient cpu, "
                           "100 selector mismatch")
    assert str(FitTally().report()) == "0/0 machines fit"


def full_and_mismatched() -> Harness:
    """m0 and m1 (zone a) are full of a task nobody may preempt; m2 is in zone b."""
    h = Harness()
    zone_a = (("zone", "a"),)
    h.admin.add_machines([machine("m0", cpu=2, labels=zone_a),
                          machine("m1", cpu=2, labels=zone_a),
                          machine("m2", cpu=2, labels=(("zone", "b"),))])
    h.admin.submit_job(job("hog", tasks=2, cpu=2, scheduler="other", precedence=9))
    assert h.admin.commit(Transaction("other", (Claim("hog", 0, "m0"),
                                                Claim("hog", 1, "m1")))).ok
    return h


ZONE_A = Constraints(machine_selector=(Requirement("zone", SelectorOp.IN, ("a",)),))
WHY = "0/3 machines fit: 2 insufficient cpu, 1 selector mismatch"


@pytest.mark.parametrize("policy", [BatchPolicy(), ServicePolicy()], ids=["batch", "service"])
def test_a_policy_says_how_many_machines_each_rule_excluded(policy: Policy) -> None:
    h = full_and_mismatched()
    snap = h.admin.read_snapshot()
    picky = job("picky", cpu=1, scheduler=policy.name, constraints=ZONE_A)
    ctx = Context(CellView(snap, policy.name), 0.0, random.Random(1), policy.name, "0")
    plan = policy.schedule_job(ctx, picky)
    (unplaced,) = plan.unplaced
    assert plan.claims == () and not unplaced.permanent
    assert unplaced.fit == FitReport(3, 0, (("insufficient cpu", 2), ("selector mismatch", 1)))
    assert unplaced.reason.endswith(": " + WHY)


@pytest.mark.parametrize("policy", [BatchPolicy(), ServicePolicy()], ids=["batch", "service"])
def test_the_tally_reaches_the_reason_of_a_job_given_up(policy: Policy) -> None:
    h = full_and_mismatched()
    h.add(policy, scheduler=policy.name, config=RuntimeConfig(max_fruitless_attempts=3))
    h.submit([job("picky", cpu=1, scheduler=policy.name, constraints=ZONE_A)])
    h.run(lambda s: "picky" in s.statuses, max_time=10_000)
    status = h.admin.read_snapshot().statuses["picky"]
    assert status.state is JobState.ABANDONED
    assert "3 attempts in a row placed nothing; last reason: " in status.reason
    assert status.reason.endswith(WHY)


# -- a machine remembers that its jobs keep no one off -----------------------------------


def test_a_machine_is_remembered_calm_only_when_every_job_on_it_is_known() -> None:
    """The anti-affinity of a neighbour unknown to one reader must still count for a
    reader that knows it, on the very same machine record."""
    m = on(M, alloc("quiet/0"))
    newcomer = j(labels=[("app", "noisy")])
    # A reader that does not know job "quiet" lets the newcomer in, as before ...
    assert fit.misfit(newcomer, m, {}, {}) is None
    assert not m.calm
    # ... and one that knows it keeps the newcomer off, on the same record.
    miss = fit.misfit(newcomer, m, {}, {"quiet": QUIET})
    assert miss is not None and miss.rule is Rule.ANTI_AFFINITY
    calm = on(M, alloc("noisy/0"))
    assert fit.misfit(newcomer, calm, {}, {"noisy": NOISY}) is None
    assert calm.calm


def test_validation_carries_calm_only_while_no_rule_arrives() -> None:
    """A claim of a job with an anti-affinity rule on a calm machine leaves it not
    calm: a later claim in the same transaction is kept off by that rule."""
    m = on(M, alloc("noisy/0"))
    keeps = job("keeps", tasks=1, constraints=Constraints(anti_affinity=(
        Requirement("app", SelectorOp.IN, ("late",)),)))
    late = job("late", tasks=1, labels=[("app", "late")])
    snap = cell([m], [NOISY, keeps, late])
    assert fit.misfit(late, snap.machines["m1"], {}, snap.jobs) is None
    assert snap.machines["m1"].calm
    d1 = validate(snap, Transaction("batch", (Claim("keeps", 0, "m1", m.seq),)))
    assert [c.task for c in d1.accepted] == ["keeps/0"]
    assert not d1.machines["m1"].calm
    later = attrs.evolve(snap, machines=snap.machines.set("m1", d1.machines["m1"]))
    d2 = validate(later, Transaction("batch", (Claim("late", 0, "m1", m.seq),)))
    assert [r.reason for r in d2.rejected] == [Reason.CONSTRAINT_VIOLATED]
    assert "anti-affinity" in d2.rejected[0].detail
    # A job that keeps no one off leaves a calm machine calm.
    d3 = validate(snap, Transaction("batch", (Claim("late", 0, "m1", m.seq),)))
    assert d3.machines["m1"].calm

"""The invariant checker (cellstate/invariants.py) on hand-made broken cells.

Every other test that asserts ``violations(...) == []`` rests on the checker finding a
broken cell when there is one; here each invariant is broken alone (over-commit and
limits in every resource dimension) and the exact sentence is expected. The sound cell
the breakages start from must give no violation, so a checker that finds nothing, or
finds something in everything, fails here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs
import immutables
import pytest

from cellstate.cell import CellSnapshot
from cellstate.invariants import constraint_violations, placed_tasks_of, violations
from cellstate.model import (
    Allocation,
    CellConfig,
    Constraints,
    GangRecord,
    GangState,
    Job,
    Machine,
    Requirement,
    Resources,
    SchedulerLimits,
    SelectorOp,
    TaskRecord,
    TaskState,
    UsageRecord,
)

# Four dimensions of different sizes: a dimension the checker skips shows up as a
# missing violation, whichever its position in the sorted vector.
DIMENSIONS = ("cpu", "disk", "gpu", "mem")
CAPACITY = Resources.of(cpu=8, disk=500, gpu=2, mem=64)
NEED = Resources.of(cpu=2, disk=100, gpu=1, mem=16)  # one task; two fit a machine


def _alloc(tid: str, need: Resources = NEED, scheduler: str = "s", **kw: str) -> Allocation:
    return Allocation(tid, tid.rpartition("/")[0], scheduler, 1, need, **kw)


def _job(jid: str, tasks: int = 4, scheduler: str = "s", **kw: object) -> Job:
    return Job(jid, "tester", scheduler, tasks, NEED, **kw)  # type: ignore[arg-type]


def _running(tid: str, mid: str, **kw: object) -> TaskRecord:
    job, _, index = tid.rpartition("/")
    return TaskRecord(job, int(index), TaskState.RUNNING, mid, "s", **kw)  # type: ignore[arg-type]


def _cell(
    machines: Iterable[Machine],
    jobs: Iterable[Job] = (),
    tasks: Iterable[TaskRecord] = (),
    gangs: Iterable[GangRecord] = (),
    usage: Mapping[str, object] | None = None,
    config: CellConfig | None = None,
) -> CellSnapshot:
    empty = CellSnapshot.empty()
    return attrs.evolve(
        empty,
        config=config or CellConfig(),
        machines=immutables.Map({m.id: m for m in machines}),
        jobs=immutables.Map({j.id: j for j in jobs}),
        tasks=immutables.Map({t.id: t for t in tasks}),
        gangs=immutables.Map({g.id: g for g in gangs}),
        usage=immutables.Map(usage or {}),
    )


def _machine(mid: str, *allocs: Allocation, capacity: Resources = CAPACITY) -> Machine:
    return Machine(mid, capacity, allocations={a.task: a for a in allocs})


def _sound() -> CellSnapshot:
    """Two tasks on m0 (full in every dimension but cpu), one on m1, one finished."""
    return _cell(
        [_machine("m0", _alloc("j/0"), _alloc("j/1")), _machine("m1", _alloc("j/2"))],
        [_job("j")],
        [_running("j/0", "m0"), _running("j/1", "m0"), _running("j/2", "m1"),
         TaskRecord("j", 3, TaskState.FINISHED, "m1", "s")],
    )


def _bigger(dim: str) -> Resources:
    """NEED with ``dim`` raised so that it and one NEED overflow a machine by 0.5."""
    amounts = NEED.as_dict()
    amounts[dim] = CAPACITY.get(dim) - NEED.get(dim) + 0.5
    return Resources.from_mapping(amounts)


def test_a_sound_cell_has_no_violation() -> None:
    assert violations(_sound()) == []
    assert violations(CellSnapshot.empty()) == []


@pytest.mark.parametrize("dim", DIMENSIONS)
def test_an_over_committed_machine_is_reported_in_the_dimension_that_overflows(
        dim: str) -> None:
    big = _bigger(dim)
    snap = _cell([_machine("m0", _alloc("j/0", big), _alloc("j/1"))], [_job("j")],
                 [_running("j/0", "m0"), _running("j/1", "m0")])
    total = big.get(dim) + NEED.get(dim)
    assert violations(snap) == [
        f"machine m0 over-committed in {dim}: {total:g} > {CAPACITY.get(dim):g}"]


@pytest.mark.parametrize("dim", DIMENSIONS)
def test_a_dimension_the_machine_lacks_is_over_committed_by_any_amount(dim: str) -> None:
    capacity = Resources.from_mapping({d: a for d, a in CAPACITY.amounts if d != dim})
    snap = _cell([_machine("m0", _alloc("j/0"), capacity=capacity)], [_job("j")],
                 [_running("j/0", "m0")])
    assert violations(snap) == [
        f"machine m0 over-committed in {dim}: {NEED.get(dim):g} > 0"]


def test_holds_of_an_aborted_gang_and_of_evicted_tasks_do_not_count() -> None:
    """A staged hold whose gang record is gone holds nothing; a task evicted by a
    committed gang neither holds nor counts as placed. Without these rules the
    machine below would be over-committed three times over."""
    snap = _cell(
        [_machine("m0", _alloc("j/0"), _alloc("j/1", evicted_by="g1"),
                  _alloc("k/0", gang="g0"), _alloc("k/1", gang="g1"))],
        [_job("j"), _job("k")],
        [_running("j/0", "m0"), _running("j/1", "m0"),
         _running("k/0", "m0", gang="g0"), _running("k/1", "m0", gang="g1")],
        gangs=[GangRecord("g1", "s", GangState.COMMITTED, 1)],
    )
    assert violations(snap) == []
    assert placed_tasks_of(snap, "j") == 1 and placed_tasks_of(snap, "k") == 1
    # The same staged hold under a live (preparing) gang does hold resources.
    preparing = attrs.evolve(snap, gangs=snap.gangs.set(
        "g0", GangRecord("g0", "s", GangState.PREPARING, 1)))
    assert violations(preparing) == ["machine m0 over-committed in gpu: 3 > 2"]


def test_a_task_placed_on_two_machines() -> None:
    snap = _cell([_machine("m0", _alloc("j/0")), _machine("m1", _alloc("j/0"))],
                 [_job("j")], [_running("j/0", "m0")])
    # Machines come in the map's (hash) order; when m1 is read last the record's m0
    # also disagrees with where the checker last saw the task.
    assert violations(snap) in (
        ["task j/0 placed on both m0 and m1", "task j/0 is running on m0 but holds m1"],
        ["task j/0 placed on both m1 and m0"],
    )


def test_a_task_of_an_unknown_job() -> None:
    snap = _cell([_machine("m0", _alloc("gone/0"))], [_job("j")], [_running("gone/0", "m0")])
    assert violations(snap) == ["machine m0 runs task gone/0 of unknown job gone"]


def test_a_running_task_without_its_allocation() -> None:
    snap = _cell([_machine("m0")], [_job("j")], [_running("j/0", "m0")])
    assert violations(snap) == ["task j/0 is running on m0 but holds no machine"]


def test_a_running_task_whose_allocation_is_on_another_machine() -> None:
    snap = _cell([_machine("m0"), _machine("m1", _alloc("j/0"))], [_job("j")],
                 [_running("j/0", "m0")])
    assert violations(snap) == ["task j/0 is running on m0 but holds m1"]


@pytest.mark.parametrize("state", [s for s in TaskState if s is not TaskState.RUNNING])
def test_a_task_that_is_not_running_but_still_placed(state: TaskState) -> None:
    records = [] if state is TaskState.PENDING else [TaskRecord("j", 0, state, "m0", "s")]
    snap = _cell([_machine("m0", _alloc("j/0"))], [_job("j")], records)
    assert violations(snap) == [f"task j/0 is {state.value} but still placed on m0"]


def test_a_task_beyond_its_jobs_count() -> None:
    snap = _cell([_machine("m0", _alloc("j/2"))], [_job("j", tasks=2)],
                 [_running("j/2", "m0")])
    assert violations(snap) == ["task j/2 is beyond job j's 2 tasks"]


def _limited(max_resources: Resources, used: Resources, base_revision: int = 7,
             base_used: Resources | None = None) -> CellSnapshot:
    config = CellConfig({"s": SchedulerLimits(max_resources=max_resources)}, revision=7)
    snap = _sound()
    return attrs.evolve(snap, config=config, usage=immutables.Map(
        {"s": UsageRecord("s", base_revision, used, base_used=base_used)}))


THREE = Resources.from_mapping({d: 3 * a for d, a in NEED.amounts})  # what _sound holds


def test_a_counter_that_matches_the_machines_within_the_limit_is_sound() -> None:
    assert violations(_limited(Resources.from_mapping(
        {d: 4 * a for d, a in NEED.amounts}), THREE)) == []


@pytest.mark.parametrize("dim", DIMENSIONS)
def test_a_usage_counter_off_in_one_dimension(dim: str) -> None:
    off = Resources.from_mapping({**THREE.as_dict(), dim: THREE.get(dim) + 1})
    assert violations(_limited(Resources.of(**{dim: 1000}), off)) == [
        f"usage counter of s says {off}, machines say {THREE}"]
    under = Resources.from_mapping({**THREE.as_dict(), dim: THREE.get(dim) - 1})
    assert violations(_limited(Resources.of(**{dim: 1000}), under)) == [
        f"usage counter of s says {under}, machines say {THREE}"]


@pytest.mark.parametrize("dim", DIMENSIONS)
def test_a_scheduler_past_its_limit_in_one_dimension(dim: str) -> None:
    """The limit names all four dimensions and only ``dim`` is exceeded."""
    limit = Resources.from_mapping(
        {d: (3 * a - 0.5 if d == dim else 10 * a) for d, a in NEED.amounts})
    assert violations(_limited(limit, THREE)) == [
        f"scheduler s holds {THREE.get(dim):g} {dim}, past its limit"]
    # Also when the limit was set below what it held then, if it holds more now.
    less = Resources.from_mapping({**THREE.as_dict(), dim: THREE.get(dim) - 0.25})
    assert violations(_limited(limit, THREE, base_used=less)) == [
        f"scheduler s holds {THREE.get(dim):g} {dim}, past its limit"]


def test_a_limit_set_below_what_a_scheduler_held_is_passed_until_its_tasks_end() -> None:
    """Lowered under what the scheduler held then: no claim put it past the limit, so
    holding that much (or less) breaks nothing."""
    limit = Resources.from_mapping({d: a for d, a in NEED.amounts})
    assert violations(_limited(limit, THREE, base_used=THREE)) == []
    more = Resources.from_mapping({d: 4 * a for d, a in NEED.amounts})
    assert violations(_limited(limit, THREE, base_used=more)) == []


def test_a_counter_from_an_older_config_or_of_an_unlimited_scheduler_is_not_checked() -> None:
    wrong = Resources.of(cpu=1)
    assert violations(_limited(Resources.of(cpu=1), wrong, base_revision=6)) == []
    snap = attrs.evolve(_sound(), usage=immutables.Map({"s": UsageRecord("s", 0, wrong)}))
    assert violations(snap) == []


def test_several_broken_invariants_are_all_reported() -> None:
    snap = _cell(
        [_machine("m0", _alloc("j/0", _bigger("gpu")), _alloc("j/1"), _alloc("j/5")),
         _machine("m1", _alloc("x/0"))],
        [_job("j", tasks=5)],
        [_running("j/0", "m0"), _running("j/1", "m0"), _running("j/5", "m0"),
         _running("x/0", "m1"), _running("j/2", "m1")],
    )
    assert sorted(violations(snap)) == sorted([
        "machine m0 over-committed in gpu: 3.5 > 2",
        "machine m1 runs task x/0 of unknown job x",
        "task j/5 is beyond job j's 5 tasks",
        "task j/2 is running on m1 but holds no machine",
    ])


# -- Resources' fit arithmetic, per dimension ----------------------------------------


@pytest.mark.parametrize("dim", DIMENSIONS)
def test_exceeding_names_the_one_dimension_that_does_not_fit(dim: str) -> None:
    over = Resources.from_mapping({**CAPACITY.as_dict(), dim: CAPACITY.get(dim) + 1})
    assert over.exceeding(CAPACITY) == dim
    assert not over.fits_in(CAPACITY)
    assert CAPACITY.exceeding(CAPACITY) is None
    half = Resources.from_mapping({d: a / 2 for d, a in CAPACITY.amounts})
    assert half.exceeding_with(over - CAPACITY, CAPACITY) is None
    assert CAPACITY.exceeding_with(over - CAPACITY, CAPACITY) == dim
    assert Resources().exceeding_with(over, CAPACITY) == dim
    assert over.exceeding_limit(Resources.of(**{dim: CAPACITY.get(dim)})) == dim
    others = Resources.from_mapping({d: a for d, a in CAPACITY.amounts if d != dim})
    assert over.exceeding_limit(others) is None  # a dimension the limit omits is free


def test_exceeding_reports_the_first_overflowing_dimension_by_name() -> None:
    over = Resources.of(cpu=9, disk=1, gpu=3, mem=65)
    assert over.exceeding(CAPACITY) == "cpu"
    assert Resources.of(disk=1, gpu=3, mem=65).exceeding(CAPACITY) == "gpu"
    assert Resources().exceeding_with(Resources.of(mem=65, gpu=3), CAPACITY) == "gpu"


def test_float_residue_within_the_slack_still_fits_and_beyond_it_does_not() -> None:
    tenths = sum((Resources.of(mem=0.1) for _ in range(640)), Resources())
    assert tenths.exceeding(CAPACITY) is None  # 64.00000000000x
    assert Resources.of(mem=64 * (1 + 1e-6)).exceeding(CAPACITY) == "mem"
    assert Resources.of(gpu=1e-10).exceeding(Resources()) is None  # slack of 1e-9 * 1
    assert Resources.of(gpu=1e-8).exceeding(Resources()) == "gpu"


# -- the placement audit ------------------------------------------------------------


def _placed(jobs: Iterable[Job], **on: Iterable[str]) -> CellSnapshot:
    machines = [Machine(mid, CAPACITY, labels=(("zone", mid[-1]),),
                        allocations={t: _alloc(t, Resources.of(cpu=1)) for t in tids})
                for mid, tids in on.items()]
    return _cell(machines, jobs)


def test_constraint_audit_names_each_broken_rule() -> None:
    sel = (Requirement("zone", SelectorOp.IN, ("1",)),)
    web = (Requirement("app", SelectorOp.IN, ("web",)),)
    jobs = [
        _job("a", constraints=Constraints(machine_selector=sel)),
        _job("b", constraints=Constraints(max_per_machine=1)),
        _job("c", constraints=Constraints(affinity=web)),
        _job("d", constraints=Constraints(anti_affinity=web)),
        _job("w", labels=(("app", "web"),)),
    ]
    # Machines come in the map's (hash) order: compare as sorted lists.
    assert sorted(constraint_violations(_placed(jobs, m0=["a/0", "b/0", "b/1", "c/0"],
                                                m1=["a/1", "c/1", "d/0", "w/0"]))) == [
        "job a runs on m0, which its selector does not match",
        "job b runs 2 tasks on m0 (max_per_machine 1)",
        "job c runs on m0 with no task of a job its affinity matches",
        "job d runs on m1 beside job w, which its anti-affinity matches",
    ]
    assert constraint_violations(_placed(jobs, m1=["a/0", "b/0", "c/0", "w/0"],
                                         m2=["b/1", "d/0"])) == []


def test_constraint_audit_counts_only_placed_tasks() -> None:
    """A hold staged by a gang still preparing is not a placed task: it breaks no
    tasks-per-machine rule yet."""
    b = _job("b", constraints=Constraints(max_per_machine=1))
    m0 = Machine("m0", CAPACITY, allocations={
        "b/0": _alloc("b/0", Resources.of(cpu=1)),
        "b/1": _alloc("b/1", Resources.of(cpu=1), gang="g0")})
    preparing = _cell([m0], [b], gangs=[GangRecord("g0", "s", GangState.PREPARING, 1)])
    assert constraint_violations(preparing) == []
    committed = attrs.evolve(preparing, gangs=immutables.Map(
        {"g0": GangRecord("g0", "s", GangState.COMMITTED, 1)}))
    assert constraint_violations(committed) == ["job b runs 2 tasks on m0 (max_per_machine 1)"]


def test_usage_records_that_are_not_checked_do_not_hide_the_ones_that_are() -> None:
    """Records the checker skips (not a usage record, a scheduler without a limit, a
    counter from an older config) come first; the wrong counter after them is still
    found. A plain dict keeps that order (the snapshot's map would hash it)."""
    off = Resources.from_mapping({**THREE.as_dict(), "cpu": THREE.get("cpu") + 1})
    snap = _limited(Resources.of(cpu=1000), off)
    usage = {"raw": "not decoded", "free": UsageRecord("free", 7, Resources.of(cpu=1)),
             "old": UsageRecord("old", 6, Resources.of(cpu=1)), "s": snap.usage["s"]}
    config = CellConfig({"s": SchedulerLimits(max_resources=Resources.of(cpu=1000)),
                         "old": SchedulerLimits(max_resources=Resources.of(cpu=1))}, 7)
    ordered = attrs.evolve(snap, usage=usage, config=config)  # type: ignore[arg-type]
    assert violations(ordered) == [f"usage counter of s says {off}, machines say {THREE}"]

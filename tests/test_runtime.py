"""The scheduler runtime over the memory store on a virtual clock."""

from __future__ import annotations

import pytest

from cellstate.cell import task_view
from cellstate.invariants import placed_tasks_of, violations
from cellstate.keys import KeyKind
from cellstate.model import Constraints, Job, JobState, Requirement, SelectorOp, TaskState
from schedulers.api import Context, Plan
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig, owner_of
from schedulers.service import ServicePolicy
from schedulers.testing import Harness, job, machine, settled


def test_batch_scheduler_places_a_job_and_records_metrics() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4) for i in range(10)])
    inst = h.add(BatchPolicy())
    h.submit([job("j1", tasks=20, cpu=1)])
    h.run(settled)
    snap = h.admin.read_snapshot()
    assert placed_tasks_of(snap, "j1") == 20 and violations(snap) == []
    m = inst.metrics.summary(h.clock())
    assert m["tasks_placed"] == 20 and m["successful"] >= 1 and m["conflicted"] == 0
    assert m["jobs_attempted"] == 1


def test_partial_placement_is_retried_when_room_appears() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=2)])
    h.add(BatchPolicy())
    h.submit([job("big", tasks=4, cpu=1)])
    h.run(lambda s: placed_tasks_of(s, "big") == 2)
    h.admin.add_machine(machine("m1", cpu=2))
    h.run(settled)
    assert placed_tasks_of(h.admin.read_snapshot(), "big") == 4


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (job("huge", cpu=64), "each task needs 64 cpu; the largest machine has 4"),
        (job("picky", constraints=Constraints(machine_selector=(
            Requirement("gpu", SelectorOp.EXISTS),))), "matches the job's machine selector"),
    ],
)
def test_impossible_jobs_are_abandoned_at_once_with_a_reason(spec, reason) -> None:  # type: ignore[no-untyped-def]
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4) for i in range(3)])
    h.add(BatchPolicy())
    h.submit([spec, job("fine", tasks=3)])
    h.run(settled)
    snap = h.admin.read_snapshot()
    status = snap.statuses[spec.id]
    assert status.state is JobState.ABANDONED and reason in status.reason
    assert placed_tasks_of(snap, "fine") == 3  # nothing else disturbed
    assert "fine" not in snap.statuses


def test_job_for_an_unknown_scheduler_is_abandoned_after_the_grace() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0")])
    h.add(BatchPolicy(), config=RuntimeConfig(unknown_scheduler_grace=5))
    h.submit([job("lost", scheduler="nosuch"), job("ok")])
    h.run(lambda s: "lost" in s.statuses, max_time=60)
    snap = h.admin.read_snapshot()
    assert "no scheduler named 'nosuch'" in snap.statuses["lost"].reason
    assert "known: batch" in snap.statuses["lost"].reason
    assert placed_tasks_of(snap, "ok") == 1


def test_give_up_after_fruitless_attempts() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=2)])
    h.admin.submit_job(job("hog", cpu=2, scheduler="other"))
    from cellstate.model import Claim, Transaction
    assert h.admin.commit(Transaction("other", (Claim("hog", 0, "m0"),))).ok
    inst = h.add(BatchPolicy(), config=RuntimeConfig(max_fruitless_attempts=5))
    h.submit([job("starved", cpu=2)])
    h.run(lambda s: "starved" in s.statuses, max_time=10_000)
    status = h.admin.read_snapshot().statuses["starved"]
    assert "5 attempts in a row placed nothing" in status.reason
    assert inst.metrics.attempts["starved"] == 5


def test_rendezvous_ownership_moves_only_the_leavers_jobs() -> None:
    jobs = [f"j{i}" for i in range(300)]
    three = {j: owner_of(j, ["a", "b", "c"]) for j in jobs}
    two = {j: owner_of(j, ["a", "c"]) for j in jobs}
    assert {j for j in jobs if three[j] != two[j]} == {j for j in jobs if three[j] == "b"}
    assert 60 < sum(1 for j in jobs if three[j] == "b") < 140


def test_service_scheduler_spreads_over_failure_domains() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{d}{r}", cpu=8, rack=f"r{d}{r // 2}",
                                  failure_domain=f"fd{d}") for d in range(3) for r in range(4)])
    h.add(ServicePolicy(), scheduler="service")
    h.submit([job("web", tasks=6, scheduler="service")])
    h.run(settled)
    snap = h.admin.read_snapshot()
    domains = [snap.machines[task_view(snap, f"web/{i}").machine].failure_domain
               for i in range(6)]
    assert sorted(domains) == ["fd0", "fd0", "fd1", "fd1", "fd2", "fd2"]


def test_service_scheduler_respects_anti_affinity() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8) for i in range(4)])
    h.add(ServicePolicy(), scheduler="service")
    spread = Constraints(max_per_machine=1)
    h.submit([job("db", tasks=4, scheduler="service", constraints=spread),
              job("noisy", tasks=2, scheduler="service", labels=[("app", "noisy")]),
              job("calm", tasks=2, scheduler="service", constraints=Constraints(
                  anti_affinity=(Requirement("app", SelectorOp.IN, ("noisy",)),)))])
    h.run(settled)
    snap = h.admin.read_snapshot()
    db_machines = {task_view(snap, f"db/{i}").machine for i in range(4)}
    assert len(db_machines) == 4
    noisy = {task_view(snap, f"noisy/{i}").machine for i in range(2)}
    calm = {task_view(snap, f"calm/{i}").machine for i in range(2)}
    assert not noisy & calm and violations(snap) == []


def test_service_preemption_picks_the_fewest_lowest_precedence_victims() -> None:
    h = Harness()
    # m0: two small tasks of precedence 1; m1: one big task of precedence 1;
    # m2: one big task of precedence 3. The new task needs 4 cpu on a full 4-cpu machine.
    h.admin.add_machines([machine(f"m{i}", cpu=4) for i in range(3)])
    from cellstate.model import Claim, Transaction
    h.admin.submit_job(job("small", tasks=2, cpu=2, precedence=1, scheduler="x"))
    h.admin.submit_job(job("big1", cpu=4, precedence=1, scheduler="x"))
    h.admin.submit_job(job("big3", cpu=4, precedence=3, scheduler="x"))
    assert h.admin.commit(Transaction("x", (Claim("small", 0, "m0"), Claim("small", 1, "m0"),
                                            Claim("big1", 0, "m1"), Claim("big3", 0, "m2")))).ok
    h.add(ServicePolicy(), scheduler="service")
    h.submit([job("vip", cpu=4, precedence=5, scheduler="service")])
    h.run(settled)
    snap = h.admin.read_snapshot()
    assert task_view(snap, "vip/0").machine == "m1"
    assert task_view(snap, "big1/0").state is TaskState.PREEMPTED
    assert {task_view(snap, f"small/{i}").state for i in range(2)} == {TaskState.RUNNING}
    assert task_view(snap, "big3/0").state is TaskState.RUNNING


def test_a_policy_proposing_an_invalid_transaction_does_not_stop_the_instance() -> None:
    from cellstate.model import Claim
    from schedulers.api import Plan, Policy

    class Sloppy(Policy):
        name = "sloppy"

        def schedule_job(self, ctx: Context, job: Job) -> Plan:
            dup = Claim(job.id, 0, "m0")
            return Plan((dup, dup))  # the same task twice: a malformed transaction

    h = Harness()
    h.admin.add_machines([machine("m0")])
    inst = h.add(Sloppy(), config=RuntimeConfig(max_fruitless_attempts=3, retry_delay=1))
    h.submit([job("j", scheduler="sloppy")])
    h.run(lambda s: "j" in s.statuses)
    status = h.admin.read_snapshot().statuses["j"]
    assert "3 attempts in a row placed nothing" in status.reason
    assert inst.metrics.transactions == 0


def test_instance_keeps_its_registration_through_an_unreachable_store() -> None:
    """Unreachable store: the lease is kept (not re-registered) until renewal works
    again; a lease that is really gone is replaced by a new registration."""
    from cellstate.kv.base import UnavailableError
    from cellstate.replica import Replica
    from cellstate.store import CellStore
    from schedulers.runtime import SchedulerInstance

    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])

    class Flaky(CellStore):
        down = False
        registrations = 0

        def register_instance(self, record, ttl):  # type: ignore[no-untyped-def]
            if self.down:
                raise UnavailableError("etcd is down")
            self.registrations += 1
            return super().register_instance(record, ttl)

        def keep_alive(self, lease: int) -> None:
            if self.down:
                raise UnavailableError("etcd is down")
            super().keep_alive(lease)

    store = Flaky(h.kv)
    replica = Replica(h.kv, clock=h.clock)
    replica.load()
    inst = SchedulerInstance(BatchPolicy(), store, replica, clock=h.clock,
                             config=RuntimeConfig(lease_ttl=10))
    h.attach(inst, replica)
    first = inst.lease
    store.down = True
    h.clock.now += 4  # past a third of the ttl: a renewal is due, and fails
    inst.step()
    assert inst.lease == first and store.registrations == 1
    store.down = False
    inst.step()  # renewed: still the same registration
    assert inst.lease == first and store.registrations == 1
    h.clock.now += 11  # nobody renews for longer than the ttl: the lease lapses
    inst.step()
    assert inst.lease != first and store.registrations == 2
    h.submit([job("j", tasks=2, cpu=1)])
    h.run(settled)
    assert placed_tasks_of(h.admin.read_snapshot(), "j") == 2


def test_a_plan_of_several_jobs_is_one_commit_and_later_decisions_see_the_fallbacks() -> None:
    from collections.abc import Sequence

    from cellstate.model import Transaction
    from cellstate.replica import Replica
    from cellstate.store import CellStore
    from schedulers.api import Plan, Policy
    from schedulers.runtime import SchedulerInstance

    class Everything(Policy):
        """Every due job at once, every task on m0 with m1 as the fallback."""

        name = "everything"

        def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
            for j in jobs:
                for i in ctx.view.pending_tasks(j):
                    ctx.view.claim(j, i, "m0", fallbacks=["m1"])
            return Plan(ctx.view.claims)

    calls: list[list[Transaction]] = []

    class Recording(CellStore):
        def commit_many(self, txns):  # type: ignore[no-untyped-def]
            calls.append(list(txns))
            return super().commit_many(txns)

    h = Harness()
    h.admin.add_machines([machine("m0", cpu=2), machine("m1", cpu=4)])
    h.submit([job(f"j{i}", scheduler="everything") for i in range(3)])
    replica = Replica(h.kv, clock=h.clock)
    replica.load()
    inst = SchedulerInstance(Everything(), Recording(h.kv), replica, clock=h.clock)
    h.attach(inst, replica)
    results = inst.finish(attempt) if not isinstance(attempt := inst.decide(), float) else {}
    assert [[t.job for t in txns] for txns in calls] == [["j0", "j1", "j2"]]  # one call
    assert {j: r.placed_on() for j, r in results.items()} == {
        "j0": {"j0/0": "m0"}, "j1": {"j1/0": "m0"}, "j2": {"j2/0": "m1"}}
    assert results["j2"].fell_back == ("j2/0",)
    # Until its copy shows the commit, the instance's next decisions see j2/0 where it
    # went (m1), not where the plan put it first.
    assert sorted((c.task, c.machine) for _, c, _ in inst._inflight) == [
        ("j0/0", "m0"), ("j1/0", "m0"), ("j2/0", "m1")]
    assert inst.metrics.transactions == 3 and inst.metrics.successful == 3


def test_batch_policy_proposes_fallbacks_that_can_host_the_task_when_asked() -> None:
    import random as _random

    from cellstate.model import MAX_FALLBACKS, Claim, Transaction
    from schedulers.api import CellView, Context
    from schedulers.placement import can_host

    h = Harness()
    # Enough machines that two alternatives are always found in the policy's few
    # random draws (the machines' order, and so the draws, depend on the hash seed).
    h.admin.add_machines([machine(f"m{i}", cpu=2) for i in range(40)]
                         + [machine("full", cpu=0.5)])
    h.submit([job("big", cpu=2), job("j", tasks=3)])
    h.admin.commit(Transaction("batch", (Claim("big", 0, "m5"),)))  # m5 is full now
    snap = h.admin.read_snapshot()
    j = snap.jobs["j"]

    def plan(fallbacks: object) -> Plan:
        view = CellView(snap, "batch")
        return BatchPolicy().schedule_job(
            Context(view, 0.0, _random.Random(1), "batch", "0", {"fallbacks": fallbacks}), j)

    claims = plan(2).claims
    assert len(claims) == 3 and all(len(c.fallbacks) == 2 for c in claims)
    for c in claims:
        alts = [f.machine for f in c.fallbacks]
        assert c.machine not in alts and len(set(alts)) == 2
        assert not {"m5", "full"} & set(alts)  # only machines that can host a task
        assert all(f.seen_seq == snap.machines[f.machine].seq for f in c.fallbacks)
        assert all(can_host(CellView(snap, "batch"), j, snap.machines[m]) for m in alts)
    assert all(c.fallbacks == () for c in plan(0).claims)
    for bad in (MAX_FALLBACKS + 1, -1, "two", True):
        with pytest.raises(ValueError, match="option fallbacks must be a whole number"):
            plan(bad)


def test_an_idle_instance_asks_to_wake_for_its_next_proposal() -> None:
    """With nothing queued, a policy that proposes is woken when the next proposal is
    due, however long the idle wait (the simulator's is infinite)."""
    from tests.policies import ElasticGrower

    h = Harness()
    h.admin.add_machines([machine("m0")])
    inst = h.add(ElasticGrower(), config=RuntimeConfig(idle_wait=float("inf"),
                                                       lease_ttl=10**9))
    assert inst.step() == 0.0  # the first proposal, at once
    assert inst.step() == ElasticGrower.propose_interval


class _Absorbing(BatchPolicy):
    """Batch placement that records the changes handed to it, between decisions
    (absorb) and in them."""

    absorbs_changes = True

    def __init__(self, take: bool) -> None:
        super().__init__()
        self.take = take
        self.absorbed: list[frozenset[tuple[KeyKind, str]] | None] = []
        self.decided: list[frozenset[tuple[KeyKind, str]] | None] = []

    def absorb(self, ctx: Context) -> bool:
        self.absorbed.append(ctx.changes)
        return self.take or ctx.changes is None  # the first look (None) is always taken

    def schedule_job(self, ctx: Context, j: Job) -> Plan:
        self.decided.append(ctx.changes)
        return super().schedule_job(ctx, j)


@pytest.mark.parametrize("take", [True, False])
def test_changes_between_decisions_go_to_a_policy_that_absorbs_them(take: bool) -> None:
    """Where the runtime is told to, a policy that asks for them gets the changes while
    nothing is due; those it takes are not handed to its next decision again."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])
    pol = _Absorbing(take)
    inst = h.add(pol, config=RuntimeConfig(absorb_when_idle=True))
    inst.step()  # the first look at the cell: nothing due
    h.admin.add_machine(machine("m1", cpu=4))
    h.pump()
    inst.step()
    assert (KeyKind.MACHINE, "m1") in (pol.absorbed[-1] or ())
    h.submit([job("j1", tasks=2, cpu=1)])
    h.run(settled)
    decided = pol.decided[0]
    assert decided is not None and (KeyKind.JOB, "j1") in decided
    # Taken in between: not again. Not taken: still owed to the decision.
    assert ((KeyKind.MACHINE, "m1") in decided) is not take
    if not take:
        return  # declined changes are offered again, with any newer ones
    # Nothing changed since: absorb is not called for nothing.
    h.pump()
    inst.step()  # the commit's own changes come back
    calls = len(pol.absorbed)
    inst.step()
    assert len(pol.absorbed) == calls and frozenset() not in pol.absorbed


def test_changes_are_not_absorbed_unless_the_runtime_is_told_to() -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])
    pol = _Absorbing(True)
    inst = h.add(pol)
    inst.step()
    h.admin.add_machine(machine("m1", cpu=4))
    h.submit([job("j1", cpu=1)])
    h.run(settled)
    assert pol.absorbed == []
    assert pol.decided[0] is None  # everything since the start is owed to the decision


def test_changes_a_policy_failed_to_absorb_reach_its_next_decision() -> None:
    class Failing(_Absorbing):
        def absorb(self, ctx: Context) -> bool:
            super().absorb(ctx)
            if ctx.changes is not None:
                raise RuntimeError("a bug in the policy")
            return True

    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])
    pol = Failing(True)
    inst = h.add(pol, config=RuntimeConfig(absorb_when_idle=True))
    inst.step()  # the first look (None) is taken
    h.admin.add_machine(machine("m1", cpu=4))
    h.pump()
    with pytest.raises(RuntimeError, match="a bug in the policy"):
        inst.step()
    pol.absorb = lambda ctx: False  # type: ignore[method-assign]
    h.submit([job("j1", cpu=1)])
    h.run(settled)
    assert (KeyKind.MACHINE, "m1") in (pol.decided[0] or ())


def test_a_stopped_instance_started_again_reads_the_whole_cell() -> None:
    """A stopped instance keeps no account of the changes it is still told of (a
    simulator's prefill instance would otherwise go over every change of a run);
    started again, it reads the whole cell: the job and the machine that came while it
    was stopped are found, and its policy is told that anything may have changed."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=1)])
    pol = _Absorbing(True)
    inst = h.add(pol)
    h.submit([job("j1", tasks=1, cpu=1)])
    h.run(settled)
    inst.stop()
    h.admin.add_machine(machine("m1", cpu=1))
    h.submit([job("j2", tasks=1, cpu=1)])
    h.pump()
    inst.start()
    h.run(settled)
    snap = h.admin.read_snapshot()
    assert placed_tasks_of(snap, "j2") == 1
    assert task_view(snap, "j2/0").machine == "m1"
    assert pol.decided[-1] is None

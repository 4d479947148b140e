"""LeastLoaded, tested with the kit omega-cell ships (schedulers.testing)."""

from __future__ import annotations

from least_loaded import LeastLoaded

from cellstate.model import Claim, JobState, Reason, Transaction
from schedulers.testing import Harness, JobBuilder, MachineBuilder, settled


def two_machines(cpu_a: float = 8, mem_a: float = 16, busy_a: float = 0) -> Harness:
    """Machines "a" (as given) and "b" (8 cpu, 32 GiB); another scheduler's task
    holds ``busy_a`` cpu on "a"."""
    h = Harness()
    h.admin.add_machines([MachineBuilder("a").cpu(cpu_a).mem(mem_a).build(),
                          MachineBuilder("b").cpu(8).mem(32).build()])
    if busy_a:
        h.admin.submit_job(JobBuilder("filler").cpu(busy_a).scheduler("other").build())
        assert h.admin.commit(Transaction("other", (Claim("filler", 0, "a"),))).ok
    return h


def web(tasks: int) -> JobBuilder:
    return JobBuilder("web").tasks(tasks).cpu(1).scheduler("least-loaded")


def test_each_task_goes_to_the_machine_with_the_most_free_cpu() -> None:
    h = two_machines(busy_a=6)
    h.add(LeastLoaded())
    h.submit([web(3).build()])
    h.run(settled)
    assert h.machines_of("web") == ["b", "b", "b"]


def test_tasks_alternate_between_equal_machines() -> None:
    h = two_machines()
    h.add(LeastLoaded())
    h.submit([web(4).build()])
    h.run(settled)
    assert h.machines_of("web") == ["b", "a", "b", "a"]  # a tie goes to the larger id


def test_the_dimension_option_chooses_what_to_balance() -> None:
    h = two_machines(cpu_a=16, mem_a=8)  # "a" has more cpu, "b" more memory
    h.add(LeastLoaded(dimension="mem"))
    h.submit([web(2).build()])
    h.run(settled)
    assert h.machines_of("web") == ["b", "b"]


def test_a_task_larger_than_every_machine_is_abandoned_at_once() -> None:
    h = two_machines()
    inst = h.add(LeastLoaded())
    h.submit([web(1).cpu(64).build()])
    h.run(settled)
    status = h.snapshot().statuses["web"]
    assert status.state is JobState.ABANDONED and "64 cpu" in status.reason
    assert h.committer(inst).log == []  # nothing was sent to the store


def test_claims_the_store_rejects_are_retried() -> None:
    h = two_machines()
    inst = h.add(LeastLoaded())
    committer = h.committer(inst)
    committer.reject_machines(["a"], Reason.SEQUENCE_CHANGED, times=1)
    h.submit([web(4).build()])
    h.run(settled)
    first, retry = committer.log
    assert first.result is not None and retry.result is not None
    assert [c.machine for c in first.result.committed] == ["b", "b"]
    assert [r.reason for r in first.result.rejected] == [Reason.SEQUENCE_CHANGED] * 2
    # The retry sees "b" half full, so both tasks left go to "a".
    assert [c.machine for c in retry.result.committed] == ["a", "a"]
    assert h.machines_of("web") == ["b", "a", "b", "a"]
    assert inst.metrics.summary(h.clock())["conflicted"] == 1

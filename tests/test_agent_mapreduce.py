"""The node agent runs a MapReduce job by the linear speedup model: workers added or
evicted anywhere in the cell move the end of its own workers, and all end together
when the work is done (hand-computed times on a virtual clock)."""

from __future__ import annotations

import pytest

from cellstate.kv.base import KV
from cellstate.model import Claim, Job, Machine, Resources, TaskState
from schedulers.testing import Clock, JobBuilder, txn
from tests.test_agent import M1, M2, T0, Rig, RigFactory, make_rig

__all__ = ["make_rig"]  # the fixture, used by name


def wordcount(workers: int) -> Job:
    # 100 maps of 10 s (1,000 worker-seconds), then 10 reduces of 30 s (300).
    return (JobBuilder("wc").cpu(1).mem(1)
            .mapreduce(100, 10, reduces=10, reduce_seconds=30, workers=workers,
                       max_workers=100).build())


def place(rig: Rig, tasks: dict[int, str], evict: tuple[str, ...] = ()) -> None:
    res = rig.store.commit(txn([Claim("wc", i, m, evict=evict) for i, m in tasks.items()]))
    assert res.ok, res.rejected


def states(rig: Rig, count: int) -> list[TaskState]:
    return [rig.state(f"wc/{i}") for i in range(count)]


def at(rig: Rig, when: float) -> None:
    clock = rig.clock
    assert isinstance(clock, Clock)
    clock.now = when
    rig.step()


def test_workers_added_mid_run_bring_the_end_forward(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.store.submit_job(wordcount(2))
    place(rig, {0: M1, 1: M2})
    rig.step()
    run = rig.agent.tasks()["wc/0"]
    assert (run.kind, run.started_at) == ("mapreduce", T0)
    # With 2 workers throughout: 1000 / 2 + 300 / 2 = 650 s.
    at(rig, T0 + 50)
    # 50 s later 6 more (the cell holds 8): 100 of the map work done, 900 left at 8
    # workers = 112.5 s, then 300 / 8 = 37.5 s of reduces: done at T0 + 200.
    rig.store.resize_job("wc", 8)
    place(rig, {2: M1, 3: M1, 4: M1, 5: M2, 6: M2, 7: M2})
    rig.step()
    at(rig, T0 + 199.9)
    assert states(rig, 8) == [TaskState.RUNNING] * 8
    at(rig, T0 + 200)
    assert states(rig, 8) == [TaskState.FINISHED] * 8
    assert rig.agent.stats.finished == 8
    assert rig.machine(M1).allocations == {} and rig.machine(M2).allocations == {}


def test_workers_evicted_mid_run_push_the_end_back(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    rig.store.submit_job(wordcount(1))
    rig.store.resize_job("wc", 4)
    place(rig, {0: M1, 1: M1, 2: M2, 3: M2})
    rig.step()  # 4 workers: 1000 / 4 + 300 / 4 = 325 s
    at(rig, T0 + 100)
    # A higher-precedence job evicts two extra workers at T0 + 100: 600 map worker-s
    # left at 2 workers = 300 s, then 150 s of reduces: done at T0 + 550.
    rig.store.submit_job(JobBuilder("svc").cpu(2).mem(1).precedence(5).build())
    res = rig.store.commit(txn([Claim("svc", 0, M2, evict=("wc/2", "wc/3"))]))
    assert res.ok, res.rejected
    rig.step()
    at(rig, T0 + 549.9)
    assert states(rig, 2) == [TaskState.RUNNING] * 2
    at(rig, T0 + 550)
    assert states(rig, 4) == [TaskState.FINISHED] * 2 + [TaskState.PREEMPTED] * 2


def test_a_worker_finished_elsewhere_ends_ours(kv: KV, make_rig: RigFactory) -> None:
    rig = make_rig(kv)
    rig.step()
    # A machine of another agent (registered by hand here) runs the job's other worker.
    rig.store.add_machine(Machine("elsewhere", Resources.of(cpu=4, mem=16)))
    rig.store.submit_job(wordcount(2))
    place(rig, {0: M1, 1: "elsewhere"})
    rig.step()
    at(rig, T0 + 10)
    assert rig.state("wc/0") is TaskState.RUNNING
    # That agent counts the job done first (it has followed it longer, say).
    rig.store.release_task("wc/1", TaskState.FINISHED, "elsewhere")
    rig.step()
    assert rig.state("wc/0") is TaskState.FINISHED
    assert rig.agent.tasks()["wc/0"].ended_at == pytest.approx(T0 + 10)

"""The simulation's collector (paused between sweeps) and the scheduler process's (off
inside decisions, collecting between steps): cyclic garbage still freed, the process's
collector as it was afterwards."""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref
from collections.abc import Iterator

import attrs
import pytest

from cellstate.gc_tuning import RoundCollector, SweptCollector
from cellstate.invariants import placed_tasks_of
from cellstate.kv.memory import MemoryKV
from cellstate.model import Job
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.api import Context, Plan
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig, SchedulerInstance
from schedulers.testing import job, machine


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def collector_state() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_pause_stops_automatic_collection_and_resume_restores_it(collector_state: None) -> None:
    gc.enable()
    c = SweptCollector()
    c.pause()
    assert not gc.isenabled()
    c.resume()
    assert gc.isenabled()


def test_resume_leaves_a_disabled_collector_disabled(collector_state: None) -> None:
    gc.disable()
    c = SweptCollector()
    c.pause()
    c.resume()
    assert not gc.isenabled()


def test_a_due_sweep_frees_cycles_made_since_the_last(collector_state: None) -> None:
    c = SweptCollector(every=0.0)
    c.pause()
    ref = _cycle()
    assert ref() is not None  # paused: nothing collects it
    c.sweep()
    assert ref() is None


def test_a_sweep_before_its_time_collects_nothing(collector_state: None) -> None:
    c = SweptCollector(every=3600.0)
    c.pause()
    ref = _cycle()
    c.sweep()
    assert ref() is not None
    c.resume()
    gc.collect()
    assert ref() is None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_round_collector_is_off_until_stopped_and_restores_the_collector(
        collector_state: None) -> None:
    gc.enable()
    c = RoundCollector()
    c.start()
    assert not gc.isenabled()
    c.between(idle=True)
    assert not gc.isenabled()
    c.stop()
    assert gc.isenabled()


def test_young_garbage_is_collected_between_steps_once_enough_has_accumulated(
        collector_state: None) -> None:
    c = RoundCollector(young=100_000, clock=_Clock())
    c.start()
    ref = _cycle()
    c.between(idle=False)
    assert ref() is not None  # below the threshold: left for later
    c.young = 1
    c.between(idle=False)
    assert ref() is None
    assert (c.young_passes, c.full_passes) == (1, 0)
    c.stop()


def _frozen_garbage(c: RoundCollector) -> weakref.ref[_Node]:
    """A cycle that a young pass froze while it was alive, and garbage since."""
    holder = [_Node()]
    holder[0].other = holder[0]
    ref = weakref.ref(holder[0])
    c.between(idle=False)
    holder.clear()
    return ref


def test_a_cycle_frozen_while_alive_is_freed_by_the_full_pass(collector_state: None) -> None:
    clock = _Clock()
    c = RoundCollector(young=1, full_every=600.0, clock=clock)
    c.start()
    ref = _frozen_garbage(c)
    c.between(idle=False)
    assert ref() is not None  # frozen: young passes no longer see it
    clock.now = 700.0
    c.between(idle=False)
    assert ref() is not None  # a busy loop waits up to twice the period
    c.between(idle=True)
    assert ref() is None
    assert c.full_passes == 1
    c.stop()


def test_a_never_idle_loop_still_gets_its_full_pass(collector_state: None) -> None:
    clock = _Clock()
    c = RoundCollector(young=1, full_every=600.0, clock=clock)
    c.start()
    ref = _frozen_garbage(c)
    clock.now = 1200.0
    c.between(idle=False)
    assert ref() is None
    c.stop()


@attrs.define
class _Watched(BatchPolicy):
    """Batch placement that notes whether the collector could run during its decision
    and leaves a reference cycle behind, as a round's garbage may."""

    enabled: list[bool] = attrs.field(factory=list)
    made: list[weakref.ref[_Node]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__init__()

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        self.enabled.append(gc.isenabled())
        self.made.append(_cycle())
        return super().schedule_job(ctx, job)


def test_a_scheduler_loop_never_collects_inside_a_decision(collector_state: None) -> None:
    """The loop with a process's collector: automatic collection off in every decision,
    the cycles decisions left freed between steps, every job still placed."""
    gc.enable()
    kv = MemoryKV()
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=8) for i in range(4)])
    policy = _Watched()
    replica = Replica(kv).start()
    inst = SchedulerInstance(policy, CellStore(kv), replica, scheduler="batch",
                             config=RuntimeConfig(retry_delay=0.05), rng=random.Random(1))
    collector = RoundCollector(young=1)
    stop = threading.Event()
    runner = threading.Thread(target=inst.run, args=(stop, collector), daemon=True)
    try:
        collector.start()
        inst.start()
        runner.start()
        now = time.time()
        for i in range(5):
            admin.submit_job(attrs.evolve(job(f"b{i}", tasks=2), submitted_at=now))
        deadline = time.monotonic() + 60  # a bound for failure, not a measurement
        while not all(placed_tasks_of(admin.read_snapshot(), f"b{i}") == 2 for i in range(5)):
            assert time.monotonic() < deadline, "jobs not placed within 60 s"
            time.sleep(0.05)
    finally:
        stop.set()
        runner.join(timeout=30)
        inst.stop()
        replica.stop()
        collector.stop()
    assert len(policy.enabled) >= 5 and not any(policy.enabled)
    assert collector.young_passes >= 1
    assert all(ref() is None for ref in policy.made)

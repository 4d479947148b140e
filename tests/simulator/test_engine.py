"""The event loop's ordering and the random streams."""

from __future__ import annotations

import random

from simulator.engine import EventLoop, stream
from simulator.workload import Distribution


def test_ties_run_by_priority_then_scheduling_order() -> None:
    loop = EventLoop()
    ran: list[str] = []
    loop.at(5.0, 3, lambda: ran.append("wake"))
    loop.at(5.0, 0, lambda: ran.append("end-1"))
    loop.at(2.0, 9, lambda: ran.append("early"))
    loop.at(5.0, 0, lambda: ran.append("end-2"))
    cancelled = loop.at(4.0, 0, lambda: ran.append("cancelled"))
    cancelled.cancel()
    loop.run(until=10.0)
    assert ran == ["early", "end-1", "end-2", "wake"]
    assert loop.now == 10.0


def test_events_past_the_horizon_wait() -> None:
    loop = EventLoop()
    ran: list[float] = []
    def later() -> None:
        loop.after(3.0, 0, lambda: ran.append(loop.now))

    loop.at(1.0, 0, later)
    loop.run(until=3.0)
    assert ran == [] and loop.peek() == 4.0


def test_streams_are_independent_and_reproducible() -> None:
    a1 = [stream(7, "workload/batch").random() for _ in range(3)]
    a2 = [stream(7, "workload/batch").random() for _ in range(3)]
    b = [stream(7, "workload/service").random() for _ in range(3)]
    c = [stream(8, "workload/batch").random() for _ in range(3)]
    assert a1 == a2 and a1 != b and a1 != c


def test_empirical_samples_interpolate_between_quantiles() -> None:
    """Quantiles 0 -> 10, 0.5 -> 20, 1 -> 40: every sample lies in [10, 40], half
    of them below 20, and the mean approaches (15 + 30) / 2 = 22.5."""
    d = Distribution.empirical([10.0, 20.0, 40.0])
    rng = random.Random(1)
    xs = [d.sample(rng) for _ in range(20_000)]
    assert min(xs) >= 10.0 and max(xs) <= 40.0
    assert abs(sum(x < 20.0 for x in xs) / len(xs) - 0.5) < 0.02
    assert abs(sum(xs) / len(xs) - 22.5) < 0.3
    assert d.mean() == 22.5


def test_decision_cost_model_and_measured() -> None:
    """t_job + t_task x (tasks placed + tasks reported unplaced), per job kind; or the
    measured time, scaled."""
    from cellstate.model import Claim, JobKind
    from schedulers.api import Plan, Unplaced
    from schedulers.testing import job
    from simulator.config import DecisionTime, SchedulerSpec
    from simulator.drivers import decision_cost

    spec = SchedulerSpec("s", ("service",), decision={
        JobKind.SERVICE: DecisionTime(2.0, 0.5)}, default=DecisionTime(0.25, 0.125))
    svc = job("svc", tasks=5, kind=JobKind.SERVICE)
    bat = job("bat", tasks=5)
    plan = Plan((Claim("svc", 0, "m1"), Claim("svc", 1, "m1")), (Unplaced("svc", "full", 3),))
    assert decision_cost(spec)([svc], plan, 99.0) == 2.0 + 0.5 * 5
    assert decision_cost(spec)([bat], Plan(), 99.0) == 0.25
    measured = SchedulerSpec("s", ("batch",), measured=True, measured_scale=4.0)
    assert decision_cost(measured)([bat], plan, 0.5) == 2.0

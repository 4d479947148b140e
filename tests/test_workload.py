"""The demo workload: jobs for every scheduler of the demo, flow jobs with input data
on machines of the cell, each a job the service accepts."""

from __future__ import annotations

import random
import threading
from collections import Counter

from cellstate import codec
from omega.workload import (
    FAIR_BATCH_USERS,
    FAIR_INTERACTIVE_USERS,
    CachedHosts,
    WorkloadOptions,
    generate,
    random_job,
)
from schedulers.testing import Clock

HOSTS = tuple(f"m{i:05}" for i in range(1, 41))


def _jobs(n: int, opts: WorkloadOptions, hosts: tuple[str, ...] = HOSTS) -> list:  # type: ignore[type-arg]
    rng = random.Random(3)
    return [random_job(rng, i, 100.0, opts, hosts) for i in range(n)]


def test_jobs_go_to_batch_service_flow_mapreduce_and_fair() -> None:
    jobs = _jobs(1000, WorkloadOptions(service_fraction=0.2, flow_fraction=0.3,
                                       mapreduce_fraction=0.1, fair_fraction=0.15))
    share = Counter(j.scheduler for j in jobs)
    assert set(share) == {"batch", "service", "flow", "mapreduce", "fair"}
    # Binomial(1000, p): far more than five standard deviations from these fails.
    assert 130 < share["service"] < 270 and 220 < share["flow"] < 380
    assert 50 < share["mapreduce"] < 150 and 90 < share["fair"] < 210


def test_fair_jobs_come_from_batch_users_and_interactive_users() -> None:
    fair = [j for j in _jobs(800, WorkloadOptions(fair_fraction=0.5)) if j.scheduler == "fair"]
    batch = [j for j in fair if j.owner in FAIR_BATCH_USERS]
    interactive = [j for j in fair if j.owner in FAIR_INTERACTIVE_USERS]
    assert len(batch) + len(interactive) == len(fair) and batch and interactive
    # Batch users' jobs are big and long; interactive ones small, short and ranked first.
    assert min(j.task_count for j in batch) >= 50 and min(j.duration or 0 for j in batch) >= 60
    assert max(j.task_count for j in interactive) <= 4
    assert max(j.duration or 0 for j in interactive) <= 10
    assert all(j.priority > 0 for j in interactive) and not any(j.priority for j in batch)
    assert not any(j.scheduler == "fair" for j in _jobs(300, WorkloadOptions(fair_fraction=0)))


def test_mapreduce_jobs_ask_for_a_few_workers_and_may_grow() -> None:
    mr = [j for j in _jobs(400, WorkloadOptions(mapreduce_fraction=0.5))
          if j.scheduler == "mapreduce"]
    assert mr and not any(j.scheduler == "mapreduce" for j in _jobs(
        300, WorkloadOptions(mapreduce_fraction=0)))
    for j in mr:
        spec = j.mapreduce
        assert spec is not None and j.task_count == spec.workers in (2, 3, 5)
        assert spec.max_workers == 10 * spec.workers and spec.maps >= 5 * spec.workers
        assert j.duration is None and not j.gang


def test_some_flow_jobs_read_input_stored_on_machines_of_the_cell() -> None:
    flow = [j for j in _jobs(600, WorkloadOptions(flow_fraction=0.5)) if j.scheduler == "flow"]
    with_data = [j for j in flow if j.input]
    assert 0 < len(with_data) < len(flow)
    for j in with_data:
        machines = [m for m, _ in j.input]
        assert machines == sorted(set(machines)) and set(machines) <= set(HOSTS)
        assert 1 <= len(machines) <= 3 and all(a > 0 for _, a in j.input)
    # Some read blocks of their own, task by task, on the job's machines.
    own = [j for j in with_data if j.task_input]
    assert 0 < len(own) < len(with_data)
    for j in own:
        assert len(j.task_input) == j.task_count
        assert all(set(b.on) <= {m for m, _ in j.input} for t in j.task_input for b in t)


def test_no_hosts_no_input_and_no_flow_fraction_no_flow_jobs() -> None:
    assert not any(j.input for j in _jobs(300, WorkloadOptions(flow_fraction=0.5), ()))
    assert not any(j.scheduler == "flow" for j in _jobs(300, WorkloadOptions(flow_fraction=0)))


def test_every_job_is_one_the_service_accepts() -> None:
    for j in _jobs(300, WorkloadOptions(flow_fraction=0.4, mapreduce_fraction=0.2)):
        doc = codec.job_to_doc(j)
        assert codec.parse_job(doc, "job") == j


def test_generate_asks_for_hosts_before_each_job() -> None:
    stop = threading.Event()
    asked = []

    def hosts() -> tuple[str, ...]:
        asked.append(1)
        return HOSTS

    def submit(job: object) -> None:
        if len(asked) == 20:
            stop.set()

    n = generate(submit, WorkloadOptions(jobs_per_second=10_000.0), stop, hosts=hosts)
    assert n == len(asked) == 20


def test_cached_hosts_fetch_again_when_old_and_soon_while_there_are_none() -> None:
    clock = Clock(0.0)
    answers = [[], ["m1"], ["m1", "m2"]]
    fetched = []

    def fetch() -> list[str]:
        fetched.append(clock())
        return answers[min(len(fetched) - 1, 2)]

    hosts = CachedHosts(fetch, clock, ttl=10.0)
    assert hosts() == ()
    clock.now = 0.5
    assert hosts() == () and len(fetched) == 1  # none yet, but asked a moment ago
    clock.now = 1.0
    assert hosts() == ("m1",)
    clock.now = 10.5
    assert hosts() == ("m1",) and len(fetched) == 2  # some, and not ten seconds old
    clock.now = 11.0
    assert hosts() == ("m1", "m2") and fetched == [0.0, 1.0, 11.0]

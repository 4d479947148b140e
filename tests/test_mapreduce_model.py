"""MapReduce jobs: the linear speedup model with hand-computed numbers, the tracker's
integration of workers over time, and the job spec's checks (a clear error, nothing
written on bad input)."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from cellstate import codec
from cellstate.errors import StoreError
from cellstate.kv.memory import MemoryKV
from cellstate.mapreduce import Progress, Tracker, job_seconds, speedup, useful_workers
from cellstate.model import (
    OPPORTUNISTIC_PRECEDENCE,
    JobKind,
    MapReduceSpec,
    ModelError,
    required_tasks,
    task_precedence,
)
from cellstate.store import CellStore
from schedulers.testing import JobBuilder

# 100 maps of 10 s (1,000 worker-seconds), 10 reduces of 30 s (300), 10 workers asked.
WORDCOUNT = MapReduceSpec(100, 10, 10.0, 30.0, 10, 100)
# Every map already runs at once with the workers asked for: more cannot help.
SMALL = MapReduceSpec(5, 0, 60.0, 0.0, 5, 50)


@pytest.mark.parametrize(("spec", "workers", "seconds"), [
    (WORDCOUNT, 10, 1000 / 10 + 300 / 10),  # 130
    (WORDCOUNT, 20, 1000 / 20 + 300 / 10),  # 80: the reduces cannot use more than 10
    (WORDCOUNT, 100, 1000 / 100 + 300 / 10),  # 40: every activity of each phase at once
    (WORDCOUNT, 1000, 40.0),  # no faster beyond that
    (WORDCOUNT, 1, 1300.0),
    (SMALL, 5, 60.0),
    (SMALL, 50, 60.0),
])
def test_job_time_is_linear_up_to_full_parallelism(spec: MapReduceSpec, workers: int,
                                                   seconds: float) -> None:
    assert job_seconds(spec, workers) == pytest.approx(seconds)


def test_speedup_is_against_the_workers_asked_for() -> None:
    assert speedup(WORDCOUNT, 10) == pytest.approx(1.0)
    assert speedup(WORDCOUNT, 100) == pytest.approx(130 / 40)
    assert speedup(WORDCOUNT, 5) == pytest.approx(130 / 260)  # fewer workers: slower
    assert speedup(SMALL, 50) == pytest.approx(1.0)
    assert useful_workers(WORDCOUNT) == 100 and useful_workers(SMALL) == 5


def test_progress_carries_over_when_workers_change() -> None:
    p = Progress.start(WORDCOUNT)
    # 50 s with 10 workers: 500 of the 1,000 map worker-seconds done.
    p = p.after(WORDCOUNT, 10, 50)
    assert p.map_left == pytest.approx(500) and p.reduce_left == pytest.approx(300)
    # Then 50 workers: 500 / 50 = 10 s of maps, then 300 / min(50, 10) = 30 s.
    assert p.seconds_left(WORDCOUNT, 50) == pytest.approx(40)
    # 20 s with 50 workers crosses into the reduce phase: 10 s of maps, 10 s of reduce.
    q = p.after(WORDCOUNT, 50, 20)
    assert q.map_left == 0 and q.reduce_left == pytest.approx(300 - 10 * 10)
    assert q.fraction_done(WORDCOUNT) == pytest.approx(1 - 200 / 1300)
    assert q.seconds_left(WORDCOUNT, 0) == math.inf
    done = q.after(WORDCOUNT, 10, 20)
    assert done.done(WORDCOUNT) and done.seconds_left(WORDCOUNT, 0) == 0


def test_tracker_follows_workers_added_and_evicted_mid_run() -> None:
    t = Tracker()
    t.workers("wc", WORDCOUNT, 10, now=0)
    assert t.done_at("wc") == pytest.approx(130)
    t.workers("wc", WORDCOUNT, 50, now=50)  # 40 workers added at t=50
    assert t.done_at("wc") == pytest.approx(90)  # 10 s of maps + 30 s of reduces
    t.workers("wc", WORDCOUNT, 5, now=70)  # evicted down to 5 during the reduce phase
    # At 70: 300 - 10 x 10 = 200 reduce worker-seconds left, at 5 per second.
    assert t.done_at("wc") == pytest.approx(110)
    t.workers("wc", WORDCOUNT, 0, now=80)  # no worker left: no progress, no end
    assert t.done_at("wc") == math.inf
    t.workers("wc", WORDCOUNT, 10, now=100)
    assert t.done_at("wc") == pytest.approx(100 + 150 / 10)
    assert t.started("wc") == 0
    t.forget("wc")
    assert not t.tracks("wc")
    t.workers("other", WORDCOUNT, 0, now=5)  # not running yet: nothing to follow
    assert not t.tracks("other")


def test_extra_workers_are_opportunistic_and_optional() -> None:
    j = attrs.evolve(JobBuilder("wc").precedence(3).mapreduce(100, 10, workers=2).build(),
                     task_count=4)
    assert [task_precedence(j, i) for i in range(4)] == [3, 3, OPPORTUNISTIC_PRECEDENCE,
                                                        OPPORTUNISTIC_PRECEDENCE]
    assert required_tasks(j) == 2
    plain = JobBuilder("b").tasks(7).precedence(3).build()
    assert task_precedence(plain, 6) == 3 and required_tasks(plain) == 7


# -- the job spec ---------------------------------------------------------------------------

SPEC: dict[str, Any] = {
    "id": "wc", "scheduler": "mapreduce", "task_resources": {"cpu": 1, "mem": 2},
    "mapreduce": {"maps": 100, "reduces": 10, "map_seconds": 10, "reduce_seconds": 30,
                  "workers": 10, "max_workers": 40},
}


def test_a_mapreduce_spec_parses_and_round_trips() -> None:
    job = codec.parse_job(SPEC)
    assert job.kind is JobKind.MAPREDUCE and job.task_count == 10
    assert job.mapreduce == MapReduceSpec(100, 10, 10.0, 30.0, 10, 40)
    assert codec.parse_job(codec.job_to_doc(job)) == job
    # Without an upper bound the job may grow until every activity of a phase runs.
    doc = {**SPEC, "mapreduce": {k: v for k, v in SPEC["mapreduce"].items()
                                 if k != "max_workers"}}
    assert codec.parse_job(doc).mapreduce.max_workers == 100  # type: ignore[union-attr]
    # A grown job's stored record: more tasks than asked, up to the bound.
    assert codec.parse_job({**SPEC, "task_count": 40}).task_count == 40


@pytest.mark.parametrize(("change", "message"), [
    ({"mapreduce": {**SPEC["mapreduce"], "maps": 0}},
     "job.mapreduce.maps must be between 1 and 10000000, got 0"),
    ({"mapreduce": {k: v for k, v in SPEC["mapreduce"].items() if k != "maps"}},
     "job.mapreduce.maps is required"),
    ({"mapreduce": {k: v for k, v in SPEC["mapreduce"].items() if k != "workers"}},
     "job.mapreduce.workers is required"),
    ({"mapreduce": {**SPEC["mapreduce"], "map_seconds": -1}},
     "job.mapreduce.map_seconds must be a number of seconds above 0"),
    ({"mapreduce": {**SPEC["mapreduce"], "reduce_seconds": "long"}},
     "job.mapreduce.reduce_seconds must be a number of seconds above 0"),
    ({"mapreduce": {**SPEC["mapreduce"], "map_seconds": float("nan")}},
     "job.mapreduce.map_seconds must be a number"),
    ({"mapreduce": {**SPEC["mapreduce"], "max_workers": 5}},
     "job.mapreduce.max_workers (5) is below job.mapreduce.workers (10)"),
    ({"mapreduce": {**SPEC["mapreduce"], "workers": True}},
     "job.mapreduce.workers must be an integer"),
    ({"mapreduce": {**SPEC["mapreduce"], "speed": 2}},
     "job.mapreduce: unknown field(s) 'speed'"),
    ({"mapreduce": [1, 2]}, "job.mapreduce: expected an object"),
    ({"task_count": 41}, "job.task_count must be between 10 and 40, got 41"),
    ({"task_count": 9}, "job.task_count must be between 10 and 40, got 9"),
    ({"kind": "batch"}, "job.kind: a job with a mapreduce table is of kind 'mapreduce'"),
    ({"gang": True}, "job.gang: a MapReduce job cannot be a gang"),
    ({"duration": 30}, "job.duration: a MapReduce job runs as long as its map and reduce"),
    ({"command": ["sleep", "1"]}, "job.command: a MapReduce job runs as long as"),
])
def test_bad_mapreduce_specs_are_refused_by_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelError) as e:
        codec.parse_job({**SPEC, **change})
    assert message in str(e.value)


def test_kind_mapreduce_needs_its_table() -> None:
    doc = {k: v for k, v in SPEC.items() if k != "mapreduce"}
    with pytest.raises(ModelError, match=r"job\.mapreduce is required for a job of kind"):
        codec.parse_job({**doc, "kind": "mapreduce"})


def test_the_store_keeps_a_mapreduce_job_between_its_bounds() -> None:
    store = CellStore(MemoryKV())
    store.submit_job(codec.parse_job(SPEC))
    store.resize_job("wc", 40)
    assert store.read_snapshot().jobs["wc"].task_count == 40
    for count in (41, 9):
        with pytest.raises(StoreError, match=f"from the 10 workers it asked for to its "
                                             f"elastic upper bound of 40, not {count}$"):
            store.resize_job("wc", count)
    assert store.read_snapshot().jobs["wc"].task_count == 40  # nothing written

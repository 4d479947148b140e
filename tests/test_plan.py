"""`omega plan`: the job's policy on a snapshot, judged by the store's own validation,
nothing written; and on an unchanged cell a commit of the same transaction does what
the plan said."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import Claim, InstanceRecord, Job, JobKind
from cellstate.store import CellStore
from omega.cli import main
from omega.plan import plan_job
from schedulers.batch import BatchPolicy
from schedulers.service import ServicePolicy
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import running_server


def _busy_cell(store: CellStore) -> None:
    """4 machines of 4 cpu; three of them full of precedence-0 batch tasks."""
    store.add_machines([machine(f"m{i}", cpu=4, failure_domain=f"fd{i % 2}") for i in range(4)])
    store.register_instance(InstanceRecord("batch", "0"), 60)
    store.register_instance(InstanceRecord("service", "0"), 60)
    store.submit_job(job("filler", tasks=12, cpu=1))
    snap = store.read_snapshot()
    store.commit(txn([Claim("filler", i, f"m{i // 4}", snap.machines[f"m{i // 4}"].seq)
                      for i in range(12)]))


def _commit_like_the_plan(store: CellStore, spec: Job, policy: object, seed: int,
                          ) -> tuple[dict[str, str], list[str], dict[str, str], list[str]]:
    snap = store.read_snapshot()
    outcome = plan_job(snap, spec, policy, random.Random(seed), 1000.0)  # type: ignore[arg-type]
    assert outcome.txn is not None and outcome.decision is not None
    planned = {c.task: c.machine for c in outcome.decision.accepted}
    assert store.read_snapshot().revision == snap.revision  # planning wrote nothing
    store.submit_job(spec)  # the job's own record; no machine changes
    result = store.commit(outcome.txn)
    committed = {c.task: c.machine for c in result.committed}
    return planned, list(outcome.decision.evicted), committed, list(result.evicted)


@pytest.mark.parametrize(("spec", "policy"), [
    (job("fits", tasks=3, cpu=1), BatchPolicy()),
    (job("partly", tasks=6, cpu=1), BatchPolicy()),
    (attrs.evolve(job("evicts", tasks=2, cpu=3, scheduler="service", precedence=5),
                  kind=JobKind.SERVICE), ServicePolicy()),
])
def test_a_commit_on_the_unchanged_cell_does_what_the_plan_said(
        kv: KV, spec: Job, policy: object) -> None:
    store = CellStore(kv)
    _busy_cell(store)
    planned, planned_evicted, committed, evicted = _commit_like_the_plan(store, spec, policy, 7)
    assert planned and planned == committed
    assert planned_evicted == evicted
    if spec.id == "evicts":
        assert evicted  # the service job had to preempt to fit both tasks
    if spec.id == "partly":
        assert len(planned) == 4  # one free machine of 4 cpu


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, CellStore, KV]]:
    store = CellStore(kv)
    _busy_cell(store)
    # No commit leader: its election key would move etcd's revision under the test,
    # which compares revisions to show that a plan writes nothing.
    with running_server(kv, limits=None, commit_leader=False) as server:
        yield server, store, kv


def _plan(server: CellStateServer, capsys: pytest.CaptureFixture[str], path: Path,
          *extra: str) -> tuple[int, str, str]:
    code = main(["plan", str(path), "--cellstate", f"127.0.0.1:{server.port}", "--insecure",
                 *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_writes_nothing_and_says_what_the_job_would_get(
        live: tuple[CellStateServer, CellStore, KV], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server, store, kv = live
    spec = tmp_path / "job.toml"
    spec.write_text('id = "p1"\nscheduler = "batch"\ntask_count = 6\n'
                    'task_resources = { cpu = 1, mem = 1 }\nduration = 10\n')
    before = kv.range(b"\x00", b"\xff").revision
    code, out, _ = _plan(server, capsys, spec, "--json", "--seed", "1")
    assert code == 0
    doc = json.loads(out)
    assert doc["written"] is False and doc["revision"] == store.read_snapshot().revision
    assert len(doc["placed"]) == 4 and {p["machine"] for p in doc["placed"]} == {"m3"}
    assert doc["pending"] == 2
    assert doc["unplaced"] == [{"reason": "no machine has room for 2 more task(s) now: 0/4 "
                                          "machines fit: 4 insufficient cpu",
                                "tasks": 2, "permanent": False}]
    assert doc["rejected"] == [] and doc["evicted"] == []
    code, text, _ = _plan(server, capsys, spec)
    assert code == 0 and "would place 4 of 6 task(s)" in text and "m3: p1/" in text
    assert kv.range(b"\x00", b"\xff").revision == before
    assert "p1" not in store.read_snapshot().jobs


def test_plan_says_what_submission_would_refuse(
        live: tuple[CellStateServer, CellStore, KV], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server, _, _ = live
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"id": "big", "scheduler": "batch", "task_count": 17,
                                "gang": True, "task_resources": {"cpu": 1, "mem": 1}}))
    code, out, _ = _plan(server, capsys, spec)
    assert code == 2 and "submission would refuse it" in out and "at most 16" in out


def test_plan_of_a_bad_file_or_an_existing_job_is_a_clear_error(
        live: tuple[CellStateServer, CellStore, KV], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server, _, _ = live
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"id": "filler", "scheduler": "batch",
                                "task_resources": {"cpu": 1}}))
    code, _, err = _plan(server, capsys, spec)
    assert code == 2 and "job filler is already in the cell" in err
    spec.write_text("{nope")
    code, _, err = _plan(server, capsys, spec)
    assert code == 2 and "not valid JSON" in err


def test_plan_says_what_it_would_evict(live: tuple[CellStateServer, CellStore, KV],
                                       tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    server, store, kv = live
    spec = tmp_path / "web.json"
    spec.write_text(json.dumps({"id": "web", "scheduler": "service", "kind": "service",
                                "task_count": 2, "precedence": 5,
                                "task_resources": {"cpu": 3, "mem": 1}}))
    before = kv.range(b"\x00", b"\xff").revision
    code, text, _ = _plan(server, capsys, spec)
    assert code == 0, text
    assert "would place 2 of 2 task(s)" in text
    (evicts,) = [x for x in text.splitlines() if x.startswith("  would evict ")]
    assert re.fullmatch(r"  would evict \d+: filler/\d+(, filler/\d+)*", evicts), evicts
    code, out, _ = _plan(server, capsys, spec, "--json")
    doc = json.loads(out)
    assert doc["evicted"] and all(t.startswith("filler/") for t in doc["evicted"])
    assert {e for p in doc["placed"] for e in p["evict"]} == set(doc["evicted"])
    assert kv.range(b"\x00", b"\xff").revision == before  # nothing was written
    snap = store.read_snapshot()
    assert "web" not in snap.jobs and all(
        snap.machines[f"m{i}"].allocations for i in range(3))  # the filler still runs

"""Several OS processes commit conflicting claims to the same machines through one etcd;
afterwards what etcd holds must satisfy every invariant and match what each process was
told it committed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cellstate.cell import task_view
from cellstate.invariants import violations
from cellstate.kv.base import KV
from cellstate.model import TaskState
from schedulers.testing import job, machine, make_cell
from tests.etcd_fixture import EtcdServer

pytestmark = pytest.mark.etcd

PROCS = [
    # scheduler, job, precedence, mode, detection
    ("batch", "b1", 1, "incremental", "fine"),
    ("batch", "b2", 1, "incremental", "fine"),
    ("gangs", "g1", 2, "gang", "coarse"),
    ("svc", "s1", 5, "incremental", "coarse"),
    ("svc", "s2", 5, "gang", "fine"),
]


def test_concurrent_processes_never_overcommit(
    etcd_kv: KV, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    cell = "conc"
    store = make_cell(
        etcd_kv,
        [machine(f"m{i}", cpu=4, mem=64) for i in range(6)],
        [job(j, tasks=30, cpu=1 + (p % 2), mem=1, scheduler=s, precedence=p)
         for s, j, p, _, _ in PROCS],
        cell=cell,
    )
    procs = []
    try:
        for n, (s, j, _, mode, det) in enumerate(PROCS):
            out = tmp_path / f"{j}.json"
            procs.append((j, out, subprocess.Popen(
                [sys.executable, "-m", "tests.integration.committer_proc", etcd_server.endpoint,
                 cell, s, j, str(n), "60", mode, det, str(out)],
            )))
        for _, _, p in procs:
            assert p.wait(timeout=240) == 0
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    snap = store.read_snapshot()
    assert violations(snap) == []
    reports = {j: json.loads(out.read_text()) for j, out, _ in procs}
    all_evicted = Counter(t for r in reports.values() for t in r["evicted"])
    total_conflicts = sum(r["conflicts"] for r in reports.values())
    assert total_conflicts > 0, "the workload was meant to conflict"
    for j, r in reports.items():
        running = {f"{j}/{i}" for i in range(30)
                   if task_view(snap, f"{j}/{i}").state is TaskState.RUNNING}
        placements = Counter(r["committed"])
        ended = Counter(r["released"]) + Counter(t for t in all_evicted.elements()
                                                  if t.startswith(f"{j}/"))
        # Each running task was committed once more than it ended; nothing else runs.
        expected = {t for t in placements if placements[t] - ended[t] == 1}
        assert running == expected, j
        assert all(placements[t] - ended[t] in (0, 1) for t in placements), j

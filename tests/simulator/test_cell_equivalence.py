"""SimCell gives the same commit results as CellStore over MemoryKV.

The same random sequence of transactions (incremental and gang, fine and coarse,
claims seen on fresh or stale snapshots, tasks placed twice, machines that are full)
and task releases is applied to both; every commit result and the cell afterwards
must agree claim by claim."""

from __future__ import annotations

import random

import pytest

from cellstate.cell import CellSnapshot, task_view
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, Detection, TaskState, Transaction, TxnMode
from cellstate.store import CellStore
from schedulers.testing import job, machine, make_cell
from simulator.cell import SimCell

MACHINES = [machine(f"m{i}", cpu=2, mem=8) for i in range(4)]
JOBS = [job(f"j{i}", tasks=4, cpu=1, mem=1, scheduler="a" if i % 2 else "b")
        for i in range(8)]


def _cells() -> tuple[CellStore, SimCell]:
    store = make_cell(MemoryKV(), MACHINES, JOBS)
    sim = SimCell()
    sim.add_machines(MACHINES)
    for j in JOBS:
        sim.submit_job(j)
    return store, sim


def _outcome(snap: CellSnapshot) -> tuple[dict[str, list[str]], dict[str, TaskState]]:
    allocs = {mid: sorted(m.allocations) for mid, m in snap.machines.items()}
    states = {f"{j.id}/{i}": task_view(snap, f"{j.id}/{i}").state for j in JOBS
              for i in range(j.task_count)}
    return allocs, states


@pytest.mark.parametrize("mode", list(TxnMode))
@pytest.mark.parametrize("detection", list(Detection))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_commit_results(mode: TxnMode, detection: Detection, seed: int) -> None:
    rng = random.Random(seed)
    store, sim = _cells()
    # Each side's snapshots, newest last; a claim may be made on an older one, as a
    # scheduler deciding slowly would.
    seen: list[tuple[CellSnapshot, CellSnapshot]] = [(store.read_snapshot(), sim.snapshot())]
    for _ in range(60):
        if rng.random() < 0.25:
            running = [t for t, s in _outcome(sim.snapshot())[1].items()
                       if s is TaskState.RUNNING]
            if running:
                tid = rng.choice(sorted(running))
                store.release_task(tid, TaskState.FINISHED)
                assert sim.release_tasks([tid]) == [tid]
        else:
            j = rng.choice(JOBS)
            tasks = rng.sample(range(j.task_count), rng.randint(1, 3))
            mids = [rng.choice(MACHINES).id for _ in tasks]
            old_store, old_sim = seen[-rng.randint(1, min(3, len(seen)))]
            results = []
            for snap, target in ((old_store, store), (old_sim, sim)):
                claims = tuple(Claim(j.id, i, mid, snap.machines[mid].seq)
                               for i, mid in zip(tasks, mids, strict=True))
                txn = Transaction(j.scheduler, claims, mode, detection, job=j.id)
                results.append(target.commit(txn))
            a, b = results
            assert [c.task for c in a.committed] == [c.task for c in b.committed]
            assert [(r.claim.task, r.reason) for r in a.rejected] == [
                (r.claim.task, r.reason) for r in b.rejected]
        seen.append((store.read_snapshot(), sim.snapshot()))
        assert _outcome(seen[-1][0]) == _outcome(seen[-1][1])


def test_an_end_event_of_an_earlier_placement_releases_nothing() -> None:
    """A task preempted and placed again must not be ended by its first placement's
    end event (the simulator passes the revision the task was placed at)."""
    _, sim = _cells()
    first = sim.commit(Transaction("a", (Claim("j1", 0, "m0"),), job="j1"))
    assert sim.release_tasks(["j1/0"], placed_at=first.revision - 1) == []
    assert sim.release_tasks(["j1/0"], placed_at=first.revision) == ["j1/0"]
    assert sim.release_tasks(["j1/0"]) == []  # finished already

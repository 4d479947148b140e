"""The load spread without a scan of every machine per sample.

``SimCell`` keeps how many machines are at each CPU share as machines are written,
and ``Recorder.spread_counts`` computes the spread from those counts. Outputs must stay
byte-identical to the scan over every machine with ``statistics``, so both are checked
exactly (==, not approx): the counts against a scan after random writes of every
kind that touches a machine, the figures against ``statistics.fmean`` and
``statistics.pstdev``."""

from __future__ import annotations

import random
import statistics
from collections import Counter

from hypothesis import given, settings, strategies as st

from cellstate.cell import machine_used
from cellstate.model import Claim, MachineState, Resources, TaskState, Transaction
from schedulers.testing import job, machine
from simulator.cell import SimCell
from simulator.recorder import Recorder

VALUES = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 1 / 3, 2 / 3]),
                   st.floats(min_value=0.0, max_value=1.5, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=60))
def test_spread_from_counts_is_exactly_the_statistics_of_the_values(used: list[float]) -> None:
    rec = Recorder(100.0, 100.0)
    rec.spread_counts(1.0, Counter(used))
    mean = statistics.fmean(used)
    if mean <= 0:
        assert rec.placements.spread_cv == []
        return
    assert rec.placements.spread_cv == [statistics.pstdev(used, mean) / mean]
    assert rec.placements.spread_max == [max(used) / mean]


def test_counts_of_zero_machines_and_before_the_warmup_add_no_sample() -> None:
    rec = Recorder(100.0, 100.0, warmup=10.0)
    rec.spread_counts(5.0, Counter([0.5, 1.0]))
    rec.spread_counts(20.0, Counter({0.5: 0}))
    rec.spread_counts(30.0, Counter())
    assert rec.placements.spread_cv == []


def _scan(cell: SimCell) -> Counter[float]:
    snap = cell.snapshot()
    return Counter(machine_used(m, snap.gangs).get("cpu") / cap
                   for m in snap.machines.values() if (cap := m.capacity.get("cpu")) > 0)


def test_the_cells_share_counts_follow_every_machine_write() -> None:
    rng = random.Random(7)
    cell = SimCell()
    cell.add_machines([machine(f"m{i}", cpu=rng.choice([0, 2, 3, 4]), mem=8)
                       for i in range(12)])
    assert cell.cpu_share_counts() == _scan(cell)
    running: list[str] = []
    placed = released = 0
    for step in range(200):
        what = rng.random()
        if what < 0.5:
            j = job(f"j{step}", tasks=3, cpu=rng.choice([0.5, 1, 1.5]), mem=1)
            cell.submit_job(j)
            claims = tuple(Claim(j.id, i, f"m{rng.randrange(12)}") for i in range(3))
            res = cell.commit(Transaction(j.scheduler, claims, job=j.id))
            running += [c.task for c in res.committed]
            placed += len(res.committed)
        elif what < 0.8 and running:
            ended = rng.sample(running, min(len(running), rng.randrange(1, 4)))
            released += len(cell.release_tasks(ended, TaskState.FINISHED))
            running = [t for t in running if t not in ended]
        elif what < 0.9:
            mid = f"m{rng.randrange(12)}"
            if mid in cell.snapshot().machines:
                cell.update_machine(mid, capacity=Resources.of(cpu=rng.choice([0, 4, 6]),
                                                               mem=8))
        else:
            mid = f"m{rng.randrange(12)}"
            m = cell.snapshot().machines.get(mid)
            if m is not None and not m.allocations:
                cell.remove_machine(mid)
            elif m is not None:
                cell.update_machine(mid, state=MachineState.DRAINING)
        assert cell.cpu_share_counts() == _scan(cell), step
    assert placed > 50 and released > 50  # the sequence did exercise the counts

"""A round's victim search reuses what it found before (schedulers.fair.victims.RoundMemo):
after any sequence of preemptions and placements within a round, and at any threshold
and precedence, it finds exactly the victims a search from scratch finds."""

from __future__ import annotations

import random

from cellstate.model import split_task_id
from schedulers.api import CellView
from schedulers.fair.shares import OrderKey, read_shares, task_order
from schedulers.fair.victims import RoundMemo, eligible
from schedulers.testing import Harness, claims, machine, txn
from tests.test_fair_policy import fair_job

USERS = ("ann", "ben", "cat")


def _cell(rng: random.Random) -> Harness:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, mem=32) for i in range(6)])
    jobs = []
    for n in range(12):
        gang = n % 4 == 3  # some gangs: their members decide together
        jobs.append(fair_job(f"j{n}", USERS[n % 3], rng.randint(2, 4), gang=gang,
                             priority=rng.randrange(2), precedence=rng.choice([0, 0, 3]),
                             at=float(n + 1)))
    h.submit(jobs)
    free = {f"m{i}": 8 for i in range(6)}
    for job in jobs:
        where = []
        for i in range(job.task_count):
            mid = rng.choice([m for m, left in free.items() if left])
            free[mid] -= 1
            where.append((i, mid))
        assert h.admin.commit(txn(claims(h.snapshot(), job.id, where), scheduler="fair",
                                  gang=job.gang)).ok
    return h


def test_the_rounds_memo_finds_what_a_fresh_search_finds() -> None:
    found = searches = 0
    for seed in range(10):
        rng = random.Random(seed)
        h = _cell(rng)
        view = CellView(h.snapshot(), "fair")
        shares = read_shares(view, "fair", {"ben": 2.0})
        young = frozenset(t for t in shares.where if rng.random() < 0.15)

        def old_enough(task: str, young: frozenset[str] = young) -> bool:
            return task not in young

        memo = RoundMemo(view, shares, old_enough)
        book = shares.book
        gone: dict[str, tuple[str, OrderKey, str]] = {}
        threshold = 0.0
        for _ in range(120):
            r = rng.random()
            running = sorted(shares.where)
            if r < 0.25 and running:  # a victim preempted
                task = rng.choice(running)
                jid, index = split_task_id(task)
                job = view.jobs[jid]
                # read_shares without start times counts every running task as started at 0
                gone[task] = (job.owner, task_order(job, index, 0.0), shares.where.pop(task))
                book.remove(task)
            elif r < 0.35 and gone:  # a gang that did not fit: its victims come back
                task = rng.choice(sorted(gone))
                owner, key, mid = gone.pop(task)
                book.add(owner, key, task, view.jobs[split_task_id(task)[0]].task_resources)
                shares.where[task] = mid
            else:
                # Thresholds mostly rise within a round (the waiting tasks come lowest
                # CRS first) but may fall back.
                threshold = (rng.random() * 0.15 if rng.random() < 0.15
                             else threshold + rng.random() * 0.01)
                precedence = rng.choice([0, 3, 5])
                got = eligible(view, shares, precedence, threshold, old_enough, memo)
                want = eligible(view, shares, precedence, threshold, old_enough)
                assert got == want, (seed, threshold, precedence)
                found += bool(got[0])
                searches += 1
    assert found > searches / 2  # most searches find victims: the test compares something

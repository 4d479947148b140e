"""The share book keeps its cumulative sums up to date across changes: after any
sequence of additions and removals, every CRS is what a book built afresh from the
same tasks gives."""

from __future__ import annotations

import random

from cellstate.model import Resources
from schedulers.fair.shares import OrderKey, ShareBook

TOTALS = Resources.of(cpu=64, mem=256)


def fresh(tasks: dict[str, tuple[str, OrderKey, Resources]]) -> ShareBook:
    book = ShareBook(TOTALS, {"u1": 2.0})
    for task, (user, key, need) in sorted(tasks.items()):
        book.add(user, key, task, need)
    return book


def test_crs_after_changes_equals_a_fresh_book() -> None:
    rng = random.Random(5)
    book = ShareBook(TOTALS, {"u1": 2.0})
    tasks: dict[str, tuple[str, OrderKey, Resources]] = {}
    for step in range(400):
        if tasks and rng.random() < 0.4:
            victim = rng.choice(sorted(tasks))
            book.remove(victim)
            del tasks[victim]
        else:
            user = rng.choice(["u0", "u1", "u2"])
            key = (-rng.randrange(3), float(rng.randrange(50)), 0.0, f"j{step}", 0)
            need = Resources.of(cpu=rng.choice([1, 2]), mem=rng.choice([1, 8]))
            book.add(user, key, f"j{step}/0", need)
            tasks[f"j{step}/0"] = (user, key, need)
        # Read some values between changes, so that partial sums are cached.
        probe = (-1, 25.0, 0.0, "probe", 0)
        ref = fresh(tasks)
        for user in ("u0", "u1", "u2"):
            need = Resources.of(cpu=1, mem=1)
            assert book.crs_waiting(user, probe, need) == ref.crs_waiting(user, probe, need)
            if step % 7 == 0:
                assert list(book.crs_of_all(user)) == list(ref.crs_of_all(user))
                assert book.share(user) == ref.share(user)
        if tasks and step % 5 == 0:
            t = rng.choice(sorted(tasks))
            assert book.crs(t) == ref.crs(t)

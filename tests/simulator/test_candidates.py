"""First fit's machine pool: the same random draws pick the same machines as a copied
list swap-removed in place (what first fit did before), and the list is not changed."""

from __future__ import annotations

import random

from schedulers.batch import Candidates


def test_draws_pick_what_a_swap_removed_copy_picks() -> None:
    ids = [f"m{i}" for i in range(50)]
    pool, copy = Candidates(ids), list(ids)
    rng_a, rng_b = random.Random(7), random.Random(7)
    picked_pool, picked_copy = [], []
    while copy:
        i = rng_a.randrange(len(pool))
        j = rng_b.randrange(len(copy))
        picked_pool.append(pool[i])
        picked_copy.append(copy[j])
        pool.drop(i)
        copy[j] = copy[-1]
        copy.pop()
        assert len(pool) == len(copy)
        assert [pool[k] for k in range(len(pool))] == copy
    assert picked_pool == picked_copy
    assert not pool
    assert ids == [f"m{i}" for i in range(50)]  # the shared list is untouched

"""The share view (``omega shares``) on a hand-made cell: what each user holds, their
weighted share, and what their next waiting task would do, computed by hand."""

from __future__ import annotations

from cellstate.model import JobState, JobStatus
from schedulers.fair.policy import FairConfig
from schedulers.fair.report import share_table
from schedulers.testing import Harness, claims, machine, txn
from tests.test_fair_policy import fair_job


def test_the_share_view_says_who_fits_who_preempts_and_who_waits() -> None:
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=4, mem=16), machine("m2", cpu=4, mem=16)])
    # alice holds 7 of the 8 cpus; bob 1. carol has nothing yet.
    h.submit([fair_job("a", "alice", 8), fair_job("b", "bob", 2), fair_job("c", "carol", 1)])
    snap = h.snapshot()
    placed = [(i, "m1" if i < 4 else "m2") for i in range(7)]
    assert h.admin.commit(txn(claims(snap, "a", placed), scheduler="fair")).ok
    assert h.admin.commit(txn(claims(h.snapshot(), "b", [(0, "m2")]), scheduler="fair")).ok
    config = FairConfig(weights={"bob": 2.0}, delta=0.05)
    rows = {r.user: r for r in share_table(h.snapshot(), "fair", config)}
    alice, bob, carol = rows["alice"], rows["bob"], rows["carol"]
    # Weights 1, 2 and 1 split the 8 cpus: alice is entitled to 2, bob 4, carol 2.
    assert (alice.tasks, alice.share, alice.waiting) == (7, 7 / 2, 1)
    assert alice.running == {"cpu": 7.0, "mem": 7.0}
    # alice's a/7 would have CRS 8/2; nobody runs above 4.05.
    assert (alice.next_task, alice.next_crs, alice.verdict) == ("a/7", 4.0, "waits")
    # bob at weight 2: his b/1 would have CRS 2/4 = 0.5; alice's a/6 (7/2) is the
    # highest above 0.55.
    assert (bob.weight, bob.share, bob.next_task, bob.next_crs) == (2.0, 0.25, "b/1", 0.5)
    assert bob.verdict == "preempts" and "a/6 (CRS 3.500)" in bob.detail
    assert (carol.tasks, carol.share, carol.next_crs, carol.verdict) == (0, 0.0, 0.5,
                                                                        "preempts")
    # Once a machine has room, the next task fits without preempting.
    h.admin.kill_job(JobStatus("b", JobState.KILLED, "done", "tester", h.clock()))
    rows = {r.user: r for r in share_table(h.snapshot(), "fair", FairConfig())}
    assert rows["carol"].verdict == "fits" and "bob" not in rows

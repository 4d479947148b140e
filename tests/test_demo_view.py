"""The demo's live view and closing line: labelled, and their sums hold."""

from __future__ import annotations

import re

from cellstate.model import CellConfig, Reason, Resources, SchedulerLimits
from omega.demoview import cell_line, done_line, instance_rows, totals
from omega.statusfmt import status_text
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig
from schedulers.testing import Harness, job, machine

STATUS = {
    "revision": 150, "machines_up": 298, "machines_down": 2,
    "capacity": {"cpu": 100.0, "mem": 400.0, "gpu": 0.0}, "used": {"cpu": 25.0, "mem": 100.0},
    "jobs": {"running": 3, "finished": 2, "pending": 1, "abandoned": 1},
    "tasks": {"running": 10, "finished": 7, "lost": 2, "preempted": 1, "pending": 5},
    "schedulers": [],
}
REPORTS = [
    {"scheduler": "batch", "instance": "b1", "tasks_placed": 12, "transactions": 8,
     "successful": 5, "conflicted": 2, "attempts_per_job": 1.5, "busyness": 0.125,
     "wait_mean_s": 0.25},
    {"scheduler": "batch", "instance": "b0", "tasks_placed": 9, "transactions": 2,
     "conflicted": 0},
]


def test_the_cell_line_labels_every_number_and_its_parts_add_up() -> None:
    t = totals(STATUS, REPORTS)
    line = cell_line(STATUS, t, now=0)
    jobs = re.search(r"jobs (\d+): running (\d+), finished (\d+), pending (\d+), "
                     r"abandoned (\d+) \|", line)
    assert jobs, line
    assert int(jobs.group(1)) == sum(map(int, jobs.groups()[1:])) == 7
    tasks = re.search(r"tasks placed (\d+): running (\d+), finished (\d+), lost (\d+), "
                      r"preempted (\d+); pending (\d+)", line)
    assert tasks, line
    assert int(tasks.group(1)) == sum(map(int, tasks.groups()[1:5])) == 20
    assert "machines up 298, down 2" in line and "used cpu 25.0%  mem 25.0%" in line
    assert re.match(r"\[\d\d:\d\d:\d\d rev 150\] ", line)


def test_the_instance_table_has_a_header_and_marks_instances_gone() -> None:
    header, b0, b1 = instance_rows(REPORTS, gone={("batch", "b0")})
    assert header.split() == ["scheduler", "placed", "txns", "conflicted", "conflict%",
                              "refused", "attempts/job", "busy%", "wait"]
    assert b0.split() == ["batch/b0", "(gone)", "9", "2", "0", "0", "0", "0.00", "0.0",
                          "0.00s"]
    # 8 transactions: 5 committed whole, 2 conflicted, so 1 refused (by a limit, say).
    assert b1.split() == ["batch/b1", "12", "8", "2", "25", "1", "1.50", "12.5", "0.25s"]
    # Columns line up: every row's numbers end where the header's labels do.
    assert len({len(r) for r in (header, b0, b1)}) == 1


def test_the_done_line_sums_hold_and_count_conflicts_of_every_instance() -> None:
    t = totals(STATUS, REPORTS)
    line = done_line(t, "0 flow rounds", "hold")
    assert line.startswith("done: 7 jobs (finished 2, running 3, pending 1, abandoned 1); "
                           "20 tasks placed (running 10, finished 7, failed 0, lost 2, "
                           "preempted 1, killed 0), 5 pending; 10 transactions, 2 conflicted "
                           "(20.0%), "
                           "1 refused (limits)")
    assert line.endswith("; 0 flow rounds; invariants hold")


def test_omega_status_counts_transactions_a_quota_turned_down() -> None:
    """Issue 15: "1739 txns (0 conflicted)" while the quota refused everything. A real
    instance's summary after its limit turned a claim down says so in omega status."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=1), machine("m1", cpu=1)])
    h.admin.set_config(CellConfig({"batch": SchedulerLimits(
        max_resources=Resources.of(cpu=2))}))
    inst = h.add(BatchPolicy(), config=RuntimeConfig(retry_delay=60, max_retry_delay=60))
    # Its own limit has room for both (it sends no claim past it, schedulers/limits.py),
    # but another instance of batch takes the last of it meanwhile: the store turns the
    # claim down at the limit, which is no conflict.
    h.committer(inst).reject_machines(["m1"], Reason.LIMIT_EXCEEDED, "past the limit",
                                      times=1)
    h.submit([job("j", tasks=2, cpu=1)])
    h.pump()
    inst.step()  # one claim committed, one turned down by the limit
    text = status_text({**STATUS, "server": "s", "agents": 1,
                        "schedulers": [inst.metrics_summary(h.clock())]})
    assert "  batch/0: 1 tasks placed, 1 txns (0 conflicted, 1 refused), " in text, text

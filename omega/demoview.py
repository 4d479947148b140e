"""The demo's live view and its closing totals, from the cell's status (``omega status
--json``'s document) and the scheduler instances' reports.

Every number is labelled, and the totals come from one source each: jobs and tasks by
state from the cell at one revision (so placed = running + finished + failed + lost +
preempted, always), transactions and conflicts from each instance's last report (kept
after an instance is gone, so a killed scheduler's work still counts).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from omega.statusfmt import refused

# A task that has a record was placed at least once; these are the states it can be in.
PLACED_STATES = ("running", "finished", "failed", "lost", "preempted", "killed")
INSTANCE_COLUMNS = ("scheduler", "placed", "txns", "conflicted", "conflict%", "refused",
                    "attempts/job", "busy%", "wait")


def instance_key(report: Mapping[str, Any]) -> tuple[str, str]:
    return str(report["scheduler"]), str(report["instance"])


@attrs.frozen
class Totals:
    """What the cell and its schedulers have done, with every sum stated."""

    jobs: dict[str, int]
    tasks: dict[str, int]
    transactions: int = 0
    conflicted: int = 0
    refused: int = 0  # turned down for another reason than a conflict (a limit, say)

    @property
    def jobs_total(self) -> int:
        return sum(self.jobs.values())

    @property
    def placed_states(self) -> dict[str, int]:
        return {s: self.tasks.get(s, 0) for s in PLACED_STATES}

    @property
    def tasks_placed(self) -> int:
        return sum(self.placed_states.values())

    @property
    def conflict_fraction(self) -> float:
        return self.conflicted / self.transactions if self.transactions else 0.0


def totals(status: Mapping[str, Any], reports: Iterable[Mapping[str, Any]]) -> Totals:
    reports = list(reports)
    return Totals(dict(status["jobs"]), dict(status["tasks"]),
                  sum(int(r.get("transactions", 0)) for r in reports),
                  sum(int(r.get("conflicted", 0)) for r in reports),
                  sum(refused(r) for r in reports))


def _states(counts: Mapping[str, int], shown: Iterable[str]) -> str:
    """``running 3, finished 1, ...``: the states ``shown`` always, then any other
    state that counts something."""
    shown = list(shown)
    rest = sorted(k for k, n in counts.items() if n and k not in shown)
    return ", ".join(f"{k} {counts.get(k, 0)}" for k in [*shown, *rest])


def cell_line(status: Mapping[str, Any], t: Totals, now: float | None = None) -> str:
    """``[12:00:03 rev 150] jobs 32: running 31, finished 1, pending 0 | tasks ...``"""
    clock = time.strftime("%H:%M:%S", time.localtime(time.time() if now is None else now))
    cap, used = status["capacity"], status["used"]
    util = "  ".join(f"{r} {100 * used.get(r, 0) / c:.1f}%" for r, c in sorted(cap.items())
                     if c and r in ("cpu", "mem"))
    return (f"[{clock} rev {status['revision']}] "
            f"jobs {t.jobs_total}: {_states(t.jobs, ('running', 'finished', 'pending'))} | "
            f"tasks placed {t.tasks_placed}: {_states(t.placed_states, ('running', 'finished'))}"
            f"; pending {t.tasks.get('pending', 0)} | "
            f"machines up {status['machines_up']}, down {status['machines_down']} | "
            f"used {util or 'nothing'}")


def instance_rows(reports: Iterable[Mapping[str, Any]], gone: set[tuple[str, str]]
                  ) -> list[str]:
    """A labelled table of the scheduler instances (those in ``gone`` marked so)."""
    rows = [list(INSTANCE_COLUMNS)]
    for r in sorted(reports, key=instance_key):
        name = "/".join(instance_key(r)) + (" (gone)" if instance_key(r) in gone else "")
        txns, conflicted = int(r.get("transactions", 0)), int(r.get("conflicted", 0))
        rows.append([name, str(r.get("tasks_placed", 0)), str(txns), str(conflicted),
                     f"{100 * conflicted / txns if txns else 0:.0f}", str(refused(r)),
                     f"{float(r.get('attempts_per_job', 0)):.2f}",
                     f"{100 * float(r.get('busyness', 0)):.1f}",
                     f"{float(r.get('wait_mean_s', 0)):.2f}s"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(INSTANCE_COLUMNS))]
    return ["    " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
            for row in rows]


def done_line(t: Totals, extras: str, verdict: str) -> str:
    """The closing summary; its sums hold by construction (see :class:`Totals`)."""
    return (f"done: {t.jobs_total} jobs ({_states(t.jobs, ('finished', 'running', 'pending'))}"
            f"); {t.tasks_placed} tasks placed ({_states(t.placed_states, PLACED_STATES)}), "
            f"{t.tasks.get('pending', 0)} pending; {t.transactions} transactions, "
            f"{t.conflicted} conflicted ({100 * t.conflict_fraction:.1f}%), {t.refused} "
            f"refused (limits); {extras}; invariants {verdict}")

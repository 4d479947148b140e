"""The batch scheduler: fast randomized first fit over the whole cell (Omega §4).

Pick a random candidate machine; if a task fits, place it there and keep the machine
as a candidate; otherwise drop the machine, counting the fit rule that kept the task
off. Stop when every pending task is placed or no candidate is left; in the latter case
every machine was dropped once, so the counts say why nothing fits ("0/300 machines
fit: 200 insufficient cpu, 100 selector mismatch") at no extra cost.

What fits nowhere free may take room on loan: it evicts the fewest opportunistic
tasks (a MapReduce job's extra workers, run on idle resources at a precedence below
any job's) that make room, so elastic growth never keeps batch work out.

Incremental transactions by default; a job that asks for gang scheduling is committed
as a gang by the runtime.

Option ``fallbacks`` (default 0, at most ``MAX_FALLBACKS``): each claim also names that
many other random machines that can host the task now, in the order drawn; when its
machine no longer fits at commit time (another scheduler got there first), the store
takes the first of them that does instead of rejecting the claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cellstate.fit import FitTally
from cellstate.model import MAX_FALLBACKS, Job
from schedulers.api import Context, Plan, Policy, Unplaced
from schedulers.placement import Reclaimer, can_host, impossible, why_not


class BatchPolicy(Policy):
    name = "batch"
    # First fit reads the cell as it is, never what changed (a subclass that does says
    # so: Policy.reads_changes).
    reads_changes = False

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if "fallbacks" in options:
            fallbacks_option(options["fallbacks"])  # a bad value fails at start-up

    def _fallbacks(self, ctx: Context) -> int:
        return fallbacks_option(self.options.get("fallbacks", ctx.options.get("fallbacks", 0)))

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        return first_fit(ctx, job, ctx.view.pending_tasks(job), self._fallbacks(ctx))


def first_fit(ctx: Context, job: Job, pending: list[int], alternatives: int = 0) -> Plan:
    """Randomized first fit of tasks ``pending`` of ``job`` (the batch policy's
    placement); what fits nowhere free then takes room held on loan by opportunistic
    tasks (``schedulers.placement.Reclaimer``), if there is some."""
    view = ctx.view
    if not pending:
        return Plan()
    candidates = Candidates(view.machine_id_list())
    claims = []
    tally = FitTally()
    while pending and candidates:
        i = ctx.rng.randrange(len(candidates))
        mid = candidates[i]
        m = view.machine(mid)
        if m is not None:
            miss = why_not(view, job, m)
            if miss is None:
                alts = (_alternatives(ctx, job, candidates, mid, alternatives)
                        if alternatives else ())
                claims.append(view.claim(job, pending.pop(0), mid, fallbacks=alts))
                continue
            tally.add(miss)
        candidates.drop(i)
    if pending:
        reclaimer = Reclaimer(view)
        while pending and (found := reclaimer.find(job, pending[0])) is not None:
            claims.append(view.claim(job, pending.pop(0), found[0], found[1]))
    if not pending:
        return Plan(tuple(claims))
    # Only now, when something did not fit, is it worth a pass over the whole cell
    # to tell "not now" from "never".
    why = impossible(view, job) if not claims else None
    if why is not None:
        return Plan(unplaced=(Unplaced(job.id, why, len(pending), permanent=True),))
    report = tally.report()
    return Plan(tuple(claims), (Unplaced(
        job.id, f"no machine has room for {len(pending)} more task(s) now: {report}",
        len(pending), fit=report),))


class Candidates:
    """The machines not dropped yet, for random picks: ``ids`` (not changed) with the
    swap-removes kept apart, so a decision does not copy the list of every machine.
    Position ``i`` reads as it would in a copy that was swap-removed the same way, so
    the same random draws pick the same machines."""

    __slots__ = ("_ids", "_moved", "_n")

    def __init__(self, ids: Sequence[str]) -> None:
        self._ids = ids
        self._moved: dict[int, str] = {}
        self._n = len(ids)

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __getitem__(self, i: int) -> str:
        moved = self._moved.get(i)
        return self._ids[i] if moved is None else moved

    def drop(self, i: int) -> None:
        """Swap-remove position ``i``: O(1), and the order of the rest does not matter
        (random picks)."""
        last = self._n - 1
        self._moved[i] = self[last]
        self._n = last


def fallbacks_option(raw: object) -> int:
    n = int(raw) if isinstance(raw, int | str) and str(raw).isdigit() else -1
    if not 0 <= n <= MAX_FALLBACKS:
        raise ValueError(f"batch policy: option fallbacks must be a whole number from 0 "
                         f"to {MAX_FALLBACKS}, got {raw!r}")
    return n


def _alternatives(ctx: Context, job: Job, candidates: Candidates, mid: str, n: int
                  ) -> list[str]:
    """Up to ``n`` other random candidates that can host a task of ``job`` now. A few
    draws each: a busy cell may offer fewer (the claim then names fewer)."""
    view, rng = ctx.view, ctx.rng
    out: list[str] = []
    for _ in range(4 * n):
        if len(out) == n or len(candidates) <= len(out) + 1:
            break
        alt = candidates[rng.randrange(len(candidates))]
        if alt == mid or alt in out:
            continue
        m = view.machine(alt)
        if m is not None and can_host(view, job, m):
            out.append(alt)
    return out

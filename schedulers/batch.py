"""The batch scheduler: fast randomized first fit over the whole cell (Omega §4).

Pick a random candidate machine; if a task fits, place it there and keep the machine
as a candidate; otherwise drop the machine, counting the fit rule that kept the task
off. Stop when every pending task is placed or no candidate is left; in the latter case
every machine was dropped once, so the counts say why nothing fits ("0/300 machines
fit: 200 insufficient cpu, 100 selector mismatch") at no extra cost.

Incremental transactions by default; a job that asks for gang scheduling is committed
as a gang by the runtime.
"""

from __future__ import annotations

from cellstate.fit import FitTally
from cellstate.model import Job
from schedulers.api import Context, Plan, Policy, Unplaced
from schedulers.placement import impossible, why_not


class BatchPolicy(Policy):
    name = "batch"

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        view = ctx.view
        pending = view.pending_tasks(job)
        if not pending:
            return Plan()
        candidates = view.machine_ids()
        claims = []
        tally = FitTally()
        while pending and candidates:
            i = ctx.rng.randrange(len(candidates))
            mid = candidates[i]
            m = view.machine(mid)
            if m is not None:
                miss = why_not(view, job, m)
                if miss is None:
                    claims.append(view.claim(job, pending.pop(0), mid))
                    continue
                tally.add(miss)
            # Swap-remove: O(1) and the order of the rest does not matter (random picks).
            candidates[i] = candidates[-1]
            candidates.pop()
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

"""A scheduling policy for omega-cell: each task to the machine with the most free
capacity (CPU unless the ``dimension`` option names another), which spreads load."""

from __future__ import annotations

from cellstate.model import Claim, Job
from schedulers.api import Context, Plan, Policy, Unplaced
from schedulers.placement import hosts, impossible


class LeastLoaded(Policy):
    """Spread load: each task to the machine with the most free ``dimension``."""

    name = "least-loaded"

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        view = ctx.view
        dimension = str(self.options.get("dimension", "cpu"))
        pending = view.pending_tasks(job)
        why = impossible(view, job)
        if why is not None:  # no state of the cell would ever fit it: give up now
            return Plan(unplaced=(Unplaced(job.id, why, len(pending), permanent=True),))
        claims: list[Claim] = []
        for index in pending:
            fitting, report = hosts(view, job)
            if not fitting:  # full for now: the runtime retries later
                left = len(pending) - len(claims)
                why = f"{left} task(s) fit nowhere: {report}"
                return Plan(tuple(claims), (Unplaced(job.id, why, left, fit=report),))
            # The view counts this decision's earlier claims, so each choice sees them.
            best = max(fitting, key=lambda m: (view.free(m.id).get(dimension), m.id))
            claims.append(view.claim(job, index, best.id))
        return Plan(tuple(claims))

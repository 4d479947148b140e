"""Small real policies, one per plugin style the interface must serve."""

from __future__ import annotations

from collections.abc import Sequence

from cellstate.cell import alloc_placed
from cellstate.model import Claim, Job, sum_resources
from schedulers.api import Context, Plan, Policy, Unplaced
from schedulers.placement import can_host


class PrecedenceFirst(Policy):
    """Style 2: decides for every due job at once. Highest precedence first; a task
    that fits nowhere may preempt the lowest-precedence tasks of one machine."""

    name = "precedence-first"

    def schedule_jobs(self, ctx: Context, jobs: Sequence[Job]) -> Plan:
        view = ctx.view
        unplaced = []
        for job in sorted(jobs, key=lambda j: (-j.precedence, j.submitted_at, j.id)):
            left = 0
            for index in view.pending_tasks(job):
                home = next((m for m in view.machines() if can_host(view, job, m)), None)
                if home is not None:
                    view.claim(job, index, home.id)
                    continue
                victim_plan = self._preempt(ctx, job)
                if victim_plan is None:
                    left += 1
                else:
                    view.claim(job, index, victim_plan[0], victim_plan[1])
            if left:
                unplaced.append(Unplaced(job.id, f"{left} task(s) fit nowhere", left))
        return Plan(view.claims, tuple(unplaced))

    @staticmethod
    def _preempt(ctx: Context, job: Job) -> tuple[str, list[str]] | None:
        view = ctx.view
        for m in view.machines():
            low = sorted((a for a in m.allocations.values()
                          if a.precedence < job.precedence and alloc_placed(a, view.gangs)),
                         key=lambda a: a.precedence)
            chosen = []
            for a in low:
                chosen.append(a)
                freed = sum_resources(v.resources for v in chosen)
                if view.fits(m.id, job.task_resources, freed):
                    return m.id, [v.task for v in chosen]
        return None


class ElasticGrower(Policy):
    """Style 3: no new job needed. Every ``propose_interval`` seconds it grows running
    jobs labelled ``elastic_max`` towards that many tasks while the cell's CPU
    utilization is below ``cap`` (Omega §6's global-cap policy, much simplified)."""

    name = "elastic"
    propose_interval = 5.0

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        view = ctx.view
        claims: list[Claim] = []
        for index in view.pending_tasks(job):
            m = next((m for m in view.machines() if can_host(view, job, m)), None)
            if m is None:
                return Plan(tuple(claims), (Unplaced(job.id, "cell is full"),))
            claims.append(view.claim(job, index, m.id))
        return Plan(tuple(claims))

    def propose(self, ctx: Context) -> Plan:
        view = ctx.view
        cap = float(self.options.get("cap", 0.6))
        total = sum(m.capacity.get("cpu") for m in view.machines())
        used = sum(view.used(m.id).get("cpu") for m in view.machines())
        resize = {}
        for job in view.jobs.values():
            target = dict(job.labels).get("elastic_max")
            if job.scheduler != ctx.scheduler or target is None or job.task_count >= int(target):
                continue
            room = int((cap * total - used) // max(job.task_resources.get("cpu"), 1e-9))
            if room > 0:
                resize[job.id] = min(int(target), job.task_count + room)
                used += (resize[job.id] - job.task_count) * job.task_resources.get("cpu")
        return Plan(resize=resize)

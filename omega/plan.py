"""``omega plan JOBFILE``: what a job would get now, without writing anything.

The dry run of ``nomad job plan`` and ``kubectl --dry-run=server``: read the cell at
one revision (the sync stream's snapshot), add the job to that copy, run its
scheduler's policy on it exactly as the runtime would, and hand the claims to the
store's judge (``cellstate.validation.validate``), which decides them as a commit
would on that revision. Nothing is committed: the decision is only read. On a cell
that has not changed since, committing the same transaction does the same (the judge
is the store's; tests/test_plan.py checks both).

The policy is the job's scheduler's (its registered name, or the policy the cell
recorded when that scheduler last ran), made with default options unless
``--policy``/``--option`` say otherwise; a policy with randomness (batch's random
first fit) may choose other machines than the running scheduler would.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from cellstate.admission import Blocker, blockers, refusal
from cellstate.cell import CellSnapshot
from cellstate.model import Detection, Job, Transaction, TxnMode
from cellstate.validation import Decision, validate
from schedulers.api import CellView, Context, Policy, Unplaced


@attrs.frozen
class PlanOutcome:
    """What the job would get at ``revision``: ``decision`` is the judge's verdict on
    ``txn`` (None when the policy made no claim), ``unplaced`` the policy's reasons
    for what it left, ``refused`` what submission would say (then nothing else is
    planned), ``blockers`` the cell's own reasons."""

    job: Job
    scheduler: str
    policy: str
    revision: int
    txn: Transaction | None
    decision: Decision | None
    unplaced: tuple[Unplaced, ...]
    refused: str | None
    blockers: tuple[Blocker, ...]


def plan_job(snap: CellSnapshot, job: Job, policy: Policy, rng: random.Random,
             now: float, mode: TxnMode = TxnMode.INCREMENTAL) -> PlanOutcome:
    """Plan ``job`` (not yet in the cell) on ``snap``: pure, writes nothing."""
    scheduler = job.scheduler
    found = tuple(blockers(snap, job))
    refused = refusal(snap, job)
    if refused is not None:
        return PlanOutcome(job, scheduler, policy.name, snap.revision, None, None, (),
                           refused, found)
    cell = attrs.evolve(snap, jobs=snap.jobs.set(job.id, job))
    ctx = Context(CellView(cell, scheduler), now, rng, scheduler, "plan", policy.options)
    plan = (policy.schedule_jobs(ctx, [job]) if policy.batches_jobs()
            else policy.schedule_job(ctx, job))
    claims = tuple(c for c in plan.claims if c.job == job.id)
    unplaced = tuple(u for u in plan.unplaced if u.job == job.id)
    if not claims:
        return PlanOutcome(job, scheduler, policy.name, snap.revision, None, None, unplaced,
                           None, found)
    # As the runtime commits it (schedulers/runtime.py, _commit).
    txn = Transaction(scheduler, claims, TxnMode.GANG if job.gang else mode,
                      job.detection or Detection.FINE, job=job.id)
    return PlanOutcome(job, scheduler, policy.name, snap.revision, txn, validate(cell, txn),
                       unplaced, None, found)


def outcome_doc(o: PlanOutcome) -> dict[str, Any]:
    d = o.decision
    placed = [{"task": c.task, "machine": c.machine, "evict": list(c.evict),
               **({"moves_from": c.moves_from} if c.moves_from else {})}
              for c in (d.accepted if d is not None else ())]
    rejected = [{"task": r.claim.task, "machine": r.claim.machine, "reason": r.reason.value,
                 "detail": r.detail} for r in (d.rejected if d is not None else ())]
    return {
        "job": o.job.id, "scheduler": o.scheduler, "policy": o.policy,
        "revision": o.revision, "written": False, "refused": o.refused,
        "tasks": o.job.task_count, "placed": placed,
        "evicted": list(d.evicted) if d is not None else [],
        "pending": o.job.task_count - len(placed),
        "unplaced": [{"reason": u.reason, "tasks": u.tasks, "permanent": u.permanent}
                     for u in o.unplaced],
        "rejected": rejected, "cell": [b.to_doc() for b in o.blockers],
    }


def outcome_text(o: PlanOutcome) -> str:
    doc = outcome_doc(o)
    head = (f"plan for job {o.job.id} ({o.scheduler}, policy {o.policy}) at revision "
            f"{o.revision}; nothing was written")
    if o.refused:
        return f"{head}\n  submission would refuse it: {o.refused}"
    lines = [head, f"  would place {len(doc['placed'])} of {o.job.task_count} task(s)"]
    by_machine: dict[str, list[str]] = {}
    for p in doc["placed"]:
        by_machine.setdefault(p["machine"], []).append(p["task"])
    for mid, tasks in sorted(by_machine.items()):
        lines.append(f"    {mid}: {', '.join(tasks)}")
    if doc["evicted"]:
        lines.append(f"  would evict {len(doc['evicted'])}: {', '.join(doc['evicted'])}")
    if doc["pending"]:
        lines.append(f"  would leave {doc['pending']} pending:")
        lines.extend(f"    {u['reason']}" for u in doc["unplaced"])
        lines.extend(f"    store: {r['task']} on {r['machine']}: {r['reason']}: {r['detail']}"
                     for r in doc["rejected"])
        lines.extend(f"    cell: {b['text']}" for b in doc["cell"])
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------


def register(sub: Any, cellstate_flag: Callable[[argparse.ArgumentParser], None],
             option: Callable[[str], tuple[str, Any]],
             options_from_flags: Callable[[Any], dict[str, Any]]) -> None:
    """Add ``plan``, with the command line's own ``--cellstate`` and ``--option``
    (handed over: omega/cli.py imports this module)."""

    p = sub.add_parser(
        "plan", help="what a job would get now from its scheduler, without writing anything",
        description="Run the job's scheduler policy on a snapshot of the cell and validate "
                    "its claims with the store's judge, without committing: which machines, "
                    "what it would evict, what would stay pending and why.")
    cellstate_flag(p)
    p.add_argument("file", metavar="JOBFILE",
                   help="job spec (JSON or TOML, as omega submit --file; one job)")
    p.add_argument("--policy", help="the registered policy to run (default: the one the "
                                     "job's scheduler ran, else its name)")
    p.add_argument("--option", action="append", type=option, default=[], metavar="KEY=VALUE",
                   help="an option of the policy (as omega scheduler --option)")
    p.add_argument("--seed", type=int, help="random seed of the policy (default: random)")
    p.add_argument("--cell", default="default", help="cell name (default 'default')")
    p.set_defaults(func=lambda args: run(args, options_from_flags))


def run(args: argparse.Namespace, options_from_flags: Callable[[Any], dict[str, Any]]) -> int:
    from cellstate import codec
    from cellstate.api.client import remote_replica
    from omega.cliglobal import BAD_INPUT, cell_client, emit
    from omega.jobfile import load_job_file
    from schedulers.registry import Registry, UnknownSchedulerError

    docs = load_job_file(Path(args.file))
    if len(docs) != 1:
        raise ValueError(f"{args.file}: plan takes one job, the file has {len(docs)}")
    job = codec.parse_job(docs[0], "job")
    job = attrs.evolve(job, submitted_at=job.submitted_at or time.time())
    with cell_client(args) as client:
        replica = remote_replica(client, args.cell)
        replica.load()
        snap = replica.snapshot()
    if job.id in snap.jobs:
        raise ValueError(f"job {job.id} is already in the cell; plan a new id (omega why "
                         f"{job.id} says why it waits)")
    record = snap.schedulers.get(job.scheduler)
    name = args.policy or (record.policy if record is not None and record.policy else
                           job.scheduler)
    try:
        policy = Registry.from_entry_points().create(name, **options_from_flags(args.option))
    except UnknownSchedulerError as e:
        raise ValueError(f"{e}; name one with --policy") from None
    rng = random.Random(args.seed) if args.seed is not None else random.Random()
    outcome = plan_job(snap, job, policy, rng, time.time())
    emit(args, outcome_doc(outcome), outcome_text(outcome))
    return BAD_INPUT if outcome.refused else 0

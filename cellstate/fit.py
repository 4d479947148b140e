"""The fit rules: whether one more task of a job may go on a machine.

Written once, used by the store's validation (``cellstate/validation.py``, the judge)
and by every policy (``schedulers/placement.py``), so a policy proposes exactly the
claims the store would accept on the same data. Two copies drift: Nomad runs one
``AllocsFit`` in both its scheduler and its plan applier, and its issue #9506 shows
what happened while they differed.

Each rule is a small pure function of the machine, the job, the allocations that hold
the machine and the victims that leave it. It returns None when the rule passes, or a
:class:`Misfit`: the rule, the store's reason, a detail for people and, for resources,
the dimension. :func:`misfit` runs them in the store's order (the first that fails
names the reason):

1. the machine is up (not draining or down)                -> machine_down
2. the machine's labels match the job's selector            -> constraint_violated
3. tasks per machine, anti-affinity both ways, affinity     -> constraint_violated
   (a claim that *founds* an affinity group meets its affinity: see
   :func:`self_affine`)
4. the task fits, in every dimension, in what is free once
   the victims leave                                         -> insufficient_resources

and one rule of the scheduler rather than the machine, :func:`quota`: one more task
keeps a resource-limited scheduler within its limit (Omega §3.4)   -> limit_exceeded.
The store applies it to what the scheduler holds within its decision, the runtime to
the usage it last saw plus what it has committed since (``schedulers/limits.py``), and
the admission report (why a job waits) to the same.

The neighbour rules (3) are skipped when neither the job nor any job already on the
machine has such a rule: the common case, and the commit hot path.

A :class:`FitTally` counts, as a policy scans machines, how many each rule excluded, so
a task that fits nowhere says why: "0/300 machines fit: 200 insufficient cpu, 100
selector mismatch" (kube-scheduler's "0/N nodes are available" message).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import attrs

from cellstate.cell import holding, machine_used
from cellstate.model import (
    Allocation,
    GangRecord,
    Job,
    Machine,
    MachineState,
    Reason,
    Resources,
    selector_matches_labels,
    sum_resources,
)

# Enum members as globals on hot paths (why: cellstate/validation.py).
_UP = MachineState.UP


class Rule(enum.Enum):
    MACHINE_STATE = "machine_state"
    SELECTOR = "selector"
    MAX_PER_MACHINE = "max_per_machine"
    ANTI_AFFINITY = "anti_affinity"
    AFFINITY = "affinity"
    RESOURCES = "resources"
    QUOTA = "quota"


_RESOURCES = Rule.RESOURCES  # as a global: see _UP


_NOTHING = Resources()
_SHORT: dict[str, str] = {}  # dimension -> its label, made once (a tally hashes it)
_REASONS = {Rule.MACHINE_STATE: Reason.MACHINE_DOWN, Rule.RESOURCES: Reason.INSUFFICIENT_RESOURCES,
            Rule.QUOTA: Reason.LIMIT_EXCEEDED}


class Misfit(NamedTuple):
    """Why a machine cannot take one more task of a job.

    ``label`` is what a tally counts the machine under ("insufficient cpu", "selector
    mismatch"); ``detail`` names the machine, the job and the numbers. A scan builds
    one per machine it rejects, so the detail is formatted only when read, and this is
    a NamedTuple: half the cost of a frozen attrs class to build."""

    rule: Rule
    label: str
    template: str  # str.format template of the detail, over args
    args: tuple[object, ...]
    dimension: str = ""  # the resource that does not fit (Rule.RESOURCES only)

    @property
    def reason(self) -> Reason:
        return _REASONS.get(self.rule, Reason.CONSTRAINT_VIOLATED)

    @property
    def detail(self) -> str:
        return self.template.format(*self.args)


# -- the rules ------------------------------------------------------------------------


def machine_up(m: Machine) -> Misfit | None:
    if m.state is _UP:
        return None
    return Misfit(Rule.MACHINE_STATE, f"machine {m.state.value}", "machine {0!r} is {1}",
                  (m.id, m.state.value))


def selector(job: Job, m: Machine) -> Misfit | None:
    sel = job.constraints.machine_selector
    if not sel or all(r.matches(m.label(r.key)) for r in sel):
        return None
    return Misfit(Rule.SELECTOR, "selector mismatch", "machine {0!r} does not match the selector",
                  (m.id,))


def max_per_machine(job: Job, m: Machine, staying: Sequence[Allocation]) -> Misfit | None:
    """At most ``max_per_machine`` of the job's own tasks on one machine."""
    limit = job.constraints.max_per_machine
    if not limit:
        return None
    mine = sum(1 for a in staying if a.job == job.id)
    if mine < limit:
        return None
    return Misfit(Rule.MAX_PER_MACHINE, "max per machine",
                  "machine {0!r} already runs {1} task(s) of job {2!r} (max_per_machine {3})",
                  (m.id, mine, job.id, limit))


def anti_affinity(job: Job, m: Machine, neighbours: Sequence[Job]) -> Misfit | None:
    """No neighbour job the job's anti-affinity matches, and no neighbour job whose
    anti-affinity matches the job (both ways: a rule keeps newcomers off too)."""
    mine = job.constraints.anti_affinity
    for other in neighbours:
        if other.id == job.id:
            continue
        if mine and selector_matches_labels(mine, other.labels):
            return Misfit(Rule.ANTI_AFFINITY, "anti-affinity",
                          "anti-affinity: machine {0!r} runs job {1!r}", (m.id, other.id))
        theirs = other.constraints.anti_affinity
        if theirs and selector_matches_labels(theirs, job.labels):
            return Misfit(Rule.ANTI_AFFINITY, "anti-affinity",
                          "anti-affinity: job {0!r} on machine {1!r} keeps job {2!r} off",
                          (other.id, m.id, job.id))
    return None


def self_affine(job: Job) -> bool:
    """Whether the job's own labels match its affinity selector: its tasks form an
    *affinity group* that must share machines. The rule "the machine already runs a
    matching task" alone could never place such a group's first task, so a claim may
    *found* the group: the first claim of a transaction that claims every one of the
    job's tasks (none of them runs anywhere then) meets the job's affinity on any
    machine, and the transaction's later claims meet it through that one."""
    sel = job.constraints.affinity
    return bool(sel) and selector_matches_labels(sel, job.labels)


def affinity(job: Job, m: Machine, neighbours: Sequence[Job],
             founding: bool = False) -> Misfit | None:
    """The machine runs a task of a job the affinity matches (the job's own count), or
    the claim founds the job's affinity group (``founding``, see :func:`self_affine`)."""
    sel = job.constraints.affinity
    if not sel or any(selector_matches_labels(sel, o.labels) for o in neighbours):
        return None
    if founding and self_affine(job):
        return None
    return Misfit(Rule.AFFINITY, "affinity unmet",
                  "affinity: machine {0!r} runs no task of a matching job", (m.id,))


def resources(need: Resources, m: Machine, used: Resources,
              freed: Resources = _NOTHING) -> Misfit | None:
    """A task needing ``need`` fits in the capacity minus ``used`` plus ``freed``, in
    every dimension any of them names (a dimension the machine lacks has capacity 0)."""
    left = used - freed if freed.amounts else used
    dim = left.exceeding_with(need, m.capacity)
    if dim is None:
        return None
    free = max(m.capacity.get(dim) - left.get(dim), 0.0)
    label = _SHORT.get(dim)
    if label is None:
        label = f"insufficient {dim}"
        if len(_SHORT) < 256:  # dimensions are few; never let odd input grow it
            _SHORT[dim] = label
    return Misfit(_RESOURCES, label,
                  "machine {0!r} has {1:g} {2} free, task needs {3:g}",
                  (m.id, free, dim, need.get(dim)), dim)


def quota(held: Resources, need: Resources, limit: Resources,
          scheduler: str = "") -> Misfit | None:
    """A scheduler holding ``held`` may take ``need`` more within its resource ``limit``
    (a dimension the limit does not name is not limited). ``args`` of the misfit: the
    scheduler, what it holds in the dimension, the dimension, the limit there, and
    what ``need`` asks of it."""
    dim = (held + need).exceeding_limit(limit)
    if dim is None:
        return None
    return Misfit(Rule.QUOTA, f"{dim} quota",
                  "scheduler {0!r} holds {1:g} {2}; this task would take it past its "
                  "limit of {3:g}",
                  (scheduler, held.get(dim), dim, limit.get(dim), need.get(dim)), dim)


# -- what the rules read ------------------------------------------------------------------


def staying(m: Machine, gangs: Mapping[str, GangRecord], own_gang: str = "",
            victims: Sequence[Allocation] = ()) -> list[Allocation]:
    """The allocations that hold ``m`` and stay once ``victims`` leave."""
    gone = {v.task for v in victims}
    return [a for a in holding(m, gangs, own_gang) if a.task not in gone]


def neighbour_jobs(staying: Sequence[Allocation], jobs: Mapping[str, Job]) -> list[Job]:
    """The jobs of ``staying``, each once, in the machine's order (so a detail names the
    same job on every run); a job the reader does not know is left out."""
    out = []
    for jid in dict.fromkeys(a.job for a in staying):
        j = jobs.get(jid)
        if j is not None:
            out.append(j)
    return out


def keeps_others_off(jobs: Mapping[str, Job], job_ids: Iterable[str]) -> bool:
    """Whether one of these jobs has an anti-affinity rule (which may keep a newcomer
    off)."""
    for jid in job_ids:
        j = jobs.get(jid)
        if j is not None and j.constraints.anti_affinity:
            return True
    return False


def keeps_others_off_machine(jobs: Mapping[str, Job], m: Machine) -> bool:
    """:func:`keeps_others_off` for every job with an allocation on ``m`` (holding or
    not: a cheap upper bound), remembered on the record (:attr:`Machine.calm`) once
    every one of those jobs is known to have no anti-affinity rule. A job the reader
    does not know counts as keeping no one off, as above, but is not remembered so:
    another reader may know it."""
    if m.calm:
        return False
    known = True
    for jid in m.job_ids:
        j = jobs.get(jid)
        if j is None:
            known = False
        elif j.constraints.anti_affinity:
            return True
    if known:
        object.__setattr__(m, "calm", True)
    return False


# -- the rules together ---------------------------------------------------------------


def constraints(
    job: Job,
    m: Machine,
    gangs: Mapping[str, GangRecord],
    jobs: Mapping[str, Job],
    victims: Sequence[Allocation] = (),
    own_gang: str = "",
    founding: bool = False,
    calm: bool = False,
) -> Misfit | None:
    """Selector, tasks per machine, anti-affinity both ways, affinity (in that order).
    ``own_gang`` is the gang being staged, whose evictions count as done; ``founding``:
    the claim founds the job's affinity group (see :func:`self_affine`); ``calm``: the
    caller knows that no job in ``jobs`` has an anti-affinity rule (no neighbour can
    keep this task off, so the machine's jobs need no look)."""
    c = job.constraints
    if c.machine_selector:
        miss = selector(job, m)
        if miss is not None:
            return miss
    if not (c.max_per_machine or c.anti_affinity or c.affinity) and (
        calm or not keeps_others_off_machine(jobs, m)
    ):
        return None  # nothing on this machine cares (the common case: skip the scan)
    stay = staying(m, gangs, own_gang, victims)
    miss = max_per_machine(job, m, stay)
    if miss is not None:
        return miss
    if not (c.anti_affinity or c.affinity) and not keeps_others_off(jobs, (a.job for a in stay)):
        return None
    others = neighbour_jobs(stay, jobs)
    return anti_affinity(job, m, others) or affinity(job, m, others, founding)


def misfit(
    job: Job,
    m: Machine,
    gangs: Mapping[str, GangRecord],
    jobs: Mapping[str, Job],
    victims: Sequence[Allocation] = (),
    own_gang: str = "",
    founding: bool = False,
    used: Resources | None = None,
    calm: bool = False,
) -> Misfit | None:
    """The first rule that keeps one more task of ``job`` off ``m`` once ``victims``
    leave, or None if it may go there. ``jobs`` are the cell's jobs (neighbours' rules
    and labels), ``gangs`` its gang records (which staged holds count); ``founding``:
    the claim founds the job's affinity group (see :func:`self_affine`). ``used``:
    what holds ``m`` (``machine_used``) where the caller keeps count of it already,
    which spares summing a record's allocations; ``calm``: as :func:`constraints`."""
    if m.state is not _UP:
        return machine_up(m)
    return (
        constraints(job, m, gangs, jobs, victims, own_gang, founding, calm)
        or resources(job.task_resources, m,
                     machine_used(m, gangs, own_gang) if used is None else used,
                     sum_resources(v.resources for v in victims) if victims else _NOTHING)
    )


# -- why nothing fits -------------------------------------------------------------------


@attrs.frozen(slots=True)
class FitReport:
    """How many of the machines looked at fit, and how many each rule excluded."""

    machines: int
    fit: int
    excluded: tuple[tuple[str, int], ...] = ()  # (label, machines), most first

    def __str__(self) -> str:
        head = f"{self.fit:,}/{self.machines:,} machines fit"
        if not self.excluded:
            return head
        return head + ": " + ", ".join(f"{n:,} {label}" for label, n in self.excluded)


class FitTally:
    """Counts the verdicts of a scan, one per machine, as the scan goes (a dict
    increment each), for a :class:`FitReport` when nothing fit."""

    def __init__(self) -> None:
        self.machines = 0
        self.fit = 0
        self._counts: defaultdict[str, int] = defaultdict(int)

    def add(self, verdict: Misfit | None) -> None:
        self.machines += 1
        if verdict is None:
            self.fit += 1
        else:
            self._counts[verdict.label] += 1

    def report(self) -> FitReport:
        ranked = sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return FitReport(self.machines, self.fit, tuple(ranked))

"""What one simulation run is: cell, workload, schedulers, architecture, horizon, seed.

These values are built from an experiment file (simulator/experiment.py) or in code
(tests, benchmarks). The defaults are the Omega simulator's example setup (see
docs/simulator.md): 10,000 machines of 4 CPUs and 16 GB, batch jobs every 10 s of
100 tasks running 100 s, service jobs every 20 s of 10 tasks running 500 s, all
exponential, tasks of 1 CPU and 2 GB, and the cell prefilled to 60% of its CPUs.
"""

from __future__ import annotations

import enum

import attrs

from cellstate.model import CellConfig, Detection, JobKind, TxnMode
from simulator.constraints import Attribute
from simulator.workload import Distribution, JobClass, Prefill


class Architecture(enum.Enum):
    SHARED = "shared"  # Omega: every scheduler commits to the shared cell state
    MONOLITHIC = "monolithic"  # one scheduler for every job (single- or multi-path)
    TWO_LEVEL = "two-level"  # Mesos: an allocator offers resources to frameworks


@attrs.frozen
class DecisionTime:
    """t_decision = t_job + t_task x tasks (Omega §4), per job kind."""

    t_job: float = 0.1
    t_task: float = 0.005

    def of(self, tasks: int) -> float:
        return self.t_job + self.t_task * tasks


@attrs.frozen
class SchedulerSpec:
    """A scheduler: a policy under a name, run as ``instances`` instances that share
    its jobs by hashing job ids. ``serves`` names the workload classes whose jobs it
    gets. ``decision`` maps a job kind to its decision time; a kind not named takes
    ``default``. With ``measured`` set, the policy's real decision time is charged
    (times ``measured_scale``) instead of the model, as measured by ``measured_clock``:
    ``cpu`` (the process's CPU time, which other processes on the machine do not
    inflate) or ``wall``. ``options`` go to the policy
    (``Context.options``), e.g. ``fallbacks`` for the batch policy."""

    name: str
    serves: tuple[str, ...]
    policy: str = "batch"
    instances: int = 1
    decision: dict[JobKind, DecisionTime] = attrs.field(factory=dict)
    default: DecisionTime = DecisionTime()
    measured: bool = False
    measured_scale: float = 1.0
    mode: TxnMode = TxnMode.INCREMENTAL
    detection: Detection = Detection.FINE
    options: dict[str, object] = attrs.field(factory=dict)
    measured_clock: str = "cpu"

    def decision_for(self, kind: JobKind) -> DecisionTime:
        return self.decision.get(kind, self.default)


@attrs.frozen
class CellSpec:
    """Machines of one shape, ``rack_size`` to a rack (racks matter to data
    locality); each draws a value of every one of ``attributes`` as a label (what
    high-fidelity jobs' constraints select on)."""

    machines: int = 10_000
    cpu: float = 4.0
    mem: float = 16.0
    rack_size: int = 40
    attributes: tuple[Attribute, ...] = ()

    def machine_id(self, index: int) -> str:
        """The id of the cell's ``index``-th machine (m00000, m00001, ...)."""
        return f"m{index:05d}"

    def has_machine(self, mid: str) -> bool:
        digits = mid[1:]
        return (mid.startswith("m") and digits.isdigit() and int(digits) < self.machines
                and mid == self.machine_id(int(digits)))


FAILURE_SCOPES = ("machine", "rack", "failure_domain")


@attrs.frozen
class FailureSpec:
    """Machines that fail and come back. What fails together is one ``scope``: a
    machine, a rack or a failure domain (every machine of it at once, as a switch or
    a power feed takes them). Each such unit fails after an exponential time of mean
    ``mtbf`` seconds (0: never), and ``at`` lists failures at given times
    (``(seconds, machine id)``, the unit of that machine: a failure trace to replay); a
    failed unit is down for a ``repair`` time, its machines' running tasks are lost and
    wait to be placed again."""

    mtbf: float = 0.0
    repair: Distribution = attrs.field(factory=lambda: Distribution.fixed(600.0))
    at: tuple[tuple[float, str], ...] = ()
    scope: str = "machine"


@attrs.frozen
class TwoLevelSpec:
    """The Mesos-like allocator (Omega §4.2): offers go out every ``offer_interval``
    seconds, each costing ``offer_cost`` seconds of the allocator's time."""

    offer_interval: float = 1.0
    offer_cost: float = 0.001


@attrs.frozen
class RetrySpec:
    """Omega's released simulator: retry after 1 s; give up after 1,000 attempts or
    100 in a row that placed nothing (``fruitless``: which attempts that placed nothing
    count, ``in-a-row``, ``from-start`` or ``off``; schedulers.runtime). ``order``:
    where a job waits for its retry, ``back`` of the queue (the released simulator
    re-enqueues it when the retry is due) or at its place by ``submission`` (oldest
    first; before the option, the only behaviour)."""

    delay: float = 1.0
    max_delay: float = 1.0
    max_attempts: int = 1000
    max_fruitless: int = 100
    order: str = "back"
    fruitless: str = "in-a-row"


BATCH = JobClass("batch", JobKind.BATCH, Distribution.exponential(10.0),
                 Distribution.exponential(100.0), Distribution.exponential(100.0))
SERVICE = JobClass("service", JobKind.SERVICE, Distribution.exponential(20.0),
                   Distribution.exponential(10.0), Distribution.exponential(500.0))


@attrs.frozen
class SimConfig:
    architecture: Architecture
    schedulers: tuple[SchedulerSpec, ...]
    classes: tuple[JobClass, ...] = (BATCH, SERVICE)
    cell: CellSpec = CellSpec()
    prefill: Prefill | None = attrs.field(factory=Prefill)
    horizon: float = 86_400.0
    seed: int = 0
    trace: str | None = None  # a trace file replaces the generators
    retry: RetrySpec = RetrySpec()
    two_level: TwoLevelSpec = TwoLevelSpec()
    sample_interval: float = 60.0  # utilization samples
    day: float = 86_400.0  # the period of busyness values (shorter for short runs)
    warmup: float = 0.0  # placement measures count jobs submitted from then on
    # Seconds the run goes on past the horizon without new jobs, so that work in
    # progress there can finish (effective utilization counts finished runs only).
    drain: float = 0.0
    # "lightweight" (Omega §4's simplifications) or "high" (§5: constraints,
    # precedence, the real service policy); a label carried into the results.
    fidelity: str = "lightweight"
    # Record each scheduler's measured decision time (CPU seconds the policy ran)
    # beside the model's, whichever is charged; those columns then depend on the
    # machine the run ran on.
    measure_decisions: bool = False
    failures: FailureSpec | None = None  # machines never fail without it
    # Per-scheduler limits (Omega §3.4), set once the prefill is placed: what a
    # scheduler holds then counts toward its resource limit.
    limits: CellConfig | None = None

    def scheduler_of(self, cls: str) -> SchedulerSpec:
        for s in self.schedulers:
            if cls in s.serves:
                return s
        raise ValueError(f"no scheduler serves workload class {cls!r}")


def shared_state(batch_schedulers: int = 1, t_job_service: float = 0.1,
                 mode: TxnMode = TxnMode.INCREMENTAL,
                 detection: Detection = Detection.FINE) -> tuple[SchedulerSpec, ...]:
    """Omega's setup: batch scheduler(s) and one service scheduler."""
    return (
        SchedulerSpec("batch", ("batch",), instances=batch_schedulers, mode=mode,
                      detection=detection),
        SchedulerSpec("service", ("service",), mode=mode, detection=detection,
                      default=DecisionTime(t_job_service, 0.005)),
    )


def monolithic(t_job_service: float = 0.1, multi_path: bool = False
               ) -> tuple[SchedulerSpec, ...]:
    """One scheduler for all jobs; multi-path gives batch jobs the fast decision."""
    slow = DecisionTime(t_job_service, 0.005)
    decision = {JobKind.SERVICE: slow, JobKind.BATCH: DecisionTime() if multi_path else slow}
    return (SchedulerSpec("monolithic", ("batch", "service"), decision=decision),)

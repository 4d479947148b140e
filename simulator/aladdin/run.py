"""Runs of the Aladdin+H placement experiment: each scheduler alone on an empty cell
of the experiment's machines, every application submitted at once, stepped by the
testing kit's harness (the real runtime, store and validation over the memory
backend; a virtual clock for retries and rounds, the wall clock for latency).

What a run measures:

* ``machines_used``: machines running at least one task at the end;
* ``rs_cpu``, ``rs_mem``: the paper's Eq. 11, the placed tasks' demand per used machine
  (cores, GiB), and ``cpu_eff``, ``mem_eff``: that demand as a share of the used
  machines' capacity (the paper's "CPU efficiency" of 32% vs 42%);
* ``refused``: claims the store refused for a placement rule (affinity, anti-affinity,
  tasks per machine): the violations a scheduler proposed. Nothing it commits can
  break a rule (the store checks every claim); ``audit`` re-checks the final cell
  (``cellstate.invariants.constraint_violations``) and must be 0;
* ``unplaced``: tasks not placed when the run ended (all placed, no placement for
  ``IDLE`` virtual seconds, or the wall-clock budget spent);
* latency: per task, the wall-clock time from the submission of everything to the
  commit that placed it (median, p99); ``eq12_ms``: the paper's Eq. 12, the time to
  place everything over the tasks placed; ``stream_*_ms``: once the cell is loaded,
  ``STREAM`` more applications arrive one at a time, each timed from its submission
  to its last task's commit (``streamed``: how many were placed within
  ``STREAM_BUDGET`` seconds).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import attrs

from cellstate.invariants import constraint_violations, violations
from cellstate.model import Job, Machine, Reason
from schedulers.api import Policy
from schedulers.flow import FlowPolicy
from schedulers.flow.mcf.compile import warm as warm_kernels
from schedulers.medea import MedeaPolicy
from schedulers.packing import FirstFitPolicy, TetrisPolicy
from schedulers.service import ServicePolicy
from schedulers.testing import Harness
from simulator.aladdin.workload import App, SchedulerSpec

#: A run ends once this many virtual seconds pass without a placement (a flow
#: scheduler solves a round a virtual second; the runtime retries a job at most every
#: 30 s).
IDLE = 60.0
#: Applications timed one by one in the loaded cell, and the wall-clock seconds one
#: may take (all of them: four times that) before the rest are skipped.
STREAM = 20
STREAM_BUDGET = 15.0
_RULES = (Reason.CONSTRAINT_VIOLATED,)


@attrs.frozen
class Result:
    scheduler: str
    machines: int
    tasks: int
    placed: int
    unplaced: int
    machines_used: int
    rs_cpu: float
    rs_mem: float
    cpu_eff: float
    mem_eff: float
    refused: int
    audit: int
    moved: int
    wall_s: float
    latency_median_s: float
    latency_p99_s: float
    eq12_ms: float
    stream_median_ms: float
    stream_p99_ms: float
    streamed: int  # of the STREAM applications, those placed within STREAM_BUDGET
    finished: bool  # everything placed or nothing more to do, within the budget
    regroups: int = 0  # Aladdin groups made from what machines have left, and the
    regroup_ms: float = 0.0  # milliseconds that took (the batch and the stream)

    def row(self) -> dict[str, Any]:
        return attrs.asdict(self)


def make_policy(spec: SchedulerSpec) -> Policy:
    opts = dict(spec.options)
    if spec.flow:
        return FlowPolicy(policy=spec.flow, **opts)
    factories: dict[str, type[Policy]] = {"firstfit": FirstFitPolicy, "tetris": TetrisPolicy,
                                          "service": ServicePolicy, "medea": MedeaPolicy}
    if spec.policy not in factories:
        raise ValueError(f"scheduler {spec.name}: policy {spec.policy!r} is not one of "
                         f"{', '.join(sorted(factories))}")
    return factories[spec.policy](**opts)


class Run:
    def __init__(self, spec: SchedulerSpec, machines: Sequence[Machine], apps: Sequence[App],
                 budget: float = 600.0, seed: int = 1) -> None:
        self.spec = spec
        self.name = spec.name
        self.machines = list(machines)
        self.apps = list(apps)
        self.budget = budget
        self.rng = random.Random(seed)
        self.h = Harness()
        self.placed_at: dict[str, float] = {}
        self.refused = 0
        self.moved = 0
        self._seen = 0

    def _job(self, job: Job, suffix: str = "") -> Job:
        return attrs.evolve(job, id=job.id + suffix, scheduler=self.name,
                            submitted_at=self.h.clock())

    def run(self) -> Result:
        h = self.h
        h.admin.add_machines(self.machines)
        for app in self.apps:
            h.admin.submit_job(self._job(app.job))
        policy = make_policy(self.spec)
        if isinstance(policy, FlowPolicy):
            # The solver's kernels load (or compile, the first time) on first use:
            # about a second that is not placing (most of a small cell's batch).
            warm_kernels()
        inst = h.add(policy, scheduler=self.name)
        self.log = h.committer(inst).log
        total = sum(a.job.task_count for a in self.apps)
        self.start = time.perf_counter()
        finished = self._until(lambda: len(self.placed_at) >= total, self.budget)
        wall = max(self.placed_at.values(), default=0.0)
        lat = sorted(self.placed_at.values())
        placed = len(self.placed_at)
        snap = h.snapshot()  # the batch's placement, before the streamed applications
        used = cpu = mem = cap_cpu = cap_mem = 0.0
        for m in snap.machines.values():
            if m.allocations:
                used += 1
                cap_cpu += m.capacity.get("cpu")
                cap_mem += m.capacity.get("mem")
                cpu += m.settled_used.get("cpu")
                mem += m.settled_used.get("mem")
        broken = violations(snap)
        if broken:
            raise AssertionError(f"{self.name}: the cell's invariants broke: {broken[:3]}")
        audit = len(constraint_violations(snap))
        refused, moved = self.refused, self.moved
        stream = self._stream() if finished else []
        n = max(used, 1)
        planner = getattr(policy, "planner", None)
        return Result(
            self.name, len(self.machines), total, placed, total - placed, int(used),
            cpu / n, mem / n, cpu / cap_cpu if cap_cpu else 0.0,
            mem / cap_mem if cap_mem else 0.0, refused, audit, moved, wall,
            _quantile(lat, 0.5), _quantile(lat, 0.99), 1000 * wall / max(placed, 1),
            1000 * _quantile(stream, 0.5), 1000 * _quantile(stream, 0.99), len(stream),
            finished, int(getattr(planner, "regroups", 0)),
            1000 * float(getattr(planner, "regroup_seconds", 0.0)))

    def _until(self, done: Any, budget: float) -> bool:
        """Step until ``done()``; False if the budget ran out or nothing was placed for
        IDLE virtual seconds."""
        h = self.h
        inst = h.instances[0]
        quiet_since = h.clock.now
        deadline = time.perf_counter() + budget
        while not done():
            h.pump()
            delay = inst.step()
            if self._collect():
                quiet_since = h.clock.now
            if time.perf_counter() > deadline:
                return False
            if h.clock.now - quiet_since > IDLE:
                return True  # nothing more will be placed: the rest cannot be
            if delay > 0:
                h.clock.now += delay
        return True

    def _collect(self) -> bool:
        t = time.perf_counter() - self.start
        new = False
        for rec in self.log[self._seen:]:
            if rec.result is None:
                continue
            for c in rec.result.committed:
                if c.moves_from:
                    self.moved += 1
                elif c.task not in self.placed_at:
                    self.placed_at[c.task] = t
                    new = True
            self.refused += sum(1 for r in rec.result.rejected if r.reason in _RULES)
        self._seen = len(self.log)
        return new

    def _stream(self) -> list[float]:
        """Applications arriving one by one in the loaded cell: seconds each took."""
        out: list[float] = []
        picks = self.rng.sample(self.apps, min(STREAM, len(self.apps)))
        deadline = time.perf_counter() + 4 * STREAM_BUDGET
        for n, app in enumerate(picks):
            if time.perf_counter() > deadline:
                break
            job = self._job(app.job, f"-stream{n}")
            tasks = {f"{job.id}/{i}" for i in range(job.task_count)}
            t0 = time.perf_counter()
            self.h.admin.submit_job(job)
            if self._until(lambda tasks=tasks: tasks <= self.placed_at.keys(),
                           STREAM_BUDGET) and (
                    tasks <= self.placed_at.keys()):
                out.append(time.perf_counter() - t0)
        return out


def _quantile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    s = sorted(xs)
    return float(statistics.quantiles(s, n=1000, method="inclusive")[int(q * 1000) - 1]) \
        if q < 1 else s[-1]

"""One simulation run: builds the cell, workload and schedulers of a :class:`SimConfig`,
runs the event loop to the horizon, and returns the metrics.

Jobs arrive from their class's generator (or a trace), are submitted to the cell and
poke the scheduler instance that owns them (rendezvous hashing, as the runtime does).
When an attempt commits, each job's committed tasks run for the job's duration and
then end (one event per job and commit: the tasks of one commit end together).

A job of a class with ``input`` gets its data blocks when it arrives, on machines
drawn from the class's own random stream; every first placement of a task is
measured (latency, and the data it reads locally), and a flow scheduler's rounds are
recorded as they are decided (see ``simulator/recorder.py``).

Every run of a task is recorded when it ends (Cook's measures): one that finished
counts toward effective utilization, one that another task preempted counts only as
raw use and lost work; the preempted task waits again and its next run starts from
scratch, as a task without checkpoints does. A job is complete when every one of its
tasks has finished a run.
A MapReduce job's workers run until its work is done by the speedup model, which the
workers placed and evicted over time decide (``simulator/mapreduce.py``).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from cellstate.cell import CellSnapshot
from cellstate.keys import KeyKind
from cellstate.model import (
    PLACEABLE,
    Block,
    CommitResult,
    Job,
    JobKind,
    JobState,
    Machine,
    Resources,
    TaskState,
    required_tasks,
    task_id,
)
from schedulers.api import Plan, Policy
from schedulers.batch import BatchPolicy
from schedulers.flow import FlowPolicy
from schedulers.registry import Registry
from schedulers.runtime import Attempt, RuntimeConfig, SchedulerInstance, owner_of
from simulator.cell import Changes, Listener, SimCell, capacity_of
from simulator.config import Architecture, SchedulerSpec, SimConfig
from simulator.constraints import machine_labels
from simulator.drivers import InstanceDriver, decision_cost
from simulator.engine import ARRIVAL, END, SAMPLE, EventLoop, stream
from simulator.failures import Failures
from simulator.mapreduce import MapReduceRuns
from simulator.prefill import workload_jobs
from simulator.recorder import Recorder
from simulator.twolevel import Allocator, Framework, OfferView
from simulator.workload import (
    JobClass,
    JobSpec,
    generate,
    input_of,
    load_trace,
    task_input_of,
)

# Leases never lapse in virtual time; an instance with no work sleeps until poked.
_NEVER = 10**9


class _Locality:
    """Where a job's input blocks are, and what each task reads: its own blocks
    (``per_task`` of them, task i's from block ``i * per_task``), or, with
    ``per_task`` 0, an even share of all of them. A block is read from a copy on the
    task's machine if there is one, else from its rack if a copy is there."""

    def __init__(self, blocks: list[tuple[str, ...]], rack_of: dict[str, str],
                 per_task: float, blocks_per_task: int = 0) -> None:
        self.blocks = blocks
        self.per_task = per_task
        self.own = blocks_per_task
        self.rack_of = rack_of
        if not self.own:
            self.whole = self._held(blocks)

    def _held(self, blocks: Sequence[tuple[str, ...]]
              ) -> tuple[dict[str, int], dict[str, int], int, int]:
        """Blocks with a copy on each machine and rack, and the most any one holds."""
        on_machine: dict[str, int] = {}
        on_rack: dict[str, int] = {}
        for copies in blocks:
            for m in copies:
                on_machine[m] = on_machine.get(m, 0) + 1
            for r in {self.rack_of[m] for m in copies}:
                on_rack[r] = on_rack.get(r, 0) + 1
        return (on_machine, on_rack, max(on_machine.values(), default=0),
                max(on_rack.values(), default=0))

    def read(self, index: int, machine: str, rack: str
             ) -> tuple[float, float, float, float, float]:
        """(data, local data, rack-local data) of task ``index`` running on
        ``machine``, and the local and rack-local data on the best machine and rack
        for it (the ceilings)."""
        if not self.blocks:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        if self.own:
            mine = self.blocks[index * self.own:(index + 1) * self.own]
            if not mine:
                return 0.0, 0.0, 0.0, 0.0, 0.0
            on_machine, on_rack, best_machine, best_rack = self._held(mine)
            n = len(mine)
        else:
            on_machine, on_rack, best_machine, best_rack = self.whole
            n = len(self.blocks)
        share = self.per_task / n
        return (self.per_task, share * on_machine.get(machine, 0),
                share * on_rack.get(rack, 0), share * best_machine, share * best_rack)


class Driver(Protocol):
    inst: SchedulerInstance

    @property
    def name(self) -> str: ...
    def poke(self) -> None: ...


class Simulation:
    def __init__(self, config: SimConfig, registry: Registry | None = None,
                 base_dir: Path | None = None) -> None:
        self.config = config
        self.loop = EventLoop()
        self.cell = SimCell(lambda: self.loop.now)
        self.recorder = Recorder(config.horizon, config.day, config.warmup)
        self.registry = registry or Registry.from_entry_points()
        self.base_dir = base_dir or Path.cwd()
        self._running: dict[str, int] = {}  # job -> tasks running
        self._ended: dict[str, int] = {}  # job -> tasks finished
        self._jobs: dict[str, Job] = {}
        self._instances: dict[str, list[str]] = {}
        self._drivers: dict[tuple[str, str], Driver] = {}
        self._abandoned: set[str] = set()
        self._input_rngs: dict[str, random.Random] = {}
        self._prefilled: set[str] = set()  # jobs of the prefill (not measured)
        self._classes: dict[str, JobClass] = {c.name: c for c in config.classes}
        self._first: dict[str, set[int]] = {}  # job -> tasks placed at least once
        self._runs: dict[str, tuple[float, float]] = {}  # running task -> (start, cpu)
        self._class: dict[str, str] = {}  # job -> its workload class
        self._locality: dict[str, _Locality] = {}
        self.policies: dict[tuple[str, str], Policy] = {}
        self._last_round: dict[tuple[str, str], object] = {}
        machines = list(self._machines())
        self._machine_ids = [m.id for m in machines]
        self._rack_of = {m.id: m.rack for m in machines}
        self._racks: dict[str, list[str]] = {}
        for m in machines:
            self._racks.setdefault(m.rack, []).append(m.id)
        self.mapreduce = MapReduceRuns(self.loop, self.cell, self.recorder, self._completed)
        self.cell.add_machines(machines)
        self.capacity = capacity_of(self.cell.snapshot())
        self.recorder.track_usage(config.sample_interval, self.capacity.get("cpu"))
        self.allocator: Allocator | None = None
        if config.architecture is Architecture.TWO_LEVEL:
            self.allocator = Allocator(self.loop, self.cell, config.two_level, self.capacity)
        self.cell.on_changes(self._watch)

    # -- building ------------------------------------------------------------------------

    def _machines(self) -> Iterator[Machine]:
        c = self.config.cell
        cap = Resources.of(cpu=c.cpu, mem=c.mem)
        # Its own stream: cells without attributes draw nothing and stay as they were.
        rng = stream(self.config.seed, "cell/attributes")
        for i in range(c.machines):
            yield Machine(c.machine_id(i), cap, rack=f"r{i // c.rack_size:03d}",
                          failure_domain=f"fd{i // (10 * c.rack_size):02d}",
                          labels=machine_labels(c.attributes, rng) if c.attributes else ())

    def _runtime_config(self, spec: SchedulerSpec) -> RuntimeConfig:
        r = self.config.retry
        return RuntimeConfig(mode=spec.mode, detection=spec.detection,
                             max_attempts=r.max_attempts, max_fruitless_attempts=r.max_fruitless,
                             fruitless_rule=r.fruitless,
                             retry_delay=r.delay, max_retry_delay=r.max_delay,
                             retry_order=r.order, lease_ttl=_NEVER, idle_wait=math.inf,
                             options=dict(spec.options))

    def _add_schedulers(self) -> None:
        for spec in self.config.schedulers:
            names = [str(i) for i in range(spec.instances)]
            self._instances[spec.name] = names
            self.recorder.scheduler(spec.name, spec.instances)
            for name in names:
                source: SimCell | OfferView = self.cell
                if self.allocator is not None:
                    source = OfferView(self.cell)
                policy = self.registry.create(spec.policy, **spec.options)
                self.policies[(spec.name, name)] = policy
                timer = time.process_time if spec.measured_clock == "cpu" else time.perf_counter
                if isinstance(policy, FlowPolicy):
                    policy.timer = timer
                policy.warm_up()  # not charged to the first round
                inst = SchedulerInstance(
                    policy, self.cell, source, scheduler=spec.name,
                    instance=name, clock=self.loop.clock,
                    rng=stream(self.config.seed, f"scheduler/{spec.name}/{name}"),
                    config=self._runtime_config(spec),
                    decision_cost=self._charge(spec, name, policy), timer=timer)
                inst.start()
                driver: Driver
                if isinstance(source, OfferView) and self.allocator is not None:
                    driver = Framework(self.loop, self.recorder, inst, source, self.allocator,
                                       self._committed)
                else:
                    driver = InstanceDriver(self.loop, self.recorder, inst, self._committed)
                self._drivers[(spec.name, name)] = driver
                if policy.propose_interval is not None:
                    driver.poke()  # proposes from the start, not from the first job

    def _charge(self, spec: SchedulerSpec, instance: str, policy: Policy
                ) -> Callable[[Sequence[Job], Plan, float], float]:
        """The decision-cost hook of one instance; it also records a flow policy's
        round (the hook runs right after each decision)."""
        cost = decision_cost(spec)
        model = decision_cost(attrs.evolve(spec, measured=False))
        key = (spec.name, instance)

        def charge(jobs: Sequence[Job], plan: Plan, measured: float) -> float:
            if isinstance(policy, FlowPolicy) and policy.rounds:
                r = policy.rounds[-1]
                if r is not self._last_round.get(key):
                    self._last_round[key] = r
                    self.recorder.flow_round(spec.name, r.update, r.solve, r.extract,
                                             r.nodes, r.arcs, r.placed, r.migrated,
                                             r.preempted, r.repaired)
            charged = cost(jobs, plan, measured)
            if self.config.measure_decisions:
                tried = len(plan.claims) + sum(u.tasks for u in plan.unplaced)
                self.recorder.decision(spec.name, measured, model(jobs, plan, measured), tried)
            return charged

        return charge

    def _prefill(self) -> None:
        """Fill the cell at time 0, with no decision time, by randomized first fit."""
        p = self.config.prefill
        if p is None:
            return
        # Placed by an instance under the owner's name, so that the tasks are the
        # owner's (a flow scheduler re-offers them); it leaves before the owner starts.
        owner = p.scheduler or "prefill"
        source = _Detachable(self.cell)
        inst = SchedulerInstance(BatchPolicy(), self.cell, source, scheduler=owner,
                                 instance="prefill", clock=self.loop.clock,
                                 rng=stream(self.config.seed, "prefill"),
                                 config=RuntimeConfig(lease_ttl=_NEVER, idle_wait=math.inf,
                                                      max_fruitless_attempts=1))
        inst.start()
        total = self.capacity.get("cpu")
        specs = (workload_jobs(p, self.config.classes, total,
                               stream(self.config.seed, "prefill/jobs"))
                 if p.from_workload else p.jobs(total))
        for spec in specs:
            self._prefilled.add(spec.id)
            self._submit(spec.job(owner), spec.cls)
        while True:
            attempt = inst.decide()
            if not isinstance(attempt, Attempt):
                break
            self._committed(attempt, inst.finish(attempt))
        inst.stop()
        # Gone for good: the changes of the rest of the run are not its to follow (each
        # was handed to it, to find what kinds of record changed, and then dropped).
        source.detach()

    # -- events ----------------------------------------------------------------------------

    def _arrivals(self) -> Iterator[JobSpec]:
        if self.config.trace is not None:
            kinds = {c.name: c.kind for c in self.config.classes}
            path = Path(self.config.trace)
            if not path.is_absolute():
                path = self.base_dir / path
            return iter(load_trace(path, kinds))
        gens = [generate(c, stream(self.config.seed, f"workload/{c.name}"))
                for c in self.config.classes]
        return _merge(gens)

    def _schedule_arrival(self, source: Iterator[JobSpec]) -> None:
        spec = next(source, None)
        if spec is None or spec.submit > self.config.horizon:
            return

        def arrive() -> None:
            sched = self.config.scheduler_of(spec.cls)
            job = spec.job(sched.name, *self._input(spec))
            self._submit(job, spec.cls)
            owner = owner_of(job.id, self._instances[sched.name])
            if owner is not None:
                self._drivers[(sched.name, owner)].poke()
            self._schedule_arrival(source)

        self.loop.at(spec.submit, ARRIVAL, arrive)

    # -- machine failures ---------------------------------------------------------------

    def _schedule_failures(self) -> None:
        f = self.config.failures
        if f is not None:
            Failures(f, self.loop, self.cell, self._machine_ids,
                     stream(self.config.seed, "failures"), self.config.horizon,
                     self._machines_down).start()

    def _machines_down(self, down: list[Machine]) -> None:
        """``down`` (as they were before) failed: their running tasks are lost, with
        their work; their schedulers place them again."""
        tasks = self.cell.snapshot().tasks
        runs = []
        hit: dict[str, None] = {}
        for m in down:
            for tid in m.allocations:
                rec = tasks.get(tid)
                if rec is None or rec.state is not TaskState.LOST:
                    continue  # a hold of a gang still staging, or of an evicted task
                run = self._runs.pop(tid, None)
                if run is not None:
                    runs.append(run)
                self._running[rec.job] = self._running.get(rec.job, 0) - 1
                hit[rec.job] = None
        self.recorder.machine_failed(self.loop.now, runs, len(down))
        for job_id in hit:
            job = self._jobs.get(job_id)
            if job is None:
                continue
            if job.mapreduce is not None:
                self.mapreduce.workers(job, self._running[job_id])
            self._poke_owner(job)

    def _poke_owner(self, job: Job) -> None:
        """A task of ``job`` waits again (it was preempted): its scheduler, perhaps
        another than the preempting one and asleep, has work."""
        names = self._instances.get(job.scheduler)
        owner = owner_of(job.id, names) if names else None
        driver = self._drivers.get((job.scheduler, owner)) if owner is not None else None
        if driver is not None:
            driver.poke()

    def _input(self, spec: JobSpec
               ) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[Block, ...], ...]]:
        """Input blocks for a job of a class that has them: the job's
        (``Job.input``) and, where its tasks read their own, each task's
        (``Job.task_input``)."""
        cls = self._classes.get(spec.cls)
        if cls is None or cls.input is None:
            return (), ()
        rng = self._input_rngs.get(cls.name)
        if rng is None:
            rng = self._input_rngs[cls.name] = stream(self.config.seed, f"input/{cls.name}")
        spec_in = cls.input
        blocks = spec_in.blocks(spec.tasks, rng, self._machine_ids, self._rack_of, self._racks)
        own = spec_in.reads == "task"
        self._locality[spec.id] = _Locality(
            blocks, self._rack_of, spec_in.blocks_per_task * spec_in.block_size,
            spec_in.blocks_per_task if own else 0)
        return (input_of(blocks, spec_in.block_size),
                task_input_of(blocks, spec_in.block_size, spec_in.blocks_per_task)
                if own else ())

    def _submit(self, job: Job, cls: str) -> None:
        self._jobs[job.id] = job
        self._class[job.id] = cls
        self.cell.submit_job(job)
        if job.id in self._prefilled:
            self.recorder.unmeasured(job.id)
        else:
            self.recorder.submitted_job(job)
            self.recorder.job_submitted(job, cls)

    def _committed(self, attempt: Attempt, results: dict[str, CommitResult]) -> None:
        now = self.loop.now
        for job_id, res in results.items():
            for victim in res.evicted:
                vjob = victim.rpartition("/")[0]
                self._running[vjob] -= 1
                self._run_ended(vjob, victim, self._class.get(job_id, "?"))
                self.mapreduce.workers(self._jobs[vjob], self._running[vjob])
                self._poke_owner(self._jobs[vjob])
            if not res.committed:
                continue
            job = self._jobs[job_id]
            self._running[job_id] = self._running.get(job_id, 0) + len(res.committed)
            tids = [c.task for c in res.committed]
            # One tuple for the commit's runs: alike, they are counted together at the end.
            self._runs.update(dict.fromkeys(tids, (now, job.task_resources.get("cpu"))))
            if job_id not in self._prefilled and self.recorder.measured(job):
                self._measure(job, res, now)
            if job.mapreduce is not None:
                self.mapreduce.workers(job, self._running[job_id])
            elif job.duration is not None:
                self.loop.at(now + job.duration, END,
                             _bind(self._end, job_id, tids, res.revision))

    def _measure(self, job: Job, res: CommitResult, now: float) -> None:
        """Latency and data locality of the tasks this commit placed for the first
        time; the job's response time once all its tasks have been placed."""
        first = self._first.setdefault(job.id, set())
        if len(first) >= job.task_count:
            return
        loc = self._locality.get(job.id)
        for c in res.committed:
            if c.moves_from or c.index in first:
                continue
            first.add(c.index)
            self.recorder.placed(job, now)
            if loc is not None:
                self.recorder.read(*loc.read(c.index, c.machine, self._rack_of[c.machine]))
        if len(first) >= job.task_count and job.duration is not None:
            # Tasks of a job run equally long: the last placed ends last.
            self.recorder.job_response(now + job.duration - job.submitted_at, job.duration)

    def _run_ended(self, job_id: str, task: str, preempted_by: str = "") -> None:
        run = self._runs.pop(task, None)
        if run is not None:
            self.recorder.run_ended(job_id, run[1], run[0], self.loop.now, preempted_by)

    def _end(self, job_id: str, tids: list[str], placed_at: int) -> None:
        released = self.cell.release_tasks(tids, TaskState.FINISHED, placed_at)
        self._finished(job_id, released)

    def _completed(self, job: Job, released: list[str]) -> None:
        """A MapReduce job's work is done and its running workers ended."""
        self._finished(job.id, released)

    def _finished(self, job_id: str, released: list[str]) -> None:
        runs = self._runs
        self.recorder.add_runs(
            [run for task in released if (run := runs.pop(task, None)) is not None],
            self.loop.now)
        self._running[job_id] = self._running.get(job_id, 0) - len(released)
        ended = self._ended[job_id] = self._ended.get(job_id, 0) + len(released)
        job = self._jobs.get(job_id)
        if released and job is not None and ended >= job.task_count:
            self.recorder.job_completed(job_id, self.loop.now)
        self._maybe_forget(job_id)

    def _watch(self, snap: CellSnapshot, changes: Changes | None) -> None:
        if not changes or KeyKind.STATUS not in dict(changes):
            return  # nearly every change: claims and ends write machines and tasks only
        for kind, ident in changes:
            if kind is KeyKind.STATUS and ident not in self._abandoned:
                status = snap.statuses.get(ident)
                if status is not None and status.state is JobState.ABANDONED:
                    self._abandoned.add(ident)
                    job = self._jobs[ident]
                    if ident not in self._prefilled:
                        self.recorder.abandoned_job(job)
                    # Not from inside the store's publish: at once, as its own event.
                    self.loop.at(self.loop.now, END, _bind(self._maybe_forget, ident))

    def _maybe_forget(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is None or self._running.get(job_id, 0) > 0:
            return
        if (self._ended.get(job_id, 0) >= job.task_count or job_id in self._abandoned
                or job_id in self.mapreduce.finished):
            self.mapreduce.forget(job_id)
            self.cell.forget_job(job_id)
            self.recorder.forget(job_id)
            del self._jobs[job_id]
            self._prefilled.discard(job_id)
            self._first.pop(job_id, None)
            self._class.pop(job_id, None)
            self._locality.pop(job_id, None)
            self._running.pop(job_id, None)
            self._ended.pop(job_id, None)
            self._abandoned.discard(job_id)

    def _sample(self) -> None:
        cpu = self.cell.used("cpu") / max(self.capacity.get("cpu"), 1e-9)
        mem = self.cell.used("mem") / max(self.capacity.get("mem"), 1e-9)
        self.recorder.sample(self.loop.now, cpu, mem)
        if self.loop.now >= self.config.warmup:
            self.recorder.spread_counts(self.loop.now, self.cell.cpu_share_counts())
        nxt = self.loop.now + self.config.sample_interval
        if nxt <= self.config.horizon:
            self.loop.at(nxt, SAMPLE, self._sample)

    # -- running ---------------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None,
            after_prefill: Callable[[], None] | None = None) -> dict[str, Any]:
        """Prefill, then run to the horizon. ``after_prefill`` is for process entry
        points (e.g. to tune the garbage collector once the cell is loaded)."""
        self._prefill()
        if self.config.limits is not None:
            self.cell.set_config(self.config.limits)
        if after_prefill is not None:
            after_prefill()
        self._add_schedulers()
        self._schedule_arrival(self._arrivals())
        self._schedule_failures()
        self.loop.at(0.0, SAMPLE, self._sample)
        self.loop.run(self.config.horizon + self.config.drain, progress)
        # Runs still going at the end: used, but whether they would finish is unknown.
        self.recorder.add_runs(list(self._runs.values()), self.loop.now, finished=False)
        return self.summary()

    def unscheduled(self) -> dict[str, int]:
        """Live jobs (not abandoned) with tasks still waiting, per job kind."""
        snap = self.cell.snapshot()
        out: dict[str, int] = {}
        for job in snap.jobs.values():
            if job.id in self._prefilled or job.id in snap.statuses:
                continue
            if any(_state(snap, task_id(job.id, i)) in PLACEABLE
                   for i in range(required_tasks(job))):
                out[job.kind.value] = out.get(job.kind.value, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        out = self.recorder.summary(self.unscheduled())
        out["tasks_unplaced"] = self.tasks_unplaced()
        if any(c.kind is JobKind.MAPREDUCE for c in self.config.classes):
            out.update(self.mapreduce.summary(self.recorder.utilization))
        if self.config.failures is not None:
            self.recorder.failure_summary(out)
        if self.config.limits is not None:
            # Jobs a scheduler's limits held back (schedulers/limits.py; a job counts
            # again after each attempt that left it waiting).
            for name in self._instances:
                out[f"{name}_jobs_held"] = sum(d.inst.metrics.jobs_held
                                               for (s, _), d in self._drivers.items()
                                               if s == name)
        out["events"] = self.loop.processed
        if self.allocator is not None:
            out["offers"] = self.allocator.offers_made
        return out


    def tasks_unplaced(self) -> int:
        """Tasks of live jobs (not abandoned) still waiting at the end of the run."""
        snap = self.cell.snapshot()
        return sum(1 for job in snap.jobs.values()
                   if job.id not in self._prefilled and job.id not in snap.statuses
                   for i in range(job.task_count)
                   if _state(snap, task_id(job.id, i)) in PLACEABLE)


class _Detachable:
    """The cell as a scheduler instance's snapshot source, whose listeners can be
    taken off the cell again (:meth:`detach`): for an instance that leaves for good."""

    def __init__(self, cell: SimCell) -> None:
        self._cell = cell
        self._listeners: list[Listener] = []

    def snapshot(self) -> CellSnapshot:
        return self._cell.snapshot()

    def on_changes(self, listener: Listener) -> None:
        self._cell.on_changes(listener)
        self._listeners.append(listener)

    def detach(self) -> None:
        for listener in self._listeners:
            self._cell.off_changes(listener)
        self._listeners.clear()


def _state(snap: CellSnapshot, tid: str) -> TaskState:
    rec = snap.tasks.get(tid)
    return TaskState.PENDING if rec is None else rec.state


def _bind(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    """An event action calling ``fn(*args)`` (a lambda in a loop would bind late)."""
    return lambda: fn(*args)


def _merge(gens: list[Iterator[JobSpec]]) -> Iterator[JobSpec]:
    """The jobs of several generators in order of submission (ties by class order)."""
    heads: list[JobSpec | None] = [next(g, None) for g in gens]
    for _ in itertools.count():
        live = [(h.submit, i) for i, h in enumerate(heads) if h is not None]
        if not live:
            return
        _, i = min(live)
        spec = heads[i]
        assert spec is not None
        heads[i] = next(gens[i], None)
        yield spec


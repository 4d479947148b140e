"""Workloads: distributions, job classes, prefill, and traces.

A workload class (batch, service, ...) draws each job's interarrival time, task count,
task duration and task shape from its own distributions, on its own random stream;
optionally its jobs' owners (users), their priorities in their owner's own order, and
a daily pattern of its arrival rate (``Diurnal``).
A trace file lists jobs instead (see docs/simulator.md for the format).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from cellstate.codec import parse_mapreduce
from cellstate.model import (
    Block,
    Constraints,
    Job,
    JobKind,
    MapReduceSpec,
    ModelError,
    Resources,
    check_name,
)
from simulator.constraints import ConstraintGen, parse_constraints


class InputError(ValueError):
    """A bad experiment or trace file; the message names the file, line and field."""


@attrs.frozen
class Distribution:
    """``fixed`` (value), ``exponential`` (mean), ``empirical`` (values at evenly
    spaced quantiles 0..1, sampled by linear interpolation between neighbours) or
    ``choice`` (one of ``quantiles``, drawn with the relative ``weights``)."""

    kind: str
    value: float = 0.0  # fixed value, or the exponential's mean
    quantiles: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()  # choice only

    def sample(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.value
        if self.kind == "exponential":
            return rng.expovariate(1.0 / self.value) if self.value > 0 else 0.0
        if self.kind == "choice":
            return rng.choices(self.quantiles, self.weights)[0]
        u = rng.random() * (len(self.quantiles) - 1)
        i = int(u)
        if i >= len(self.quantiles) - 1:
            return self.quantiles[-1]
        lo, hi = self.quantiles[i], self.quantiles[i + 1]
        # lo + (hi - lo) * frac: the released simulator added lo instead of subtracting.
        return lo + (hi - lo) * (u - i)

    def mean(self) -> float:
        if self.kind in ("fixed", "exponential"):
            return self.value
        if self.kind == "choice":
            return sum(v * w for v, w in zip(self.quantiles, self.weights, strict=True)) / sum(
                self.weights)
        q = self.quantiles
        return sum((a + b) / 2 for a, b in itertools.pairwise(q)) / (len(q) - 1)

    @classmethod
    def fixed(cls, value: float) -> Distribution:
        return cls("fixed", value)

    @classmethod
    def exponential(cls, mean: float) -> Distribution:
        return cls("exponential", mean)

    @classmethod
    def empirical(cls, quantiles: Sequence[float]) -> Distribution:
        return cls("empirical", 0.0, tuple(quantiles))

    @classmethod
    def choice(cls, values: Sequence[float], weights: Sequence[float]) -> Distribution:
        return cls("choice", 0.0, tuple(values), tuple(weights))


@attrs.frozen
class Diurnal:
    """A repeating pattern of a class's arrival rate: ``period`` (a day) is split into
    ``len(rates)`` equal slots, and in slot i jobs arrive ``rates[i]`` times as often as
    the class's own interarrival distribution says (0: none then).

    Interarrival times are drawn in *active time*, which runs at the slot's rate; an
    arrival's wall time is where the active time it is due at is reached. So any
    interarrival distribution keeps its shape within a slot, and a class with rate 1
    in every slot is the class without a pattern."""

    rates: tuple[float, ...]
    period: float = 86_400.0

    def __attrs_post_init__(self) -> None:
        if not self.rates or any(r < 0 or not math.isfinite(r) for r in self.rates):
            raise ValueError("rates must be finite numbers >= 0, at least one")
        if not sum(self.rates) > 0:
            raise ValueError("at least one rate must be above 0")
        if not self.period > 0:
            raise ValueError("period must be above 0")

    def wall_time(self, active: float) -> float:
        """The wall time at which ``active`` seconds of active time have passed."""
        slot = self.period / len(self.rates)
        per_period = slot * sum(self.rates)
        periods = math.floor(active / per_period)
        rest = active - periods * per_period
        for i, r in enumerate(self.rates):
            span = slot * r
            if rest < span:
                return periods * self.period + i * slot + rest / r
            rest -= span
        # Rounding left a sliver past the last active slot: the next period's first one.
        return (periods + 1) * self.period + self.wall_time(0.0)


@attrs.frozen
class MapReduceClass:
    """The MapReduce side of a class of MapReduce jobs: a job asks for the class's
    ``tasks`` workers; it has ``ceil(workers x maps_per_worker)`` map activities (at
    least 1) and ``ceil(workers x reduces_per_worker)`` reduce activities of
    ``map_seconds`` and ``reduce_seconds``; it may grow to ``max_workers`` (0: until
    every activity of a phase runs at once)."""

    maps_per_worker: Distribution
    reduces_per_worker: Distribution
    map_seconds: Distribution
    reduce_seconds: Distribution
    max_workers: int = 0

    def spec(self, workers: int, rng: random.Random) -> MapReduceSpec:
        maps = max(1, math.ceil(workers * self.maps_per_worker.sample(rng)))
        reduces = math.ceil(workers * self.reduces_per_worker.sample(rng))
        map_s = max(self.map_seconds.sample(rng), 1e-3)
        reduce_s = max(self.reduce_seconds.sample(rng), 1e-3)
        most = max(workers, max(maps, reduces))
        if self.max_workers:
            most = max(workers, min(most, self.max_workers))
        return MapReduceSpec(maps, reduces, map_s, reduce_s, workers, most)


PLACEMENTS = ("hdfs", "random")
#: What a task reads: its own blocks (``task``: ``Job.task_input``, each task's node
#: priced on its own, as Quincy's tasks are), or an even share of all its job's
#: blocks (``job``: only ``Job.input``, the job's tasks alike).
READS = ("task", "job")


@attrs.frozen
class InputSpec:
    """Input data for a class's jobs, stored as a distributed file system stores it:
    each task of a job reads ``blocks_per_task`` blocks of ``block_size`` (GB), and
    each block has ``replicas`` copies on distinct machines (``reads``: see
    :data:`READS`). ``hdfs`` placement is
    HDFS's default: the first copy on a random machine, the second on a machine of
    another rack, the third on another machine of the second's rack, any further ones
    on random machines; ``random`` puts every copy on a random machine."""

    blocks_per_task: int = 2
    replicas: int = 3
    block_size: float = 0.25
    placement: str = "hdfs"
    reads: str = "task"

    def blocks(self, job_tasks: int, rng: random.Random, machines: Sequence[str],
               rack_of: dict[str, str], racks: dict[str, list[str]]
               ) -> list[tuple[str, ...]]:
        """Where each block of a job of ``job_tasks`` tasks is stored: for each block,
        the machines holding a copy (as many as there are machines, at most)."""
        copies = min(self.replicas, len(machines))
        return [self._place(rng, copies, machines, rack_of, racks)
                for _ in range(job_tasks * self.blocks_per_task)]

    def _place(self, rng: random.Random, copies: int, machines: Sequence[str],
               rack_of: dict[str, str], racks: dict[str, list[str]]) -> tuple[str, ...]:
        chosen: list[str] = []
        if self.placement == "hdfs" and copies >= 2 and len(racks) >= 2:
            first = machines[rng.randrange(len(machines))]
            chosen.append(first)
            # Other racks: draw machines until one is off the first's rack.
            while True:
                second = machines[rng.randrange(len(machines))]
                if rack_of[second] != rack_of[first]:
                    break
            chosen.append(second)
            mates = racks[rack_of[second]]
            if copies >= 3 and len(mates) >= 2:
                while True:
                    third = mates[rng.randrange(len(mates))]
                    if third != second:
                        break
                chosen.append(third)
        while len(chosen) < copies:
            m = machines[rng.randrange(len(machines))]
            if m not in chosen:
                chosen.append(m)
        return tuple(chosen)


def task_input_of(blocks: Sequence[tuple[str, ...]], block_size: float, per_task: int
                  ) -> tuple[tuple[Block, ...], ...]:
    """``Job.task_input`` for these blocks: task i reads blocks ``i * per_task`` on."""
    return tuple(tuple(Block(block_size, copies) for copies in blocks[i:i + per_task])
                 for i in range(0, len(blocks), per_task))


def input_of(blocks: Sequence[tuple[str, ...]], block_size: float
             ) -> tuple[tuple[str, float], ...]:
    """``Job.input`` for these blocks: the data each machine holds (every copy
    counted where it is), sorted by machine."""
    held: dict[str, float] = {}
    for copies in blocks:
        for m in copies:
            held[m] = held.get(m, 0.0) + block_size
    return tuple(sorted(held.items()))


@attrs.frozen
class JobClass:
    """One stream of jobs. ``rate_scale`` multiplies its arrival rate."""

    name: str
    kind: JobKind
    interarrival: Distribution
    tasks: Distribution
    duration: Distribution
    cpu: Distribution = attrs.field(factory=lambda: Distribution.fixed(1.0))
    mem: Distribution = attrs.field(factory=lambda: Distribution.fixed(2.0))
    rate_scale: float = 1.0
    input: InputSpec | None = None  # input data blocks of each job (data locality)
    mapreduce: MapReduceClass | None = None  # a class of MapReduce jobs
    # Each job's owner is drawn evenly from ``users`` (none: every job is "sim"'s).
    users: tuple[str, ...] = ()
    # The job's priority in its owner's own order, rounded to a whole number (a fair
    # scheduler reads it); None: 0.
    priority: Distribution | None = None
    diurnal: Diurnal | None = None  # a daily pattern of the arrival rate
    # High fidelity (Omega §5): each job's precedence across all jobs (rounded; the
    # store lets a job evict lower-precedence tasks) and its placement constraints.
    precedence: Distribution | None = None
    constraints: ConstraintGen | None = None

    def mean_tasks(self) -> float:
        return self.tasks.mean()


@attrs.frozen
class JobSpec:
    """A job to submit at ``submit`` (from a generator or a trace)."""

    id: str
    cls: str
    kind: JobKind
    submit: float
    tasks: int
    duration: float | None  # None: runs until the end of the run
    cpu: float
    mem: float
    mapreduce: MapReduceSpec | None = None  # its duration then follows from its workers
    owner: str = "sim"
    priority: int = 0  # in its owner's own order (higher first)
    precedence: int = 0  # across all jobs: who may evict whom
    constraints: Constraints = attrs.field(factory=Constraints)

    def job(self, scheduler: str, data: tuple[tuple[str, float], ...] = (),
            task_data: tuple[tuple[Block, ...], ...] = ()) -> Job:
        """The job to submit; ``data`` is its input (``Job.input``), ``task_data``
        each task's own (``Job.task_input``)."""
        return Job(self.id, self.owner, scheduler, self.tasks,
                   Resources.of(cpu=self.cpu, mem=self.mem), kind=self.kind,
                   duration=self.duration if self.mapreduce is None else None,
                   submitted_at=self.submit, input=data, task_input=task_data,
                   mapreduce=self.mapreduce,
                   priority=self.priority, precedence=self.precedence,
                   constraints=self.constraints)


def generate(cls: JobClass, rng: random.Random, start: float = 0.0) -> Iterator[JobSpec]:
    """Jobs of ``cls`` forever, one after another (the caller stops at the horizon).

    Owners, priorities, precedences and constraints are drawn after everything else,
    and only for classes that have them, so that classes without them draw exactly
    what they drew before."""
    active = 0.0
    n = 0
    while True:
        active += cls.interarrival.sample(rng) / cls.rate_scale
        t = start + (active if cls.diurnal is None else cls.diurnal.wall_time(active))
        n += 1
        spec = JobSpec(f"{cls.name}-{n:07d}", cls.name, cls.kind, t,
                       max(1, math.ceil(cls.tasks.sample(rng))), cls.duration.sample(rng),
                       cls.cpu.sample(rng), cls.mem.sample(rng))
        if cls.mapreduce is not None:
            spec = attrs.evolve(spec, mapreduce=cls.mapreduce.spec(spec.tasks, rng))
        if cls.users:
            spec = attrs.evolve(spec, owner=cls.users[rng.randrange(len(cls.users))])
        if cls.priority is not None:
            spec = attrs.evolve(spec, priority=round(cls.priority.sample(rng)))
        if cls.precedence is not None:
            spec = attrs.evolve(spec, precedence=max(0, round(cls.precedence.sample(rng))))
        if cls.constraints is not None:
            spec = attrs.evolve(spec, constraints=cls.constraints.draw(rng))
        yield spec


@attrs.frozen
class Prefill:
    """Fill the cell before time 0 to ``utilization`` of its CPUs, with jobs of
    ``tasks`` tasks of the given shape that run ``duration`` seconds (None: all run).
    ``scheduler``: the scheduler that owns the prefilled jobs once placed (a flow
    scheduler then has their running tasks in its network); None: no scheduler.
    ``from_workload``: draw the jobs from the workload's classes instead, durations
    and all (simulator/prefill.py); the fixed shape above is then unused."""

    utilization: float = 0.6
    tasks: int = 100
    cpu: float = 1.0
    mem: float = 2.0
    duration: float | None = None
    scheduler: str | None = None
    from_workload: bool = False

    def jobs(self, total_cpu: float) -> list[JobSpec]:
        target = self.utilization * total_cpu
        per_job = self.tasks * self.cpu
        out: list[JobSpec] = []
        placed = 0.0
        while placed + 1e-9 < target and per_job > 0:
            tasks = min(self.tasks, math.ceil((target - placed) / self.cpu - 1e-9))
            out.append(JobSpec(f"prefill-{len(out) + 1:06d}", "prefill", JobKind.SERVICE, 0.0,
                               tasks, self.duration, self.cpu, self.mem))
            placed += tasks * self.cpu
        return out


# -- traces --------------------------------------------------------------------------

TRACE_FIELDS = ("submit", "class", "tasks", "duration", "cpu", "mem")
# A MapReduce job's activities, named as in a job spec's ``mapreduce`` table; its
# ``tasks`` are the workers it asks for.
TRACE_MAPREDUCE = ("maps", "reduces", "map_seconds", "reduce_seconds", "max_workers")
TRACE_OPTIONAL = ("id", "owner", "priority", "precedence", "constraints", *TRACE_MAPREDUCE)


def load_trace(path: Path, classes: dict[str, JobKind]) -> list[JobSpec]:
    """Jobs from a JSON-lines or CSV trace (by suffix: .jsonl/.json or .csv), sorted
    by submission time. ``classes`` maps the class names a trace may use to kinds."""
    text = _read(path)
    if path.suffix == ".csv":
        rows = _csv_rows(path, text)
    elif path.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path, text)
    else:
        raise InputError(f"{path}: unknown trace format {path.suffix!r} (use .jsonl or .csv)")
    specs = [_spec(path, line, row, classes) for line, row in rows]
    return sorted(specs, key=lambda s: (s.submit, s.id))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e


def _jsonl_rows(path: Path, text: str) -> list[tuple[int, dict[str, object]]]:
    rows = []
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}, line {line}: not JSON: {e.msg} (column {e.colno})") from e
        if not isinstance(row, dict):
            raise InputError(f"{path}, line {line}: expected a JSON object, got "
                             f"{type(row).__name__}")
        rows.append((line, row))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict[str, object]]]:
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in TRACE_FIELDS if f not in (reader.fieldnames or ()) and f != "duration"]
    if missing:
        raise InputError(f"{path}, line 1: the header lacks field(s) {', '.join(missing)} "
                         f"(expected {', '.join(TRACE_FIELDS)}[, id])")
    rows: list[tuple[int, dict[str, object]]] = []
    for row in reader:
        line = reader.line_num
        if None in row:
            raise InputError(f"{path}, line {line}: more values than header fields")
        rows.append((line, {k: v for k, v in row.items() if v != ""}))
    return rows


def _spec(path: Path, line: int, row: dict[str, object],
          classes: dict[str, JobKind]) -> JobSpec:
    where = f"{path}, line {line}"
    unknown = sorted(set(row) - {*TRACE_FIELDS, *TRACE_OPTIONAL})
    if unknown:
        raise InputError(f"{where}, field {unknown[0]!r}: unknown field (expected "
                         f"{', '.join(TRACE_FIELDS + TRACE_OPTIONAL)})")
    cls = row.get("class")
    if not isinstance(cls, str) or cls not in classes:
        raise InputError(f"{where}, field 'class': {cls!r} is not a workload class "
                         f"(known: {', '.join(sorted(classes))})")
    submit = _number(where, row, "submit", minimum=0.0)
    tasks = _number(where, row, "tasks", minimum=1.0)
    if tasks != int(tasks):
        raise InputError(f"{where}, field 'tasks': must be a whole number, got {row['tasks']!r}")
    duration = _number(where, row, "duration", minimum=0.0) if "duration" in row else None
    job_id = row.get("id", f"{cls}-l{line:07d}")
    if not isinstance(job_id, str):
        raise InputError(f"{where}, field 'id': must be a string")
    owner = row.get("owner", "sim")
    if not isinstance(owner, str):
        raise InputError(f"{where}, field 'owner': must be a string, got {owner!r}")
    try:
        check_name(owner, "user")
    except ModelError as e:
        raise InputError(f"{where}, field 'owner': {e}") from None
    priority = _number(where, row, "priority", -1e9) if "priority" in row else 0.0
    if priority != int(priority):
        raise InputError(f"{where}, field 'priority': must be a whole number, got "
                         f"{row['priority']!r}")
    precedence = _number(where, row, "precedence", 0.0) if "precedence" in row else 0.0
    if precedence != int(precedence):
        raise InputError(f"{where}, field 'precedence': must be a whole number, got "
                         f"{row['precedence']!r}")
    text = row.get("constraints", "")
    if not isinstance(text, str):
        raise InputError(f"{where}, field 'constraints': must be a string such as "
                         f"'platform=x|y;max_per_machine=1', got {text!r}")
    try:
        constraints = parse_constraints(text)
    except ValueError as e:
        raise InputError(f"{where}, field 'constraints': {e}") from None
    mapreduce = _mapreduce(where, row, classes[cls], int(tasks))
    return JobSpec(job_id, cls, classes[cls], submit, int(tasks), duration,
                   _number(where, row, "cpu", minimum=0.0), _number(where, row, "mem", 0.0),
                   mapreduce, owner=owner, priority=int(priority), precedence=int(precedence),
                   constraints=constraints)


def _mapreduce(where: str, row: dict[str, object], kind: JobKind,
               workers: int) -> MapReduceSpec | None:
    """A trace row's MapReduce activities: required for a class of kind mapreduce, and
    refused for any other (the same rules as a job spec's ``mapreduce`` table)."""
    given = [f for f in TRACE_MAPREDUCE if f in row]
    if kind is not JobKind.MAPREDUCE:
        if given:
            raise InputError(f"{where}, field {given[0]!r}: only a job of a class of kind "
                             "mapreduce has activities")
        return None
    if "duration" in row:
        raise InputError(f"{where}, field 'duration': a MapReduce job runs as long as its "
                         "activities take (maps, map_seconds, reduces, reduce_seconds); "
                         "leave it out")

    # The numbers as a job spec's mapreduce table has them, judged by the same rules
    # (cellstate.codec.parse_mapreduce); the trace's own work is reading the numbers.
    doc: dict[str, object] = {"tasks": workers}
    for field in TRACE_MAPREDUCE:
        if field in row:
            value = _number(where, row, field, minimum=-math.inf)
            doc[field] = int(value) if field in _WHOLE and value == int(value) else value
    try:
        spec = parse_mapreduce(doc, "", workers_field="tasks")
    except ModelError as e:
        raise InputError(f"{where}: {e}") from None
    assert spec is not None
    return spec


_WHOLE = frozenset({"maps", "reduces", "max_workers"})


def _number(where: str, row: dict[str, object], field: str, minimum: float) -> float:
    if field not in row:
        raise InputError(f"{where}, field {field!r}: missing")
    raw = row[field]
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw) if isinstance(raw, int | float | str) else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"{where}, field {field!r}: {raw!r} is not a finite number")
    if value < minimum:
        raise InputError(f"{where}, field {field!r}: {raw!r} is below the minimum {minimum:g}")
    return value


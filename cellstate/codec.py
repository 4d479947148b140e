"""Encoding of cell records as JSON values in etcd, and parsing of user-given specs.

Two kinds of entry point:

* ``encode_*`` / ``decode_*``: the store's own records. Decoding trusts the layout the
  store wrote (it was validated before), so it is fast, but still checks every resource
  amount (a cheap check, and the fit rules add them up); a value that cannot be decoded
  raises :class:`~cellstate.model.ModelError` naming the key.
* ``parse_*``: user or network input (a job spec, a machine spec, a config). Every
  field is checked and an error names the path of the field that is wrong.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson

from cellstate.model import (
    MAX_AMOUNT,
    MAX_BLOCK_COPIES,
    MAX_INPUT_LOCATIONS,
    MAX_TASK_INPUT_COPIES,
    AgentRecord,
    Allocation,
    Block,
    CellConfig,
    Constraints,
    Detection,
    GangRecord,
    GangState,
    InstanceRecord,
    Job,
    JobKind,
    JobState,
    JobStatus,
    Labels,
    Machine,
    MachineState,
    MapReduceSpec,
    ModelError,
    Requirement,
    Resources,
    SchedulerLimits,
    SchedulerRecord,
    Selector,
    SelectorOp,
    TaskEvent,
    TaskRecord,
    TaskState,
    UsageRecord,
    UserQuota,
    check_amount,
    check_name,
    labels_from,
    set_key_seq,
    trusted_machine,
    trusted_resources,
)

# Decoding looks states up by value in these (an Enum call costs about as much as
# decoding the rest of a task's record); what they lack goes to the Enum, whose error
# is the one a corrupt value has always raised.
_MACHINE_STATES: dict[object, MachineState] = {s.value: s for s in MachineState}
_TASK_STATES: dict[object, TaskState] = {s.value: s for s in TaskState}


_E = TypeVar("_E", bound=enum.Enum)


def _member(table: Mapping[object, _E], cls: type[_E], value: object) -> _E:
    try:
        return table[value]
    except (KeyError, TypeError):
        return cls(value)


MAX_TASKS_PER_JOB = 1_000_000
MAX_PRECEDENCE = 1_000_000
MAX_PRIORITY = 1_000_000  # either way: a job may rank below its owner's default


def _res(r: Resources) -> dict[str, float]:
    return dict(r.amounts)


def _unres(d: Mapping[str, float], signed: bool = False) -> Resources:
    # What _res wrote: no zero amounts, so the sorted pairs are the vector as it was
    # (built without attrs' __init__: an allocation's is decoded for every hold read).
    pairs = tuple(sorted(d.items()))
    # Checked all the same, cheaply: the fit rules add these up, and a value edited in
    # etcd by hand (a zero, negative or NaN amount, a string) would otherwise pass as a
    # vector no parser would have made. Capacities and holds are positive; only the
    # running sums (usage counters, a gang's usage change) may go below zero.
    for name, amount in pairs:
        t = type(amount)
        if (t is not float and t is not int) or not (
                (-MAX_AMOUNT <= amount <= MAX_AMOUNT and amount != 0) if signed
                else 0 < amount <= MAX_AMOUNT):
            raise ValueError(f"resource {name!r} has amount {amount!r}")
    return trusted_resources(pairs)


# -- machines ------------------------------------------------------------------------


def encode_machine(m: Machine) -> bytes:
    """The machine's own record, without its allocations (keys of their own)."""
    doc: dict[str, Any] = {"capacity": _res(m.capacity), "state": m.state._value_}
    if m.rack:
        doc["rack"] = m.rack
    if m.failure_domain:
        doc["fd"] = m.failure_domain
    if m.labels:
        doc["labels"] = dict(m.labels)
    if m.agent:
        doc["agent"] = m.agent
    if m.allocations:
        # How many allocation keys the machine has: a reader that learns only the keys
        # written since the sequence it holds (keys.py) sees deletions from this. Last,
        # so that a decoder splits it off and decodes the rest once (_split_count).
        doc["n"] = len(m.allocations)
    return orjson.dumps(doc)


def decode_machine(
    machine_id: str, value: bytes, revision: int,
    allocations: Mapping[str, Allocation] | None = None, *, copy: bool = True,
) -> Machine:
    return decode_machine_counted(machine_id, value, revision, allocations, copy=copy)[0]


def decode_machine_counted(
    machine_id: str, value: bytes, revision: int,
    allocations: Mapping[str, Allocation] | None = None, *, copy: bool = True,
) -> tuple[Machine, int]:
    """The machine, and how many allocation keys its record says it has. ``copy``:
    the machine gets a copy of ``allocations`` (False: the caller's dict itself, which it
    must not change afterwards)."""
    try:
        static, count = _split_count(value)
        capacity, rack, fd, labels, state, agent, n = _machine_fields(static)
        allocs = (dict(allocations) if copy else allocations) if allocations else {}
        return trusted_machine(machine_id, capacity, rack, fd, labels, state, agent, allocs,
                               revision), n if count is None else count
    except _OldLayout:
        raise ModelError(
            f"machine {machine_id!r} is stored in the layout before allocation keys "
            "(allocations inside the machine's record); this version cannot read it"
        ) from None
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError,
            AttributeError) as e:
        raise ModelError(f"machine {machine_id!r}: stored record is corrupt ({e})") from e


class _OldLayout(Exception):
    pass


_COUNT_FIELD = b',"n":'


def _split_count(value: bytes) -> tuple[bytes, int | None]:
    """A machine's record without the allocation count that :func:`encode_machine`
    writes last, and the count; ``(value, None)`` for a record that does not end so.
    Every placement rewrites the record with only that count changed, so what comes
    before it is decoded once (:func:`_machine_fields`) and not again per placement.
    (A ``"`` inside a JSON string is escaped, so the field's bytes only occur as the
    field itself.)"""
    i = value.rfind(_COUNT_FIELD)
    if i > 0 and value[-1:] == b"}":
        digits = value[i + len(_COUNT_FIELD) : -1]
        if digits.isdigit() and (digits[:1] != b"0" or len(digits) == 1):
            return value[:i] + b"}", int(digits)
    return value, None


@functools.lru_cache(maxsize=65_536)
def _machine_fields(
    static: bytes,
) -> tuple[Resources, str, str, Labels, MachineState, str, int]:
    """A machine record's fields but its allocations (a pure function of the bytes,
    kept for as many machines as a large cell has: see _split_count)."""
    doc = orjson.loads(static)
    if "allocs" in doc:
        raise _OldLayout
    count = doc.get("n", 0)
    if type(count) is not int or count < 0:
        raise ValueError(f"allocation count {count!r}")
    return (_unres(doc["capacity"]), doc.get("rack", ""), doc.get("fd", ""),
            tuple(sorted(doc.get("labels", {}).items())),
            _member(_MACHINE_STATES, MachineState, doc["state"]), doc.get("agent", ""), count)


def encode_alloc(a: Allocation) -> bytes:
    doc: list[Any] = [a.job, a.scheduler, a.precedence, _res(a.resources)]
    if a.gang or a.evicted_by:
        doc += [a.gang, a.evicted_by]
    return orjson.dumps(doc)


def decode_alloc(task: str, value: bytes, key_seq: int = 0) -> Allocation:
    try:
        d = orjson.loads(value)
        gang, evicted_by = (d[4], d[5]) if len(d) > 4 else ("", "")
        return set_key_seq(Allocation(task, d[0], d[1], d[2], _unres(d[3]), gang, evicted_by),
                           key_seq)
    except (orjson.JSONDecodeError, IndexError, TypeError, ValueError) as e:
        raise ModelError(f"allocation of task {task!r}: stored record is corrupt ({e})") from e


# -- jobs ----------------------------------------------------------------------------


def _selector_doc(selector: Selector) -> list[dict[str, Any]]:
    return [{"key": r.key, "op": r.op.value, "values": list(r.values)} for r in selector]


def job_to_doc(job: Job) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": job.id,
        "owner": job.owner,
        "scheduler": job.scheduler,
        "kind": job.kind.value,
        "task_count": job.task_count,
        "task_resources": _res(job.task_resources),
        "gang": job.gang,
        "precedence": job.precedence,
    }
    c = job.constraints
    if c != Constraints():
        doc["constraints"] = {
            "machine_selector": _selector_doc(c.machine_selector),
            "anti_affinity": _selector_doc(c.anti_affinity),
            "affinity": _selector_doc(c.affinity),
            "max_per_machine": c.max_per_machine,
        }
    if job.labels:
        doc["labels"] = dict(job.labels)
    if job.duration is not None:
        doc["duration"] = job.duration
    if job.command:
        doc["command"] = list(job.command)
    if job.submitted_at:
        doc["submitted_at"] = job.submitted_at
    if job.detection is not None:
        doc["detection"] = job.detection.value
    if job.input:
        doc["input"] = dict(job.input)
    if job.task_input:
        doc["task_input"] = [[{"size": b.size, "on": list(b.on)} for b in blocks]
                             for blocks in job.task_input]
    if job.priority:
        doc["priority"] = job.priority
    if job.mapreduce is not None:
        mr = job.mapreduce
        doc["mapreduce"] = {"maps": mr.maps, "reduces": mr.reduces,
                            "map_seconds": mr.map_seconds, "reduce_seconds": mr.reduce_seconds,
                            "workers": mr.workers, "max_workers": mr.max_workers}
    return doc


def encode_job(job: Job) -> bytes:
    return orjson.dumps(job_to_doc(job))


def decode_job(job_id: str, value: bytes, revision: int) -> Job:
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise ModelError(f"job {job_id!r}: stored record is corrupt ({e})") from e
    return parse_job(doc, revision=revision)


class _Fields:
    """Reads fields of one user document, naming the path of whatever is wrong."""

    def __init__(self, doc: object, where: str) -> None:
        if not isinstance(doc, Mapping):
            raise ModelError(f"{where}: expected an object, got {type(doc).__name__}")
        self.doc = doc
        self.where = where
        self.seen: set[str] = set()

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, default: Any = None, *, required: bool = False) -> Any:
        self.seen.add(name)
        if name not in self.doc:
            if required:
                raise ModelError(f"{self.path(name)} is required")
            return default
        return self.doc[name]

    def string(self, name: str, *, required: bool = False, default: str = "") -> str:
        v = self.get(name, default, required=required)
        if not isinstance(v, str):
            raise ModelError(f"{self.path(name)} must be a string, got {v!r}")
        return v

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        v = self.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelError(f"{self.path(name)} must be an integer, got {v!r}")
        if not lo <= v <= hi:
            raise ModelError(f"{self.path(name)} must be between {lo} and {hi}, got {v}")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        v = self.get(name, default)
        if not isinstance(v, bool):
            raise ModelError(f"{self.path(name)} must be true or false, got {v!r}")
        return v

    def no_unknown(self) -> None:
        unknown = sorted(set(self.doc) - self.seen)
        if unknown:
            raise ModelError(
                f"{self.where or 'document'}: unknown field(s) {', '.join(map(repr, unknown))}"
            )


def parse_resources(value: object, where: str, *, keep_zero: bool = False) -> Resources:
    if not isinstance(value, Mapping):
        raise ModelError(f"{where} must be an object of dimension to amount, got {value!r}")
    return Resources.from_mapping(value, where, keep_zero=keep_zero)


def parse_selector(value: object, where: str) -> Selector:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ModelError(f"{where} must be a list of requirements")
    out = []
    for i, item in enumerate(value):
        f = _Fields(item, f"{where}[{i}]")
        key = check_name(f.string("key", required=True), f.path("key"))
        op_name = f.string("op", default="in")
        try:
            op = SelectorOp(op_name)
        except ValueError:
            choices = ", ".join(o.value for o in SelectorOp)
            raise ModelError(f"{f.path('op')}: {op_name!r} is not one of {choices}") from None
        values = f.get("values", [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ModelError(f"{f.path('values')} must be a list of strings")
        if op in (SelectorOp.IN, SelectorOp.NOT_IN) and not values:
            raise ModelError(f"{f.path('values')} must not be empty for op {op.value!r}")
        f.no_unknown()
        out.append(Requirement(key, op, tuple(values)))
    return tuple(out)


def parse_constraints(value: object, where: str) -> Constraints:
    if value is None:
        return Constraints()
    f = _Fields(value, where)
    c = Constraints(
        parse_selector(f.get("machine_selector"), f.path("machine_selector")),
        parse_selector(f.get("anti_affinity"), f.path("anti_affinity")),
        parse_selector(f.get("affinity"), f.path("affinity")),
        f.integer("max_per_machine", 0, 0, MAX_TASKS_PER_JOB),
    )
    f.no_unknown()
    return c


def parse_job(doc: object, where: str = "job", *, revision: int = 0) -> Job:
    """A job from a user document (JSON object), checked field by field."""
    f = _Fields(doc, where)
    job_id = check_name(f.string("id", required=True), f.path("id"))
    mapreduce = parse_mapreduce(f.get("mapreduce"), f.path("mapreduce"))
    kind_name = f.string("kind", default="mapreduce" if mapreduce is not None else "batch")
    try:
        kind = JobKind(kind_name)
    except ValueError:
        choices = ", ".join(k.value for k in JobKind)
        raise ModelError(f"{f.path('kind')}: {kind_name!r} is not one of {choices}") from None
    resources = parse_resources(f.get("task_resources", required=True), f.path("task_resources"))
    if not resources:
        raise ModelError(f"{f.path('task_resources')} must ask for some resource")
    duration = f.get("duration")
    if duration is not None and (
        isinstance(duration, bool)
        or not isinstance(duration, int | float)
        or not math.isfinite(duration)
        or not 0 <= duration <= MAX_AMOUNT
    ):
        raise ModelError(f"{f.path('duration')} must be a non-negative number of seconds")
    command = f.get("command", [])
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise ModelError(f"{f.path('command')} must be a list of strings")
    detection_name = f.get("detection")
    detection = None
    if detection_name is not None:
        try:
            detection = Detection(detection_name)
        except ValueError:
            raise ModelError(
                f"{f.path('detection')}: {detection_name!r} is not one of fine, coarse"
            ) from None
    submitted_at = f.get("submitted_at", 0.0)
    if isinstance(submitted_at, bool) or not isinstance(submitted_at, int | float):
        raise ModelError(f"{f.path('submitted_at')} must be a number")
    input_ = _parse_input(f.get("input"), f.path("input"))
    task_input = _parse_task_input(f.get("task_input"), f.path("task_input"))
    if mapreduce is None:
        task_count = f.integer("task_count", 1, 1, MAX_TASKS_PER_JOB)
    else:
        # The workers it runs now: those it asked for until an elastic scheduler grows it.
        task_count = f.integer("task_count", mapreduce.workers, mapreduce.workers,
                               mapreduce.max_workers)
    gang = f.boolean("gang", False)
    _check_kind(f, kind, mapreduce, gang, duration, command)
    job = Job(
        id=job_id,
        owner=check_name(f.string("owner", default="nobody"), f.path("owner")),
        scheduler=check_name(f.string("scheduler", required=True), f.path("scheduler")),
        task_count=task_count,
        task_resources=resources,
        kind=kind,
        gang=gang,
        precedence=f.integer("precedence", 0, 0, MAX_PRECEDENCE),
        constraints=parse_constraints(f.get("constraints"), f.path("constraints")),
        labels=labels_from(f.get("labels"), f.path("labels")),
        duration=float(duration) if duration is not None else None,
        command=tuple(command),
        submitted_at=float(submitted_at),
        detection=detection,
        revision=revision,
        input=input_,
        task_input=task_input,
        mapreduce=mapreduce,
        priority=f.integer("priority", 0, -MAX_PRIORITY, MAX_PRIORITY),
    )
    f.no_unknown()
    if len(task_input) > task_count:
        raise ModelError(f"{f.path('task_input')} lists the input of {len(task_input)} "
                         f"tasks; the job has {task_count}")
    return job


# A MapReduce job's activity counts and durations: generous, but finite.
MAX_ACTIVITIES = 10_000_000
MAX_ACTIVITY_SECONDS = 1e7


def parse_mapreduce(value: object, where: str,
                    workers_field: str = "workers") -> MapReduceSpec | None:
    """A MapReduce job's activities and workers (``mapreduce`` in a job spec; a
    simulator trace's row has the same fields and rules, its workers under the name
    ``workers_field``, ``tasks``)."""
    if value is None:
        return None
    f = _Fields(value, where)
    if "maps" not in f.doc:
        raise ModelError(f"{f.path('maps')} is required (the number of map activities)")
    maps = f.integer("maps", 0, 1, MAX_ACTIVITIES)
    reduces = f.integer("reduces", 0, 0, MAX_ACTIVITIES)
    map_seconds = _activity_seconds(f, "map_seconds", required=True)
    reduce_seconds = _activity_seconds(f, "reduce_seconds", required=reduces > 0)
    if workers_field not in f.doc:
        raise ModelError(f"{f.path(workers_field)} is required (the workers the job asks "
                         "for)")
    workers = f.integer(workers_field, 1, 1, MAX_TASKS_PER_JOB)
    # By default the job may grow until every activity of a phase runs at once: more
    # workers than that never help.
    useful = max(workers, min(max(maps, reduces), MAX_TASKS_PER_JOB))
    max_workers = f.integer("max_workers", useful, 1, MAX_TASKS_PER_JOB)
    if max_workers < workers:
        raise ModelError(f"{f.path('max_workers')} ({max_workers}) is below "
                         f"{f.path(workers_field)} ({workers}): the elastic upper bound cannot "
                         "be less than what the job asks for")
    f.no_unknown()
    return MapReduceSpec(maps, reduces, map_seconds, reduce_seconds, workers, max_workers)


def _activity_seconds(f: _Fields, name: str, *, required: bool) -> float:
    v = f.get(name, 0.0, required=required)
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
            or not (0 < v <= MAX_ACTIVITY_SECONDS or (v == 0 and not required))):
        raise ModelError(f"{f.path(name)} must be a number of seconds above 0 and at most "
                         f"{MAX_ACTIVITY_SECONDS:g}, got {v!r}")
    return float(v)


def _check_kind(f: _Fields, kind: JobKind, mapreduce: MapReduceSpec | None, gang: bool,
                duration: object, command: object) -> None:
    """A MapReduce job, and only one, has a ``mapreduce`` table; its workers run for as
    long as its activities take, grown one by one (never as a gang)."""
    if kind is JobKind.MAPREDUCE and mapreduce is None:
        raise ModelError(f"{f.path('mapreduce')} is required for a job of kind 'mapreduce' "
                         "(maps, reduces, map_seconds, reduce_seconds, workers)")
    if mapreduce is None:
        return
    if kind is not JobKind.MAPREDUCE:
        raise ModelError(f"{f.path('kind')}: a job with a mapreduce table is of kind "
                         f"'mapreduce', not {kind.value!r}")
    if gang:
        raise ModelError(f"{f.path('gang')}: a MapReduce job cannot be a gang (its workers "
                         "are placed and grown one by one)")
    for name, given in (("duration", duration is not None), ("command", bool(command))):
        if given:
            raise ModelError(f"{f.path(name)}: a MapReduce job runs as long as its map and "
                             "reduce activities take; it takes no duration or command")


def _parse_input(value: object, where: str) -> tuple[tuple[str, float], ...]:
    """A job's input locations: a mapping of machine id to amount of data there."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ModelError(f"{where} must be a mapping of machine id to the amount of the "
                         "job's input data stored there")
    if len(value) > MAX_INPUT_LOCATIONS:
        raise ModelError(f"{where} names {len(value)} machines, above the limit of "
                         f"{MAX_INPUT_LOCATIONS}")
    out = []
    for mid, amount in value.items():
        check_name(mid, f"{where}: machine id")
        out.append((mid, check_amount(amount, f"{where}.{mid}")))
    return tuple(sorted(out))


def _parse_task_input(value: object, where: str) -> tuple[tuple[Block, ...], ...]:
    """Each task's input blocks: a list (task by task) of lists of blocks, each a
    mapping with ``size`` and ``on`` (the machines holding a copy)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ModelError(f"{where} must be a list with, for each task in order, the list "
                         "of its input blocks ({size = ..., on = [machine, ...]})")
    out: list[tuple[Block, ...]] = []
    copies = 0
    for i, blocks in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(blocks, list):
            raise ModelError(f"{at} must be a list of blocks ({{size = ..., on = "
                             f"[machine, ...]}}), got {blocks!r}")
        task: list[Block] = []
        for j, block in enumerate(blocks):
            b = _Fields(block, f"{at}[{j}]")
            size = check_amount(b.get("size", required=True), b.path("size"))
            on = b.get("on", required=True)
            if (not isinstance(on, list) or not on or len(on) > MAX_BLOCK_COPIES
                    or not all(isinstance(m, str) for m in on)):
                raise ModelError(f"{b.path('on')} must list 1 to {MAX_BLOCK_COPIES} machine "
                                 f"ids holding a copy of the block, got {on!r}")
            if len(set(on)) != len(on):
                raise ModelError(f"{b.path('on')} names a machine twice: {on!r}")
            for mid in on:
                check_name(mid, f"{b.path('on')}: machine id")
            b.no_unknown()
            copies += len(on)
            if copies > MAX_TASK_INPUT_COPIES:
                raise ModelError(f"{where} names more than {MAX_TASK_INPUT_COPIES} copies "
                                 "of blocks in all, above the limit")
            task.append(Block(size, tuple(on)))
        out.append(tuple(task))
    return tuple(out)


# -- machines from user input --------------------------------------------------------


def machine_to_doc(m: Machine) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": m.id, "capacity": _res(m.capacity), "state": m.state._value_}
    if m.rack:
        doc["rack"] = m.rack
    if m.failure_domain:
        doc["failure_domain"] = m.failure_domain
    if m.labels:
        doc["labels"] = dict(m.labels)
    if m.agent:
        doc["agent"] = m.agent
    return doc


def parse_machine(doc: object, where: str = "machine") -> Machine:
    f = _Fields(doc, where)
    machine_id = check_name(f.string("id", required=True), f.path("id"))
    capacity = parse_resources(f.get("capacity", required=True), f.path("capacity"))
    if not capacity:
        raise ModelError(f"{f.path('capacity')} must have some resource")
    state_name = f.string("state", default="up")
    try:
        state = MachineState(state_name)
    except ValueError:
        choices = ", ".join(s.value for s in MachineState)
        raise ModelError(f"{f.path('state')}: {state_name!r} is not one of {choices}") from None
    rack = f.string("rack")
    fd = f.string("failure_domain")
    labels: Labels = labels_from(f.get("labels"), f.path("labels"))
    agent = f.string("agent")
    f.no_unknown()
    for value, name in ((rack, "rack"), (fd, "failure_domain"), (agent, "agent")):
        if value:
            check_name(value, f.path(name))
    return Machine(machine_id, capacity, rack, fd, labels, state, agent)


# -- tasks, gangs, usage, config -----------------------------------------------------


def encode_task(t: TaskRecord) -> bytes:
    doc: dict[str, Any] = {"state": t.state._value_}
    if t.machine:
        doc["machine"] = t.machine
    if t.scheduler:
        doc["scheduler"] = t.scheduler
    if t.gang:
        doc["gang"] = t.gang
    if t.exit_code is not None:
        doc["exit_code"] = t.exit_code
    if t.started_at:
        doc["started_at"] = t.started_at
    if t.ended_at:
        doc["ended_at"] = t.ended_at
    if t.detail:
        doc["detail"] = t.detail
    # Times to the millisecond, and each event as [at, state, machine, by, why]: every
    # placement writes the record, so its bytes count (docs/performance.md).
    if t.placed_at:
        doc["placed_at"] = round(t.placed_at, 3)
    if t.history:
        doc["history"] = [[round(e.at, 3), e.state._value_, e.machine, e.by, e.why]
                          for e in t.history]
    return orjson.dumps(doc)


def decode_task(tid: str, value: bytes, revision: int) -> TaskRecord:
    job, _, index = tid.rpartition("/")
    try:
        doc = orjson.loads(value)
        return TaskRecord(
            job,
            int(index),
            _member(_TASK_STATES, TaskState, doc["state"]),
            doc.get("machine", ""),
            doc.get("scheduler", ""),
            doc.get("gang", ""),
            revision,
            _optional_int(doc.get("exit_code")),
            float(doc.get("started_at", 0.0)),
            float(doc.get("ended_at", 0.0)),
            str(doc.get("detail", "")),
            float(doc.get("placed_at", 0.0)),
            tuple(TaskEvent(float(at), _member(_TASK_STATES, TaskState, state), str(machine),
                            str(by), str(why))
                  for at, state, machine, by, why in doc.get("history", ())),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"task {tid!r}: stored record is corrupt ({e})") from e


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"exit_code {value!r} is not a whole number")
    return value


def encode_gang(g: GangRecord) -> bytes:
    return orjson.dumps(
        {
            "scheduler": g.scheduler,
            "state": g.state.value,
            "claims": g.claims,
            "usage_delta": {s: _res(r) for s, r in g.usage_delta.items()},
        }
    )


def decode_gang(gang_id: str, value: bytes, revision: int) -> GangRecord:
    try:
        doc = orjson.loads(value)
        return GangRecord(
            gang_id,
            doc["scheduler"],
            GangState(doc["state"]),
            doc["claims"],
            {s: _unres(r, signed=True) for s, r in doc.get("usage_delta", {}).items()},
            revision,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"gang {gang_id!r}: stored record is corrupt ({e})") from e


def encode_status(s: JobStatus) -> bytes:
    return orjson.dumps({"state": s.state.value, "reason": s.reason, "by": s.by, "at": s.at})


def decode_status(job: str, value: bytes, revision: int) -> JobStatus:
    try:
        doc = orjson.loads(value)
        return JobStatus(job, JobState(doc["state"]), doc["reason"], doc.get("by", ""),
                         doc.get("at", 0.0), revision)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"job status {job!r}: stored record is corrupt ({e})") from e


def encode_instance(i: InstanceRecord) -> bytes:
    return orjson.dumps({"policy": i.policy, "started_at": i.started_at})


def decode_instance(ident: str, value: bytes, revision: int) -> InstanceRecord:
    scheduler, _, instance = ident.partition("/")
    try:
        doc = orjson.loads(value)
        return InstanceRecord(scheduler, instance, doc.get("policy", ""),
                              doc.get("started_at", 0.0), revision)
    except (orjson.JSONDecodeError, TypeError, ValueError) as e:
        raise ModelError(f"instance {ident!r}: stored record is corrupt ({e})") from e


def encode_agent(a: AgentRecord) -> bytes:
    return orjson.dumps({"machines": list(a.machines), "started_at": a.started_at})


def decode_agent(agent: str, value: bytes, revision: int) -> AgentRecord:
    try:
        doc = orjson.loads(value)
        return AgentRecord(agent, tuple(doc["machines"]), doc.get("started_at", 0.0), revision)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"agent {agent!r}: stored record is corrupt ({e})") from e


def encode_scheduler(s: SchedulerRecord) -> bytes:
    return orjson.dumps({"policy": s.policy})


def decode_scheduler(name: str, value: bytes, revision: int) -> SchedulerRecord:
    try:
        return SchedulerRecord(name, orjson.loads(value).get("policy", ""), revision)
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
        raise ModelError(f"scheduler {name!r}: stored record is corrupt ({e})") from e


def encode_usage(u: UsageRecord) -> bytes:
    doc: dict[str, Any] = {"base": u.base_revision, "used": _res(u.used)}
    if u.base_used is not None:
        doc["base_used"] = _res(u.base_used)
    return orjson.dumps(doc)


def decode_usage(scheduler: str, value: bytes, revision: int) -> UsageRecord:
    try:
        doc = orjson.loads(value)
        base_used = doc.get("base_used")
        return UsageRecord(scheduler, doc["base"], _unres(doc["used"], signed=True), revision,
                           None if base_used is None else _unres(base_used, signed=True))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"usage {scheduler!r}: stored record is corrupt ({e})") from e


def config_to_doc(c: CellConfig) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    for name, lim in sorted(c.limits.items()):
        limits[name] = {k: v for k, v in limits_to_doc(lim).items()
                        if v is not None and v != {}}
    return {"limits": limits}


def _quota_doc(q: UserQuota) -> dict[str, Any]:
    return {**({"count": q.count} if q.count is not None else {}), **_res(q.resources)}


def limits_to_doc(lim: SchedulerLimits | None) -> dict[str, Any]:
    """One scheduler's limits as its table in the config: every field, None (or an
    empty table) where it has no such limit."""
    lim = lim or SchedulerLimits()
    cap = lim.max_resources
    return {"max_precedence": lim.max_precedence,
            "max_resources": _res(cap) if cap is not None else None,
            "shares": {u: _res(r) for u, r in sorted(lim.shares.items())},
            "quotas": {u: _quota_doc(q) for u, q in sorted(lim.quotas.items())}}


_LIMIT_FIELDS = ("max_precedence", "max_resources", "shares", "quotas")


def changed_limits(scheduler: str, current: SchedulerLimits | None,
                   changes: object) -> SchedulerLimits:
    """``current`` with ``changes`` applied: an object whose ``max_precedence`` and
    ``max_resources`` (each optional) replace the current ones, None removing that
    limit, and whose ``shares`` and ``quotas`` (user -> entry) change those users'
    entries only, None removing a user's entry (``shares: null``: every user's).
    Judged as a server's ``[limits.NAME]`` table is (errors name the field)."""
    where = f"limits.{scheduler}"
    if not isinstance(changes, Mapping):
        raise ModelError(f"{where} must be an object with some of {', '.join(_LIMIT_FIELDS)}, "
                         f"got {changes!r}")
    unknown = sorted(set(changes) - set(_LIMIT_FIELDS))
    if unknown:
        raise ModelError(f"{where}: unknown field {unknown[0]!r} (known: "
                         f"{', '.join(_LIMIT_FIELDS)})")
    if not changes:
        raise ModelError(f"{where}: nothing to change (give some of "
                         f"{', '.join(_LIMIT_FIELDS)})")
    merged: dict[str, Any] = limits_to_doc(current)
    for field, value in changes.items():
        if field in ("shares", "quotas") and value is not None:
            if not isinstance(value, Mapping):
                raise ModelError(f"{where}.{field} must be an object of user to entry "
                                 f"(null removes a user's), got {value!r}")
            table = dict(merged[field])
            for user, entry in value.items():
                if entry is None:
                    table.pop(user, None)
                else:
                    table[user] = entry
            merged[field] = table
        else:
            merged[field] = value
    merged = {k: v for k, v in merged.items() if v is not None}
    return parse_config({"limits": {scheduler: merged}}, "").limits[scheduler]


def _user_table(f: _Fields, name: str, parse: Callable[[object, str], Any]) -> dict[str, Any]:
    raw = f.get(name, {})
    if not isinstance(raw, Mapping):
        raise ModelError(f"{f.path(name)} must be a table of user to entry, got {raw!r}")
    out = {}
    for user, entry in raw.items():
        path = f"{f.path(name)}.{user}"
        check_name(user, path)
        out[user] = parse(entry, path)
    return out


def _parse_share(entry: object, where: str) -> Resources:
    share = parse_resources(entry, where)
    if not share.amounts:
        raise ModelError(f"{where}: a share names at least one dimension with an amount "
                         "above 0 (e.g. {cpu = 100})")
    return share


def _parse_quota(entry: object, where: str) -> UserQuota:
    if not isinstance(entry, Mapping):
        raise ModelError(f"{where} must be an object of count and dimension to amount, "
                         f"got {entry!r}")
    rest = dict(entry)
    count = rest.pop("count", None)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or not 0 <= count <= 10**9):
        raise ModelError(f"{where}.count must be a whole number from 0 to 1e9, got {count!r}")
    if count is None and not rest:
        raise ModelError(f"{where}: a quota caps something (count and/or dimensions, "
                         "e.g. {count = 50, cpu = 100})")
    return UserQuota(count, parse_resources(rest, where, keep_zero=True))


def encode_config(c: CellConfig) -> bytes:
    return orjson.dumps(config_to_doc(c))


def decode_config(value: bytes, revision: int) -> CellConfig:
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise ModelError(f"cell config: stored record is corrupt ({e})") from e
    return parse_config(doc, revision=revision)


def parse_config(doc: object, where: str = "config", *, revision: int = 0) -> CellConfig:
    f = _Fields(doc, where)
    raw = f.get("limits", {})
    f.no_unknown()
    if not isinstance(raw, Mapping):
        raise ModelError(f"{f.path('limits')} must be an object keyed by scheduler name")
    limits = {}
    for name, entry in raw.items():
        path = f"{f.path('limits')}.{name}"
        check_name(name, path)
        lf = _Fields(entry, path)
        max_prec = lf.get("max_precedence")
        if max_prec is not None:
            max_prec = lf.integer("max_precedence", 0, 0, MAX_PRECEDENCE)
        max_res = lf.get("max_resources")
        limits[name] = SchedulerLimits(
            max_prec,
            # A limit of 0 in a dimension is a limit, not "no limit" (dropping the zero
            # as other resources do would leave that dimension unlimited).
            parse_resources(max_res, lf.path("max_resources"), keep_zero=True)
            if max_res is not None else None,
            _user_table(lf, "shares", _parse_share),
            _user_table(lf, "quotas", _parse_quota),
        )
        lf.no_unknown()
    return CellConfig(limits, revision)

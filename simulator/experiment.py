"""Experiment files: one TOML file per experiment (cell, workload, schedulers, sweep,
plots). See docs/simulator.md for the format. Every error names the file, the line
(as well as it can be found) and the field.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import attrs

from cellstate import codec
from cellstate.model import (
    CellConfig,
    Detection,
    JobKind,
    ModelError,
    SchedulerLimits,
    TxnMode,
    check_name,
)
from schedulers.runtime import FRUITLESS_RULES, RETRY_ORDERS
from simulator.config import (
    FAILURE_SCOPES,
    Architecture,
    CellSpec,
    DecisionTime,
    FailureSpec,
    RetrySpec,
    SchedulerSpec,
    SimConfig,
    TwoLevelSpec,
)
from simulator.constraints import Attribute, ConstraintGen
from simulator.workload import (
    PLACEMENTS,
    READS,
    Distribution,
    Diurnal,
    InputError,
    InputSpec,
    JobClass,
    MapReduceClass,
    Prefill,
)

Doc = dict[str, Any]
Path_ = tuple[str | int, ...]
CLOCKS = ("cpu", "wall")  # what measured decision times are measured with
FIDELITIES = ("lightweight", "high")
PREFILL_JOBS = ("workload", "fixed")  # where prefill jobs come from
# Arrays of tables whose entries a path picks by their ``name``.
_NAMED_ARRAYS = ("workload", "scheduler")


@attrs.frozen
class Axis:
    """One sweep dimension: each value is set at every path in ``set``; a value that is
    a list as long as ``set`` gives its i-th element to the i-th path. ``labels`` name
    the values in results and plots (default: the values themselves)."""

    name: str
    paths: tuple[str, ...]
    values: tuple[Any, ...]
    labels: tuple[Any, ...]

    def assignments(self, value: Any) -> list[tuple[str, Any]]:
        if isinstance(value, list) and len(self.paths) > 1 and len(value) == len(self.paths):
            return list(zip(self.paths, value, strict=True))
        return [(p, value) for p in self.paths]


PLOT_KINDS = ("line", "cdf", "utilization", "speedup", "effective")
SERIES = ("effective", "raw")  # the integrated CPU utilization series (effective plots)


@attrs.frozen
class PlotSpec:
    """``line``: metrics (y) over a sweep axis (x), one line per value of ``series``.
    ``cdf``: the distributions named in y (e.g. ``mapreduce_speedup``), one line
    per run (labelled by its ``series`` value, or by its whole sweep point).
    ``utilization``: the utilization of the resources named in y (``cpu``, ``mem``)
    over time, one panel per run. ``speedup``: each paired run's per-job speedups
    (see :class:`SpeedupSpec`), ranked, one line per pair. ``effective``: the CPU
    utilization series named in y (``effective``, ``raw``) over time, one line per run
    and series."""

    x: str
    y: tuple[str, ...]
    series: str = ""  # a sweep axis: one line per value
    title: str = ""
    ylabel: str = ""
    logx: bool = False
    logy: bool = False
    file: str = ""
    kind: str = "line"


@attrs.frozen
class SpeedupSpec:
    """Pairs of runs compared job by job: each run whose value on ``axis`` is not
    ``baseline`` is paired with the run that has ``baseline`` there and the same
    values on every other axis. A job's speedup is its completion time in the run over
    that in the baseline (Cook's ratio: below 1 is faster); within ``tolerance`` of 1
    it counts as unchanged."""

    axis: str
    baseline: Any
    tolerance: float = 0.01


@attrs.frozen
class Run:
    """One point of the sweep: the axis values and the config they give."""

    point: dict[str, Any]
    config: SimConfig


@attrs.frozen
class Experiment:
    name: str
    description: str
    path: Path
    axes: tuple[Axis, ...]
    runs: tuple[Run, ...]
    plots: tuple[PlotSpec, ...]
    speedup: SpeedupSpec | None = None


class _Where:
    """Turns a field path into "file, line N, field a.b.c"."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def error(self, field: Path_, message: str) -> InputError:
        line = self.line_of(field)
        at = f", line {line}" if line else ""
        name = ".".join(str(p) for p in field)
        return InputError(f"{self.path}{at}, field {name!r}: {message}")

    def line_of(self, field: Path_) -> int | None:
        if not field:
            return None
        start, stop = 0, len(self.lines)
        rest: list[str | int] = list(field)
        head = str(rest.pop(0))
        if rest and isinstance(rest[0], int):
            index = rest.pop(0)
            assert isinstance(index, int)
            hits = [i for i, t in enumerate(self.lines)
                    if re.match(rf"\s*\[\[\s*{re.escape(head)}\s*\]\]", t)]
            if index >= len(hits):
                return None
            start = hits[index]
            stop = self._next_header(start)
            if not rest:
                return start + 1
        elif rest:
            hits = [i for i, t in enumerate(self.lines)
                    if re.match(rf"\s*\[\s*{re.escape(head)}\s*\]", t)]
            # A sub-table may have a header of its own: [limits.batch].
            sub = [i for i, t in enumerate(self.lines)
                   if re.match(rf"\s*\[\s*{re.escape(head)}\s*\.\s*\"?"
                               rf"{re.escape(str(rest[0]))}\"?\s*\]", t)]
            if hits:
                start, stop = hits[0], self._next_header(hits[0])
            elif sub:
                start, stop = sub[0], self._next_header(sub[0])
                rest.pop(0)
                if not rest:
                    return start + 1
            else:
                rest.insert(0, head)
        else:
            rest = [head]
            stop = self._next_header(-1)
        key = str(rest[0])
        for i in range(start, stop):
            if re.match(rf"\s*\"?{re.escape(key)}\"?\s*=", self.lines[i]):
                return i + 1
        return start + 1 if start or field[0] != key else None

    def _next_header(self, after: int) -> int:
        for i in range(after + 1, len(self.lines)):
            if re.match(r"\s*\[", self.lines[i]):
                return i
        return len(self.lines)


def load(path: Path) -> Experiment:
    """Read and check an experiment file; every run of its sweep is built (and so
    checked) before anything runs."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from e
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not valid TOML: {e}") from e
    where = _Where(path, text)
    _only(where, (), doc, {"name", "description", "architecture", "horizon", "day", "seed",
                           "sample_interval", "warmup", "trace", "cell", "prefill",
                           "workload", "scheduler", "retry", "two_level", "sweep", "plot",
                           "drain", "speedup", "fidelity", "measure_decisions", "failures",
                           "limits"})
    name = _str(where, ("name",), doc.get("name", path.stem))
    axes = tuple(_axis(where, i, a) for i, a in enumerate(_list(where, ("sweep",),
                                                                  doc.get("sweep", []))))
    plots = tuple(_plot(where, i, p, axes) for i, p in enumerate(_list(where, ("plot",),
                                                                       doc.get("plot", []))))
    speedup = _speedup(where, doc["speedup"], axes) if "speedup" in doc else None
    if speedup is None and any(p.kind == "speedup" for p in plots):
        i = next(i for i, p in enumerate(plots) if p.kind == "speedup")
        raise where.error(("plot", i, "kind"), "a speedup plot needs a [speedup] table "
                          "(which runs to pair)")
    runs = []
    for combo in itertools.product(*(a.values for a in axes)) if axes else [()]:
        run_doc = copy.deepcopy(doc)
        point: dict[str, Any] = {}
        for axis, value in zip(axes, combo, strict=True):
            point[axis.name] = axis.labels[axis.values.index(value)]
            for p, v in axis.assignments(value):
                _set(where, run_doc, axis, p, v)
        try:
            runs.append(Run(point, _config(where, run_doc)))
        except InputError as e:
            if point:
                raise InputError(f"{e} (in the sweep run {point})") from e
            raise
    return Experiment(name, str(doc.get("description", "")), path, axes, tuple(runs), plots,
                      speedup)


def _speedup(where: _Where, raw: object, axes: tuple[Axis, ...]) -> SpeedupSpec:
    at: Path_ = ("speedup",)
    t = _table(where, at, raw)
    _only(where, at, t, {"axis", "baseline", "tolerance"})
    name = _str(where, (*at, "axis"), t.get("axis"))
    axis = next((a for a in axes if a.name == name), None)
    if axis is None:
        raise where.error((*at, "axis"), f"{name!r} is not a sweep axis (axes: "
                          f"{', '.join(a.name for a in axes) or 'none'})")
    baseline = t.get("baseline")
    if baseline not in axis.labels:
        raise where.error((*at, "baseline"), f"{_show(baseline)} is not a value of axis "
                          f"{name!r} (its values: {', '.join(map(str, axis.labels))})")
    if len(axis.labels) < 2:
        raise where.error((*at, "axis"), f"axis {name!r} has one value: nothing to pair")
    tolerance = _num(where, (*at, "tolerance"), t.get("tolerance", 0.01))
    if tolerance >= 1:
        raise where.error((*at, "tolerance"), f"must be below 1, got {tolerance:g}")
    return SpeedupSpec(name, baseline, tolerance)


# -- the sweep -----------------------------------------------------------------------


def _axis(where: _Where, i: int, raw: object) -> Axis:
    at: Path_ = ("sweep", i)
    t = _table(where, at, raw)
    _only(where, at, t, {"name", "set", "values", "labels"})
    paths = tuple(_str(where, (*at, "set"), p) for p in _list(where, (*at, "set"),
                                                                t.get("set")))
    values = tuple(_list(where, (*at, "values"), t.get("values")))
    if not paths or not values:
        raise where.error((*at, "set" if not paths else "values"), "must not be empty")
    labels = tuple(_list(where, (*at, "labels"), t.get("labels", list(values))))
    if len(labels) != len(values):
        raise where.error((*at, "labels"), f"has {len(labels)} entries for {len(values)} values")
    return Axis(_str(where, (*at, "name"), t.get("name")), paths, values, labels)


def _set(where: _Where, doc: Doc, axis: Axis, dotted: str, value: Any) -> None:
    """Set ``value`` at a dotted path; arrays of named tables are entered by name."""
    parts = dotted.split(".")
    node: Any = doc
    for j, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            found = [x for x in node if isinstance(x, dict) and x.get("name") == part]
            if not found:
                raise where.error(("sweep",), f"axis {axis.name!r}: path {dotted!r}: no "
                                  f"entry named {part!r} in {'.'.join(parts[:j])!r}")
            node = found[0]
            continue
        if not isinstance(node, dict):
            raise where.error(("sweep",), f"axis {axis.name!r}: path {dotted!r} does not lead"
                              " to a table")
        node = node.setdefault(part, {})
    if not isinstance(node, dict):
        raise where.error(("sweep",), f"axis {axis.name!r}: path {dotted!r} does not lead to"
                          " a table")
    node[parts[-1]] = value


def _plot(where: _Where, i: int, raw: object, axes: tuple[Axis, ...]) -> PlotSpec:
    at: Path_ = ("plot", i)
    t = _table(where, at, raw)
    _only(where, at, t, {"x", "y", "series", "title", "ylabel", "logx", "logy", "file",
                         "kind"})
    names = {a.name for a in axes}
    kind = t.get("kind", "line")
    if kind not in PLOT_KINDS:
        raise where.error((*at, "kind"), f"{_show(kind)} is not one of {', '.join(PLOT_KINDS)}")
    x = _str(where, (*at, "x"), t.get("x")) if kind == "line" or "x" in t else ""
    series = _str(where, (*at, "series"), t["series"]) if "series" in t else ""
    for field, value in (("x", x), ("series", series)):
        if value and value not in names:
            raise where.error((*at, field), f"{value!r} is not a sweep axis (axes: "
                              f"{', '.join(sorted(names)) or 'none'})")
    # A speedup plot draws the pairs' speedups: it has no y of its own.
    raw_y = t.get("y", [] if kind == "speedup" else None)
    ys = tuple(_str(where, (*at, "y"), y) for y in _list(where, (*at, "y"), raw_y))
    if kind == "utilization":
        for y in ys:
            if y not in ("cpu", "mem"):
                raise where.error((*at, "y"), f"{y!r} is not a sampled resource (cpu, mem)")
    if kind == "effective":
        for y in ys:
            if y not in SERIES:
                raise where.error((*at, "y"), f"{y!r} is not a utilization series "
                                  f"({', '.join(SERIES)})")
    return PlotSpec(x, ys, series, str(t.get("title", "")), str(t.get("ylabel", "")),
                    bool(t.get("logx", False)), bool(t.get("logy", False)),
                    str(t.get("file", "")) or f"plot{i + 1}.png", kind)


# -- one run's configuration ---------------------------------------------------------------


def _config(where: _Where, doc: Doc) -> SimConfig:
    arch = _enum(where, ("architecture",), doc.get("architecture", "shared"), Architecture)
    horizon = _num(where, ("horizon",), doc.get("horizon", 86_400.0), positive=True)
    classes = tuple(_job_class(where, i, w, traced=doc.get("trace") is not None)
                    for i, w in enumerate(_list(where, ("workload",), doc.get("workload", []))))
    if not classes:
        raise where.error(("workload",), "an experiment needs at least one [[workload]]")
    schedulers = tuple(_scheduler(where, i, s) for i, s in enumerate(
        _list(where, ("scheduler",), doc.get("scheduler", []))))
    for i, s in enumerate(schedulers):
        for c in s.serves:
            if c not in {k.name for k in classes}:
                raise where.error(("scheduler", i, "serves"), f"{c!r} is not a workload class")
    served = {c: s.name for s in schedulers for c in s.serves}
    for i, k in enumerate(classes):
        if k.name not in served:
            raise where.error(("workload", i, "name"), f"no [[scheduler]] serves {k.name!r}")
    seed = _num(where, ("seed",), doc.get("seed", 0))
    trace = doc.get("trace")
    prefill = _prefill(where, doc.get("prefill", {"utilization": 0.0}))
    if prefill is not None and prefill.scheduler is not None and prefill.scheduler not in {
            s.name for s in schedulers}:
        raise where.error(("prefill", "scheduler"), f"{prefill.scheduler!r} is not a "
                          "[[scheduler]] of this experiment")
    fidelity = doc.get("fidelity", "lightweight")
    if fidelity not in FIDELITIES:
        raise where.error(("fidelity",), f"{_show(fidelity)} is not one of "
                          f"{', '.join(FIDELITIES)}")
    measure = doc.get("measure_decisions", False)
    if not isinstance(measure, bool):
        raise where.error(("measure_decisions",), f"must be true or false, got {_show(measure)}")
    cell = _cell(where, doc.get("cell", {}))
    failures = _failures(where, doc["failures"], cell) if "failures" in doc else None
    limits = (_limits(where, doc["limits"], {s.name for s in schedulers})
              if "limits" in doc else None)
    return SimConfig(
        arch, schedulers, classes, cell, prefill, horizon,
        int(seed), _str(where, ("trace",), trace) if trace is not None else None,
        _retry(where, doc.get("retry", {})), _two_level(where, doc.get("two_level", {})),
        _num(where, ("sample_interval",), doc.get("sample_interval", 60.0), positive=True),
        _num(where, ("day",), doc.get("day", min(86_400.0, horizon)), positive=True),
        _num(where, ("warmup",), doc.get("warmup", 0.0)),
        _num(where, ("drain",), doc.get("drain", 0.0)), str(fidelity), measure, failures,
        limits)


def _cell(where: _Where, raw: object) -> CellSpec:
    t = _table(where, ("cell",), raw)
    _only(where, ("cell",), t, {"machines", "cpu", "mem", "rack_size", "attributes"})
    machines = _whole(where, ("cell", "machines"), t.get("machines", 10_000))
    at: Path_ = ("cell", "attributes")
    attributes = tuple(_attribute(where, at, a) for a in _list(where, at,
                                                                 t.get("attributes", [])))
    if len({a.key for a in attributes}) != len(attributes):
        raise where.error(at, "names an attribute key twice")
    return CellSpec(machines, _num(where, ("cell", "cpu"), t.get("cpu", 4.0), True),
                    _num(where, ("cell", "mem"), t.get("mem", 16.0), True),
                    _whole(where, ("cell", "rack_size"), t.get("rack_size", 40)), attributes)


def _labels(where: _Where, at: Path_, t: Doc) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """``values`` (label values) and their ``weights`` (default: even)."""
    values = tuple(_str(where, (*at, "values"), v) for v in _list(where, (*at, "values"),
                                                                   t.get("values")))
    weights = tuple(_num(where, (*at, "weights"), w) for w in _list(
        where, (*at, "weights"), t.get("weights", [1.0] * len(values))))
    if not values or len(weights) != len(values) or not sum(weights):
        raise where.error((*at, "weights" if values else "values"),
                          "needs a value, and as many weights (not all 0) as values")
    return values, weights


def _attribute(where: _Where, at: Path_, raw: object) -> Attribute:
    t = _table(where, at, raw)
    _only(where, at, t, {"key", "values", "weights"})
    key = _str(where, (*at, "key"), t.get("key"))
    try:
        check_name(key, "attribute key")
    except ModelError as e:
        raise where.error((*at, "key"), str(e)) from None
    return Attribute(key, *_labels(where, at, t))


def _constraints(where: _Where, at: Path_, raw: object) -> ConstraintGen:
    t = _table(where, at, raw)
    _only(where, at, t, {"pick", "key", "values", "weights", "max_per_machine"})
    pick = _num(where, (*at, "pick"), t.get("pick", 0.0))
    if pick > 1:
        raise where.error((*at, "pick"), f"{pick:g} is above 1 (a fraction of the jobs)")
    key = ""
    values: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    if pick:
        key = _str(where, (*at, "key"), t.get("key"))
        try:
            check_name(key, "label key")
        except ModelError as e:
            raise where.error((*at, "key"), str(e)) from None
        values, weights = _labels(where, at, t)
    per = (_dist(where, (*at, "max_per_machine"), t["max_per_machine"])
           if "max_per_machine" in t else None)
    return ConstraintGen(pick, key, values, weights, per)


def _prefill(where: _Where, raw: object) -> Prefill | None:
    at: Path_ = ("prefill",)
    t = _table(where, at, raw)
    _only(where, at, t, {"utilization", "tasks", "cpu", "mem", "duration", "scheduler",
                         "jobs"})
    util = _num(where, (*at, "utilization"), t.get("utilization", 0.6))
    if util > 1:
        raise where.error((*at, "utilization"), f"{util:g} is above 1 (a fraction of the CPUs)")
    if util == 0:
        return None
    # Omega's simulator prefills from the workload, whose jobs end; a table giving a
    # fixed shape asks for the fixed jobs (which run forever unless given a duration).
    shape = [f for f in ("tasks", "cpu", "mem", "duration") if f in t]
    jobs = t.get("jobs", "fixed" if shape else "workload")
    if jobs not in PREFILL_JOBS:
        raise where.error((*at, "jobs"), f"{_show(jobs)} is not one of "
                          f"{', '.join(PREFILL_JOBS)}")
    if jobs == "workload" and shape:
        raise where.error((*at, shape[0]), "a prefill from the workload takes its jobs' "
                          "shape and duration from the workload classes (remove it, or set "
                          'jobs = "fixed")')
    duration = t.get("duration")
    owner = t.get("scheduler")
    return Prefill(util, int(_num(where, (*at, "tasks"), t.get("tasks", 100), True)),
                   _num(where, (*at, "cpu"), t.get("cpu", 1.0), True),
                   _num(where, (*at, "mem"), t.get("mem", 2.0)),
                   None if duration is None else _num(where, (*at, "duration"), duration),
                   None if owner is None else _str(where, (*at, "scheduler"), owner),
                   from_workload=jobs == "workload")


def _job_class(where: _Where, i: int, raw: object, traced: bool = False) -> JobClass:
    at: Path_ = ("workload", i)
    t = _table(where, at, raw)
    _only(where, at, t, {"name", "kind", "interarrival", "tasks", "duration", "cpu", "mem",
                         "rate_scale", "input", "mapreduce", "users", "priority", "diurnal",
                         "precedence", "constraints"})
    name = _str(where, (*at, "name"), t.get("name"))
    kind = _enum(where, (*at, "kind"), t.get("kind", name), JobKind)
    mapreduce = _mapreduce(where, (*at, "mapreduce"), t["mapreduce"]) if "mapreduce" in t \
        else None
    # With a trace, the jobs' activities may come from it instead (trace columns maps,
    # map_seconds, ...), so the class needs no table to draw them from.
    if (mapreduce is not None and kind is not JobKind.MAPREDUCE) or (
            kind is JobKind.MAPREDUCE and mapreduce is None and not traced):
        raise where.error((*at, "mapreduce" if mapreduce is None else "kind"),
                          "a class of kind mapreduce, and only one, has a [mapreduce] table "
                          "(its jobs' activities; with a trace, the trace may give them)")
    # A MapReduce job runs as long as its activities take: no duration of its own.
    mapreducing = kind is JobKind.MAPREDUCE
    for field in ("interarrival", "tasks") if mapreducing else ("interarrival", "tasks",
                                                                "duration"):
        if field not in t:
            raise where.error((*at, field), "missing (a distribution)")

    def dist(field: str, default: float) -> Distribution:
        return _dist(where, (*at, field), t.get(field, default))

    return JobClass(name, kind, dist("interarrival", 0), dist("tasks", 0), dist("duration", 0),
                    dist("cpu", 1.0), dist("mem", 2.0),
                    _num(where, (*at, "rate_scale"), t.get("rate_scale", 1.0), positive=True),
                    input=_input(where, (*at, "input"), t["input"]) if "input" in t else None,
                    mapreduce=mapreduce, users=_users(where, (*at, "users"), t.get("users", [])),
                    priority=dist("priority", 0) if "priority" in t else None,
                    diurnal=_diurnal(where, (*at, "diurnal"), t["diurnal"]) if "diurnal" in t
                    else None,
                    precedence=dist("precedence", 0) if "precedence" in t else None,
                    constraints=_constraints(where, (*at, "constraints"), t["constraints"])
                    if "constraints" in t else None)


def _users(where: _Where, at: Path_, raw: object) -> tuple[str, ...]:
    users = tuple(_str(where, at, u) for u in _list(where, at, raw))
    for u in users:
        try:
            check_name(u, "user")
        except ModelError as e:
            raise where.error(at, str(e)) from None
    if len(set(users)) != len(users):
        raise where.error(at, "names a user twice")
    return users


def _diurnal(where: _Where, at: Path_, raw: object) -> Diurnal:
    t = _table(where, at, raw)
    _only(where, at, t, {"rates", "period"})
    rates = tuple(_num(where, (*at, "rates"), r) for r in _list(where, (*at, "rates"),
                                                                t.get("rates")))
    if not rates or not sum(rates) > 0:
        raise where.error((*at, "rates"), "needs at least one rate above 0")
    return Diurnal(rates, _num(where, (*at, "period"), t.get("period", 86_400.0), True))


def _input(where: _Where, at: Path_, raw: object) -> InputSpec:
    t = _table(where, at, raw)
    _only(where, at, t, {"blocks_per_task", "replicas", "block_size", "placement", "reads"})
    d = InputSpec()
    placement = t.get("placement", d.placement)
    if placement not in PLACEMENTS:
        raise where.error((*at, "placement"), f"{_show(placement)} is not one of "
                          f"{', '.join(PLACEMENTS)}")
    reads = t.get("reads", d.reads)
    if reads not in READS:
        raise where.error((*at, "reads"), f"{_show(reads)} is not one of {', '.join(READS)}")
    return InputSpec(_whole(where, (*at, "blocks_per_task"),
                            t.get("blocks_per_task", d.blocks_per_task)),
                     _whole(where, (*at, "replicas"), t.get("replicas", d.replicas)),
                     _num(where, (*at, "block_size"), t.get("block_size", d.block_size), True),
                     str(placement), str(reads))


def _mapreduce(where: _Where, at: Path_, raw: object) -> MapReduceClass:
    t = _table(where, at, raw)
    fields = ("maps_per_worker", "reduces_per_worker", "map_seconds", "reduce_seconds")
    _only(where, at, t, {*fields, "max_workers"})
    for field in fields:
        if field not in t:
            raise where.error((*at, field), "missing (a distribution)")
    most = _num(where, (*at, "max_workers"), t.get("max_workers", 0))
    if most != int(most):
        raise where.error((*at, "max_workers"), "must be a whole number")
    maps, reduces, map_s, reduce_s = (_dist(where, (*at, f), t[f]) for f in fields)
    return MapReduceClass(maps, reduces, map_s, reduce_s, int(most))


def _dist(where: _Where, at: Path_, raw: object) -> Distribution:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Distribution.fixed(_num(where, at, raw))
    t = _table(where, at, raw)
    kind = t.get("dist")
    if kind == "fixed":
        _only(where, at, t, {"dist", "value"})
        return Distribution.fixed(_num(where, (*at, "value"), t.get("value")))
    if kind == "exponential":
        _only(where, at, t, {"dist", "mean"})
        return Distribution.exponential(_num(where, (*at, "mean"), t.get("mean"), True))
    if kind == "choice":
        _only(where, at, t, {"dist", "values", "weights"})
        values = [_num(where, (*at, "values"), v) for v in _list(where, (*at, "values"),
                                                                 t.get("values"))]
        weights = [_num(where, (*at, "weights"), w) for w in _list(
            where, (*at, "weights"), t.get("weights", [1.0] * len(values)))]
        if not values or len(weights) != len(values) or not sum(weights):
            raise where.error((*at, "weights" if values else "values"),
                              "needs a value, and as many weights (not all 0) as values")
        return Distribution.choice(values, weights)
    if kind == "empirical":
        _only(where, at, t, {"dist", "quantiles"})
        q = [_num(where, (*at, "quantiles"), v) for v in _list(where, (*at, "quantiles"),
                                                               t.get("quantiles"))]
        if len(q) < 2 or any(b < a for a, b in itertools.pairwise(q)):
            raise where.error((*at, "quantiles"), "needs at least 2 values, in rising order")
        return Distribution.empirical(q)
    raise where.error((*at, "dist"), f"{kind!r} is not one of fixed, exponential, empirical, "
                      "choice")


def _scheduler(where: _Where, i: int, raw: object) -> SchedulerSpec:
    at: Path_ = ("scheduler", i)
    t = _table(where, at, raw)
    _only(where, at, t, {"name", "serves", "policy", "instances", "decision", "measured",
                         "measured_scale", "measured_clock", "mode", "detection", "options"})
    policy = _str(where, (*at, "policy"), t.get("policy", "batch"))
    name = _str(where, (*at, "name"), t.get("name"))
    serves = tuple(_str(where, (*at, "serves"), s) for s in _list(where, (*at, "serves"),
                                                                    t.get("serves", [name])))
    instances = _num(where, (*at, "instances"), t.get("instances", 1), positive=True)
    if instances != int(instances):
        raise where.error((*at, "instances"), "must be a whole number")
    dec = _table(where, (*at, "decision"), t.get("decision", {}))
    default = DecisionTime()
    per_kind: dict[JobKind, DecisionTime] = {}
    for key, value in dec.items():
        d = _decision(where, (*at, "decision", key), value)
        if key == "default":
            default = d
        else:
            per_kind[_enum(where, (*at, "decision", key), key, JobKind)] = d
    # A flow scheduler's decision time is its solver's: measured unless told otherwise.
    measured = t.get("measured", policy == "flow")
    if not isinstance(measured, bool):
        raise where.error((*at, "measured"), f"must be true or false, got {_show(measured)}")
    clock = t.get("measured_clock", "cpu")
    if clock not in CLOCKS:
        raise where.error((*at, "measured_clock"), f"{_show(clock)} is not one of "
                          f"{', '.join(CLOCKS)}")
    options = _options(where, (*at, "options"), t.get("options", {}))
    if policy == "flow":
        _check_flow(where, (*at, "options"), options)
    if policy == "fair":
        _check_fair(where, (*at, "options"), options)
    return SchedulerSpec(
        name, serves, policy, int(instances), per_kind, default, measured,
        _num(where, (*at, "measured_scale"), t.get("measured_scale", 1.0), True),
        _enum(where, (*at, "mode"), t.get("mode", "incremental"), TxnMode),
        _enum(where, (*at, "detection"), t.get("detection", "fine"), Detection),
        options, str(clock))


def _options(where: _Where, at: Path_, raw: object, nested: bool = True
             ) -> dict[str, object]:
    """Policy options: a table of plain values, or of tables of them (the flow
    scheduler's ``costs``); the policy checks their meaning."""
    t = _table(where, at, raw)
    for key, value in t.items():
        if nested and isinstance(value, dict):
            _options(where, (*at, key), value, nested=False)
        elif not isinstance(value, str | int | float | bool):
            raise where.error((*at, key), f"must be a string, number or boolean"
                              f"{' or a table of them' if nested else ''}, got "
                              f"{type(value).__name__}")
    return dict(t)


def _check_flow(where: _Where, at: Path_, options: dict[str, object]) -> None:
    """The flow scheduler's options, checked now rather than at its first round."""
    from schedulers.flow.policy import FlowOptionError, FlowPolicy

    try:
        FlowPolicy(**options)
    except FlowOptionError as e:
        raise where.error(at, str(e)) from None


def _check_fair(where: _Where, at: Path_, options: dict[str, object]) -> None:
    """The fair scheduler's options, checked now rather than at its first decision."""
    from schedulers.fair.policy import FairConfig, FairOptionError

    try:
        FairConfig.from_options(options)
    except FairOptionError as e:
        raise where.error(at, str(e)) from None


def _decision(where: _Where, at: Path_, raw: object) -> DecisionTime:
    t = _table(where, at, raw)
    _only(where, at, t, {"t_job", "t_task"})
    return DecisionTime(_num(where, (*at, "t_job"), t.get("t_job", 0.1)),
                        _num(where, (*at, "t_task"), t.get("t_task", 0.005)))


def _retry(where: _Where, raw: object) -> RetrySpec:
    t = _table(where, ("retry",), raw)
    _only(where, ("retry",), t, {"delay", "max_delay", "max_attempts", "max_fruitless",
                                 "order", "fruitless"})
    d = RetrySpec()
    order = t.get("order", d.order)
    if order not in RETRY_ORDERS:
        raise where.error(("retry", "order"), f"{_show(order)} is not one of "
                          f"{', '.join(RETRY_ORDERS)}")
    fruitless = t.get("fruitless", d.fruitless)
    if fruitless not in FRUITLESS_RULES:
        raise where.error(("retry", "fruitless"), f"{_show(fruitless)} is not one of "
                          f"{', '.join(FRUITLESS_RULES)}")
    return RetrySpec(_num(where, ("retry", "delay"), t.get("delay", d.delay), True),
                     _num(where, ("retry", "max_delay"), t.get("max_delay", d.max_delay), True),
                     int(_num(where, ("retry", "max_attempts"),
                              t.get("max_attempts", d.max_attempts), True)),
                     int(_num(where, ("retry", "max_fruitless"),
                              t.get("max_fruitless", d.max_fruitless), True)), str(order),
                     str(fruitless))


def _limits(where: _Where, raw: object, schedulers: set[str]) -> CellConfig:
    """``[limits.NAME]`` tables, as a cellstate server's configuration has them
    (``max_precedence``, ``max_resources``), for schedulers of the experiment."""
    t = _table(where, ("limits",), raw)
    limits: dict[str, SchedulerLimits] = {}
    for name, entry in t.items():
        if name not in schedulers:
            raise where.error(("limits", name), f"{name!r} is not a [[scheduler]] of this "
                              f"experiment ({', '.join(sorted(schedulers))})")
        try:
            limits.update(codec.parse_config({"limits": {name: entry}}, "").limits)
        except ModelError as e:
            raise where.error(("limits", name), str(e)) from None
    return CellConfig(limits)


def _failures(where: _Where, raw: object, cell: CellSpec) -> FailureSpec:
    at: Path_ = ("failures",)
    t = _table(where, at, raw)
    _only(where, at, t, {"mtbf", "repair", "at", "scope"})
    scope = t.get("scope", "machine")
    if scope not in FAILURE_SCOPES:
        raise where.error((*at, "scope"), f"{_show(scope)} is not one of "
                          f"{', '.join(FAILURE_SCOPES)} (what fails together)")
    mtbf = _num(where, (*at, "mtbf"), t.get("mtbf", 0.0))
    repair = _dist(where, (*at, "repair"), t.get("repair", FailureSpec().repair.value))
    if repair.mean() <= 0:
        raise where.error((*at, "repair"), "a machine is down for some time: the mean "
                          "repair time must be above 0")
    scripted = []
    for i, item in enumerate(_list(where, (*at, "at"), t.get("at", []))):
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], str)):
            raise where.error((*at, "at", i), "must be a pair [seconds, machine id], got "
                              f"{_show(item)}")
        when = _num(where, (*at, "at", i, 0), item[0])
        mid = item[1]
        if not cell.has_machine(mid):
            raise where.error((*at, "at", i, 1), f"{mid!r} is not a machine of the cell "
                              f"({cell.machine_id(0)} to "
                              f"{cell.machine_id(cell.machines - 1)})")
        scripted.append((when, mid))
    # Neither mtbf nor at: no failure happens, and the results still have the failure
    # columns (the baseline of a sweep over mtbf).
    return FailureSpec(mtbf, repair, tuple(sorted(scripted)), scope)


def _two_level(where: _Where, raw: object) -> TwoLevelSpec:
    t = _table(where, ("two_level",), raw)
    _only(where, ("two_level",), t, {"offer_interval", "offer_cost"})
    d = TwoLevelSpec()
    return TwoLevelSpec(
        _num(where, ("two_level", "offer_interval"), t.get("offer_interval", d.offer_interval),
             True),
        _num(where, ("two_level", "offer_cost"), t.get("offer_cost", d.offer_cost)))


# -- field checks ------------------------------------------------------------------------


def _only(where: _Where, at: Path_, t: Doc, allowed: set[str]) -> None:
    for key in t:
        if key not in allowed:
            raise where.error((*at, key), f"unknown field (expected one of "
                              f"{', '.join(sorted(allowed))})")


def _table(where: _Where, at: Path_, raw: object) -> Doc:
    if not isinstance(raw, dict):
        raise where.error(at, f"must be a table, got {_show(raw)}")
    return raw


def _list(where: _Where, at: Path_, raw: object) -> list[Any]:
    if not isinstance(raw, list):
        raise where.error(at, f"must be a list, got {_show(raw)}")
    return raw


def _str(where: _Where, at: Path_, raw: object) -> str:
    if not isinstance(raw, str) or not raw:
        raise where.error(at, f"must be a non-empty string, got {_show(raw)}")
    return raw


def _num(where: _Where, at: Path_, raw: object, positive: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise where.error(at, f"must be a number, got {_show(raw)}")
    if raw < 0 or (positive and raw == 0):
        raise where.error(at, f"must be {'positive' if positive else 'non-negative'}, "
                          f"got {raw!r}")
    return float(raw)


def _whole(where: _Where, at: Path_, raw: object) -> int:
    """A whole number of at least 1."""
    value = _num(where, at, raw, positive=True)
    if value != int(value):
        raise where.error(at, f"must be a whole number, got {raw!r}")
    return int(value)


E = TypeVar("E", Architecture, JobKind, TxnMode, Detection)


def _enum(where: _Where, at: Path_, raw: object, cls: type[E]) -> E:
    values = [str(m.value) for m in cls]
    if not isinstance(raw, str) or raw not in values:
        raise where.error(at, f"{_show(raw)} is not one of {', '.join(values)}")
    return cls(raw)


def _show(raw: object) -> str:
    return "nothing" if raw is None else f"{type(raw).__name__} {raw!r}"

"""The Aladdin+H placement experiment's file, and the machines and jobs it describes
(Tables 3 and 4 of seed 002; the file states what the paper leaves open:
``experiments/aladdin/alibaba_placement.toml``).

Every error names the file and the field. The same file and seed give the same cell
and jobs."""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from cellstate.model import (
    Constraints,
    Job,
    JobKind,
    Machine,
    Requirement,
    Resources,
    SelectorOp,
)

#: Affinity groups must fit a machine of this size (the table's smallest common type).
GROUP_ROOM = Resources.of(cpu=28, mem=78.5)
PLACEHOLDER = "scheduler"  # jobs are built once and given each scheduler's name


class ExperimentError(ValueError):
    pass


@attrs.frozen
class SchedulerSpec:
    name: str
    flow: str = ""  # a flow cost model, or
    policy: str = ""  # a policy: firstfit, tetris, service, medea
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class TaskType:
    cpu: float
    mem_mb: float
    count: int

    @property
    def key(self) -> str:
        return f"{self.cpu:g}-{self.mem_mb:g}"

    @property
    def resources(self) -> Resources:
        return Resources.of(cpu=self.cpu, mem=self.mem_mb / 1024)


@attrs.frozen
class Experiment:
    name: str
    machine_types: tuple[tuple[str, Resources, int, Mapping[str, str]], ...]
    tasks: tuple[TaskType, ...]
    schedulers: tuple[SchedulerSpec, ...]
    seed: int = 1
    scale: float = 1.0
    load: float = 0.5
    affinity_share: float = 0.2
    anti_share: float = 0.5
    cross_share: float = 0.2
    heavy_apps: int = 10
    heavy_types: tuple[str, ...] = ()
    app_mean: float = 8.0
    group_max: int = 4


_FRACTIONS = ("scale", "load", "affinity_share", "anti_share", "cross_share")


def load_experiment(path: Path, root: Path | None = None) -> Experiment:
    """Read an experiment file; ``root`` resolves its ``cell`` path (default: the
    current folder)."""
    where = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ExperimentError(f"{where}: {e}") from None
    known = {"name", "cell", "seed", *_FRACTIONS, "heavy_apps", "heavy_types", "app_mean",
             "group_max", "tasks", "scheduler"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ExperimentError(f"{where}: unknown field(s) {', '.join(unknown)}")
    kw: dict[str, Any] = {}
    for key in _FRACTIONS:
        if key in doc:
            kw[key] = _number(doc[key], f"{where}: {key}", 0.0, 1.0)
    if kw.get("scale", 1.0) <= 0:
        raise ExperimentError(f"{where}: scale must be above 0")
    for key, lo, hi in (("seed", 0, 2**31), ("heavy_apps", 0, 10**6), ("group_max", 2, 64)):
        if key in doc:
            kw[key] = int(_number(doc[key], f"{where}: {key}", lo, hi, whole=True))
    if "app_mean" in doc:
        kw["app_mean"] = _number(doc["app_mean"], f"{where}: app_mean", 1.0, 10**6)
    tasks = []
    for i, row in enumerate(_list(doc.get("tasks"), f"{where}: tasks")):
        at = f"{where}: tasks[{i}]"
        if not isinstance(row, list) or len(row) != 3:
            raise ExperimentError(f"{at} must be [cpu, MB of RAM, tasks]")
        tasks.append(TaskType(_number(row[0], f"{at} cpu", 1e-9, 1e6),
                              _number(row[1], f"{at} MB", 1e-9, 1e12),
                              int(_number(row[2], f"{at} tasks", 0, 1e9, whole=True))))
    heavy_doc = doc.get("heavy_types", [])
    if not isinstance(heavy_doc, list):
        raise ExperimentError(f"{where}: heavy_types must be a list of task types")
    heavy = tuple(str(h) for h in heavy_doc)
    keys = {t.key for t in tasks}
    for h in heavy:
        if h not in keys:
            raise ExperimentError(f"{where}: heavy_types names {h!r}, which is no task type "
                                  "(cpu-MB, as in tasks)")
    scheds = scheduler_specs(doc.get("scheduler"), where)
    if "cell" not in doc:
        raise ExperimentError(f"{where}: cell (a cell spec file of the machine types) is "
                              "missing")
    cell_path = (root or Path.cwd()) / str(doc["cell"])
    return Experiment(str(doc.get("name", path.stem)), _machine_types(cell_path),
                      tuple(tasks), scheds, heavy_types=heavy, **kw)


def scheduler_specs(value: object, where: str) -> tuple[SchedulerSpec, ...]:
    """The file's ``[[scheduler]]`` tables: a name, and a flow cost model (``flow``, its
    options in ``costs``) or a policy (``policy``, its ``options``)."""
    scheds = []
    for i, s in enumerate(_list(value, f"{where}: scheduler")):
        at = f"{where}: scheduler[{i}]"
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            raise ExperimentError(f"{at} needs a name")
        if bool(s.get("flow")) == bool(s.get("policy")):
            raise ExperimentError(f"{at} ({s['name']}) needs one of flow or policy")
        extra = sorted(set(s) - {"name", "flow", "policy", "costs", "options"})
        if extra:
            raise ExperimentError(f"{at}: unknown field(s) {', '.join(extra)}")
        opts = dict(s.get("options", {}))
        if s.get("costs"):
            opts["costs"] = dict(s["costs"])
        scheds.append(SchedulerSpec(s["name"], str(s.get("flow", "")),
                                    str(s.get("policy", "")), opts))
    return tuple(scheds)


def _machine_types(path: Path) -> tuple[tuple[str, Resources, int, Mapping[str, str]], ...]:
    """The types of a cell spec file (omega/cellspec.py's format: [[types]] with name,
    count, capacity, labels), read without the application layer."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ExperimentError(f"cell {path}: {e}") from None
    out = []
    for i, t in enumerate(_list(doc.get("types"), f"cell {path}: types")):
        at = f"cell {path}: types[{i}]"
        if not isinstance(t, dict):
            raise ExperimentError(f"{at} must be a table")
        out.append((str(t.get("name", f"type{i}")),
                    Resources.from_mapping(t.get("capacity", {}), f"{at}.capacity"),
                    int(_number(t.get("count"), f"{at}.count", 0, 1e7, whole=True)),
                    dict(t.get("labels", {}))))
    return tuple(out)


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ExperimentError(f"{where} must be a non-empty list")
    return value


def _number(value: object, where: str, lo: float, hi: float, whole: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or not lo <= value <= hi:
        raise ExperimentError(f"{where} must be a number from {lo:g} to {hi:g}, got {value!r}")
    if whole and value != int(value):
        raise ExperimentError(f"{where} must be a whole number, got {value!r}")
    return float(value)


# -- the cell and the jobs -----------------------------------------------------------------


def machines(exp: Experiment) -> list[Machine]:
    """``scale`` of each machine type (at least one), 40 to a rack."""
    out: list[Machine] = []
    for name, cap, count, labels in exp.machine_types:
        for i in range(max(1, round(count * exp.scale))):
            n = len(out)
            out.append(Machine(f"{name}-{i:05}", cap, rack=f"r{n // 40:04}",
                               failure_domain=f"fd{n // 400:03}",
                               labels=tuple(sorted(labels.items()))))
    return out


def task_counts(exp: Experiment, cores: float) -> list[int]:
    """Tasks per type: Table 4's shares, as many as ask for ``load`` of ``cores``."""
    total = sum(t.count for t in exp.tasks)
    mean_cpu = sum(t.cpu * t.count for t in exp.tasks) / total
    n = exp.load * cores / mean_cpu
    return [round(n * t.count / total) for t in exp.tasks]


@attrs.frozen
class App:
    job: Job
    kind: str  # group, spread, spread+cross, heavy-averse, free


def jobs(exp: Experiment, cores: float) -> list[App]:
    """The applications (one job each), constraints as the file says, in a shuffled
    submission order (the same for every scheduler)."""
    rng = random.Random(exp.seed)
    counts = task_counts(exp, cores)
    n = sum(counts)
    # Affinity groups: spread over the types that can form them, by their counts.
    kmax = {i: _group_max(t, exp.group_max) for i, t in enumerate(exp.tasks)}
    eligible = {i: c for i, c in enumerate(counts) if kmax[i] >= 2}
    room = sum(eligible.values())
    grouped = {i: min(c, round(exp.affinity_share * n * c / room)) if room else 0
               for i, c in eligible.items()}
    # Applications with anti-affinity: this share of those that are not groups.
    p_anti = min(1.0, exp.anti_share / max(1e-9, 1 - exp.affinity_share))
    apps: list[tuple[int, int, str]] = []  # (type, tasks, kind)
    for i, count in enumerate(counts):
        left = count
        g = grouped.get(i, 0)
        while g >= 2:
            k = min(rng.randint(2, kmax[i]), g)
            apps.append((i, k, "group"))
            g -= k
            left -= k
        while left > 0:
            size = min(left, 1 + int(rng.expovariate(1 / max(exp.app_mean - 1, 1e-9))))
            apps.append((i, size, "spread" if rng.random() < p_anti else "free"))
            left -= size
    rng.shuffle(apps)
    ids = [f"a{x:05}-{exp.tasks[i].key}" for x, (i, _, _) in enumerate(apps)]
    spread = [x for x, (_, _, kind) in enumerate(apps) if kind == "spread"]
    cross = set(rng.sample(spread, round(exp.cross_share * len(spread))))
    heavy_averse = set(rng.sample(sorted(set(spread) - cross),
                                  min(exp.heavy_apps, len(spread) - len(cross))))
    out = []
    for x, (i, size, kind) in enumerate(apps):
        t = exp.tasks[i]
        labels = [("app", ids[x])]
        if t.key in exp.heavy_types:
            labels.append(("tier", "heavy"))
        c = Constraints()
        if kind == "group":
            c = Constraints(affinity=(Requirement("app", SelectorOp.IN, (ids[x],)),))
        elif kind == "spread":
            anti: tuple[Requirement, ...] = ()
            if x in cross:
                other = rng.randrange(len(apps))
                if other != x:
                    anti = (Requirement("app", SelectorOp.IN, (ids[other],)),)
                    kind = "spread+cross"
            elif x in heavy_averse:
                anti = (Requirement("tier", SelectorOp.IN, ("heavy",)),)
                kind = "heavy-averse"
            c = Constraints(anti_affinity=anti, max_per_machine=1)
        job = Job(ids[x], "alibaba", PLACEHOLDER, size, t.resources, kind=JobKind.SERVICE,
                  gang=kind == "group", constraints=c, labels=tuple(sorted(labels)),
                  submitted_at=0.0)
        out.append(App(job, kind))
    return out


def _group_max(t: TaskType, most: int) -> int:
    r = t.resources
    fit = min(math.floor(GROUP_ROOM.get(d) / a + 1e-9) for d, a in r.amounts if a > 0)
    return min(most, fit)

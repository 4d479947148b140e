"""Cell specs: the machines of a cell, described by type and count in a TOML file.

A node agent registers the machines of a spec (or its share of them, when several
agents split one spec). The format::

    name = "demo"                  # optional; the file's stem by default
    description = "..."            # optional, free text

    [layout]                       # optional; these are the defaults
    machines_per_rack = 40         # a rack holds this many machines
    racks_per_failure_domain = 4   # consecutive racks form one failure domain

    [[types]]                      # one table per machine type, in order
    name = "standard"              # required; a name (letters, digits, '_', '.', '-')
    count = 160                    # required; 1 .. 1,000,000
    capacity = { cpu = 16, mem = 64, disk = 500 }   # required; positive amounts
    labels = { tier = "general" }  # optional; string values
    machines_per_rack = 20         # optional; overrides the layout for this type

Units are the model's (``cpu`` in cores, ``mem`` and ``disk`` in GiB, any other
dimension as the jobs that ask for it count it). Unknown fields are errors, so a typo
cannot silently drop a setting.

Machines are laid out deterministically, so every agent that reads the same file
derives the same cell:

* ids ``m00001``, ``m00002``, ... over the types in file order (at least five digits,
  more when the cell needs them);
* each type starts a new rack (a rack is bought as one batch), and fills racks of
  ``machines_per_rack`` machines: ``r001``, ``r002``, ...;
* consecutive racks, across types, are grouped into failure domains of
  ``racks_per_failure_domain`` racks: ``fd01``, ``fd02``, ...;
* every machine gets the label ``type`` (the type's name) unless its type sets one;
  ``rack``, ``failure_domain`` and ``machine`` are reserved (selectors see them already).

:meth:`CellSpec.machines_for` splits a spec over several agents in contiguous blocks
(whole racks where the sizes allow), so that losing one agent takes out neighbouring
machines, as losing a real power or network domain would.

A bad file raises :class:`CellSpecError` whose message names the file and the field
path, e.g. ``cells/x.toml: types[2].capacity.cpu: must be a positive number``.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

import attrs

from cellstate.model import MAX_AMOUNT, Labels, Machine, ModelError, Resources, check_name

MAX_MACHINES = 1_000_000
DEFAULT_MACHINES_PER_RACK = 40
DEFAULT_RACKS_PER_FAILURE_DOMAIN = 4
# Labels the model derives from a machine's own fields (see Machine.label).
_RESERVED_LABELS = frozenset({"rack", "failure_domain", "machine"})
_DIMENSION = re.compile(r"[a-z][a-z0-9_]{0,31}")  # fullmatch: "$" allows a trailing newline


class CellSpecError(ValueError):
    """A cell spec that cannot be used; the message names the file and the field."""


@attrs.frozen(slots=True)
class Layout:
    machines_per_rack: int = DEFAULT_MACHINES_PER_RACK
    racks_per_failure_domain: int = DEFAULT_RACKS_PER_FAILURE_DOMAIN


@attrs.frozen(slots=True)
class MachineType:
    name: str
    count: int
    capacity: Resources
    labels: Labels = ()
    machines_per_rack: int | None = None  # None: the layout's


@attrs.frozen(slots=True)
class CellSpec:
    name: str
    types: tuple[MachineType, ...]
    layout: Layout = Layout()
    description: str = ""
    source: str = "<string>"  # where it was read from, for messages

    @property
    def machine_count(self) -> int:
        return sum(t.count for t in self.types)

    def total_capacity(self) -> Resources:
        total = Resources()
        for t in self.types:
            total = total + Resources(tuple((d, a * t.count) for d, a in t.capacity.amounts))
        return total

    def machines(self, agent: str | None = None) -> list[Machine]:
        """Every machine of the cell, in id order; ``agent`` (if given) is set on each."""
        out: list[Machine] = []
        width = max(5, len(str(self.machine_count)))
        rack = 0  # racks used so far
        for t in self.types:
            per_rack = t.machines_per_rack or self.layout.machines_per_rack
            labels = _with_type_label(t)
            for i in range(t.count):
                if i % per_rack == 0:
                    rack += 1
                fd = (rack - 1) // self.layout.racks_per_failure_domain + 1
                out.append(Machine(
                    f"m{len(out) + 1:0{width}d}", t.capacity, f"r{rack:03d}", f"fd{fd:02d}",
                    labels, agent=agent or "",
                ))
        return out

    def machines_for(
        self, agent_index: int, agent_count: int, agent: str | None = None
    ) -> list[Machine]:
        """Agent ``agent_index`` (0-based) of ``agent_count``'s share of the machines: a
        contiguous block, the blocks differing in size by at most one machine."""
        if agent_count < 1 or not 0 <= agent_index < agent_count:
            raise ValueError(
                f"agent index {agent_index} of {agent_count}: need 0 <= index < count"
            )
        return _block(self.machines(agent), agent_index, agent_count)

    def partition(self, agent_count: int) -> list[list[Machine]]:
        """The machines split into ``agent_count`` blocks (see :meth:`machines_for`)."""
        if agent_count < 1:
            raise ValueError(f"agent count must be at least 1, got {agent_count}")
        machines = self.machines()
        return [_block(machines, i, agent_count) for i in range(agent_count)]


def _block(machines: list[Machine], index: int, count: int) -> list[Machine]:
    n = len(machines)
    return machines[index * n // count:(index + 1) * n // count]


def _with_type_label(t: MachineType) -> Labels:
    if any(k == "type" for k, _ in t.labels):
        return t.labels
    return tuple(sorted((*t.labels, ("type", t.name))))


# -- parsing -------------------------------------------------------------------------


def load_cell_spec(path: str | Path) -> CellSpec:
    """Read and check a cell spec file; raises :class:`CellSpecError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise CellSpecError(f"{source}: cannot read the cell spec: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise CellSpecError(f"{source}: not UTF-8 text ({e.reason})") from None
    return parse_cell_spec(text, source, default_name=Path(path).stem)


def parse_cell_spec(text: str, source: str = "<string>", default_name: str = "cell") -> CellSpec:
    """A cell spec from TOML text; ``source`` names it in error messages."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CellSpecError(f"{source}: not valid TOML: {e}") from None
    try:
        return _parse(doc, source, default_name)
    except _FieldError as e:
        raise CellSpecError(f"{source}: {e.path}: {e.problem}") from None


class _FieldError(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class _Table:
    """Reads the fields of one TOML table, naming the path of whatever is wrong."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, Mapping):
            raise _FieldError(path or "(top level)", f"must be a table, got {_kind(value)}")
        self.value = value
        self.path = path
        self.seen: set[str] = set()

    def at(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str) -> object:
        self.seen.add(name)
        return self.value.get(name)

    def required(self, name: str) -> object:
        value = self.get(name)
        if value is None:
            raise _FieldError(self.at(name), "is required")
        return value

    def integer(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise _FieldError(self.at(name), f"must be an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            raise _FieldError(self.at(name), f"must be between {lo} and {hi}, got {value}")
        return value

    def string(self, name: str, default: str) -> str:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise _FieldError(self.at(name), f"must be a string, got {_kind(value)}")
        return value

    def name(self, field: str, default: str | None = None) -> str:
        value = self.get(field)
        if value is None:
            if default is None:
                raise _FieldError(self.at(field), "is required")
            return default
        if not isinstance(value, str):
            raise _FieldError(self.at(field), f"must be a string, got {_kind(value)}")
        try:
            return check_name(value, "")
        except ModelError:
            raise _FieldError(self.at(field), f"{value!r} is not a valid name (1-128 letters, "
                              "digits, '_', '.', '-', starting with a letter or digit)") from None

    def done(self) -> None:
        unknown = sorted(set(self.value) - self.seen)
        if unknown:
            raise _FieldError(self.path or "(top level)",
                              f"unknown field(s) {', '.join(map(repr, unknown))}")


def _kind(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _parse(doc: dict[str, object], source: str, default_name: str) -> CellSpec:
    top = _Table(doc, "")
    name = top.name("name", default=_safe_name(default_name))
    description = top.string("description", "")
    layout = _parse_layout(top.get("layout"))
    raw_types = top.required("types")
    if not isinstance(raw_types, list) or not raw_types:
        raise _FieldError("types", "must be a non-empty array of tables ([[types]])")
    types = tuple(_parse_type(t, f"types[{i}]") for i, t in enumerate(raw_types))
    top.done()
    _check_unique(types)
    total = sum(t.count for t in types)
    if total > MAX_MACHINES:
        raise _FieldError("types", f"{total} machines in all, above the limit of {MAX_MACHINES}")
    return CellSpec(name, types, layout, description, source)


def _safe_name(stem: str) -> str:
    try:
        return check_name(stem, "")
    except ModelError:
        return "cell"


def _parse_layout(value: object) -> Layout:
    if value is None:
        return Layout()
    t = _Table(value, "layout")
    per_rack = t.integer("machines_per_rack", DEFAULT_MACHINES_PER_RACK, 1, MAX_MACHINES)
    per_fd = t.integer("racks_per_failure_domain", DEFAULT_RACKS_PER_FAILURE_DOMAIN, 1,
                       MAX_MACHINES)
    t.done()
    assert per_rack is not None and per_fd is not None
    return Layout(per_rack, per_fd)


def _parse_type(value: object, path: str) -> MachineType:
    t = _Table(value, path)
    name = t.name("name")
    count = t.integer("count", None, 1, MAX_MACHINES)
    if count is None:
        raise _FieldError(t.at("count"), "is required")
    capacity = _parse_capacity(t.required("capacity"), t.at("capacity"))
    labels = _parse_labels(t.get("labels"), t.at("labels"))
    per_rack = t.integer("machines_per_rack", None, 1, MAX_MACHINES)
    t.done()
    return MachineType(name, count, capacity, labels, per_rack)


def _parse_capacity(value: object, path: str) -> Resources:
    if not isinstance(value, Mapping) or not value:
        raise _FieldError(path, "must be a non-empty table of dimension = amount "
                          "(e.g. { cpu = 16, mem = 64 })")
    amounts: dict[str, float] = {}
    for dim, amount in value.items():
        if not _DIMENSION.fullmatch(dim):
            raise _FieldError(f"{path}.{dim}", "is not a valid dimension name (lowercase "
                              "letters, digits and '_', starting with a letter)")
        amounts[dim] = _positive(amount, f"{path}.{dim}")
    return Resources(tuple(sorted(amounts.items())))


def _positive(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _FieldError(path, f"must be a positive number, got {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise _FieldError(path, f"must be a positive number, got {value}")
    if value > MAX_AMOUNT:
        raise _FieldError(path, f"is {value:g}, above the limit of {MAX_AMOUNT:g}")
    return float(value)


def _parse_labels(value: object, path: str) -> Labels:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise _FieldError(path, f"must be a table of name = \"value\", got {_kind(value)}")
    out = []
    for key, v in value.items():
        where = f"{path}.{key}"
        try:
            check_name(key, "")
        except ModelError:
            raise _FieldError(where, "is not a valid label name") from None
        if key in _RESERVED_LABELS:
            raise _FieldError(where, f"is reserved: the layout sets {key}")
        if not isinstance(v, str) or len(v) > 256:
            raise _FieldError(where, "must be a string of at most 256 characters")
        out.append((key, v))
    return tuple(sorted(out))


def _check_unique(types: tuple[MachineType, ...]) -> None:
    seen: dict[str, int] = {}
    for i, t in enumerate(types):
        if t.name in seen:
            raise _FieldError(f"types[{i}].name",
                              f"{t.name!r} is already the name of types[{seen[t.name]}]")
        seen[t.name] = i


SHIPPED = Path(__file__).resolve().parent / "cells"


def resolve_spec(name_or_path: str | Path) -> Path:
    """A spec file's path: an existing path as given, else the shipped spec of that name
    (``demo``, ``alibaba``), so that ``--spec demo`` works from any directory."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = SHIPPED / f"{path.stem}.toml"
    if path.parent == Path(".") and shipped.exists():
        return shipped
    names = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.toml")))
    raise CellSpecError(f"{path}: no such file (shipped specs: {names})")

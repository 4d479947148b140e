"""Placement constraints for the high-fidelity workloads (Omega §5): machine
attributes a cell's machines carry, the constraints a job class draws for its jobs,
and the compact text form traces use for a job's constraints.

The text form, one term per ``;``::

    platform=x|y          the machine's label ``platform`` is x or y
    kernel!=old           the machine's label ``kernel`` is not ``old`` (or absent)
    max_per_machine=1     at most 1 of the job's tasks per machine (spreading)

Label keys may also be ``rack``, ``failure_domain`` and ``machine`` (the store matches
selectors against those too). An empty text is no constraint.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

import attrs

from cellstate.model import Constraints, ModelError, Requirement, SelectorOp, check_name

PER_MACHINE = "max_per_machine"


class Sampler(Protocol):
    """A distribution (``simulator.workload.Distribution``, which imports this module)."""

    def sample(self, rng: random.Random) -> float: ...


@attrs.frozen
class Attribute:
    """A machine label ``key`` whose value each machine draws from ``values`` with the
    relative ``weights`` (Google's machines differ in platform, kernel, ...)."""

    key: str
    values: tuple[str, ...]
    weights: tuple[float, ...]

    def __attrs_post_init__(self) -> None:
        check_name(self.key, "attribute key")
        if not self.values or len(self.weights) != len(self.values) or not sum(self.weights):
            raise ValueError(f"attribute {self.key!r}: needs a value, and as many weights "
                             "(not all 0) as values")

    def draw(self, rng: random.Random) -> str:
        return rng.choices(self.values, self.weights)[0]


@attrs.frozen
class ConstraintGen:
    """The constraints of a class's jobs: a ``pick`` fraction of them ask for machines
    whose label ``key`` has one value (drawn from ``values`` by ``weights``: set them
    as the cell's attribute is set for the constraint to be as picky as it looks);
    ``max_per_machine`` is drawn for every job (rounded; 0: no limit)."""

    pick: float = 0.0
    key: str = ""
    values: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    max_per_machine: Sampler | None = None

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.pick <= 1:
            raise ValueError(f"pick must be a fraction from 0 to 1, got {self.pick!r}")
        if self.pick and (not self.key or not self.values
                          or len(self.weights) != len(self.values) or not sum(self.weights)):
            raise ValueError("a pick fraction needs a key, values and as many weights "
                             "(not all 0) as values")

    def draw(self, rng: random.Random) -> Constraints:
        selector: tuple[Requirement, ...] = ()
        if self.pick and rng.random() < self.pick:
            value = rng.choices(self.values, self.weights)[0]
            selector = (Requirement(self.key, SelectorOp.IN, (value,)),)
        per = 0
        if self.max_per_machine is not None:
            per = max(0, round(self.max_per_machine.sample(rng)))
        return Constraints(machine_selector=selector, max_per_machine=per)


def parse_constraints(text: str) -> Constraints:
    """The constraints a trace's text form says (module docstring); ValueError
    naming the bad term otherwise."""
    selector: list[Requirement] = []
    per = 0
    for raw in text.split(";"):
        term = raw.strip()
        if not term:
            continue
        negate = "!=" in term
        key, sep, rest = term.partition("!=" if negate else "=")
        key, rest = key.strip(), rest.strip()
        if not sep or not key or not rest:
            raise ValueError(f"term {term!r} is not KEY=V1|V2, KEY!=V1|V2 or "
                             f"{PER_MACHINE}=N")
        if key == PER_MACHINE:
            if negate or not rest.isdigit():
                raise ValueError(f"term {term!r}: {PER_MACHINE} takes a whole number >= 0")
            per = int(rest)
            continue
        values = tuple(v.strip() for v in rest.split("|"))
        try:
            check_name(key, "label key")
        except ModelError as e:
            raise ValueError(f"term {term!r}: {e}") from None
        if any(not v for v in values):
            raise ValueError(f"term {term!r}: an empty value")
        selector.append(Requirement(key, SelectorOp.NOT_IN if negate else SelectorOp.IN,
                                    values))
    return Constraints(machine_selector=tuple(selector), max_per_machine=per)


def format_constraints(c: Constraints) -> str:
    """The text form of ``c`` (selector terms of kind in / not in, and the limit)."""
    terms = []
    for r in c.machine_selector:
        if r.op in (SelectorOp.IN, SelectorOp.NOT_IN):
            op = "=" if r.op is SelectorOp.IN else "!="
            terms.append(f"{r.key}{op}{'|'.join(r.values)}")
    if c.max_per_machine:
        terms.append(f"{PER_MACHINE}={c.max_per_machine}")
    return ";".join(terms)


def machine_labels(attributes: Sequence[Attribute], rng: random.Random
                   ) -> tuple[tuple[str, str], ...]:
    """One machine's labels, one value of each attribute (sorted by key)."""
    return tuple(sorted((a.key, a.draw(rng)) for a in attributes))

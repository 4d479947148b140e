"""The model's classes keep Python's fast attribute reads (docs/performance.md,
"Python's slow attribute paths").

A class with a ``__getattr__`` (attrs adds one for ``functools.cached_property`` on a
slotted class) has every attribute read go through the interpreter's slow path, about
three times as long for each field; the records and claims are read on every hot path
of the store, the schedulers and the simulator."""

from __future__ import annotations

import importlib
import inspect

import attrs
import pytest

import cellstate.model
from cellstate.model import Allocation, Claim, Machine, Resources, TaskRecord
from cellstate.validation import Decision

_MODULES = ("cellstate.model", "cellstate.validation", "cellstate.cell", "cellstate.kv.base",
            "cellstate.records", "schedulers.api")


def _attrs_classes() -> list[type]:
    out = []
    for name in _MODULES:
        module = importlib.import_module(name)
        out += [c for _, c in inspect.getmembers(module, inspect.isclass)
                if c.__module__ == name and attrs.has(c)]
    return out


@pytest.mark.parametrize("cls", _attrs_classes(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_no_model_class_reads_its_attributes_through_getattr(cls: type) -> None:
    assert not hasattr(cls, "__getattr__"), (
        f"{cls.__name__} has a __getattr__ (a functools.cached_property on a slotted attrs "
        "class makes one): every attribute read of it takes Python's slow path")


def test_the_classes_on_the_hot_paths_are_among_those_checked() -> None:
    checked = set(_attrs_classes())
    assert {Machine, Claim, Decision, Allocation, TaskRecord, Resources} <= checked
    assert len(checked) > 20


def test_cached_values_are_computed_once_and_carried_by_copies() -> None:
    half = Resources.of(cpu=0.5, mem=1.0)
    m = Machine("m1", Resources.of(cpu=4.0, mem=8.0), allocations={
        "j/0": Allocation("j/0", "j", "s", 0, half),
        "g/0": Allocation("g/0", "g", "s", 0, half, gang="g1"),
    })
    assert m.known_job_ids() is None
    assert m.settled_used == half and m.settled_used is m.settled_used
    assert m.has_tags and m.gang_tags == frozenset({"g1"})
    assert m.job_ids == frozenset({"j", "g"}) and m.known_job_ids() == m.job_ids
    later = m.with_seq(7)
    assert later.seq == 7 and later.settled_used is m.settled_used
    assert later.known_job_ids() is m.job_ids and later.gang_tags is m.gang_tags
    fewer = m.with_allocations({"j/0": m.allocations["j/0"]})
    assert fewer.known_job_ids() is None and not fewer.has_tags
    assert fewer.gang_tags == frozenset() and fewer.settled_used == half


def test_a_trusted_machine_is_the_machine_attrs_would_build() -> None:
    half = Resources.of(cpu=0.5, mem=1.0)
    allocs = {"j/0": Allocation("j/0", "j", "s", 0, half)}
    fields = ("m1", Resources.of(cpu=4.0), "r1", "fd1", (("zone", "a"),),
              cellstate.model.MachineState.DRAINING, "agent-1", allocs, 9)
    built, trusted = Machine(*fields), cellstate.model.trusted_machine(*fields)
    assert [getattr(trusted, f.name) for f in attrs.fields(Machine)] == [
        getattr(built, f.name) for f in attrs.fields(Machine)]
    assert trusted == built and repr(trusted) == repr(built)
    assert trusted.allocations is allocs and trusted.settled_used == half


def test_a_claim_names_its_task_and_a_copy_names_its_own() -> None:
    c = Claim("j", 3, "m1")
    assert c.task == "j/3" == cellstate.model.task_id("j", 3)
    assert attrs.evolve(c, index=4).task == "j/4"
    assert c == Claim("j", 3, "m1") and "task" not in repr(c)


def test_a_trusted_claim_is_the_claim_attrs_would_build() -> None:
    built = Claim("j", 3, "m1", 7, ("j/1",), moves_from="m0")
    trusted = cellstate.model.trusted_claim("j", 3, "m1", 7, ("j/1",), (), "m0")
    assert [getattr(trusted, f.name) for f in attrs.fields(Claim)] == [
        getattr(built, f.name) for f in attrs.fields(Claim)]
    assert trusted == built and repr(trusted) == repr(built) and hash(trusted) == hash(built)
    assert attrs.evolve(trusted, index=4).task == "j/4"

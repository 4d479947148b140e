"""Affinity groups (a job whose labels match its own affinity selector) in the policies:
the first claim of a plan that claims every task of the group founds it, as the store
accepts (``cellstate.fit.self_affine``); before, no policy could place one."""

from __future__ import annotations

from cellstate.invariants import violations
from cellstate.model import Constraints, Job, Requirement, SelectorOp
from schedulers.api import CellView
from schedulers.flow import FlowPolicy
from schedulers.placement import can_host, founds_group
from schedulers.service import ServicePolicy
from schedulers.testing import Harness, job, machine, settled

APP_T1 = (Requirement("app", SelectorOp.IN, ("t1",)),)


def _group(scheduler: str, tasks: int = 3, gang: bool = True) -> Job:
    return job("t1", tasks=tasks, cpu=2, scheduler=scheduler, labels=[("app", "t1")],
               gang=gang, constraints=Constraints(affinity=APP_T1))


def test_founding_is_the_first_claim_of_a_group_none_of_which_runs() -> None:
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=8)])
    h.submit([_group("service")])
    view = CellView(h.snapshot(), "service")
    t1 = view.jobs["t1"]
    m1 = view.machine("m1")
    assert m1 is not None
    assert founds_group(view, t1)
    assert not can_host(view, t1, m1) and can_host(view, t1, m1, founding=True)
    view.claim(t1, 0, "m1")
    assert not founds_group(view, t1)  # the others join the founder
    m1 = view.machine("m1")
    assert m1 is not None and can_host(view, t1, m1)
    plain = job("plain", labels=[("app", "t1")])
    assert not founds_group(view, plain)  # no affinity of its own: not a group


def test_the_service_scheduler_places_an_affinity_group_on_one_machine() -> None:
    h = Harness()
    # m0 cannot hold the whole group: the founder must go where all three fit.
    h.admin.add_machines([machine("m0", cpu=4), machine("m1", cpu=8), machine("m2", cpu=8)])
    h.add(ServicePolicy())
    h.submit([_group("service")])
    h.run(settled)
    where = h.machines_of("t1")
    assert len(set(where)) == 1 and where[0] in ("m1", "m2")
    assert violations(h.snapshot()) == []


def test_the_flow_scheduler_repair_step_lets_a_founding_claim_through() -> None:
    h = Harness()
    h.admin.add_machines([machine("m1", cpu=8)])
    h.add(FlowPolicy(policy="trivial"), scheduler="flow")
    h.submit([_group("flow", gang=False)])
    h.run(settled, max_time=30)
    assert h.machines_of("t1") == ["m1"] * 3
    assert violations(h.snapshot()) == []

"""The events operators look for in a scheduler's log (docs/operations.md, "Logs"): a
commit that preempted tasks, and a lease lost and taken again."""

from __future__ import annotations

import logging
import re

import attrs
import pytest

from cellstate.model import JobKind
from schedulers.batch import BatchPolicy
from schedulers.service import ServicePolicy
from schedulers.testing import Harness, claims, job, machine, txn


def test_a_commit_that_preempts_says_which_tasks(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=4)])
    h.add(BatchPolicy())  # the batch scheduler is registered: its tasks may be placed
    inst = h.add(ServicePolicy(), scheduler="service")
    h.submit([job("filler", tasks=4, cpu=1)])
    h.admin.commit(txn(claims(h.snapshot(), "filler", [(i, "m0") for i in range(4)])))
    h.submit([attrs.evolve(job("web", cpu=3, scheduler="service", precedence=5),
                           kind=JobKind.SERVICE)])
    h.pump()
    with caplog.at_level(logging.INFO, logger="schedulers.runtime"):
        inst.step()
    lines = [r.getMessage() for r in caplog.records]
    assert any(re.fullmatch(r"service/0: job web preempted 3 task\(s\): "
                            r"filler/\d, filler/\d, filler/\d", m) for m in lines), lines


def test_a_lost_lease_is_logged_and_taken_again(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.admin.add_machines([machine("m0")])
    inst = h.add(BatchPolicy())
    lease = inst.lease
    assert lease is not None
    h.kv.lease_revoke(lease)  # as when the lease lapsed while the process hung
    h.clock.now += inst.config.lease_ttl
    with caplog.at_level(logging.WARNING, logger="schedulers.runtime"):
        inst.step()
    assert any(m.startswith("batch/0: lease lost (") and m.endswith("); registering again")
               for m in (r.getMessage() for r in caplog.records)), caplog.text
    assert inst.lease not in (None, lease)  # registered again, under a new lease

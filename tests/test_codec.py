"""User-given specs (jobs, machines, config) are checked field by field, and the error
names the path of the field that is wrong; the store then stays unchanged."""

from __future__ import annotations

import math
from typing import Any

import attrs
import orjson
import pytest

from cellstate.codec import (
    decode_alloc,
    decode_job,
    decode_machine,
    decode_usage,
    encode_job,
    encode_machine,
    parse_config,
    parse_job,
    parse_machine,
)
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, ModelError, Reason
from schedulers.testing import job, machine, make_cell, txn

GOOD_JOB: dict[str, Any] = {
    "id": "j1", "scheduler": "batch", "task_count": 3,
    "task_resources": {"cpu": 1, "mem": 2, "gpu": 1},
    "constraints": {"machine_selector": [{"key": "rack", "op": "in", "values": ["r1"]}],
                    "max_per_machine": 1},
    "labels": {"app": "web"}, "duration": 30,
}


def test_a_good_job_round_trips() -> None:
    j = parse_job(GOOD_JOB)
    assert j.task_resources.get("gpu") == 1 and j.constraints.max_per_machine == 1
    assert decode_job("j1", encode_job(j), 7) == parse_job(GOOD_JOB, revision=7)
    ranked = parse_job({**GOOD_JOB, "priority": -3})
    assert ranked.priority == -3 and decode_job("j1", encode_job(ranked), 0) == ranked


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "a/b"}, "job.id 'a/b' is not a valid name"),
        ({"task_count": 0}, "job.task_count must be between 1"),
        ({"task_count": "3"}, "job.task_count must be an integer"),
        ({"task_resources": {"cpu": math.nan}}, "job.task_resources.cpu is NaN"),
        ({"task_resources": {"cpu": -1}}, "job.task_resources.cpu is negative"),
        ({"task_resources": {"cpu": 1e13}}, "above the limit"),
        ({"task_resources": {"CPU!": 1}}, "not a valid dimension name"),
        ({"task_resources": {}}, "must ask for some resource"),
        ({"kind": "daemon"}, "job.kind: 'daemon' is not one of"),
        ({"precedence": -1}, "job.precedence must be between 0"),
        ({"priority": 1.5}, "job.priority must be an integer"),
        ({"priority": 10**7}, "job.priority must be between -1000000 and 1000000"),
        ({"constraints": {"machine_selector": [{"key": "rack", "op": "near"}]}},
         "job.constraints.machine_selector[0].op: 'near'"),
        ({"constraints": {"affinity": [{"key": "app", "op": "in", "values": []}]}},
         "job.constraints.affinity[0].values must not be empty"),
        ({"duration": -5}, "job.duration must be a non-negative"),
        ({"colour": "red"}, "unknown field(s) 'colour'"),
    ],
)
def test_bad_job_fields_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelError) as err:
        parse_job({**GOOD_JOB, **change})
    assert message in str(err.value)


def test_missing_required_fields_are_named() -> None:
    with pytest.raises(ModelError, match=r"job\.scheduler is required"):
        parse_job({"id": "x", "task_resources": {"cpu": 1}})
    with pytest.raises(ModelError, match="expected an object"):
        parse_job(["not", "a", "job"])


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"id": "m1"}, "machine.capacity is required"),
        ({"id": "m1", "capacity": {"cpu": math.inf}}, "machine.capacity.cpu is infinite"),
        ({"id": "m1", "capacity": {"cpu": 4}, "state": "broken"}, "machine.state: 'broken'"),
        ({"id": "m1", "capacity": {"cpu": 4}, "rack": "r 1"}, "machine.rack 'r 1'"),
        ({"id": "m1", "capacity": {"cpu": 4}, "labels": {"k": 5}}, "machine.labels['k']"),
    ],
)
def test_bad_machine_fields_are_named(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelError) as err:
        parse_machine(doc)
    assert message in str(err.value)


def test_bad_config_fields_are_named() -> None:
    with pytest.raises(ModelError, match=r"config.limits.batch.max_resources.cpu is negative"):
        parse_config({"limits": {"batch": {"max_resources": {"cpu": -2}}}})
    with pytest.raises(ModelError, match=r"config.limits.batch: unknown field\(s\) 'max_cpu'"):
        parse_config({"limits": {"batch": {"max_cpu": 2}}})


def test_a_corrupt_stored_record_names_its_key() -> None:
    with pytest.raises(ModelError, match="machine 'm1': stored record is corrupt"):
        decode_machine("m1", b"{not json", 3)
    m = machine("m1")
    assert decode_machine("m1", encode_machine(m), 9).seq == 9


def test_store_refuses_bad_specs_and_stays_unchanged() -> None:
    kv = MemoryKV()
    store = make_cell(kv, [machine("m1")], [job("j")])
    before = kv.revision
    bad_job = attrs.evolve(job("k", cpu=1), task_count=0)
    with pytest.raises(ModelError, match="task_count must be between 1"):
        store.submit_job(bad_job)
    with pytest.raises(ModelError, match="not a valid name"):
        store.add_machine(machine("bad name"))
    assert kv.revision == before


def test_claim_on_an_unknown_machine_names_it_and_changes_nothing() -> None:
    kv = MemoryKV()
    store = make_cell(kv, [machine("m1")], [job("j")])
    before = kv.revision
    res = store.commit(txn([Claim("j", 0, "m404")]))
    (rej,) = res.rejected
    assert rej.reason is Reason.UNKNOWN_MACHINE and "m404" in rej.detail
    assert kv.revision == before



# (JSON has no NaN or infinity: orjson refuses them when reading, so they never decode.)
@pytest.mark.parametrize("amount", [0, -1.5, "2", True, None, 1e300])
def test_a_stored_amount_no_parser_would_accept_is_corrupt(amount: object) -> None:
    """A value edited in etcd by hand: decoding trusts the store's own encoding but not
    an amount that no spec could have given (the fit rules add these up)."""
    bad = {"cpu": amount, "mem": 4.0}
    machine_doc = orjson.loads(encode_machine(machine("m1")))
    machine_doc["capacity"] = bad
    with pytest.raises(ModelError, match=r"machine 'm1': stored record is corrupt "
                                         r"\(resource 'cpu' has amount"):
        decode_machine("m1", orjson.dumps(machine_doc), 3)
    with pytest.raises(ModelError, match=r"allocation of task 'j/0': stored record is corrupt "
                                         r"\(resource 'cpu' has amount"):
        decode_alloc("j/0", orjson.dumps(["j", "batch", 0, bad]))


def test_stored_running_sums_may_be_negative_but_not_zero() -> None:
    used = decode_usage("batch", orjson.dumps({"base": 4, "used": {"cpu": -2.0}}), 9).used
    assert used.get("cpu") == -2.0
    for amount in (0, "x", 1e300):
        with pytest.raises(ModelError, match=r"usage 'batch': stored record is corrupt "
                                             r"\(resource 'cpu' has amount"):
            decode_usage("batch", orjson.dumps({"base": 4, "used": {"cpu": amount}}), 9)


def test_a_usage_counter_keeps_what_its_scheduler_held_when_it_started() -> None:
    from cellstate.codec import encode_usage
    from cellstate.model import Resources, UsageRecord
    rec = UsageRecord("batch", 4, Resources.of(cpu=2), 9, base_used=Resources.of(cpu=5))
    assert decode_usage("batch", encode_usage(rec), 9) == rec
    # Written before the field: none.
    assert decode_usage("batch", orjson.dumps({"base": 4, "used": {"cpu": 2}}),
                        9).base_used is None

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
    decode_machine_counted,
    decode_task,
    decode_usage,
    encode_job,
    encode_machine,
    encode_task,
    parse_config,
    parse_job,
    parse_machine,
)
from cellstate.keys import KeyKind, Keyspace
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Allocation,
    Claim,
    MachineState,
    ModelError,
    Reason,
    Resources,
    TaskRecord,
    TaskState,
)
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


def test_each_tasks_own_input_blocks_round_trip() -> None:
    j = parse_job({**GOOD_JOB, "task_input": [
        [{"size": 0.25, "on": ["m1", "m2", "m3"]}, {"size": 0.5, "on": ["m4"]}], []]})
    assert [[(b.size, b.on) for b in t] for t in j.task_input] == [
        [(0.25, ("m1", "m2", "m3")), (0.5, ("m4",))], []]
    assert decode_job("j1", encode_job(j), 0) == j


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
        ({"task_input": {"0": []}}, "job.task_input must be a list"),
        ({"task_input": [[{"on": ["m1"]}]]}, "job.task_input[0][0].size is required"),
        ({"task_input": [[{"size": 1, "on": []}]]}, "job.task_input[0][0].on must list 1"),
        ({"task_input": [[{"size": 1, "on": ["m1", "m1"]}]]}, "names a machine twice"),
        ({"task_input": [[{"size": 1, "on": ["m 1"]}]]}, "machine id 'm 1' is not a valid"),
        ({"task_input": [[{"size": 1, "on": ["m1"], "copies": 3}]]},
         "job.task_input[0][0]: unknown field(s) 'copies'"),
        ({"task_input": [[], [], [], []]}, "lists the input of 4 tasks; the job has 3"),
        ({"task_input": [[{"size": 1, "on": [f"m{i}" for i in range(16)]}]] * 1251},
         "more than 20000 copies"),
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


@pytest.mark.parametrize("state", ["melted", ["up"], 3, None])
def test_a_stored_state_no_record_can_have_is_corrupt(state: object) -> None:
    """States decode through a table of the enums' values; one it lacks (a value edited
    by hand, of any JSON type) is as corrupt as ever, with the enum's own words."""
    machine_doc = orjson.loads(encode_machine(machine("m1")))
    task_doc = orjson.loads(encode_task(TaskRecord("j", 0, TaskState.RUNNING, "m1", "s")))
    machine_doc["state"] = task_doc["state"] = state
    with pytest.raises(ModelError, match=r"machine 'm1': stored record is corrupt \(.*"
                                         r"not a valid MachineState"):
        decode_machine("m1", orjson.dumps(machine_doc), 3)
    with pytest.raises(ModelError, match=r"task 'j/0': stored record is corrupt \(.*"
                                         r"not a valid TaskState"):
        decode_task("j/0", orjson.dumps(task_doc), 3)
    for s in MachineState:
        machine_doc["state"] = s.value
        assert decode_machine("m1", orjson.dumps(machine_doc), 3).state is s
    for t in TaskState:
        task_doc["state"] = t.value
        assert decode_task("j/0", orjson.dumps(task_doc), 3).state is t


def test_a_machine_decodes_the_same_whatever_decoded_before() -> None:
    """What precedes a machine record's allocation count is decoded once per distinct
    bytes and reused: a record differing in any field but the count decodes anew."""
    up = attrs.evolve(machine("m1", cpu=8), rack="r1", labels=(("zone", "a"),),
                      agent="agent-1")
    allocs = {f"j/{i}": Allocation(f"j/{i}", "j", "s", 0, Resources.of(cpu=1)) for i in range(3)}
    for count in range(3):
        value = encode_machine(attrs.evolve(up, allocations=dict(list(allocs.items())[:count])))
        m, n = decode_machine_counted("m1", value, 7)
        assert n == count and m.allocations == {} and m.seq == 7
        assert (m.capacity, m.rack, m.labels, m.agent, m.state) == (
            up.capacity, "r1", (("zone", "a"),), "agent-1", MachineState.UP)
    for changed in (attrs.evolve(up, state=MachineState.DRAINING),
                    attrs.evolve(up, labels=(("zone", "b"),)),
                    attrs.evolve(up, capacity=Resources.of(cpu=4, mem=64))):
        value = encode_machine(attrs.evolve(changed, allocations=allocs))
        m, n = decode_machine_counted("m2", value, 8)
        assert (m.id, n, m.state, m.labels, m.capacity) == (
            "m2", 3, changed.state, changed.labels, changed.capacity)
    given = dict(allocs)
    assert decode_machine("m1", encode_machine(up), 9, given, copy=False).allocations is given
    assert decode_machine("m1", encode_machine(up), 9, given).allocations is not given


@pytest.mark.parametrize("count", [b"-1", b"05", b"1.5", b'"3"', b"null"])
def test_a_stored_allocation_count_no_store_writes_is_corrupt(count: bytes) -> None:
    value = encode_machine(machine("m1"))[:-1] + b',"n":' + count + b"}"
    with pytest.raises(ModelError, match=r"machine 'm1': stored record is corrupt"):
        decode_machine_counted("m1", value, 3)


def test_keys_of_every_kind_classify_and_others_do_not() -> None:
    keys = Keyspace("c")
    for kind in KeyKind:
        if kind is not KeyKind.CONFIG:
            assert keys.classify(keys.key(kind, "x/1")) == (kind, "x/1")
    assert keys.classify(keys.config) == (KeyKind.CONFIG, "")
    for other in (b"/omega/c/nothing/x", b"/omega/c/jobs/", b"/omega/c/jobs", b"/omega/d/jobs/x",
                  b"/omega/c/JOBS/x"):
        assert keys.classify(other) is None, other


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

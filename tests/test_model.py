"""The model's small pieces, at their edges: fit slack, selectors, machine labels, a
claim's machines, names in error messages. Written against the survivors of a
mutation-testing run (docs/testing.md): each test pins a behaviour that a one-token
change of cellstate/model.py left unnoticed by the rest of the fast suite."""

from __future__ import annotations

import attrs
import pytest

from cellstate.errors import ModelError
from cellstate.model import (
    MAX_AMOUNT,
    Allocation,
    Claim,
    Fallback,
    Machine,
    MachineState,
    Requirement,
    Resources,
    SelectorOp,
    check_amount,
    check_name,
    fallbacks_taken,
    labels_from,
    split_task_id,
)

# -- fit slack: exactly at capacity fits; past it by more than 1e-9 of it does not ----


@pytest.mark.parametrize("cap", [0.5, 1.0, 1.5, 2.0, 64.0, 1e6])
def test_at_capacity_fits_and_past_the_slack_does_not(cap: float) -> None:
    limit = Resources.of(mem=cap)
    slack = 1e-9 * max(cap, 1.0)  # relative above 1, absolute below
    # The slack's edge itself still fits (the same float sum as the code's).
    for amount, fits in ((cap, True), (cap + slack / 2, True), (cap + slack, True),
                         (cap + slack * 1.5, False)):
        need = Resources.of(mem=amount)
        assert (need.exceeding(limit) is None) is fits, (cap, amount)
        assert (Resources().exceeding_with(need, limit) is None) is fits, (cap, amount)
        assert (need.exceeding_limit(limit) is None) is fits, (cap, amount)


def test_resources_print_as_name_value_pairs() -> None:
    assert str(Resources.of(mem=2, cpu=1.5)) == "cpu=1.5,mem=2"
    assert str(Resources()) == "0"


# -- selectors -------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "values", "expected"), [
    # value:                            None   "a"    "b"
    (SelectorOp.IN, ("a",), (False, True, False)),
    (SelectorOp.NOT_IN, ("a",), (True, False, True)),
    (SelectorOp.EXISTS, (), (False, True, True)),
    (SelectorOp.NOT_EXISTS, (), (True, False, False)),
])
def test_each_selector_operator(op: SelectorOp, values: tuple[str, ...],
                                expected: tuple[bool, bool, bool]) -> None:
    req = Requirement("zone", op, values)
    assert (req.matches(None), req.matches("a"), req.matches("b")) == expected


def test_a_machine_answers_for_its_rack_domain_and_id_as_labels() -> None:
    m = Machine("m7", Resources.of(cpu=1), rack="r1", failure_domain="fd2",
                labels=(("zone", "a"),))
    assert m.label("rack") == "r1"
    assert m.label("failure_domain") == "fd2"
    assert m.label("machine") == "m7"
    assert m.label("zone") == "a"
    assert m.label("missing") is None


# -- claims ------------------------------------------------------------------------------


def test_a_claims_machines_are_its_candidates_and_the_one_it_moves_from() -> None:
    plain = Claim("j", 0, "m0", 3, fallbacks=(Fallback("m1", 4),))
    assert plain.machines() == ("m0", "m1")
    move = Claim("j", 0, "m0", 3, moves_from="m9")
    assert move.machines() == ("m0", "m9")


def test_bad_labels_are_named_as_labels_by_default() -> None:
    with pytest.raises(ModelError, match=r"^labels key 'bad key' is not a valid name"):
        labels_from({"bad key": "v"})
    with pytest.raises(ModelError, match=r"^machine m0 labels key"):
        labels_from({"bad key": "v"}, "machine m0 labels")


# -- resource arithmetic -------------------------------------------------------------


def test_adding_a_dimension_self_lacks_takes_its_amount() -> None:
    assert (Resources.of(cpu=1) + Resources.of(mem=2)).as_dict() == {"cpu": 1, "mem": 2}
    assert (Resources.of(cpu=1) + Resources.of(cpu=0.5)).as_dict() == {"cpu": 1.5}


def test_subtracting_a_dimension_self_lacks_leaves_it_negative() -> None:
    # Usage counters go through differences like this one (invariants compare both ways).
    assert (Resources.of(cpu=1) - Resources.of(mem=2)).as_dict() == {"cpu": 1, "mem": -2}
    assert (Resources.of(cpu=1) - Resources.of(cpu=1)) == Resources()


# -- labels ------------------------------------------------------------------------------


def test_label_values_up_to_256_characters_pass_and_longer_ones_are_named() -> None:
    assert labels_from({"k": "v" * 256}) == (("k", "v" * 256),)
    with pytest.raises(ModelError,
                       match=r"^labels\['k'\] must be a string of at most 256 characters$"):
        labels_from({"k": "v" * 257})
    with pytest.raises(ModelError, match=r"^labels\['k'\] must be a string"):
        labels_from({"k": 5})  # type: ignore[dict-item]


def test_labels_that_are_not_a_mapping_are_refused() -> None:
    with pytest.raises(ModelError, match=r"^job j labels must be a mapping of string to string$"):
        labels_from([("k", "v")], "job j labels")  # type: ignore[arg-type]


# -- machine copies ------------------------------------------------------------------------


def _full_machine() -> Machine:
    a = Allocation("j/0", "j", "batch", 0, Resources.of(cpu=1))
    return Machine("m1", Resources.of(cpu=4), rack="r1", failure_domain="fd1",
                   labels=(("zone", "a"),), state=MachineState.DRAINING, agent="ag1",
                   allocations={"j/0": a}, seq=7)


def test_a_machine_copy_with_other_allocations_keeps_everything_else() -> None:
    m = _full_machine()
    b = Allocation("k/0", "k", "batch", 0, Resources.of(cpu=2))
    for settled in (None, Resources.of(cpu=2)):
        c = m.with_allocations({"k/0": b}, settled)
        assert attrs.evolve(c, allocations=m.allocations) == m  # eq leaves allocations out
        assert (c.rack, c.failure_domain, c.agent, c.seq) == ("r1", "fd1", "ag1", 7)
        assert dict(c.allocations) == {"k/0": b}
        assert c.settled_used == Resources.of(cpu=2)


def test_a_machine_copy_at_another_sequence_keeps_everything_else() -> None:
    m = _full_machine()
    # Both cached sums computed before the copy, which carries them.
    assert m.settled_used == Resources.of(cpu=1) and m.has_tags is False
    c = m.with_seq(9)
    assert (c.id, c.capacity, c.rack, c.failure_domain, c.labels, c.state, c.agent) == (
        "m1", Resources.of(cpu=4), "r1", "fd1", (("zone", "a"),), MachineState.DRAINING, "ag1")
    assert c.seq == 9 and c.allocations == m.allocations
    assert c.settled_used == Resources.of(cpu=1) and c.has_tags is False


# -- fallbacks taken -------------------------------------------------------------------------


def test_fallbacks_taken_names_the_tasks_committed_away_from_their_first_machine() -> None:
    sent = (Claim("j", 0, "m0", fallbacks=(Fallback("m1"),)),
            Claim("j", 1, "m0", fallbacks=(Fallback("m1"),)),
            Claim("j", 2, "m5"))
    committed = (Claim("j", 0, "m1"), Claim("j", 1, "m0"), Claim("j", 2, "m5"))
    assert fallbacks_taken(sent, committed) == ("j/0",)
    assert fallbacks_taken(sent[2:], committed) == ()
    assert fallbacks_taken(sent, ()) == ()


# -- checked input: what is wrong and where ------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ("x", "job j cpu must be a number, got 'x'"),
    (True, "job j cpu must be a number, got True"),  # a bool is not an amount
    (float("nan"), "job j cpu is NaN"),
    (float("inf"), "job j cpu is infinite"),
    (-0.5, "job j cpu is negative (-0.5)"),
    (2e12, "job j cpu is 2e+12, above the limit of 1e+12"),
])
def test_a_bad_amount_is_refused_saying_what_and_where(value: object, message: str) -> None:
    with pytest.raises(ModelError) as info:
        check_amount(value, "job j cpu")
    assert str(info.value) == message


def test_amounts_up_to_the_limit_pass() -> None:
    assert check_amount(MAX_AMOUNT, "cpu") == MAX_AMOUNT
    assert check_amount(0, "cpu") == 0.0 and check_amount(3, "cpu") == 3.0


@pytest.mark.parametrize(("mapping", "message"), [
    ([("cpu", 1)], "job j resources must be a mapping of dimension to amount"),
    ({"CPU": 1}, "job j resources: 'CPU' is not a valid dimension name (lowercase letters, "
                 "digits and '_', starting with a letter)"),
    ({5: 1}, "job j resources: 5 is not a valid dimension name (lowercase letters, digits and "
             "'_', starting with a letter)"),
    ({"cpu": -1}, "job j resources.cpu is negative (-1)"),
])
def test_bad_resources_are_refused_naming_the_dimension(mapping: object, message: str) -> None:
    with pytest.raises(ModelError) as info:
        Resources.from_mapping(mapping, "job j resources")  # type: ignore[arg-type]
    assert str(info.value) == message


def test_resources_are_named_resources_by_default() -> None:
    with pytest.raises(ModelError, match=r"^resources\.cpu is negative \(-1\)$"):
        Resources.from_mapping({"cpu": -1})


def test_resources_drop_zero_amounts_and_sort_by_name() -> None:
    assert Resources.from_mapping({"mem": 2, "cpu": 1, "gpu": 0}).amounts == (
        ("cpu", 1.0), ("mem", 2.0))


@pytest.mark.parametrize("tid", ["j/01", "j/x", "/3", "j/", "j0", "j/\u0663", "j/-1"])
def test_a_string_that_is_not_a_task_id_is_refused(tid: str) -> None:
    """A leading zero or a Unicode digit would name a task key other than the index."""
    with pytest.raises(ModelError) as info:
        split_task_id(tid)
    assert str(info.value) == f"{tid!r} is not a task id (expected JOB/INDEX)"


def test_task_ids_split_into_job_and_index() -> None:
    assert split_task_id("j/0") == ("j", 0)
    assert split_task_id("job-1.x/10") == ("job-1.x", 10)


@pytest.mark.parametrize("name", ["a" * 129, "_a", "a b", "job\n", 5, ""])
def test_a_bad_name_is_refused_with_the_rule(name: object) -> None:
    with pytest.raises(ModelError) as info:
        check_name(name, "job")  # type: ignore[arg-type]
    assert str(info.value) == (f"job {name!r} is not a valid name: use 1-128 letters, digits, "
                               "'_', '.', '-', starting with a letter or digit")


def test_names_of_1_to_128_safe_characters_pass() -> None:
    for name in ("a", "a" * 128, "0.job_x-1"):
        assert check_name(name, "job") == name

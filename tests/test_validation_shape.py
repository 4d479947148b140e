"""check_shape: every malformed transaction is refused with one message that says what
is wrong and where (which claim, which field, which value), whatever the cell holds.

Transactions come from other processes (the service's Commit, a scheduler's plugin),
so the types the annotations promise are checked too. Each row is one problem alone,
and the whole message is compared: a mutation-testing run (docs/testing.md) found
that checks of a fragment let a message lose its claim number or its value."""

from __future__ import annotations

import attrs
import pytest

from cellstate import validation
from cellstate.model import Claim, Detection, Fallback, Resources, Transaction, TxnMode
from cellstate.validation import TransactionError, check_batch, check_shape

NAME_RULE = ("is not a valid name: use 1-128 letters, digits, '_', '.', '-', starting with a "
             "letter or digit")
OK = Claim("j", 0, "m1")


def _t(*claims: object, scheduler: str = "batch", mode: object = TxnMode.INCREMENTAL,
       detection: object = Detection.FINE, job: str = "") -> Transaction:
    return Transaction(scheduler, claims, mode, detection, job)  # type: ignore[arg-type]


def _c(**fields: object) -> Claim:
    return Claim(**{"job": "j", "index": 0, "machine": "m1", **fields})  # type: ignore[arg-type]


MALFORMED: dict[str, tuple[Transaction, str]] = {
    "scheduler name": (_t(OK, scheduler="bad name"), f"scheduler 'bad name' {NAME_RULE}"),
    "mode": (_t(OK, mode="gang"), "mode 'gang' is not one of incremental, gang"),
    "detection": (_t(OK, detection="fine"), "detection 'fine' is not one of fine, coarse"),
    "not a claim": (_t(OK, "j/1"), "claim 1 is not a Claim"),
    "job name": (_t(_c(job="j j")), f"claim 0: job 'j j' {NAME_RULE}"),
    "machine name": (_t(_c(machine="")), f"claim 0: machine '' {NAME_RULE}"),
    "negative index": (_t(_c(index=-1)), "claim 0: task index -1 is not a non-negative integer"),
    "bool index": (_t(_c(index=True)), "claim 0: task index True is not a non-negative integer"),
    "str index": (_t(_c(index="0")), "claim 0: task index '0' is not a non-negative integer"),
    "negative seen_seq": (_t(_c(seen_seq=-2)),
                          "claim 0: seen_seq -2 is not a non-negative integer"),
    "bool seen_seq": (_t(_c(seen_seq=False)),
                      "claim 0: seen_seq False is not a non-negative integer"),
    "another job's claim": (_t(OK, _c(job="k"), job="j"),
                            "claim 1 is for a task of job 'k', but the transaction is for job "
                            "'j'"),
    "resources not a vector": (_t(_c(resources={"cpu": 1})),
                               "claim 0: resources must be a Resources vector"),
    "resources NaN": (_t(_c(resources=Resources((("cpu", float("nan")),)))),
                      "claim 0: resources.cpu is NaN"),
    "evict a list": (_t(_c(evict=["x/0"])), "claim 0: evict must be a tuple of task ids"),
    "evict None": (_t(_c(evict=None)), "claim 0: evict must be a tuple of task ids"),
    "victim not a str": (_t(_c(evict=(5,))), "claim 0: evict: 5 is not a task id"),
    "victim not a task id": (_t(_c(evict=("x",))),
                             "claim 0: evict: 'x' is not a task id (expected JOB/INDEX)"),
    "victim twice": (_t(_c(evict=("x/0", "x/0"))), "claim 0: evicts task x/0 twice"),
    "task claimed twice": (_t(OK, _c(index=1), _c(machine="m2")),
                           "claim 2: task j/0 is already claimed by claim 0"),
    "evicts a task it claims": (_t(OK, _c(job="k", evict=("j/0",))),
                                "claim 1: evicts task j/0, which this transaction claims"),
    "moves_from None": (_t(_c(moves_from=None)),
                        "claim 0: moves_from must be a machine id or empty, got None"),
    "moves_from name": (_t(_c(moves_from="m 1")), f"claim 0: moves_from 'm 1' {NAME_RULE}"),
    "moves to its machine": (_t(_c(moves_from="m1")),
                             "claim 0: moves task j/0 from 'm1' to the same machine"),
    "fallbacks a list": (_t(_c(fallbacks=[Fallback("m2")])),
                         "claim 0: fallbacks must be a tuple of Fallback"),
    "five fallbacks": (_t(_c(fallbacks=tuple(Fallback(f"x{i}") for i in range(5)))),
                       "claim 0: 5 fallbacks, more than the limit of 4"),
    "evicts with fallbacks": (_t(_c(evict=("x/0",), fallbacks=(Fallback("m2"),))),
                              "claim 0: a claim that evicts cannot have fallbacks (its victims "
                              "run on its first machine)"),
    "fallback not a Fallback": (_t(_c(fallbacks=("m2",))),
                                "claim 0: fallbacks[0] is not a Fallback"),
    "fallback name": (_t(_c(fallbacks=(Fallback("m/2"),))),
                      f"claim 0: fallbacks[0]: machine 'm/2' {NAME_RULE}"),
    "fallback negative seq": (_t(_c(fallbacks=(Fallback("m2", -1),))),
                              "claim 0: fallbacks[0]: seen_seq -1 is not a non-negative integer"),
    "fallback bool seq": (_t(_c(fallbacks=(Fallback("m2", True),))),
                          "claim 0: fallbacks[0]: seen_seq True is not a non-negative integer"),
    "fallback is the first machine": (_t(_c(fallbacks=(Fallback("m1"),))),
                                      "claim 0: fallbacks[0]: machine 'm1' is named twice by "
                                      "this claim"),
    "fallback twice": (_t(_c(fallbacks=(Fallback("m2"), Fallback("m2")))),
                       "claim 0: fallbacks[1]: machine 'm2' is named twice by this claim"),
    "fallback is where it moves from": (_t(_c(moves_from="m3", fallbacks=(Fallback("m3"),))),
                                        "claim 0: fallbacks[0]: machine 'm3' is the one the "
                                        "task moves from"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_each_malformed_transaction_is_refused_saying_what_and_where(name: str) -> None:
    txn, message = MALFORMED[name]
    with pytest.raises(TransactionError) as info:
        check_shape(txn)
    assert str(info.value) == f"invalid transaction: {message}"


def test_good_claims_of_every_kind_pass() -> None:
    check_shape(_t(OK, _c(index=1, seen_seq=3, resources=Resources.of(cpu=1), evict=("x/0",)),
                   _c(index=2, fallbacks=(Fallback("m2", 1), Fallback("m3"))),
                   _c(index=3, machine="m2", moves_from="m1"), job="j"))


@pytest.mark.parametrize(("claims", "message"), [
    ((), "transaction has no claims"),
    ([OK], "claims must be a tuple of Claim, not list"),
    (None, "claims must be a tuple of Claim, not NoneType"),
])
def test_a_transaction_without_a_tuple_of_claims_is_refused(claims: object, message: str) -> None:
    with pytest.raises(TransactionError) as info:
        check_shape(Transaction("batch", claims))  # type: ignore[arg-type]
    assert str(info.value) == message


def test_the_claim_limit_is_inclusive() -> None:
    check_shape(_t(OK, _c(index=1)), max_claims=2)
    with pytest.raises(TransactionError) as info:
        check_shape(_t(OK, _c(index=1), _c(index=2)), max_claims=2)
    assert str(info.value) == "transaction has 3 claims, more than the limit of 2"


def test_problems_past_twenty_are_cut_short() -> None:
    """Twenty problems are shown; with more claims left unchecked the message says there
    are more without counting them, else how many more it found."""
    bad = [_c(index=i, seen_seq=-1) for i in range(25)]
    with pytest.raises(TransactionError) as info:
        check_shape(_t(*bad))
    shown = [f"claim {i}: seen_seq -1 is not a non-negative integer" for i in range(20)]
    assert str(info.value) == "invalid transaction: " + "; ".join(shown) + " (and more)"
    # 21 problems, the last found after every claim was checked: counted.
    ok = [_c(index=i, evict=(f"j/{i + 1}",)) for i in range(20)]
    with pytest.raises(TransactionError) as info:
        check_shape(_t(*ok, _c(index=20, evict=("j/0",)), scheduler="b b"))
    message = str(info.value)
    assert message.startswith(f"invalid transaction: scheduler 'b b' {NAME_RULE}; claim 0: ")
    assert message.endswith("claim 18: evicts task j/19, which this transaction claims"
                            " (and 2 more)")


# -- a batch's limits, at small sizes (the real limits' tests take seconds) --------------


def test_a_batch_at_its_limits_passes_and_one_more_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "MAX_TRANSACTIONS_PER_COMMIT", 3)
    monkeypatch.setattr(validation, "MAX_CLAIMS_PER_TRANSACTION", 5)

    def txn(claims: int, first: int = 0) -> Transaction:
        return _t(*(_c(index=first + i) for i in range(claims)))

    check_batch([txn(1), txn(1, 1), txn(1, 2)])
    check_batch([txn(2), txn(3, 2)])  # five claims in all
    with pytest.raises(TransactionError) as info:
        check_batch([txn(1)] * 4)
    assert str(info.value) == "4 transactions in one commit, more than the limit of 3"
    with pytest.raises(TransactionError) as info:
        check_batch([txn(2), txn(2, 2), txn(2, 4)])
    assert str(info.value) == "6 claims in one commit, more than the limit of 5"


def test_a_batch_with_a_transaction_whose_claims_are_not_a_tuple_names_it() -> None:
    with pytest.raises(TransactionError) as info:
        check_batch([_t(OK), Transaction("batch", 5)])  # type: ignore[arg-type]
    assert str(info.value) == "transactions[1]: claims must be a tuple of Claim, not int"


# -- several problems in one claim or transaction: each is named -------------------------


@pytest.mark.parametrize(("claim", "problems"), [
    (_c(fallbacks=("m2", Fallback("m/3"))),
     ["fallbacks[0] is not a Fallback", f"fallbacks[1]: machine 'm/3' {NAME_RULE}"]),
    (_c(fallbacks=(Fallback("m/2"), Fallback("m1"))),
     [f"fallbacks[0]: machine 'm/2' {NAME_RULE}",
      "fallbacks[1]: machine 'm1' is named twice by this claim"]),
    (_c(fallbacks=(Fallback("m2"), Fallback("m3"), Fallback("m4"), Fallback("m/5"))),
     [f"fallbacks[3]: machine 'm/5' {NAME_RULE}"]),
    (_c(fallbacks=(*(Fallback(f"m{i}") for i in range(2, 7)), Fallback("m1"))),
     ["6 fallbacks, more than the limit of 4"]),
    (_c(evict=("x", "y/01")),
     ["evict: 'x' is not a task id (expected JOB/INDEX)",
      "evict: 'y/01' is not a task id (expected JOB/INDEX)"]),
])
def test_every_problem_of_a_claim_is_named(claim: Claim, problems: list[str]) -> None:
    with pytest.raises(TransactionError) as info:
        check_shape(_t(claim))
    assert str(info.value) == "invalid transaction: " + "; ".join(
        f"claim 0: {p}" for p in problems)


def test_four_fallbacks_are_allowed() -> None:
    check_shape(_t(_c(fallbacks=tuple(Fallback(f"m{i}") for i in range(2, 6)))))


def test_claims_after_one_that_is_not_a_claim_are_still_checked() -> None:
    with pytest.raises(TransactionError) as info:
        check_shape(_t(OK, "junk", OK))
    assert str(info.value) == ("invalid transaction: claim 1 is not a Claim; claim 2: task j/0 "
                               "is already claimed by claim 0")


@pytest.mark.parametrize(("bad", "suffix"), [(20, ""), (21, " (and more)")])
def test_twenty_problems_are_all_shown(bad: int, suffix: str) -> None:
    with pytest.raises(TransactionError) as info:
        check_shape(_t(*(_c(index=i, seen_seq=-1) for i in range(bad)), _c(index=99)))
    shown = [f"claim {i}: seen_seq -1 is not a non-negative integer" for i in range(20)]
    assert str(info.value) == "invalid transaction: " + "; ".join(shown) + suffix


def test_twenty_one_problems_found_with_every_claim_checked_say_one_more() -> None:
    """Every claim passes on its own; then each of 20 evicts a task another claims, and
    the scheduler's name is bad: 21 problems, the last one counted."""
    claims = [_c(index=i, evict=(f"j/{(i + 1) % 20}",)) for i in range(20)]
    with pytest.raises(TransactionError) as info:
        check_shape(_t(*claims, scheduler="b b"))
    message = str(info.value)
    assert message.endswith("claim 18: evicts task j/19, which this transaction claims"
                            " (and 1 more)")


def test_a_well_formed_transaction_is_checked_once() -> None:
    """The runtime and then the store (in one process) check the same immutable
    record: the second check finds it marked and does not go over its claims; a copy
    is checked again, and a check with a smaller claim limit still applies its limit."""
    txn = _t(OK, _c(index=1))
    marked = [txn.shape_checked]
    check_shape(txn)
    marked.append(txn.shape_checked)
    assert marked == [False, True]
    # Were its claims somehow not what was checked, the mark alone decides.
    object.__setattr__(txn, "claims", (OK, OK))
    check_shape(txn)
    with pytest.raises(TransactionError, match="already claimed"):
        check_shape(attrs.evolve(txn))
    with pytest.raises(TransactionError, match="more than the limit of 1"):
        check_shape(txn, max_claims=1)
    bad = _t(OK, OK)
    for _ in range(2):
        with pytest.raises(TransactionError):
            check_shape(bad)
    assert not bad.shape_checked

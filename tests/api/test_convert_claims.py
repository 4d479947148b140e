"""A transaction's claims cross the wire unchanged, each kind of claim by its own path
(cellstate/api/convert.py builds plain claims, nearly every one, field by field)."""

from __future__ import annotations

import pytest

from cellstate.api import convert
from cellstate.api.pb.v1 import cellstate_pb2 as pb
from cellstate.model import Claim, Fallback, Resources, Transaction, TxnMode

CLAIMS = {
    "plain": Claim("job-a", 7, "m1", 12),
    "plain at sequence 0": Claim("job-a", 0, "m2"),
    "evicting": Claim("job-a", 8, "m1", 12, evict=("job-b/3", "job-b/4")),
    "with resources": Claim("job-a", 9, "m3", 5, resources=Resources.of(cpu=1.5, mem=2.0)),
    "with fallbacks": Claim("job-a", 10, "m3", 5, fallbacks=(Fallback("m4", 6),
                                                             Fallback("m5", 0))),
    "moving": Claim("job-a", 11, "m6", 2, moves_from="m1"),
}


@pytest.mark.parametrize("kind", sorted(CLAIMS))
def test_a_claim_crosses_the_wire_unchanged(kind: str) -> None:
    txn = Transaction("sched", (CLAIMS[kind],), TxnMode.INCREMENTAL)
    data = pb.CommitRequest(transaction=convert.transaction_to(txn, "i0")).SerializeToString()
    (back,) = convert.transactions_from(pb.CommitRequest.FromString(data))
    assert back == txn
    assert back.claims[0].task == CLAIMS[kind].task  # not compared by ==
    assert back.claims[0].resources == CLAIMS[kind].resources


def test_a_plain_claim_is_the_same_bytes_as_one_with_every_field_given() -> None:
    c = CLAIMS["plain"]
    full = pb.Claim(job=c.job, index=c.index, machine=c.machine, seen_seq=c.seen_seq,
                    evict=[], resources=None, fallbacks=[], moves_from="")
    sent = convert.transaction_to(Transaction("sched", (c,)), "i0").claims[0]
    assert sent.SerializeToString() == full.SerializeToString()


def test_too_many_fallbacks_are_refused_with_where() -> None:
    msg = pb.CommitRequest(transaction=pb.Transaction(scheduler="sched", claims=[
        pb.Claim(job="job-a", index=1, machine="m1"),
        pb.Claim(job="job-a", index=2, machine="m1", fallbacks=[
            pb.Fallback(machine=f"m{i}") for i in range(100)])]))
    with pytest.raises(convert.WireError, match=r"transaction\.claims\[1\]\.fallbacks: 100 given"):
        convert.transactions_from(msg)

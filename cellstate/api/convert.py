"""Between the wire (cellstate.api.pb) and the model (cellstate.model).

Everything that arrives from another process is checked here or by the model's own
parsers, with the path of the field at fault in the message (``claims[3].resources``),
before the store sees it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import orjson

from cellstate.api.pb.v1 import cellstate_pb2 as pb
from cellstate.errors import (
    WireError as WireError,
)
from cellstate.model import (
    MAX_FALLBACKS,
    Claim,
    CommitResult,
    Detection,
    Fallback,
    ModelError,
    Reason,
    Rejection,
    Resources,
    Transaction,
    TxnMode,
    fallbacks_taken,
    trusted_claim,
)

_MODES = {pb.TXN_MODE_UNSPECIFIED: TxnMode.INCREMENTAL, pb.INCREMENTAL: TxnMode.INCREMENTAL,
          pb.GANG: TxnMode.GANG}
_DETECTIONS = {pb.DETECTION_UNSPECIFIED: Detection.FINE, pb.FINE: Detection.FINE,
               pb.COARSE: Detection.COARSE}
_MODE_PB = {TxnMode.INCREMENTAL: pb.INCREMENTAL, TxnMode.GANG: pb.GANG}
_DETECTION_PB = {Detection.FINE: pb.FINE, Detection.COARSE: pb.COARSE}


def resources_from(amounts: Mapping[str, float], where: str) -> Resources:
    for name, value in amounts.items():
        if not math.isfinite(value) or value < 0:
            raise WireError(f"{where}.{name}: {value!r} is not a non-negative number")
    try:
        return Resources.of(**amounts)
    except ModelError as e:
        raise WireError(f"{where}: {e}") from e


def transaction_from(msg: pb.Transaction, where: str = "transaction") -> Transaction:
    if msg.mode not in _MODES:
        raise WireError(f"{where}.mode: {msg.mode} is not a known mode")
    if msg.detection not in _DETECTIONS:
        raise WireError(f"{where}.detection: {msg.detection} is not a known detection")
    claims: list[Claim] = []
    append = claims.append
    for i, c in enumerate(msg.claims):
        wire_fallbacks = c.fallbacks
        if not wire_fallbacks:
            fallbacks: tuple[Fallback, ...] = ()
        elif len(wire_fallbacks) > MAX_FALLBACKS:
            raise WireError(f"{where}.claims[{i}].fallbacks: {len(wire_fallbacks)} given, "
                            f"more than the limit of {MAX_FALLBACKS}")
        else:
            fallbacks = tuple(Fallback(f.machine, f.seen_seq) for f in wire_fallbacks)
        if c.resources:
            append(Claim(
                job=c.job, index=c.index, machine=c.machine, seen_seq=c.seen_seq,
                evict=tuple(c.evict),
                resources=resources_from(c.resources, f"{where}.claims[{i}].resources"),
                fallbacks=fallbacks, moves_from=c.moves_from))
        else:
            # Claim has no validators (check_shape judges every field later): built
            # slot by slot, as the policies build theirs, it is the same claim for a
            # quarter of the cost (every commit converts every claim here).
            append(trusted_claim(c.job, c.index, c.machine, c.seen_seq, tuple(c.evict),
                                 fallbacks, c.moves_from))
    return Transaction(
        scheduler=msg.scheduler,
        claims=tuple(claims),
        mode=_MODES[msg.mode],
        detection=_DETECTIONS[msg.detection],
        job=msg.job,
    )


def _claim_to(c: Claim) -> pb.Claim:
    if c.evict or c.resources is not None or c.fallbacks or c.moves_from:
        return pb.Claim(
            job=c.job, index=c.index, machine=c.machine, seen_seq=c.seen_seq,
            evict=list(c.evict),
            resources=c.resources.as_dict() if c.resources is not None else None,
            fallbacks=[pb.Fallback(machine=f.machine, seen_seq=f.seen_seq)
                       for f in c.fallbacks],
            moves_from=c.moves_from,
        )
    # A plain claim (nearly every one): empty fields are the wire's defaults, and
    # leaving them out of the constructor halves its cost.
    return pb.Claim(job=c.job, index=c.index, machine=c.machine, seen_seq=c.seen_seq)


def transaction_to(txn: Transaction, instance: str = "") -> pb.Transaction:
    return pb.Transaction(
        scheduler=txn.scheduler,
        instance=instance,
        claims=[_claim_to(c) for c in txn.claims],
        mode=_MODE_PB[txn.mode],
        detection=_DETECTION_PB[txn.detection],
        job=txn.job,
    )


def transactions_from(msg: pb.CommitRequest) -> list[Transaction]:
    """The transactions of a request: its one ``transaction`` or its ``transactions``."""
    if msg.HasField("transaction") and msg.transactions:
        raise WireError("give either transaction or transactions, not both")
    if msg.HasField("transaction"):
        return [transaction_from(msg.transaction)]
    if not msg.transactions:
        raise WireError("transaction is missing")
    return [transaction_from(t, f"transactions[{i}]") for i, t in enumerate(msg.transactions)]


def result_to(txn: Transaction, result: CommitResult) -> pb.CommitResponse:
    index = {c.task: i for i, c in enumerate(txn.claims)}
    return pb.CommitResponse(
        committed=[index[c.task] for c in result.committed],
        machines=[c.machine for c in result.committed],
        rejected=[
            pb.Rejection(claim=index[r.claim.task], reason=r.reason.value, detail=r.detail,
                         dimension=r.dimension)
            for r in result.rejected
        ],
        revision=result.revision,
        evicted=list(result.evicted),
        attempts=result.attempts,
    )


def result_from(txn: Transaction, msg: pb.CommitResponse) -> CommitResult:
    claims = txn.claims
    try:
        if msg.machines and len(msg.machines) != len(msg.committed):
            raise ValueError("machines and committed differ in length")
        # A server without fallbacks sends no machines: each claim took its own.
        taken = msg.machines or [claims[i].machine for i in msg.committed]
        committed = tuple(claims[i].taking(m) for i, m in zip(msg.committed, taken, strict=True))
        return CommitResult(
            committed=committed,
            rejected=tuple(
                Rejection(claims[r.claim], Reason(r.reason), r.detail, r.dimension)
                for r in msg.rejected
            ),
            revision=msg.revision,
            evicted=tuple(msg.evicted),
            attempts=msg.attempts,
            fell_back=fallbacks_taken(claims, committed),
        )
    except (IndexError, KeyError, ValueError) as e:
        raise WireError(f"commit response does not match its transaction ({e})") from e


def results_from(txns: Sequence[Transaction], msg: pb.CommitResponse) -> list[CommitResult]:
    if len(msg.results) != len(txns):
        raise WireError(f"commit response has {len(msg.results)} results for {len(txns)} "
                        "transactions")
    return [result_from(t, r) for t, r in zip(txns, msg.results, strict=True)]


def json_doc(data: bytes, where: str) -> object:
    """A JSON document from a bytes field."""
    if not data:
        raise WireError(f"{where} is empty")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise WireError(f"{where} is not valid JSON ({e})") from e

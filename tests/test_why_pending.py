"""Why a job waits: the cell's own reasons (cellstate/admission.py) and the report an
instance records after each attempt (schedulers/why.py), over the memory store on a
virtual clock. tests/e2e/test_why_pending.py shows the same through real processes."""

from __future__ import annotations

import orjson
import pytest

from cellstate.admission import blockers, refusal
from cellstate.model import CellConfig, Resources, SchedulerLimits
from schedulers.batch import BatchPolicy
from schedulers.runtime import RuntimeConfig
from schedulers.testing import Harness, JobBuilder, claims, job, machine, txn
from schedulers.why import PendingBook

LIMITS = CellConfig({"batch": SchedulerLimits(max_precedence=4,
                                              max_resources=Resources.of(cpu=6))})


def _cell() -> Harness:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=4) for i in range(4)])
    h.admin.set_config(LIMITS)
    return h


def _codes(h: Harness, spec: object) -> list[str]:
    return [b.code for b in blockers(h.snapshot(), spec)]  # type: ignore[arg-type]


@pytest.mark.parametrize(("spec", "code", "says"), [
    (job("p", precedence=5), "precedence_limit", "precedence 5 is above"),
    (job("g", tasks=17, scheduler="service", gang=True), "gang_too_large", "at most 16"),
    (job("q", tasks=7, gang=True), "quota", "need 7 cpu, above scheduler 'batch''s limit"),
    # Issue 34: a task larger than every machine was accepted and abandoned later.
    (job("huge", cpu=64, scheduler="service"), "task_too_large",
     "one task needs 64 cpu; the largest machine of the cell has 4 (4 machines)"),
])
def test_what_can_never_run_is_refused_with_its_reason(spec, code, says) -> None:  # type: ignore[no-untyped-def]
    h = _cell()
    h.add(BatchPolicy())
    h.add(BatchPolicy(), scheduler="service")
    snap = h.snapshot()
    assert code in _codes(h, spec)
    why = refusal(snap, spec)
    assert why is not None and says in why


def test_what_may_run_later_is_not_refused() -> None:
    h = _cell()
    h.add(BatchPolicy())
    h.add(BatchPolicy(), scheduler="service")
    snap = h.snapshot()
    # 16 cpu in the cell: a gang of 16 fits it when empty (service has no limits).
    assert refusal(snap, job("fits", tasks=16, scheduler="service", gang=True)) is None
    assert refusal(snap, job("ok", tasks=6, gang=True)) is None
    assert refusal(snap, job("ok", precedence=4)) is None


def test_unknown_scheduler_is_refused_only_once_schedulers_ran() -> None:
    h = _cell()
    empty = h.snapshot()
    assert refusal(empty, job("early", scheduler="batch")) is None  # none has run yet
    assert _codes(h, job("early", scheduler="batch")) == ["no_scheduler"]
    inst = h.add(BatchPolicy())
    why = refusal(h.snapshot(), job("x", scheduler="nosuch"))
    assert why is not None and "no scheduler named 'nosuch'" in why and "known: batch" in why
    h.remove(inst)  # batch ran here, but nothing runs it now
    assert _codes(h, job("later", scheduler="batch")) == ["no_instance"]
    assert refusal(h.snapshot(), job("later", scheduler="batch")) is None


def test_quota_nearly_used_is_a_reason_not_a_refusal() -> None:
    h = _cell()
    h.add(BatchPolicy())
    h.submit([job("first", tasks=6)])
    h.run(lambda s: sum(1 for t in s.tasks.values() if t.machine) == 6)
    later = job("later", tasks=1)
    assert refusal(h.snapshot(), later) is None
    (b,) = blockers(h.snapshot(), later)
    assert b.code == "quota" and "holds 6 of its limit of 6 cpu; one task needs 1 more" in b.text


def test_an_instance_records_fit_counts_and_lost_claims_after_one_attempt() -> None:
    h = _cell()
    book = PendingBook()
    inst = h.add(BatchPolicy(), config=RuntimeConfig(retry_delay=60, max_retry_delay=60))
    inst.pending = book
    h.submit([job("wide", tasks=5, cpu=4, scheduler="batch")])  # quota 6 cpu: one fits
    h.pump()
    inst.step()
    h.pump()
    puts, deletes = book.take(h.snapshot(), inst.still_waiting)
    assert deletes == [] and set(puts) == {"wide"}
    report = orjson.loads(puts["wide"])
    assert report["attempts"] == 1 and report["placed"] == 1
    reasons = {r["code"]: r for r in report["reasons"]}
    # 4 machines of 4 cpu: four claims made, one task fit nowhere; the scheduler's
    # limit took one claim and held three back (not sent to be refused at commit).
    assert reasons["fit"]["tasks"] == 1 and reasons["fit"]["machines"] == 4
    assert reasons["limit"]["tasks"] == 3 and "limit_exceeded" not in reasons
    assert "is at its resource limit of cpu=6" in reasons["limit"]["text"]
    book.sent(puts, deletes)
    # Once the job no longer waits for this instance, its report is to be deleted.
    h.admin.kill_job(_killed("wide", h.clock()))
    h.pump()
    assert book.take(h.snapshot(), inst.still_waiting) == ({}, ["wide"])


def test_fit_tally_is_recorded_when_nothing_has_room() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=2) for i in range(3)])
    book = PendingBook()
    inst = h.add(BatchPolicy(), config=RuntimeConfig(retry_delay=60, max_retry_delay=60))
    inst.pending = book
    h.submit([job("fill", tasks=3, cpu=2), job("late", tasks=1, cpu=1)])
    for _ in range(3):
        h.pump()
        inst.step()
    h.pump()
    puts, _ = book.take(h.snapshot(), inst.still_waiting)
    report = orjson.loads(puts["late"])
    (fit,) = report["reasons"]
    assert fit["code"] == "fit" and fit["machines"] == 3 and fit["fit"] == 0
    assert fit["excluded"] == {"insufficient cpu": 3}
    assert "0/3 machines fit: 3 insufficient cpu" in fit["text"]


def test_fit_tally_counts_machines_per_rule() -> None:
    """Each machine the policy looked at counts once, under the rule it failed first
    ("0/4 machines fit: 2 insufficient cpu, 2 selector mismatch")."""
    h = Harness()
    h.admin.add_machines([machine(f"a{i}", cpu=2, labels=[("zone", "a")]) for i in range(2)]
                         + [machine(f"b{i}", cpu=4, labels=[("zone", "b")]) for i in range(2)])
    book = PendingBook()
    inst = h.add(BatchPolicy(), config=RuntimeConfig(retry_delay=60, max_retry_delay=60))
    inst.pending = book
    # The zone-a machines could hold the job, but run other work now (1 of 2 cpu free).
    h.submit([job("filler", tasks=2, cpu=1)])
    h.admin.commit(txn(claims(h.snapshot(), "filler", [(0, "a0"), (1, "a1")])))
    h.submit([JobBuilder("picky").cpu(2).on_machines_with("zone", "a").build()])
    h.pump()
    inst.step()
    h.pump()
    puts, _ = book.take(h.snapshot(), inst.still_waiting)
    report = orjson.loads(puts["picky"])
    assert report["attempts"] == 1
    (fit,) = report["reasons"]
    assert fit["code"] == "fit" and (fit["machines"], fit["fit"]) == (4, 0)
    assert fit["excluded"] == {"insufficient cpu": 2, "selector mismatch": 2}
    assert "0/4 machines fit: 2 insufficient cpu, 2 selector mismatch" in fit["text"]


def test_a_claim_lost_to_another_scheduler_names_its_machine() -> None:
    """Two schedulers decide from the same copy of a one-machine cell; the one that
    commits second loses its claim, and its first report says so with the machine."""
    h = Harness()
    h.admin.add_machines([machine("m0", cpu=1)])
    slow = RuntimeConfig(retry_delay=60, max_retry_delay=60)
    first = h.add(BatchPolicy(), scheduler="batch", config=slow)
    second = h.add(BatchPolicy(), scheduler="other", config=slow)
    book = PendingBook()
    second.pending = book
    h.submit([job("a", cpu=1, scheduler="batch"), job("b", cpu=1, scheduler="other")])
    h.pump()
    first.step()  # commits a/0 on m0
    second.step()  # its copy does not show that yet: claims m0 too, and loses
    h.pump()
    puts, _ = book.take(h.snapshot(), second.still_waiting)
    report = orjson.loads(puts["b"])
    assert report["attempts"] == 1 and report["placed"] == 0
    lost = [r for r in report["reasons"] if "count" in r]
    assert [(r["count"], r["machines"]) for r in lost] == [(1, ["m0"])]
    assert lost[0]["code"] in ("sequence_changed", "insufficient_resources")
    assert "1 claim(s) lost at commit" in lost[0]["text"]


def _killed(jid: str, at: float):  # type: ignore[no-untyped-def]
    from cellstate.model import JobState, JobStatus

    return JobStatus(jid, JobState.KILLED, "test", "test", at)

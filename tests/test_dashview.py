"""The web dashboard's document: machines as a heat map, preemptions told from change
sets, each scheduler instance's history, pending jobs with their reasons."""

from __future__ import annotations

from cellstate.cell import CellSnapshot
from cellstate.keys import KeyKind
from cellstate.kv.memory import MemoryKV
from cellstate.model import Claim, MachineState, TaskState
from cellstate.store import CellStore
from omega.dashview import History, PreemptionLog, dashboard_doc, pending_row, preemptions_in
from schedulers.testing import job, machine, txn


def _store() -> CellStore:
    s = CellStore(MemoryKV())
    s.add_machines([machine("m2", cpu=4, mem=16, rack="r1"),
                    machine("m1", cpu=4, mem=16, rack="r1"),
                    machine("m3", cpu=4, mem=16, rack="r0")])
    s.submit_job(job("low", tasks=2, cpu=2, precedence=0))
    s.commit(txn([Claim("low", 0, "m1"), Claim("low", 1, "m1")]))
    return s


def test_machines_by_rack_with_how_full_they_are() -> None:
    s = _store()
    s.update_machine("m2", state=MachineState.DRAINING)
    doc = dashboard_doc(s.read_snapshot(), {}, History(), PreemptionLog(lambda: 0.0), [], 5.0)
    cells = [(m["id"], m["rack"], m["state"], m["fill"], m["tasks"]) for m in doc["machines"]]
    # The fullest resource decides: m1's cpu is full (2 x 2 of 4), its memory is not.
    assert cells == [("m3", "r0", "up", 0.0, 0), ("m1", "r1", "up", 1.0, 2),
                     ("m2", "r1", "draining", 0.0, 0)]
    assert doc["machines_up"] == 3


def test_preemptions_are_told_from_a_change_set_with_their_recorded_cause() -> None:
    s = _store()
    before = s.read_snapshot()
    s.submit_job(job("high", tasks=1, cpu=4, precedence=9))
    assert s.commit(txn([Claim("high", 0, "m1", evict=("low/0", "low/1"))])).ok
    after = s.read_snapshot()
    changed = [(KeyKind.TASK, "low/0"), (KeyKind.TASK, "low/1"), (KeyKind.TASK, "high/0"),
               (KeyKind.MACHINE, "m1")]
    found = preemptions_in(before, after, changed, now=7.0)
    at = after.tasks["low/0"].history[-1].at
    assert at > 7.0  # the record's time, not the dashboard's
    assert [(p.task, p.machine, p.for_jobs, p.at, p.by, p.why) for p in found] == [
        ("low/0", "m1", ["high"], at, "batch", "preempted for high/0"),
        ("low/1", "m1", ["high"], at, "batch", "preempted for high/0")]
    assert after.tasks["low/0"].state is TaskState.PREEMPTED


def test_the_log_keeps_the_latest_and_ignores_reloads() -> None:
    s = _store()
    log = PreemptionLog(lambda: 3.0, keep=1)
    log.changed(s.read_snapshot(), None)  # a load: nothing to compare with
    s.submit_job(job("high", tasks=1, cpu=4, precedence=9))
    assert s.commit(txn([Claim("high", 0, "m1", evict=("low/0", "low/1"))])).ok
    log.changed(s.read_snapshot(), [(KeyKind.TASK, "low/0"), (KeyKind.TASK, "low/1")])
    assert log.total == 2 and [p["task"] for p in log.recent()] == ["low/1"]
    log.changed(CellSnapshot.empty(), None)
    assert log.total == 2


def test_history_counts_transactions_and_conflicts_between_reports() -> None:
    h = History(keep=2)
    for at, txns, conflicted in ((1.0, 10, 1), (2.0, 15, 4), (3.0, 15, 4)):
        h.add(at, [{"scheduler": "batch", "instance": "b0", "transactions": txns,
                    "conflicted": conflicted, "busyness": 0.5}])
    points = h.series()["batch/b0"]
    assert [(p["t"], p["transactions"], p["conflicts"]) for p in points] == [
        (2.0, 5, 3), (3.0, 0, 0)]


def test_a_pending_job_says_why_in_words() -> None:
    info = {"spec": {"id": "j", "scheduler": "batch", "task_count": 4},
            "task_states": {"pending": 3, "running": 1},
            "why": {"cell": [{"text": "scheduler 'batch' holds 8 of its limit of 8 cpu"}],
                    "schedulers": [{"scheduler": "batch", "instance": "b0", "reasons": [
                        {"code": "no_fit", "text": "0/3 machines fit: 3 insufficient cpu"}]}]}}
    assert pending_row(info) == {
        "job": "j", "scheduler": "batch", "pending": 3, "tasks": 4,
        "reasons": ["scheduler 'batch' holds 8 of its limit of 8 cpu",
                    "batch/b0: 0/3 machines fit: 3 insufficient cpu"]}
    assert pending_row({"spec": {"id": "k", "scheduler": "batch"}})["reasons"] == [
        "waiting for its scheduler's next attempt"]


def test_the_event_log_takes_each_change_sets_new_events_only() -> None:
    """The dashboard's events panel: a reload lists what the records keep; later change
    sets add only events newer than the last seen of each task, newest first."""
    import itertools

    from omega.dashview import EventLog

    ticks = itertools.count(100)
    s = CellStore(MemoryKV(), clock=lambda: float(next(ticks)))
    s.add_machines([machine("m1", cpu=4)])
    s.submit_job(job("low", tasks=1, cpu=4))
    s.submit_job(job("high", tasks=1, cpu=4, precedence=9))
    assert s.commit(txn([Claim("low", 0, "m1")])).ok
    log = EventLog(keep=10)
    log.changed(s.read_snapshot(), None)  # a (re)load
    assert [(e["task"], e["event"]) for e in log.recent()] == [("low/0", "placed")]
    assert s.commit(txn([Claim("high", 0, "m1", evict=("low/0",))])).ok
    log.changed(s.read_snapshot(), [(KeyKind.TASK, "low/0"), (KeyKind.TASK, "high/0"),
                                    (KeyKind.MACHINE, "m1")])
    log.changed(s.read_snapshot(), [(KeyKind.TASK, "low/0")])  # told twice: kept once
    assert [(e["task"], e["event"], e["by"], e["why"]) for e in log.recent()] == [
        ("low/0", "preempted", "batch", "preempted for high/0"),
        ("high/0", "placed", "batch", "placed"),
        ("low/0", "placed", "batch", "placed")]

"""Cordon, uncordon and drain: the store's judge decides, the store applies, the
server lets only operators ask, and the command line says what happened."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import attrs
import immutables
import pytest
from prometheus_client import CollectorRegistry

from cellstate import decisions
from cellstate.api.metrics import CellCollector
from cellstate.api.server import CellStateServer
from cellstate.cell import CellSnapshot
from cellstate.errors import NotFoundError, StoreError
from cellstate.invariants import violations
from cellstate.keys import KeyKind
from cellstate.kv.base import KV
from cellstate.model import Claim, InstanceRecord, JobKind, MachineState, Reason, TaskState
from cellstate.store import CellStore
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import run_omega, running_server

UP, DRAINING, DOWN = MachineState.UP, MachineState.DRAINING, MachineState.DOWN
CORDONED = MachineState.CORDONED


def _cell(state: MachineState) -> CellSnapshot:
    m = machine("m1", cpu=4, state=state)
    return attrs.evolve(CellSnapshot.empty(), machines=immutables.Map({"m1": m}))


@pytest.mark.parametrize(("state", "action", "after"), [
    # Issue 34: a cordoned machine is cordoned, not draining like a drained one.
    (UP, "cordon", CORDONED), (UP, "uncordon", None), (UP, "drain", DRAINING),
    (CORDONED, "cordon", None), (CORDONED, "uncordon", UP), (CORDONED, "drain", DRAINING),
    (DRAINING, "cordon", None), (DRAINING, "uncordon", UP), (DRAINING, "drain", None),
])
def test_the_judge(state: MachineState, action: str, after: MachineState | None) -> None:
    change = decisions.machine_action(_cell(state), "m1", action)
    if after is None:
        assert not change.writes  # in that state already: nothing to write
    else:
        written = change.writes[(KeyKind.MACHINE, "m1")]
        assert written.state is after  # type: ignore[attr-defined]


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain"])
def test_a_down_machine_is_refused(action: str) -> None:
    with pytest.raises(StoreError, match=f"cannot {action} machine m1: it is down"):
        decisions.machine_action(_cell(DOWN), "m1", action)


def test_unknown_machines_and_actions_are_refused() -> None:
    with pytest.raises(NotFoundError, match="unknown machine 'm9'"):
        decisions.machine_action(_cell(UP), "m9", "cordon")
    with pytest.raises(StoreError, match="'reboot' is not one of cordon, uncordon, drain"):
        decisions.machine_action(_cell(UP), "m1", "reboot")


@pytest.fixture
def store(kv: KV) -> CellStore:
    s = CellStore(kv)
    s.add_machines([machine("m1", cpu=4), machine("m2", cpu=4)])
    s.submit_job(job("j", tasks=3, cpu=1))
    s.commit(txn([Claim("j", i, "m1") for i in range(3)]))
    return s


def test_drain_takes_every_task_off_and_keeps_the_machine_draining(store: CellStore) -> None:
    revision, state, lost = store.set_machine_state("m1", "drain")
    snap = store.read_snapshot()
    assert (state, lost, snap.revision) == (DRAINING, 3, revision)
    assert snap.machines["m1"].state is DRAINING and not snap.machines["m1"].allocations
    assert {snap.tasks[f"j/{i}"].state for i in range(3)} == {TaskState.LOST}
    # Drained already: nothing more to do, nothing written.
    assert store.set_machine_state("m1", "drain") == (0, DRAINING, 0)
    assert store.read_snapshot().revision == revision


def test_a_cordoned_machine_takes_nothing_new_and_keeps_its_tasks(store: CellStore) -> None:
    _, state, lost = store.set_machine_state("m1", "cordon")
    assert (state, lost) == (CORDONED, 0)
    snap = store.read_snapshot()
    assert len(snap.machines["m1"].allocations) == 3
    store.submit_job(job("k", tasks=1, cpu=1))
    res = store.commit(txn([Claim("k", 0, "m1", store.read_snapshot().machines["m1"].seq)]))
    assert not res.committed and res.rejected[0].reason is Reason.MACHINE_DOWN
    _, state, _ = store.set_machine_state("m1", "uncordon")
    assert state is UP
    res = store.commit(txn([Claim("k", 0, "m1", store.read_snapshot().machines["m1"].seq)]))
    assert len(res.committed) == 1


def test_a_refused_action_changes_nothing(store: CellStore) -> None:
    store.update_machine("m2", state=DOWN)
    before = store.read_snapshot().revision
    with pytest.raises(StoreError, match="it is down"):
        store.set_machine_state("m2", "drain")
    with pytest.raises(NotFoundError):
        store.set_machine_state("m9", "cordon")
    assert store.read_snapshot().revision == before


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, CellStore]]:
    admin = CellStore(kv)
    admin.add_machines([machine("m1", cpu=4), machine("m2", cpu=4)])
    admin.register_instance(InstanceRecord("batch", "0"), 30)
    admin.submit_job(job("j", tasks=2, cpu=1))
    admin.commit(txn([Claim("j", 0, "m1"), Claim("j", 1, "m1")]))
    with running_server(kv) as server:
        yield server, admin



def test_the_commands(live: tuple[CellStateServer, CellStore],
                      capsys: pytest.CaptureFixture[str]) -> None:
    server, admin = live
    code, out, _ = run_omega(server, capsys, "cordon", "m2")
    assert code == 0 and out.startswith("machine m2: cordoned (revision "), out
    code, out, _ = run_omega(server, capsys, "cordon", "m2")
    assert code == 0 and "machine m2: cordoned already, nothing to cordon" in out
    code, out, _ = run_omega(server, capsys, "drain", "m1", "--json")
    assert code == 0
    (doc,) = json.loads(out)
    assert doc["machine"] == "m1" and doc["state"] == "draining" and doc["tasks_lost"] == 2
    code, out, _ = run_omega(server, capsys, "machines", "--status", "draining", "--json")
    assert sorted(m["id"] for m in json.loads(out)) == ["m1"]
    code, out, _ = run_omega(server, capsys, "machines", "--status", "cordoned", "--json")
    assert sorted(m["id"] for m in json.loads(out)) == ["m2"]
    code, out, _ = run_omega(server, capsys, "uncordon", "m1", "m2")
    assert code == 0 and out.count(": up (revision") == 2
    assert {m.state for m in admin.read_snapshot().machines.values()} == {UP}
    code, out, _ = run_omega(server, capsys, "resize", "j", "--tasks", "5")
    assert code == 0 and out.startswith("job j: 5 tasks")
    assert admin.read_snapshot().jobs["j"].task_count == 5


def test_resize_down_stops_the_highest_tasks_first(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 34: `omega resize nc-aa --tasks 10` said "task 299 has run; cannot shrink".
    Now the running tasks beyond the new count stop (killed), the highest index first,
    and their records go with the count, in a cell whose invariants hold."""
    server, admin = live
    admin.submit_job(job("svc", tasks=4, cpu=0.5, kind=JobKind.SERVICE))
    admin.commit(txn([Claim("svc", i, "m2") for i in range(3)]))  # svc/3 waits
    code, out, err = run_omega(server, capsys, "resize", "svc", "--tasks", "1")
    assert code == 0 and out.startswith("job svc: 1 tasks"), err
    snap = admin.read_snapshot()
    assert snap.jobs["svc"].task_count == 1
    assert sorted(t for t in snap.tasks if t.startswith("svc/")) == ["svc/0"]
    assert set(snap.machines["m2"].allocations) == {"svc/0"}
    assert violations(snap) == []
    code, out, _ = run_omega(server, capsys, "resize", "svc", "--tasks", "3")  # and up again
    assert code == 0 and admin.read_snapshot().jobs["svc"].task_count == 3


def test_a_gang_is_not_shrunk_below_what_has_run(store: CellStore) -> None:
    store.submit_job(job("g", tasks=2, cpu=1, gang=True))
    assert store.commit(txn([Claim("g", 0, "m2"), Claim("g", 1, "m2")], gang=True)).ok
    with pytest.raises(StoreError, match="task 1 has run; cannot shrink to 1 tasks"):
        store.resize_job("g", 1, stop=True)


@pytest.mark.parametrize(("argv", "message"), [
    (["cordon", "m9"], "unknown machine 'm9'"),
    (["drain", "m1", "m9"], "unknown machine 'm9'"),
    (["resize", "nope", "--tasks", "3"], "unknown job 'nope'"),
])
def test_refusals_say_why(live: tuple[CellStateServer, CellStore],
                          capsys: pytest.CaptureFixture[str], argv: list[str],
                          message: str) -> None:
    server, admin = live
    before = admin.read_snapshot().revision
    code, _, err = run_omega(server, capsys, *argv)
    assert code == 2 and message in err, err
    assert admin.read_snapshot().revision == before


def test_the_machines_gauge_tells_cordoned_machines_apart(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    """omega_machines counts up, cordoned, draining and down machines apart."""
    server, _ = live
    registry = CollectorRegistry()
    registry.register(CellCollector(server.service))

    def machines() -> dict[str, float | None]:
        return {s: registry.get_sample_value("omega_machines", {"state": s})
                for s in ("up", "cordoned", "draining", "down")}

    assert machines() == {"up": 2, "cordoned": 0, "draining": 0, "down": 0}
    code, out, _ = run_omega(server, capsys, "cordon", "m2")
    assert code == 0, out
    revision = int(out.rsplit("revision ", 1)[1].rstrip(")\n"))
    deadline = time.monotonic() + 30  # the server's copy follows etcd's watch
    while server.service.status.view().snap.revision < revision:
        assert time.monotonic() < deadline, "the server's copy never showed the cordon"
        time.sleep(0.05)
    assert machines() == {"up": 1, "cordoned": 1, "draining": 0, "down": 0}

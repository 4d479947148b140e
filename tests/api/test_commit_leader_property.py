"""Property: commits through two servers, concurrent and in random interleavings, with
the commit leadership changing in between, leave the same cell as committing the
accepted claims one by one, in the order of the revisions they were answered with,
through a plain store; and every such replayed claim passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cellstate.api.client import RemoteStore
from cellstate.api.server import CellStateServer
from cellstate.cell import CellSnapshot
from cellstate.invariants import violations
from cellstate.kv.base import Compare, Op, TxnOp, TxnResult
from cellstate.kv.memory import MemoryKV
from cellstate.model import (
    Claim,
    CommitResult,
    Detection,
    InstanceRecord,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore
from schedulers.testing import job, machine
from tests.api.service_fixture import client_for, running_server

MACHINES = 4
JOBS = 3
TASKS = 6  # 18 tasks of 1 cpu on 4 machines of 3 cpus: many claims cannot fit

claim_st = st.tuples(st.integers(0, JOBS - 1), st.integers(0, TASKS - 1),
                     st.integers(0, MACHINES - 1))
txn_st = st.tuples(st.integers(0, 1),  # the server it is sent to
                   st.sampled_from(TxnMode), st.sampled_from(Detection),
                   st.lists(claim_st, min_size=1, max_size=4))
# A round: transactions sent at once, and machines an outside writer (a library
# committer's admin call) relabels meanwhile, failing the leader's guards on them: a
# write in flight fails and the batch decided over it is decided again.
round_st = st.tuples(st.lists(txn_st, min_size=1, max_size=5),
                     st.lists(st.integers(0, MACHINES - 1), max_size=3))
step_st = st.one_of(st.just("switch"), round_st)


class SlowWrites:
    """The KV with the leader's writes (requests of nested transactions) taking a
    while, as etcd's do: commits arriving meanwhile are decided over the write in
    flight, and outside writes land between its decision and its arrival."""

    def __init__(self, inner: MemoryKV) -> None:
        self._inner = inner

    def txn(self, compares: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        if any(isinstance(op, TxnOp) for op in success):
            time.sleep(0.02)
        return self._inner.txn(compares, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def seed(kv: MemoryKV) -> None:
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=3, mem=64) for i in range(MACHINES)])
    for j in range(JOBS):
        admin.submit_job(job(f"j{j}", tasks=TASKS, cpu=1))


def transaction(spec: tuple[int, TxnMode, Detection, list[tuple[int, int, int]]],
                snap: CellSnapshot) -> Transaction:
    _, mode, detection, raw = spec
    seen: set[tuple[int, int]] = set()
    claims = []
    for j, i, m in raw:
        if (j, i) in seen:
            continue  # a task once per transaction
        seen.add((j, i))
        mid = f"m{m}"
        claims.append(Claim(f"j{j}", i, mid, snap.machines[mid].seq))
    return Transaction("batch", tuple(claims), mode, detection)


def leader(servers: Sequence[CellStateServer]) -> tuple[CellStateServer, int] | None:
    for s in servers:
        committer, election = s.service.committer, s.service.election
        if committer is not None and election is not None:
            known = election.leader()
            if known is not None:
                return s, known.token
    return None


def switch(servers: Sequence[CellStateServer]) -> None:
    """The leader resigns; wait until a server leads under a new token."""
    held = leader(servers)
    assert held is not None
    old, token = held
    assert old.service.election is not None
    old.service.election.resign()
    deadline = time.monotonic() + 30
    while (now := leader(servers)) is None or now[1] == token:
        assert time.monotonic() < deadline, "no new leader after 30 s"
        time.sleep(0.01)


def round_of(stores: Sequence[RemoteStore], specs: Sequence[Any], snap: CellSnapshot,
             out: list[tuple[Transaction, CommitResult]], outside: CellStore,
             bumps: Sequence[int]) -> None:
    """Send every transaction at once, each from a thread of its own, while
    ``outside`` relabels the machines ``bumps`` (their allocations stay)."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def bump() -> None:
        for n, m in enumerate(bumps):
            try:
                outside.update_machine(f"m{m}", labels={"bumped": str(n)})
            except BaseException as e:  # surfaced below
                errors.append(e)

    def send(spec: Any) -> None:
        txn = transaction(spec, snap)
        try:
            res = stores[spec[0]].commit(txn)
        except BaseException as e:  # surfaced below
            errors.append(e)
            return
        with lock:
            out.append((txn, res))

    threads = [threading.Thread(target=send, args=(s,)) for s in specs]
    threads.append(threading.Thread(target=bump))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors


def cell_of(snap: CellSnapshot) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, str]]]:
    allocs = {mid: {tid: a.resources for tid, a in m.allocations.items()}
              for mid, m in snap.machines.items()}
    tasks = {tid: (t.state.value, t.machine) for tid, t in snap.tasks.items()}
    return allocs, tasks


# Both leaders: one batch at a time (the default) and pipelined.
@pytest.mark.parametrize("pipeline", [False, True], ids=["one-at-a-time", "pipelined"])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(step_st, min_size=1, max_size=6))
def test_commits_through_a_leader_equal_committing_them_one_by_one(
        pipeline: bool, steps: list[Any]) -> None:
    kv = MemoryKV()
    seed(kv)
    answered: list[tuple[Transaction, CommitResult]] = []
    slow = SlowWrites(kv)
    with running_server(slow, name="a", leader_ttl=1, commit_pipeline=pipeline) as a, \
            running_server(slow, name="b", leader_ttl=1, commit_pipeline=pipeline) as b, \
            client_for(a) as ca, client_for(b) as cb:
        stores = [RemoteStore(ca), RemoteStore(cb)]
        for n, s in enumerate(stores):
            s.register_instance(InstanceRecord("batch", f"i{n}"), 60)
        for step in steps:
            if step == "switch":
                switch([a, b])
            else:
                specs, bumps = step
                round_of(stores, specs, CellStore(kv).read_snapshot(), answered,
                         CellStore(kv), bumps)
    final = CellStore(kv).read_snapshot()
    assert violations(final) == []
    for txn, res in answered:  # each claim answered once, either way
        assert sorted(c.task for c in (*res.committed, *(r.claim for r in res.rejected))) \
            == sorted(c.task for c in txn.claims)
        if txn.mode is TxnMode.GANG:
            assert not res.committed or not res.rejected

    replay = MemoryKV()
    seed(replay)
    store = CellStore(replay)
    for _, res in sorted(answered, key=lambda tr: tr[1].revision):
        if not res.committed:
            continue
        again = store.commit(Transaction("batch", res.committed))
        assert again.rejected == (), again.rejected
    assert cell_of(final) == cell_of(store.read_snapshot())

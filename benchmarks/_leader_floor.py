#!/usr/bin/env python
"""An ``omega server`` whose Commit does only what any commit leader must: the floor
``benchmarks/service_throughput.py`` measures the leader against (its ``floor*`` paths).

    python benchmarks/_leader_floor.py MODE [omega arguments ...]

Everything but Commit is the real server (registration, the machine list the
benchmark's schedulers read, health, its replica following the cell). Commit:

* ``floor``: takes the request's claims as they came off the wire (no conversion to
  the model, no checks, no validation), and writes them as raw etcd's minimal
  transaction does (``commit_throughput.RawCommitter``: per distinct machine one
  compare of its key's mod_revision and one put of a small machine record, per claim
  one put of a task record), group-committed across the commits waiting (the leader's
  own ``GroupCommitter``: its batches, its caps, its sibling hold), in as few Txns as
  ``--max-txn-ops`` allows, one after another. Every claim is answered committed.
* ``floor-codec``: the real Commit handler (the wire converted to the model, its
  shape checked, the instance's registration, the answer converted back), with the
  ``floor``'s group commit in place of the leader's validation and records.
* ``floor-records``: ``floor`` writing the leader's record layout instead (per claim
  a task record, an allocation key and a guard on the task, and the machine's record
  per distinct machine, of the sizes the leader writes), still without validation or
  encoding: etcd's cost of today's layout behind the cheapest possible server.
* ``floor-proxy``: no batching: each Commit writes raw etcd's minimal transaction of
  its own claims from its gRPC handler thread, on keys of its scheduler's own (as the
  raw path's processes do): raw etcd with a Python gRPC server in between.
* ``leader-timed``: the real server and commit leader, unchanged, with the CPU time of
  each stage of a commit added up (below).

In every mode the thread CPU time (``time.thread_time``: running, not waiting) spent
inside each stage's function is added up over the server's life (its start's loading
of the cell included: 0.01 ms a commit or less, by the floors' replica figures),
inclusive of what each calls, and written at
exit as JSON to the file ``$OMEGA_FLOOR_STAGES`` names (when set), with how often each
was called: ``commit`` (the gRPC handler: the wire to the model and back, checks,
handing over to the committer), ``codec-in``/``codec-out`` (the request to
transactions, the results to the reply), ``batch`` (the committer's whole work per
batch), ``validate`` (``validate_many``), ``records`` (the decision's records and
guards, and their encoding: ``_decision_write``, ``_prepare``), ``etcd-client`` (the
Txn request built, sent and its answer read: ``EtcdKV.txn``), ``write`` (the store's
write with the etcd client call: the compares, the replica told what to expect
(``expect``), the written records put in the working view), ``catch-up`` (the working
view brought up to the replica and fetched where it lacks records,
``_ensure_loaded``; ``follow``: its part that takes the replica's changes,
``_catch_up``), ``replica`` (each watch response applied to the replica:
``Replica._handle``; of it ``replica-apply``, the records applied to the replica's
maps, with ``replica-machines``, its machines', and ``replica-publish``, the listeners
told), ``replica-pump`` (the same with the watch read).

The keys written live under ``/omega-floor/<cell>/``, outside the cell: the server's
replica never sees them (what the leader's replica spends applying its writes is not
in the floor). Not a server for anything but this measurement: nothing is validated.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from commit_throughput import minimal_values  # noqa: E402

from cellstate import replica as replica_mod  # noqa: E402
from cellstate.api import convert, server as srv  # noqa: E402
from cellstate.api.leader import GroupCommitter  # noqa: E402
from cellstate.api.pb.v1 import cellstate_pb2 as pb  # noqa: E402
from cellstate.kv.base import KV, Compare, Put  # noqa: E402
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from cellstate.model import CommitResult, Transaction  # noqa: E402
from cellstate.store import base as store_base, claims as store_claims  # noqa: E402

FLOORS = ("floor", "floor-codec", "floor-records", "floor-proxy", "leader-timed")
STAGES_ENV = "OMEGA_FLOOR_STAGES"

# The sizes of the leader's values for this benchmark's claims (``cellstate.codec``: a
# placed task's record with its placement time, an allocation, a machine's record with
# its allocation count); ``floor-records`` writes values of these sizes, the allocation
# under a key built as the leader's (cellstate/keys.py).
LEADER_TASK_BYTES = 87
LEADER_ALLOC_BYTES = 45
LEADER_MACHINE_BYTES = 60


def floor_prefix(cell: str) -> bytes:
    return f"/omega-floor/{cell}/".encode()


class _Wire:
    """A request's transaction as it came off the wire (GroupCommitter needs .claims)."""

    __slots__ = ("claims",)

    def __init__(self, claims: Sequence[Any]) -> None:
        self.claims = claims


class RawWriter:
    """What the floor's GroupCommitter commits through (``commit_checked``): the claims
    of a batch as raw etcd's minimal transaction, Txns filled up to ``max_txn_ops``.
    One thread writes (the committer's), so the machine revisions it compares with are
    its own writes'. ``records``: the leader's layout instead (see the module)."""

    def __init__(self, kv: KV, prefix: bytes, *, records: bool = False) -> None:
        self.kv = kv
        self.prefix = prefix
        self.records = records
        self.machine_value, self.task_value = minimal_values()
        if records:
            self.machine_value = self.machine_value.ljust(LEADER_MACHINE_BYTES, b" ")
            self.task_value = self.task_value.ljust(LEADER_TASK_BYTES, b" ")
        self.alloc_value = b"a" * LEADER_ALLOC_BYTES
        self.revs: dict[bytes, int] = {}
        self.max_ops = kv.max_txn_ops

    def commit_checked(self, txns: Sequence[Any]) -> list[Any]:
        per_claim = 2 if self.records else 1
        revision = 0
        compares: list[Compare] = []
        puts: list[Put] = []
        machines: dict[bytes, None] = {}
        mp, tp, ap = self.prefix + b"machines/", self.prefix + b"tasks/", self.prefix + b"allocs/"
        for t in txns:
            for c in t.claims:
                mkey = mp + c.machine.encode()
                new = mkey not in machines
                if len(puts) + per_claim + new > self.max_ops:
                    revision = self._send(compares, puts, machines)
                    compares, puts, machines = [], [], {}
                    new = True
                if new:
                    machines[mkey] = None
                    compares.append(Compare.mod_revision_is(mkey, self.revs.get(mkey, 0)))
                    puts.append(Put(mkey, self.machine_value))
                task = b"%s/%d" % (c.job.encode(), c.index)
                puts.append(Put(tp + task, self.task_value))
                if self.records:
                    # The leader guards each task it places (pending: absent).
                    compares.append(Compare.absent(tp + task))
                    puts.append(Put(b"%s%s/%016x/%s" % (ap, c.machine.encode(),
                                                        self.revs.get(mkey, 0), task),
                                    self.alloc_value))
        if puts:
            revision = self._send(compares, puts, machines)
        return [revision] * len(txns)

    def _send(self, compares: list[Compare], puts: list[Put],
              machines: dict[bytes, None]) -> int:
        res = self.kv.txn(compares, puts)
        if not res.succeeded:
            raise RuntimeError("a floor transaction failed its compares (another writer?)")
        for k in machines:
            self.revs[k] = res.revision
        return res.revision


class ProxyWriter:
    """``floor-proxy``: each commit's own raw Txn, on keys of its scheduler's own."""

    def __init__(self, kv: KV, prefix: bytes) -> None:
        self.kv = kv
        self.prefix = prefix
        self._writers: dict[str, RawWriter] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def commit(self, scheduler: str, claims: Sequence[Any]) -> int:
        with self._lock:
            writer = self._writers.get(scheduler)
            if writer is None:
                writer = self._writers[scheduler] = RawWriter(
                    self.kv, self.prefix + scheduler.encode() + b"/")
                self._locks[scheduler] = threading.Lock()
            lock = self._locks[scheduler]
        with lock:  # one commit in flight per scheduler, as raw's processes
            return cast(int, writer.commit_checked([_Wire(claims)])[0])


def _reply(msgs: Sequence[Any], revisions: Sequence[int], single: bool) -> pb.CommitResponse:
    answers = [pb.CommitResponse(committed=range(len(m.claims)), revision=r, attempts=1)
               for m, r in zip(msgs, revisions, strict=True)]
    return answers[0] if single else pb.CommitResponse(results=answers)


class StageClock:
    """Thread CPU seconds spent inside named functions (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        fn = getattr(owner, name)
        clock = time.thread_time
        add = self._add

        def timed(*args: Any, **kw: Any) -> Any:
            began = clock()
            try:
                return fn(*args, **kw)
            finally:
                add(stage, clock() - began)

        setattr(owner, name, timed)

    def _add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
            self.calls[stage] = self.calls.get(stage, 0) + 1

    def dump(self, path: str) -> None:
        with self._lock:
            doc = {"seconds": dict(self.seconds), "calls": dict(self.calls),
                   "process_cpu_s": time.process_time()}
        with open(path, "w") as f:
            json.dump(doc, f)


def time_stages(clock: StageClock) -> None:
    """Time the stages of a commit (the module docstring names them)."""
    for owner, name, stage in (
            (convert, "transactions_from", "codec-in"),
            (convert, "result_to", "codec-out"),
            (GroupCommitter, "_commit_now", "batch"),
            (store_claims, "validate_many", "validate"),
            (store_claims.ClaimCommits, "_decision_write", "records"),
            (store_base.StoreBase, "_prepare", "records"),
            (EtcdKV, "txn", "etcd-client"),
            (store_base.StoreBase, "_try_write", "write"),
            (store_base.StoreBase, "_expect_write", "expect"),
            (store_base.StoreBase, "_ensure_loaded", "catch-up"),
            (store_base.StoreBase, "_catch_up", "follow"),
            (replica_mod.Replica, "_handle", "replica"),
            (replica_mod.Replica, "pump", "replica-pump"),
            (replica_mod, "_apply", "replica-apply"),
            (replica_mod, "_apply_machines", "replica-machines"),
            (replica_mod.Replica, "_publish", "replica-publish")):
        clock.wrap(owner, name, stage)


def name_threads() -> None:
    """Give each Python thread started from now on its name (without a pool's ``_N``)
    as its OS thread name, so that the benchmark's CPU by thread (from /proc) says
    which thread spent what: Python's threads are all ``python`` there otherwise."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        base = self.name.rstrip("0123456789").rstrip("_-") or self.name
        prctl(15, base.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        bootstrap(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]


def install(mode: str) -> None:
    """Make every CellStateService built from now on commit as ``mode`` does."""
    if mode not in FLOORS:
        raise SystemExit(f"_leader_floor.py: mode {mode!r} is not one of {', '.join(FLOORS)}")
    name_threads()
    clock = StageClock()
    time_stages(clock)
    out = os.environ.get(STAGES_ENV)
    if out:
        atexit.register(clock.dump, out)
    service = srv.CellStateService
    if mode == "leader-timed":
        clock.wrap(service, "Commit", "commit")
        return
    original_init = service.__init__

    def init(self: srv.CellStateService, kv: KV, config: Any, *args: Any, **kw: Any) -> None:
        original_init(self, kv, config, *args, **kw)
        prefix = floor_prefix(config.cell)
        self._floor_proxy = ProxyWriter(kv, prefix)  # type: ignore[attr-defined]
        self._floor = GroupCommitter(cast(Any, RawWriter(  # type: ignore[attr-defined]
            kv, prefix, records=mode == "floor-records"))).start()

    service.__init__ = init  # type: ignore[method-assign]

    if mode == "floor-codec":
        def commit_codec(self: srv.CellStateService, txns: list[Transaction], request: Any,
                         context: Any) -> list[CommitResult]:
            revisions = self._floor.commit(txns)  # type: ignore[attr-defined]
            return [CommitResult(t.claims, (), r) for t, r in zip(txns, revisions, strict=True)]

        service._commit = commit_codec  # type: ignore[method-assign]
        clock.wrap(service, "Commit", "commit")
        return

    def commit_wire(self: srv.CellStateService, request: pb.CommitRequest,
                    context: Any) -> pb.CommitResponse:
        single = request.HasField("transaction")
        msgs = [request.transaction] if single else list(request.transactions)
        if mode == "floor-proxy":
            revisions = [self._floor_proxy.commit(m.scheduler, m.claims)  # type: ignore[attr-defined]
                         for m in msgs]
        else:
            revisions = self._floor.commit([_Wire(m.claims) for m in msgs])  # type: ignore[attr-defined]
        return _reply(msgs, revisions, single)

    service.Commit = srv.rpc(commit_wire)  # type: ignore[method-assign]
    clock.wrap(service, "Commit", "commit")


def main(argv: Sequence[str]) -> int:
    if not argv:
        raise SystemExit(f"usage: _leader_floor.py {{{','.join(FLOORS)}}} [omega args ...]")
    install(argv[0])
    from omega.cli import main as omega_main

    return omega_main(list(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python
"""Commit throughput of the cell-state store, beside the raw etcd Txn rate.

    python benchmarks/commit_throughput.py [--quick] [--seconds N] [--no-fsync]
        [--max-txn-ops N] [--json out.json]

For each backend (a real etcd started here, and the in-memory KV), each number of
concurrent committers (1, 4, 8), each mode (incremental, gang) and each detection (fine,
coarse), every committer loops for the run time: it builds a transaction of B claims
(consecutive tasks of its own job, each on a machine picked at random from the whole
cell, seen at the sequence number its store's view holds), calls ``CellStore.commit`` and
records the latency and the outcome. The committers share the machines, so conflicts are
real. Every configuration gets a cell of its own (``bench-<n>``), deleted afterwards,
and etcd's history is then compacted so that each configuration starts from the same
etcd (``--no-compact`` leaves it).

etcd committers are OS processes (each with its own EtcdKV and CellStore, loaded before
the clock starts); memory committers are threads of this process, because a MemoryKV
cannot be shared across processes (so they also share one GIL).

The raw baseline is the smallest etcd transaction Omega's semantics need for a commit of
B claims on machines picked as the committers pick them: one compare (the machine key's
mod_revision, its sequence number) and one put of a machine record without allocations
per distinct machine, and one put of a task record per task, sent with ``kv.txn`` by N
processes on keys each process owns (so none conflict). The table shows that Txn rate,
the placements per second it gives, and the store's share of it. The store's own
transactions are counted per committer (``CountingKV``: compares, puts and bytes per
committed etcd Txn) to show where they differ from that shape.

Bytes per placement: before the timed runs, a small cell whose machines already hold 0,
10 and 100 tasks (placed through the store) takes commits of B claims on each group,
and the bytes the store writes to etcd (keys + values of puts) per placement are shown
per group, beside what the layout before allocation keys would have written (an
estimate: each placement rewrote the machine's record with every allocation in it).

A second table says where the CPU goes on the etcd backend: CPU milliseconds the
committers and etcd spend per commit and per etcd write Txn (process CPU times), and
how many cores they kept busy. Every timed run also reports ``other%``, the share of the
machine's CPU that processes outside the benchmark used meanwhile (from /proc/stat), so a
figure taken on a busy machine is visible as such. At the end: the size of etcd's
database file (``member/snap/db`` in the launched etcd's data folder).

Goals checked at the end (issue 9), fsync on, B=50, on this 2-core machine: at least
10,000 placements/s with 4 committers (incremental, fine, etcd); the store reaches at
least half of the raw baseline's placements/s with 1 and with 4 committers; bytes per
placement on machines holding 0, 10 and 100 tasks agree within 20%. The results are
PASS or MISS as measured.

Other options: ``--max-txn-ops N`` starts etcd with that limit and gives every EtcdKV
(and MemoryKV) the same, so the store packs more claims into one etcd Txn (default 256,
what omega's etcd launcher sets, twice etcd's own 128: a claim costs the store 3 ops, so
a commit of B=50 claims on 50 machines is one Txn; at etcd's 128 it would be two);
``--follow-replica`` makes every store follow a Replica of its cell
(``CellStore.follow``); ``--fallbacks N`` gives every claim N other random machines
(each with the sequence number the store's view holds for it) that the store takes, in
order, when the first one no longer passes (``fb%``: committed claims that took one);
``--backends``, ``--batch``, ``--machines``, ``--seed``;
``--no-refresh`` turns off the stores' read of their claimed machines before writing
under contention (``StoreOptions.refresh_when_contended``; the CPU table's ``reads/c``
counts those read-only Txns, which ``txn/c`` does not); committer processes tune the
garbage collector after loading the cell as scheduler processes do (``--default-gc``:
they do not); ``--profile DIR`` cProfiles the committers of the incremental/fine etcd runs;
``--committers``, ``--modes``, ``--detections`` choose the configurations (e.g.
``--committers 1,4 --modes incremental --detections fine``, the goals' runs);
``--disjoint`` gives each committer machines of its own (every n-th), as the raw
baseline's processes own their keys: what the store costs without contention (a
diagnostic; the goals are not checked in it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import multiprocessing
import os
import platform
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

# Runnable as a plain script from anywhere: the repository root holds the package.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from cellstate import codec  # noqa: E402
from cellstate.gc_tuning import tune_for_large_heap  # noqa: E402
from cellstate.kv.base import (  # noqa: E402
    KV,
    Compare,
    Delete,
    Op,
    Put,
    RangeResult,
    TxnOp,
    TxnResult,
    Watcher,
    prefix_end,
)
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from cellstate.kv.memory import MemoryKV  # noqa: E402
from cellstate.model import (  # noqa: E402
    MAX_FALLBACKS,
    Claim,
    Detection,
    Fallback,
    Job,
    Machine,
    Resources,
    TaskRecord,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.replica import Replica  # noqa: E402
from cellstate.store import CellStore, StoreOptions  # noqa: E402
from omega.etcd_launcher import DEFAULT_MAX_TXN_OPS, UNSAFE_VERSIONS, LocalEtcd  # noqa: E402

COMMITTER_COUNTS = (1, 4, 8)
MODES = (TxnMode.INCREMENTAL, TxnMode.GANG)
DETECTIONS = (Detection.FINE, Detection.COARSE)
MACHINES = 2000
MACHINE_CPU, MACHINE_MEM = 32.0, 128.0
TASK_CPU, TASK_MEM = 0.1, 0.25
TASKS_PER_JOB = 1_000_000  # the codec's maximum; a run never gets near it
GOAL_PLACEMENTS = 10_000.0  # with 4 committers
GOAL_RATIO = 0.5  # store over raw, with each of GOAL_RATIO_COMMITTERS
GOAL_RATIO_COMMITTERS = (1, 4)
GOAL_BYTES_SPREAD = 1.2  # largest over smallest bytes per placement across FILL_LEVELS
FILL_LEVELS = (0, 10, 100)  # tasks a machine holds before the bytes are measured
BYTES_ROUNDS = 3  # commits of B claims measured on each group of machines
BYTES_FIRST_TASK = 100_000  # measured tasks' indices: keys of one length in every group
NOISY_PCT = 10.0  # other processes' CPU share above which a figure is flagged
REPLY_SLACK = 180.0  # seconds a worker may take beyond the run time before we give up


# -- instrumentation ----------------------------------------------------------------


class CountingKV:
    """A KV that passes every call on to ``inner`` and counts what the store's writing
    transactions hold: compares, puts and bytes (keys + values of puts) per etcd Txn
    that committed. One per committer, so counts are per committer."""

    def __init__(self, inner: KV) -> None:
        self.inner = inner
        self.max_txn_ops = inner.max_txn_ops
        self.max_request_bytes = inner.max_request_bytes
        self.reset()

    def reset(self) -> None:
        self.read_txns = 0  # transactions without puts (fetches of unknown keys)
        self.write_txns = 0
        self.failed_write_txns = 0  # a guard did not hold: a conflict
        self.ok_compares = 0  # totals over the write transactions that succeeded
        self.ok_puts = 0
        self.ok_bytes = 0  # keys + values of the success branch
        self.ok_writes = 0

    def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
            ) -> TxnResult:
        res = self.inner.txn(compares, success, failure)
        # An incremental commit under contention sends one nested transaction per
        # machine: what it wrote is the parts that committed, flattened into one.
        compares = list(compares)
        puts = [op for op in success if type(op) is Put]
        nested_failed = False
        if res.succeeded:
            for op, sub_res in zip(success, res.responses, strict=True):
                if type(op) is TxnOp and isinstance(sub_res, TxnResult):
                    if sub_res.succeeded:
                        # Guards repeated in every part (config, job) count once.
                        seen = {c.key for c in compares}
                        compares.extend(c for c in op.compares if c.key not in seen)
                        puts.extend(p for p in op.success if type(p) is Put)
                    elif any(type(p) is Put for p in op.success):
                        nested_failed = True
        if not puts and not nested_failed:
            self.read_txns += 1
            return res
        self.write_txns += 1
        if not res.succeeded or nested_failed:
            # A partly committed nested transaction counts as a conflict, and what its
            # committed parts wrote is not counted.
            self.failed_write_txns += 1
            return res
        self.ok_writes += 1
        self.ok_compares += len(compares)
        self.ok_puts += len(puts)
        self.ok_bytes += sum(len(op.key) + len(op.value) for op in puts)
        return res

    def range(self, key: bytes, range_end: bytes | None = None, *, revision: int = 0,
              limit: int = 0, keys_only: bool = False) -> RangeResult:
        return self.inner.range(key, range_end, revision=revision, limit=limit,
                                keys_only=keys_only)

    def watch(self, key: bytes, range_end: bytes | None = None, *, start_revision: int = 0
              ) -> Watcher:
        return self.inner.watch(key, range_end, start_revision=start_revision)

    def compact(self, revision: int) -> None:
        self.inner.compact(revision)

    def lease_grant(self, ttl: int) -> int:
        return self.inner.lease_grant(ttl)

    def lease_keepalive(self, lease_id: int) -> int:
        return self.inner.lease_keepalive(lease_id)

    def lease_revoke(self, lease_id: int) -> None:
        self.inner.lease_revoke(lease_id)

    def lease_keys(self, lease_id: int) -> tuple[bytes, ...]:
        return self.inner.lease_keys(lease_id)

    def close(self) -> None:
        """The inner KV is shared; its owner closes it."""


# -- cells ----------------------------------------------------------------------------


def job_id(committer: int) -> str:
    return f"job-c{committer}"


def scheduler_name(committer: int) -> str:
    return f"sched-{committer}"


def setup_cell(kv: KV, cell: str, machines: int, committers: int) -> None:
    """Machines (written in bulk, up to 100 per etcd Txn) and one job per committer. An
    empty machine is its record alone (no allocation keys), as the store writes it."""
    store = CellStore(kv, cell)
    keys = store.keys
    cap = Resources.of(cpu=MACHINE_CPU, mem=MACHINE_MEM)
    per_txn = min(100, kv.max_txn_ops)
    batch: list[tuple[bytes, bytes]] = []
    for i in range(machines):
        m = Machine(f"m{i:05d}", cap)
        batch.append((keys.machine(m.id), codec.encode_machine(m)))
        if len(batch) == per_txn or i == machines - 1:
            res = kv.txn([Compare.absent(k) for k, _ in batch], [Put(k, v) for k, v in batch])
            if not res.succeeded:
                raise RuntimeError(f"cell {cell} is not empty")
            batch = []
    task = Resources.of(cpu=TASK_CPU, mem=TASK_MEM)
    for c in range(committers):
        store.submit_job(Job(job_id(c), "bench", scheduler_name(c), TASKS_PER_JOB, task))


def delete_prefix(kv: KV, prefix: bytes, compact: bool = False) -> None:
    """Delete everything under ``prefix``; with ``compact`` also compact etcd's history
    up to the deletion and wait until the backend has dropped it (``physical``), so that
    the next configuration starts from the same etcd as the first did. Left in place,
    the previous configuration's history (some 150,000 deleted keys after a committer
    run) made etcd's reads before a commit cost 2.4 times as much (4.2 against 10.0 ms
    of etcd CPU per commit with 4 committers, docs/performance.md)."""
    res = kv.txn([], [Delete(prefix, prefix_end(prefix))])
    if compact and isinstance(kv, EtcdKV):
        kv.compact(res.revision, physical=True, timeout=600.0)


# -- the committer loop (a process for etcd, a thread for memory) ----------------------


def commit_loop(store: CellStore, counting: CountingKV, committer: int, mode: TxnMode,
                detection: Detection, batch: int, seed: int, fallbacks: int, t0: float,
                deadline: float, cpu_clock: Callable[[], float] = time.process_time,
                share: tuple[int, int] | None = None) -> dict[str, Any]:
    """Commit transactions until ``deadline``. ``cpu_clock`` measures this committer's
    CPU: the process's (threads included) for a committer process, the thread's for a
    committer thread. ``share`` (i, n): claim only every n-th machine from the i-th, so
    that n committers never share a machine (``--disjoint``)."""
    rng = random.Random(seed)
    mids = sorted(store.view.machines)
    if share is not None:
        mids = mids[share[0]::share[1]]
    machines = store.view.machines
    job, sched = job_id(committer), scheduler_name(committer)
    counting.reset()
    index = committed = rejected = commits = attempts = fell_back = 0
    latencies: list[float] = []
    pause = t0 - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    cpu0 = cpu_clock()
    perf = time.perf_counter
    while time.monotonic() < deadline:
        chosen = rng.choices(mids, k=batch)
        claims = tuple(
            Claim(job, index + i, mid, machines[mid].seq,
                  fallbacks=_alternatives(rng, mids, machines, mid, fallbacks))
            for i, mid in enumerate(chosen)
        )
        index += batch
        started = perf()
        res = store.commit(Transaction(sched, claims, mode, detection))
        latencies.append(perf() - started)
        committed += len(res.committed)
        rejected += len(res.rejected)
        fell_back += len(res.fell_back)
        commits += 1
        attempts += res.attempts
    end = time.monotonic()
    return {
        "committed": committed, "rejected": rejected, "commits": commits,
        "fell_back": fell_back,
        "attempts": attempts, "latencies": latencies, "end": end, "cpu_s": cpu_clock() - cpu0,
        "read_txns": counting.read_txns, "write_txns": counting.write_txns,
        "failed_write_txns": counting.failed_write_txns, "ok_compares": counting.ok_compares,
        "ok_puts": counting.ok_puts, "ok_bytes": counting.ok_bytes,
    }


def _alternatives(rng: random.Random, mids: Sequence[str], machines: Any, mid: str,
                  n: int) -> tuple[Fallback, ...]:
    if not n:
        return ()
    alts = [m for m in dict.fromkeys(rng.choices(mids, k=n + 1)) if m != mid][:n]
    return tuple(Fallback(m, machines[m].seq) for m in alts)


# -- the raw baseline --------------------------------------------------------------------


def minimal_values() -> tuple[bytes, bytes]:
    """A machine record without allocations and a placed task's record, as the store
    encodes them for this benchmark's cells: the values the raw baseline writes."""
    machine = codec.encode_machine(Machine("m00000", Resources.of(cpu=MACHINE_CPU,
                                                                  mem=MACHINE_MEM)))
    task = codec.encode_task(TaskRecord(job_id(0), BYTES_FIRST_TASK, TaskState.RUNNING,
                                        "m00000", scheduler_name(0)))
    return machine, task


class RawCommitter:
    """Sends the smallest etcd transaction Omega's semantics need for a commit of
    ``batch`` claims straight to etcd: for each distinct machine of B picked at random
    from ``machines`` (as a committer picks them) a compare of its key's mod_revision
    and a put of a small machine record, and a put of a task record per claim. The keys
    are under ``prefix``, owned by this process, so every compare holds. A commit whose
    puts exceed the KV's ``max_txn_ops`` goes out as several Txns, as the store's does."""

    def __init__(self, kv: KV, prefix: bytes, machines: int, batch: int, seed: int) -> None:
        self.kv = kv
        self.batch = batch
        self.rng = random.Random(seed)
        self.pool = [prefix + b"machines/m%05d" % i for i in range(machines)]
        self.task_prefix = prefix + b"tasks/" + job_id(0).encode() + b"/"
        self.machine_value, self.task_value = minimal_values()
        self.revs: dict[bytes, int] = {}
        self.next_task = BYTES_FIRST_TASK
        # Worst case every claim is on a machine of its own: two puts per claim.
        self.claims_per_txn = max(1, kv.max_txn_ops // 2)
        self.txns = self.compares = self.puts = self.put_bytes = 0

    def prepare(self) -> None:
        step = min(100, self.kv.max_txn_ops)
        for i in range(0, len(self.pool), step):
            chunk = self.pool[i : i + step]
            res = self.kv.txn([], [Put(k, self.machine_value) for k in chunk])
            self.revs.update(dict.fromkeys(chunk, res.revision))

    def one(self) -> None:
        """One commit of ``batch`` claims."""
        chosen = self.rng.choices(self.pool, k=self.batch)
        for i in range(0, self.batch, self.claims_per_txn):
            self._txn(chosen[i : i + self.claims_per_txn])

    def _txn(self, chosen: Sequence[bytes]) -> None:
        machines = list(dict.fromkeys(chosen))
        compares = [Compare.mod_revision_is(k, self.revs[k]) for k in machines]
        puts = [Put(k, self.machine_value) for k in machines]
        first = self.next_task
        self.next_task += len(chosen)
        puts.extend(Put(self.task_prefix + b"%d" % t, self.task_value)
                    for t in range(first, self.next_task))
        res = self.kv.txn(compares, puts)
        if not res.succeeded:
            raise RuntimeError("a raw transaction failed its compares (keys shared?)")
        for k in machines:
            self.revs[k] = res.revision
        self.txns += 1
        self.compares += len(compares)
        self.puts += len(puts)
        self.put_bytes += sum(len(p.key) + len(p.value) for p in puts)

    def loop(self, t0: float, deadline: float) -> dict[str, Any]:
        commits = 0
        latencies: list[float] = []
        pause = t0 - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        perf = time.perf_counter
        cpu0 = time.process_time()
        while time.monotonic() < deadline:
            started = perf()
            self.one()
            latencies.append(perf() - started)
            commits += 1
        return {"commits": commits, "placements": commits * self.batch, "txns": self.txns,
                "latencies": latencies, "end": time.monotonic(), "compares": self.compares,
                "puts": self.puts, "put_bytes": self.put_bytes,
                "cpu_s": time.process_time() - cpu0}


# -- etcd worker processes -------------------------------------------------------------


def worker_main(conn: Connection, endpoint: str, wid: int) -> None:
    """One etcd committer process: runs store or raw rounds as the parent asks. A round's
    ``max_txn_ops`` (default etcd's) is the limit its EtcdKV tells the store."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    kv = EtcdKV([endpoint])
    try:
        while True:
            msg = conn.recv()
            kind = msg[0]
            if kind == "stop":
                return
            replica: Replica | None = None
            try:
                p: dict[str, Any] = msg[1]
                limit = p.get("max_txn_ops", DEFAULT_MAX_TXN_OPS)
                if limit != kv.max_txn_ops:
                    kv.close()
                    kv = EtcdKV([endpoint], max_txn_ops=limit)
                run: Callable[[float, float], dict[str, Any]]
                if kind == "store":
                    counting = CountingKV(kv)
                    store = CellStore(counting, p["cell"], options=StoreOptions(
                        refresh_when_contended=not p.get("no_refresh")))
                    store.load()
                    if not p.get("default_gc"):
                        # As scheduler and server processes do after their first load.
                        tune_for_large_heap()
                    if p.get("follow"):
                        replica = Replica(kv, p["cell"]).start()
                        store.follow(replica)
                    run = functools.partial(commit_loop, store, counting, wid, p["mode"],
                                            p["detection"], p["batch"], p["seed"],
                                            p["fallbacks"], share=p.get("share"))
                else:
                    raw = RawCommitter(kv, p["prefix"], p["machines"], p["batch"], p["seed"])
                    raw.prepare()
                    run = raw.loop
                conn.send(("ready",))
                go = conn.recv()
                if go[0] == "stop":
                    return
                result = _profiled(run, go[1], go[2], p.get("profile"))
                conn.send(("result", result))
            except Exception:
                conn.send(("error", traceback.format_exc()))
            finally:
                if replica is not None:
                    replica.stop()
    finally:
        kv.close()


def _profiled(run: Callable[[float, float], dict[str, Any]], t0: float, deadline: float,
              profile: str | None) -> dict[str, Any]:
    if not profile:
        return run(t0, deadline)
    import cProfile

    # CPU time, not wall time: committers share the cores with etcd and each other, so a
    # wall-clock profile charges their waits for a core to whatever ran last.
    prof = cProfile.Profile(time.process_time)
    try:
        return prof.runcall(run, t0, deadline)
    finally:
        prof.dump_stats(profile)


class Workers:
    """Worker processes, started once (spawn) and reused for every round: by default
    the etcd committers; ``target(conn, endpoint, wid)`` runs another kind."""

    def __init__(self, endpoint: str, count: int,
                 target: Callable[[Connection, str, int], None] | None = None,
                 role: str = "committer") -> None:
        ctx = multiprocessing.get_context("spawn")
        self.role = role
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        for wid in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target or worker_main, args=(child, endpoint, wid),
                               name=f"{role}-{wid}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def _recv(self, i: int, timeout: float) -> tuple[Any, ...]:
        conn, proc = self.conns[i], self.procs[i]
        deadline = time.monotonic() + timeout
        while not conn.poll(0.2):
            if not proc.is_alive():
                raise RuntimeError(f"{self.role} process {i} died (exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.role} process {i} did not answer in {timeout:g} s")
        msg: tuple[Any, ...] = conn.recv()
        if msg[0] == "error":
            raise RuntimeError(f"{self.role} process {i} failed:\n{msg[1]}")
        return msg

    def round(self, kind: str, params: Sequence[dict[str, Any]], seconds: float,
              meter: CpuMeter) -> tuple[float, list[dict[str, Any]], dict[str, float | None]]:
        """Run one timed round on the first len(params) workers; returns t0, the results
        and what the CPU meter saw meanwhile."""
        n = len(params)
        for i in range(n):
            self.conns[i].send((kind, params[i]))
        for i in range(n):
            self._recv(i, REPLY_SLACK)
        t0 = time.monotonic() + 0.05
        meter.start()
        for i in range(n):
            self.conns[i].send(("go", t0, t0 + seconds))
        results = [self._recv(i, seconds + REPLY_SLACK)[1] for i in range(n)]
        return t0, results, meter.stop()

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=5)
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


# -- CPU used by other processes -----------------------------------------------------------


class CpuMeter:
    """How much of the machine's CPU processes outside this benchmark (this process, its
    committer processes and its etcd) used during a timed run: the machine is shared,
    and a figure taken while something else ran says so in the table. Linux only
    (/proc); elsewhere it reports nothing."""

    def __init__(self) -> None:
        self.pids: list[int] = [os.getpid()]
        self.etcd_pid: int | None = None  # also counted as ours; its CPU is reported
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._start: tuple[float, float, float, float] | None = None

    def _process_cpu(self, pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
        return int(stat[11]) + int(stat[12])  # utime, stime (threads included)

    def _snapshot(self) -> tuple[float, float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            # user nice system idle iowait irq softirq steal: busy is all but idle, iowait
            busy = sum(fields[:8]) - fields[3] - fields[4]
            pids = self.pids + ([self.etcd_pid] if self.etcd_pid else [])
            ours = sum(self._process_cpu(pid) for pid in pids)
            etcd = self._process_cpu(self.etcd_pid) if self.etcd_pid else 0
        except (OSError, ValueError, IndexError):
            return None
        return busy / self.tick, ours / self.tick, etcd / self.tick, time.monotonic()

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> dict[str, float | None]:
        """``other_cpu_pct``: percent of all cores' time used by other processes since
        start(); ``etcd_cpu_s``: CPU seconds etcd used meanwhile."""
        end = self._snapshot()
        if self._start is None or end is None:
            return {"other_cpu_pct": None, "etcd_cpu_s": None}
        busy, ours, etcd, wall = (b - a for a, b in zip(self._start, end, strict=True))
        cores = os.cpu_count() or 1
        other = max(0.0, 100 * (busy - ours) / (wall * cores)) if wall > 0 else None
        return {"other_cpu_pct": other, "etcd_cpu_s": etcd if self.etcd_pid else None}


# -- figures ----------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def summarize(t0: float, results: Sequence[dict[str, Any]], etcd_cpu_s: float | None = None
              ) -> dict[str, Any]:
    wall = max(r["end"] for r in results) - t0
    client_cpu = sum(r["cpu_s"] for r in results)
    all_writes = sum(r["write_txns"] for r in results)
    lat = sorted(x for r in results for x in r["latencies"])
    committed = sum(r["committed"] for r in results)
    rejected = sum(r["rejected"] for r in results)
    commits = sum(r["commits"] for r in results)
    writes = sum(r["write_txns"] for r in results)
    ok_writes = writes - sum(r["failed_write_txns"] for r in results)
    return {
        "wall_s": wall,
        "placements_per_s": committed / wall,
        "commits_per_s": commits / wall,
        "p50_ms": percentile(lat, 0.50) * 1e3,
        "p99_ms": percentile(lat, 0.99) * 1e3,
        "committed": committed,
        "rejected": rejected,
        "rejected_fraction": rejected / max(1, committed + rejected),
        "fell_back_fraction": sum(r["fell_back"] for r in results) / max(1, committed),
        "commits": commits,
        "etcd_txns_per_commit": sum(r["attempts"] for r in results) / max(1, commits),
        "conflict_fraction": (writes - ok_writes) / max(1, writes),
        "fetch_txns": sum(r["read_txns"] for r in results),
        "read_txns_per_commit": sum(r["read_txns"] for r in results) / max(1, commits),
        "compares_per_write": sum(r["ok_compares"] for r in results) / max(1, ok_writes),
        "puts_per_write": sum(r["ok_puts"] for r in results) / max(1, ok_writes),
        "bytes_per_write": sum(r["ok_bytes"] for r in results) / max(1, ok_writes),
        "client_cpu_s": client_cpu,
        "client_cpu_ms_per_commit": _per_ms(client_cpu, commits),
        "client_cpu_ms_per_txn": _per_ms(client_cpu, all_writes),
        "etcd_cpu_s": etcd_cpu_s,
        "cores_used": None if etcd_cpu_s is None else (client_cpu + etcd_cpu_s) / wall,
        "etcd_cpu_ms_per_commit": _per_ms(etcd_cpu_s, commits),
        "etcd_cpu_ms_per_txn": _per_ms(etcd_cpu_s, all_writes),
    }


def _per_ms(total_s: float | None, count: int) -> float | None:
    return None if total_s is None else 1e3 * total_s / max(1, count)


def summarize_raw(t0: float, results: Sequence[dict[str, Any]],
                  etcd_cpu_s: float | None = None) -> dict[str, Any]:
    wall = max(r["end"] for r in results) - t0
    txns = sum(r["txns"] for r in results)
    commits = sum(r["commits"] for r in results)
    placements = sum(r["placements"] for r in results)
    client_cpu = sum(r["cpu_s"] for r in results)
    lat = sorted(x for r in results for x in r["latencies"])
    put_bytes = sum(r["put_bytes"] for r in results)
    return {
        "wall_s": wall,
        "txns_per_s": txns / wall,
        "placements_per_s": placements / wall,
        "txns_per_commit": txns / max(1, commits),
        "p50_ms": percentile(lat, 0.50) * 1e3,  # per commit of B claims
        "p99_ms": percentile(lat, 0.99) * 1e3,
        "compares_per_txn": sum(r["compares"] for r in results) / max(1, txns),
        "puts_per_txn": sum(r["puts"] for r in results) / max(1, txns),
        "bytes_per_txn": put_bytes / max(1, txns),
        "bytes_per_placement": put_bytes / max(1, placements),
        "client_cpu_ms_per_txn": _per_ms(client_cpu, txns),
        "etcd_cpu_ms_per_txn": _per_ms(etcd_cpu_s, txns),
        "cores_used": None if etcd_cpu_s is None else (client_cpu + etcd_cpu_s) / wall,
    }


HEADER = (
    f"{'backend':<7} {'comm':>4} {'mode':<11} {'detect':<6} {'place/s':>8} {'commit/s':>8} "
    f"{'p50 ms':>7} {'p99 ms':>7} {'rej%':>5} {'fb%':>5} {'confl%':>6} {'txn/c':>5} "
    f"{'raw Txn/s':>9} {'raw pl/s':>8} {'st/raw':>6} {'other%':>6}"
)


def row(cfg: dict[str, Any], raw: dict[str, Any] | None) -> str:
    s = cfg["result"]
    if raw is not None:
        ratio = s["placements_per_s"] / raw["placements_per_s"]
        rawpart = f"{raw['txns_per_s']:>9.0f} {raw['placements_per_s']:>8.0f} {ratio:>6.2f}"
    else:
        rawpart = f"{'-':>9} {'-':>8} {'-':>6}"
    return (
        f"{cfg['backend']:<7} {cfg['committers']:>4} {cfg['mode']:<11} {cfg['detection']:<6} "
        f"{s['placements_per_s']:>8.0f} {s['commits_per_s']:>8.1f} {s['p50_ms']:>7.1f} "
        f"{s['p99_ms']:>7.1f} {100 * s['rejected_fraction']:>5.1f} "
        f"{100 * s['fell_back_fraction']:>5.1f} "
        f"{100 * s['conflict_fraction']:>6.1f} {s['etcd_txns_per_commit']:>5.2f} {rawpart} "
        f"{_pct(cfg.get('other_cpu_pct'))}"
    )


def _pct(value: float | None) -> str:
    return f"{'?':>6}" if value is None else f"{value:>6.0f}"


# -- the benchmark ----------------------------------------------------------------------


def configurations(args: argparse.Namespace) -> Iterator[tuple[int, TxnMode, Detection]]:
    for n in args.committers:
        for mode in args.modes:
            for det in args.detections:
                yield n, mode, det


def _thread_main(results: list[dict[str, Any] | None], errors: list[str], i: int,
                 run: Callable[[], dict[str, Any]]) -> None:
    try:
        results[i] = run()
    except Exception:
        errors.append(traceback.format_exc())


def run_memory(args: argparse.Namespace, cell_no: Iterator[int], out: list[dict[str, Any]],
               meter: CpuMeter, emit: Callable[[str], None]) -> None:
    for n, mode, det in configurations(args):
        kv = MemoryKV(max_txn_ops=args.max_txn_ops)
        cell = f"bench-{next(cell_no)}"
        setup_cell(kv, cell, args.machines, n)
        results: list[dict[str, Any] | None] = [None] * n
        errors: list[str] = []
        countings = [CountingKV(kv) for _ in range(n)]
        stores = [CellStore(c, cell) for c in countings]
        replicas: list[Replica] = []
        for s in stores:
            s.load()
            if args.follow_replica:
                replicas.append(Replica(kv, cell).start())
                s.follow(replicas[-1])
        t0 = time.monotonic() + 0.05
        threads = [
            threading.Thread(
                target=_thread_main, daemon=True,
                args=(results, errors, i, functools.partial(
                    commit_loop, stores[i], countings[i], i, mode, det, args.batch,
                    args.seed + i, args.fallbacks, t0, t0 + args.seconds, time.thread_time,
                    (i, n) if args.disjoint else None)),
            )
            for i in range(n)
        ]
        meter.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = meter.stop()
        for r in replicas:
            r.stop()
        if errors:
            raise RuntimeError("a memory committer failed:\n" + errors[0])
        cfg: dict[str, Any] = {"backend": "memory", "committers": n, "mode": mode.value,
               "detection": det.value, "cell": cell,
               "result": summarize(t0, [r for r in results if r is not None]),
               "other_cpu_pct": cpu["other_cpu_pct"]}
        out.append(cfg)
        emit(row(cfg, None))
        kv.close()


def run_etcd(args: argparse.Namespace, kv: EtcdKV, workers: Workers, cell_no: Iterator[int],
             out: list[dict[str, Any]], raws: dict[int, dict[str, Any]], meter: CpuMeter,
             emit: Callable[[str], None]) -> None:
    for n in args.committers:
        rows: list[dict[str, Any]] = []
        for mode in args.modes:
            for det in args.detections:
                cell = f"bench-{next(cell_no)}"
                setup_cell(kv, cell, args.machines, n)
                profile = None
                if args.profile and (mode, det) == (TxnMode.INCREMENTAL, Detection.FINE):
                    profile = args.profile
                params = [{"cell": cell, "mode": mode, "detection": det, "batch": args.batch,
                           "seed": args.seed + 1000 * n + i, "follow": args.follow_replica,
                           "max_txn_ops": args.max_txn_ops,
                           "fallbacks": args.fallbacks, "default_gc": args.default_gc,
                           "no_refresh": args.no_refresh,
                           "share": (i, n) if args.disjoint else None,
                           "profile": f"{profile}/committers-{n}-{i}.prof" if profile else None}
                          for i in range(n)]
                t0, results, cpu = workers.round("store", params, args.seconds, meter)
                cfg: dict[str, Any] = {"backend": "etcd", "committers": n, "mode": mode.value,
                       "detection": det.value, "cell": cell,
                       "result": summarize(t0, results, cpu["etcd_cpu_s"]),
                       "other_cpu_pct": cpu["other_cpu_pct"]}
                rows.append(cfg)
                out.append(cfg)
                delete_prefix(kv, CellStore(kv, cell).keys.root, compact=not args.no_compact)
        prefix = f"/omega/raw-{n}/".encode()
        params = [{"prefix": prefix + b"w%d/" % i, "machines": args.machines,
                   "batch": args.batch, "seed": args.seed + i,
                   "max_txn_ops": args.max_txn_ops} for i in range(n)]
        t0, results, cpu = workers.round("raw", params, args.seconds, meter)
        raw = summarize_raw(t0, results, cpu["etcd_cpu_s"])
        raw["other_cpu_pct"] = cpu["other_cpu_pct"]
        raws[n] = raw
        delete_prefix(kv, prefix, compact=not args.no_compact)
        for cfg in rows:
            cfg["raw"] = raw
            cfg["store_over_raw"] = cfg["result"]["placements_per_s"] / raw["placements_per_s"]
            emit(row(cfg, raw))


# -- what etcd holds ------------------------------------------------------------------------


def etcd_db_file_bytes(server: LocalEtcd) -> int | None:
    """The size of the launched etcd's bbolt database file, or None before it exists.
    Read from its data folder so it needs no RPC."""
    try:
        return (server.data_dir / "data" / "member" / "snap" / "db").stat().st_size
    except OSError:
        return None


def _mib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


# -- bytes written per placement ----------------------------------------------------------


def old_layout_machine_value(m: Machine) -> bytes:
    """The machine's record as the layout before allocation keys stored it (every
    allocation inside it; cellstate/codec.py before issue 9, item 7). Only for the
    estimate of what a placement used to write."""
    doc: dict[str, Any] = orjson.loads(codec.encode_machine(m))
    if m.allocations:
        doc["allocs"] = {
            a.task: [a.job, a.scheduler, a.precedence, dict(a.resources.amounts), a.gang,
                     a.evicted_by]
            for a in m.allocations.values()
        }
    return orjson.dumps(doc)


def measure_bytes(kv: KV, cell: str, batch: int, compact: bool = True) -> list[dict[str, Any]]:
    """Bytes the store writes to ``kv`` per placement on machines already holding each of
    FILL_LEVELS tasks: a group of ``batch`` machines per level, filled through the store,
    then BYTES_ROUNDS commits of one claim on every machine of the group (incremental,
    fine, one committer: no conflicts). One row per level."""
    setup_cell(kv, cell, batch * len(FILL_LEVELS), 1)
    counting = CountingKV(kv)
    store = CellStore(counting, cell)
    store.load()
    machines = store.view.machines
    mids = sorted(machines)
    groups = [mids[g * batch : (g + 1) * batch] for g in range(len(FILL_LEVELS))]
    job, sched = job_id(0), scheduler_name(0)

    def commit(targets: Sequence[tuple[int, str]]) -> int:
        claims = tuple(Claim(job, i, mid, machines[mid].seq) for i, mid in targets)
        res = store.commit(Transaction(sched, claims, TxnMode.INCREMENTAL, Detection.FINE))
        if not res.ok:
            raise RuntimeError(f"bytes measurement: {len(res.rejected)} claims rejected "
                               f"(first: {res.rejected[0]})")
        return res.attempts

    fill = [mid for group, held in zip(groups, FILL_LEVELS, strict=True)
            for _ in range(held) for mid in group]
    for i in range(0, len(fill), batch):
        commit(list(enumerate(fill[i : i + batch], start=i)))
    rows: list[dict[str, Any]] = []
    task = BYTES_FIRST_TASK
    keys = store.keys
    for group, held in zip(groups, FILL_LEVELS, strict=True):
        counting.reset()
        attempts = placements = 0
        old_bytes = 0  # what the same placements wrote in the layout before
        for _ in range(BYTES_ROUNDS):
            targets = list(enumerate(group, start=task))
            task += len(targets)
            attempts += commit(targets)
            placements += len(targets)
            for t, mid in targets:
                m = machines[mid]  # as committed: holding the new task
                tid = f"{job}/{t}"
                old_bytes += (len(keys.task(job, t)) + len(codec.encode_task(TaskRecord(
                    job, t, TaskState.RUNNING, mid, sched))) + len(keys.machine(mid))
                    + len(old_layout_machine_value(m)))
                if tid not in m.allocations:
                    raise RuntimeError(f"bytes measurement: {tid} is not on {mid} in the view")
        rows.append({
            "held": held, "placements": placements, "commits": BYTES_ROUNDS,
            "etcd_txns_per_commit": attempts / BYTES_ROUNDS,
            "bytes_per_placement": counting.ok_bytes / placements,
            "puts_per_placement": counting.ok_puts / placements,
            "compares_per_placement": counting.ok_compares / placements,
            "old_layout_bytes_per_placement_estimated": old_bytes / placements,
        })
    delete_prefix(kv, store.keys.root, compact=compact)
    return rows


def emit_bytes(rows: Sequence[dict[str, Any]], batch: int, backend: str,
               emit: Callable[[str], None]) -> None:
    emit(f"bytes written to {backend} per placement (keys + values of puts; {BYTES_ROUNDS} commits "
         f"of B={batch} claims, one per machine, on machines already holding the tasks "
         "shown; one committer):")
    emit(f"{'held':>5} {'bytes/pl':>8} {'puts/pl':>7} {'cmp/pl':>6} {'txn/c':>5} "
         f"{'old layout (estimated)':>22}")
    for r in rows:
        emit(f"{r['held']:>5} {r['bytes_per_placement']:>8.0f} {r['puts_per_placement']:>7.2f} "
             f"{r['compares_per_placement']:>6.2f} {r['etcd_txns_per_commit']:>5.2f} "
             f"{r['old_layout_bytes_per_placement_estimated']:>22.0f}")
    emit("  old layout (estimated) = the task's record plus the machine's record with every "
         "allocation in it, encoded as before allocation keys (not measured: that code is "
         "gone)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="short runs (1.5 s each)")
    ap.add_argument("--seconds", type=float, help="seconds per configuration (default 4)")
    ap.add_argument("--no-fsync", action="store_true",
                    help="run etcd with --unsafe-no-fsync (default: fsync on, as in production)")
    ap.add_argument("--json", metavar="OUT", help="also write every figure to this file")
    ap.add_argument("--batch", type=int, default=50, help="claims per transaction (B)")
    ap.add_argument("--machines", type=int, default=MACHINES)
    ap.add_argument("--backends", default="etcd,memory", help="comma-separated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--follow-replica", action="store_true",
                    help="each committer's store follows a Replica of the cell (a watch), so "
                         "its view sees other committers' writes (CellStore.follow)")
    ap.add_argument("--fallbacks", type=int, default=0,
                    help=f"alternative machines per claim (0-{MAX_FALLBACKS})")
    ap.add_argument("--profile", metavar="DIR",
                    help="cProfile every committer of the incremental/fine etcd runs into "
                         "DIR/committers-<n>-<i>.prof (slows them down)")
    ap.add_argument("--no-refresh", action="store_true",
                    help="stores do not read their claimed machines again before writing "
                         "while guards keep failing (StoreOptions.refresh_when_contended)")
    ap.add_argument("--disjoint", action="store_true",
                    help="each committer claims only machines of its own share (every n-th), "
                         "so committers never conflict, as the raw baseline's processes "
                         "never do: the store's cost without contention (a diagnostic, not "
                         "the goals' set-up)")
    ap.add_argument("--no-compact", action="store_true",
                    help="leave etcd's history of each configuration in place after its cell "
                         "is deleted (by default it is compacted, so every configuration "
                         "starts from the same etcd)")
    ap.add_argument("--default-gc", action="store_true",
                    help="leave the committer processes' garbage collector as it is (by "
                         "default each tunes it after loading the cell, as scheduler and "
                         "server processes do: cellstate.gc_tuning)")
    ap.add_argument("--committers", default=",".join(map(str, COMMITTER_COUNTS)),
                    help="comma-separated committer counts to run (default %(default)s)")
    ap.add_argument("--modes", default=",".join(m.value for m in MODES),
                    help="comma-separated: incremental, gang (default both)")
    ap.add_argument("--detections", default=",".join(d.value for d in DETECTIONS),
                    help="comma-separated: fine, coarse (default both)")
    ap.add_argument("--max-txn-ops", type=int, default=DEFAULT_MAX_TXN_OPS, metavar="N",
                    help="start etcd with --max-txn-ops=N and give every store's KV the same "
                         f"limit (default {DEFAULT_MAX_TXN_OPS}, what omega's etcd launcher sets)")
    args = ap.parse_args(argv)
    if args.max_txn_ops < 8:
        ap.error(f"--max-txn-ops must be at least 8, got {args.max_txn_ops} (one claim alone "
                 "puts 5 compares in the store's etcd Txn)")
    if args.seconds is None:
        args.seconds = 1.5 if args.quick else 4.0
    if not 0 <= args.fallbacks <= MAX_FALLBACKS:
        ap.error(f"--fallbacks takes 0 to {MAX_FALLBACKS}")
    try:
        args.committers = tuple(int(n) for n in args.committers.split(",") if n.strip())
        args.modes = tuple(TxnMode(m.strip()) for m in args.modes.split(",") if m.strip())
        args.detections = tuple(Detection(d.strip()) for d in args.detections.split(",")
                                if d.strip())
    except ValueError as e:
        ap.error(f"--committers/--modes/--detections: {e}")
    if not (args.committers and args.modes and args.detections) or min(args.committers) < 1:
        ap.error("--committers, --modes and --detections each need at least one value "
                 "(committer counts from 1)")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not set(backends) <= {"etcd", "memory"}:
        ap.error("--backends takes etcd and/or memory")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)

    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    configs: list[dict[str, Any]] = []
    raws: dict[int, dict[str, Any]] = {}
    meta: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/commit_throughput.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "machine": platform.platform(), "seconds": args.seconds, "batch": args.batch,
        "machines": args.machines, "fsync": not args.no_fsync,
        "load_average_at_start": os.getloadavg(), "follow_replica": args.follow_replica,
        "disjoint": args.disjoint,
        "max_txn_ops": args.max_txn_ops,
        "fallbacks": args.fallbacks,
    }
    bytes_rows: list[dict[str, Any]] = []
    cell_no = iter(range(1_000_000))
    meter = CpuMeter()
    server: LocalEtcd | None = None
    workers: Workers | None = None
    kv: EtcdKV | None = None
    try:
        if "etcd" in backends:
            server = LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True,
                               max_txn_ops=args.max_txn_ops)
            server.start()
            meta["etcd_version"] = server.version
            meta["etcd_binary"] = server.binary
            meta["etcd_db_file_bytes_at_start"] = etcd_db_file_bytes(server)
            kv = EtcdKV([server.endpoint], max_txn_ops=args.max_txn_ops)
            workers = Workers(server.endpoint, max(args.committers))
            meter.pids.extend([p.pid for p in workers.procs if p.pid is not None])
            meter.etcd_pid = server.pid
        emit(f"commit throughput: {args.machines} machines (cpu={MACHINE_CPU:g}, "
             f"mem={MACHINE_MEM:g}), tasks cpu={TASK_CPU:g} mem={TASK_MEM:g}, "
             f"B={args.batch} claims per transaction, {args.seconds:g} s per configuration; "
             + ("each store follows a replica (--follow-replica)" if args.follow_replica else
                "stores learn others' writes only from failed guards (no replica)")
             + f"; {args.fallbacks} fallback machine(s) per claim"
             + ("; committers claim disjoint machines (--disjoint)" if args.disjoint else ""))
        load = os.getloadavg()
        emit(f"host: {os.cpu_count()} cores (load average {load[0]:.2f} {load[1]:.2f} "
             f"{load[2]:.2f} at the start), Python {platform.python_version()}"
             + (f"; etcd {server.version} ({server.binary}), fsync "
                f"{'OFF (--unsafe-no-fsync)' if args.no_fsync else 'on'}, --max-txn-ops="
                f"{args.max_txn_ops}" if server else ""))
        if server is not None and server.version in UNSAFE_VERSIONS:
            emit(f"note: etcd {server.version} is fine for a benchmark, not for production "
                 "(use 3.5.6+)")
        emit("etcd committers are processes; memory committers are threads of one process "
             "(a MemoryKV cannot be shared across processes), so they share one GIL")
        emit("")
        bytes_rows = measure_bytes(kv if kv is not None else
                                   MemoryKV(max_txn_ops=args.max_txn_ops),
                                   f"bench-{next(cell_no)}", args.batch,
                                   compact=not args.no_compact)
        emit_bytes(bytes_rows, args.batch, "etcd" if kv is not None else "the memory KV", emit)
        emit("")
        emit("place/s = committed claims per second of wall time over all committers; "
             "rej% = claims rejected; fb% = committed claims that took a fallback; "
             "confl% = etcd Txns whose guards failed; txn/c = etcd "
             "Txns per commit; raw = the smallest Txn a commit of B claims needs (per machine "
             "a compare and a put of its small record, per task a put of its record; same "
             "etcd, same process count, no store, no conflicts); raw Txn/s = its etcd Txns "
             "per second; raw pl/s = its placements per second; st/raw = place/s / raw pl/s; "
             "other% = share of all cores used by processes outside this benchmark during the "
             "run (the machine may be shared)")
        emit("")
        emit(HEADER)
        if kv is not None and workers is not None:
            run_etcd(args, kv, workers, cell_no, configs, raws, meter, emit)
        if "memory" in backends:
            run_memory(args, cell_no, configs, meter, emit)
        if raws:
            emit("")
        for n, raw in sorted(raws.items()):
            emit(f"raw etcd, {n} process(es): {raw['txns_per_s']:.0f} Txn/s "
                 f"({raw['txns_per_commit']:.2f} per commit of B), p50 {raw['p50_ms']:.1f} ms, "
                 f"p99 {raw['p99_ms']:.1f} ms per commit; {raw['compares_per_txn']:.0f} compares, "
                 f"{raw['puts_per_txn']:.0f} puts, {raw['bytes_per_txn'] / 1024:.1f} KiB of puts "
                 f"per Txn, {raw['bytes_per_placement']:.0f} bytes per placement (other "
                 f"processes {_pct(raw['other_cpu_pct']).strip()}% CPU)")
        for cfg in configs:
            if cfg["backend"] == "etcd" and cfg["mode"] == "incremental" and \
                    cfg["detection"] == "fine":
                s = cfg["result"]
                emit(f"store Txn shape, {cfg['committers']} committer(s), incremental/fine: "
                     f"{s['compares_per_write']:.0f} compares, {s['puts_per_write']:.0f} puts, "
                     f"{s['bytes_per_write'] / 1024:.1f} KiB of puts per committed etcd Txn")
        emit_cpu_table(configs, raws, emit)
        emit("")
        emit_goals(configs, bytes_rows, emit, disjoint=args.disjoint)
        if server is not None:
            emit("")
            db = meta["etcd_db_file_bytes_at_end"] = etcd_db_file_bytes(server)
            emit(f"etcd database after the run: {_mib(db)} (member/snap/db file; "
                 f"{_mib(meta['etcd_db_file_bytes_at_start'])} at the start). The file keeps "
                 "free pages and history not yet compacted; the size in use is not read here")
    except KeyboardInterrupt:
        print("\ninterrupted; stopping committers and etcd", file=sys.stderr)
        return 130
    finally:
        if workers is not None:
            workers.stop()
        if kv is not None:
            kv.close()
        if server is not None:
            server.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "configurations": configs, "raw": raws,
                       "bytes_per_placement": bytes_rows, "table": lines}, f, indent=2)
    return 0


def emit_cpu_table(configs: Sequence[dict[str, Any]], raws: dict[int, dict[str, Any]],
                   emit: Callable[[str], None]) -> None:
    """Where the CPU goes on the etcd backend: CPU milliseconds (all threads) spent by the
    committers and by etcd per commit and per etcd write Txn, and the cores both kept busy."""
    etcd = [c for c in configs if c["backend"] == "etcd"]
    if not etcd:
        return
    emit("")

    def ms(value: float | None) -> str:
        return f"{'?':>8}" if value is None else f"{value:>8.1f}"

    emit("CPU time, etcd backend (ms per commit / per etcd write Txn, all threads; cores = "
         "committers + etcd CPU over wall time; reads/c = read-only etcd Txns per commit, "
         "not counted in txn/c):")
    emit(f"{'comm':>4} {'mode':<11} {'detect':<6} {'cl/commit':>9} {'etcd/cmt':>8} "
         f"{'cl/Txn':>8} {'etcd/Txn':>8} {'cores':>6} {'reads/c':>7}")
    for c in etcd:
        s = c["result"]
        cores = s.get("cores_used")
        emit(f"{c['committers']:>4} {c['mode']:<11} {c['detection']:<6} "
             f" {ms(s['client_cpu_ms_per_commit'])} {ms(s['etcd_cpu_ms_per_commit'])} "
             f"{ms(s['client_cpu_ms_per_txn'])} {ms(s['etcd_cpu_ms_per_txn'])} "
             f"{'?' if cores is None else f'{cores:.2f}':>6} "
             f"{s.get('read_txns_per_commit', 0.0):>7.2f}")
    for n, raw in sorted(raws.items()):
        cores = raw.get("cores_used")
        emit(f"{n:>4} {'raw Txn':<11} {'':<6}  {'':>8} {'':>8} "
             f"{ms(raw['client_cpu_ms_per_txn'])} {ms(raw['etcd_cpu_ms_per_txn'])} "
             f"{'?' if cores is None else f'{cores:.2f}':>6}")


def emit_goals(configs: Sequence[dict[str, Any]], bytes_rows: Sequence[dict[str, Any]],
               emit: Callable[[str], None], disjoint: bool = False) -> None:
    def find(n: int) -> dict[str, Any] | None:
        for c in configs:
            if (c["backend"], c["committers"], c["mode"], c["detection"]) == (
                    "etcd", n, "incremental", "fine"):
                return c
        return None

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    if bytes_rows:
        per = [r["bytes_per_placement"] for r in bytes_rows]
        spread = max(per) / min(per)
        listed = ", ".join(f"{r['held']} tasks {r['bytes_per_placement']:.0f}"
                           for r in bytes_rows)
        emit(f"goal: bytes per placement within {100 * (GOAL_BYTES_SPREAD - 1):.0f}% on "
             f"machines holding {', '.join(str(n) for n in FILL_LEVELS)} tasks: {listed} "
             f"(largest / smallest {spread:.2f}) -> {verdict(spread <= GOAL_BYTES_SPREAD)}")
    if disjoint:
        emit("throughput goals: not checked (--disjoint is a diagnostic: the goals are set "
             "for committers that share the machines)")
        return
    four = find(4)
    if four is None:
        emit("throughput goals: not checked (they need the etcd backend's incremental/fine "
             "runs with 4 committers)")
        return
    rate = four["result"]["placements_per_s"]
    emit(f"goal: >= {GOAL_PLACEMENTS:,.0f} placements/s with 4 committers (incremental, fine, "
         f"etcd): {rate:,.0f}/s at {four['result']['etcd_txns_per_commit']:.2f} etcd Txns per "
         f"commit -> {verdict(rate >= GOAL_PLACEMENTS)}")
    ratios = {n: c["store_over_raw"] for n in sorted({c["committers"] for c in configs})
              if (c := find(n)) is not None and "store_over_raw" in c}
    named = {n: r for n, r in ratios.items() if n in GOAL_RATIO_COMMITTERS}
    listed = ", ".join(f"{n} committer(s) {r:.2f}" for n, r in named.items())
    ok = len(named) == len(GOAL_RATIO_COMMITTERS) and all(r >= GOAL_RATIO
                                                          for r in named.values())
    rest = ", ".join(f"{n} committers {r:.2f}" for n, r in ratios.items() if n not in named)
    emit(f"goal: store/raw >= {GOAL_RATIO} with "
         f"{' and '.join(str(n) for n in GOAL_RATIO_COMMITTERS)} committers (incremental, "
         f"fine, etcd): {listed} -> {verdict(ok)}"
         + (f" (not a goal: {rest})" if rest else ""))
    others = [c for c in configs if c["backend"] == "etcd" and "store_over_raw" in c]
    met = sum(1 for c in others if c["store_over_raw"] >= GOAL_RATIO)
    emit(f"      (all etcd configurations: {met} of {len(others)} at >= {GOAL_RATIO})")
    involved = [("store", n, c.get("other_cpu_pct")) for n in (4, *GOAL_RATIO_COMMITTERS)
                if (c := find(n)) is not None]
    involved += [("raw", n, c["raw"].get("other_cpu_pct")) for n in GOAL_RATIO_COMMITTERS
                 if (c := find(n)) is not None and "raw" in c]
    busy = sorted({f"{what} {n}c {pct:.0f}%" for what, n, pct in involved
                   if pct is not None and pct > NOISY_PCT})
    if busy:
        emit(f"warning: other processes used more than {NOISY_PCT:g}% of the CPU during runs "
             f"these goals rest on ({', '.join(busy)}): rerun on a quiet machine")


if __name__ == "__main__":
    sys.exit(main())

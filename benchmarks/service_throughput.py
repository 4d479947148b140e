#!/usr/bin/env python
"""Placements per second through the cellstate gRPC service, beside committing straight
to the store, and how fast a commit reaches another process's synced copy.

    python benchmarks/service_throughput.py [--quick] [--seconds N] [--no-fsync]
        [--batch B] [--processes 1,2,4] [--sync-rate R] [--json out.json]
        [--sync-seconds S] [--direct-follow] [--py-spy DIR] [--paths P,...]
        [--baseline DIR] [--max-txn-ops N]

One etcd (``LocalEtcd``) serves the whole run. For each number of scheduler processes
N (1, 2, 4 by default), two rounds run back to back on the same worker processes:

* ``direct``: each process has its own ``EtcdKV`` and ``CellStore`` and commits to etcd
  itself, exactly as ``benchmarks/commit_throughput.py`` does (its ``commit_loop``: B
  claims per transaction, consecutive tasks of the process's own job, machines picked at
  random from the whole cell, incremental mode, fine detection). As there by default,
  a direct store learns other processes' writes only from failed guards;
  ``--direct-follow`` makes it follow a Replica, as the server's store handles do.
* ``service``: an ``omega server`` process (one cellstate replica, default settings:
  4 store handles) serves a fresh cell; each process has its own ``CellClient`` and
  ``RemoteStore``, registers a scheduler instance, and commits transactions of the same
  shape through the server's Commit RPC.

Every round gets a fresh cell of the same size (``svc-bench-<n>``), deleted afterwards.
The table shows both rates and their ratio (goal: the service keeps at least half of
the direct rate), the commit latency, and the CPU milliseconds per commit that the
scheduler processes, the server and etcd spent.

Sync latency: one process commits at a fixed rate (``--sync-rate`` transactions of B
claims per second, the benchmark's load: 20/s, i.e. 1,000 placements/s, well inside
what one scheduler process sustains through the service here, so that the figure is the
sync path's and not a queue of commits), another process follows the cell, and for
every commit the benchmark takes the time from the commit's reply (in the committer)
to the first applied batch at or past its revision in the follower's local copy (a
listener on the follower's Replica). Both stamp ``time.time()``: CLOCK_REALTIME, one
clock for every process on this host. Through the service the follower is a
``remote_replica`` (the server's sync stream); the peer figure is a plain ``Replica``
over an etcd watch with the committer writing through its own ``CellStore``. A
follower can see a commit before the committer has its reply, so single samples can be
negative. Goal: p99 under 10 ms through the service.

``--paths`` also takes the leader's floor (``benchmarks/_leader_floor.py``: ``floor``,
``floor-codec``, ``floor-records``, ``floor-proxy``, servers whose Commit does only what
any leader must, and ``leader-timed``, the real leader with its stages timed): under
each floor's row, its server's CPU per commit by stage and by thread.

The machine is shared: the load average and the CPU share of processes outside the
benchmark (``other%``, from /proc) are printed before the run and for every round; the
busiest outside processes are named. Compare figures within one run only.

The last line printed is one JSON object with every figure (for scripts).
``--py-spy DIR`` records the server process with py-spy during every service round
(``DIR/server-<N>p.txt``, collapsed stacks; needs py-spy and ptrace rights) and prints
the functions the server spent most samples in.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import datetime
import functools
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Runnable as a plain script from anywhere: the repository root holds the package, and
# the direct side comes from the commit benchmark next to this file.
_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from _leader_floor import FLOORS, STAGES_ENV  # noqa: E402
from commit_throughput import (  # noqa: E402
    MACHINE_CPU,
    MACHINE_MEM,
    MACHINES,
    NOISY_PCT,
    REPLY_SLACK,
    TASK_CPU,
    TASK_MEM,
    CountingKV,
    CpuMeter,
    RawCommitter,
    Workers as CommitWorkers,
    commit_loop,
    delete_prefix,
    job_id,
    percentile,
    scheduler_name,
    setup_cell,
)

from cellstate.api.client import (  # noqa: E402
    CellClient,
    RemoteStore,
    remote_replica,
    wait_until_serving,
)
from cellstate.cell import CellSnapshot  # noqa: E402
from cellstate.gc_tuning import tune_for_large_heap  # noqa: E402
from cellstate.kv.etcd import EtcdKV  # noqa: E402
from cellstate.model import (  # noqa: E402
    Claim,
    Detection,
    InstanceRecord,
    Transaction,
    TxnMode,
)
from cellstate.replica import Replica  # noqa: E402
from cellstate.store import CellStore  # noqa: E402
from omega.etcd_launcher import (  # noqa: E402
    DEFAULT_MAX_TXN_OPS,
    UNSAFE_VERSIONS,
    LocalEtcd,
    free_ports,
)
from omega.proc import Child, omega  # noqa: E402

PROCESS_COUNTS = (1, 2, 4)
DEFAULT_PATHS = ("raw", "direct", "leader", "pipe", "no-lead")
# The leader's floor (benchmarks/_leader_floor.py): a server whose Commit does only
# what any leader must, raw etcd's minimal transaction group-committed; and stages of
# the real handler put back one by one.
PATHS = (*DEFAULT_PATHS, *FLOORS)
# Issue 35's goals, with GOAL_PROCESSES scheduler processes sharing the machines: the
# service with its commit leader reaches GOAL_OVER_RAW of raw etcd's minimal transaction
# and GOAL_OVER_DIRECT times the direct committers' rate, at most GOAL_TXNS etcd Txns a
# commit. Anchors printed beside them (placements/s): Nomad's C1M, Goedel in production.
GOAL_PROCESSES = 4
GOAL_OVER_RAW = 0.5
GOAL_OVER_DIRECT = 2.0
GOAL_TXNS = 1.1
ANCHORS = (("Nomad C1M", 3750), ("Goedel", 5000))
GOAL_RATIO = 0.5
GOAL_SYNC_P99_MS = 10.0
SYNC_RATE = 20.0  # commits per second of B claims in the sync-latency rounds (see below)
SYNC_TAIL = 1.0  # seconds the follower keeps listening after the committer stops
INSTANCE_TTL = 120


# -- the worker processes ----------------------------------------------------------------


def service_loop(store: RemoteStore, mids: Sequence[str], seqs: dict[str, int], committer: int,
                 batch: int, seed: int, t0: float, deadline: float) -> dict[str, Any]:
    """``commit_loop``'s workload through the service: the same claims (the process's
    own job, random machines, B per transaction), committed with ``RemoteStore``."""
    rng = random.Random(seed)
    job, sched = job_id(committer), scheduler_name(committer)
    index = committed = rejected = commits = attempts = 0
    latencies: list[float] = []
    pause = t0 - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    cpu0 = time.process_time()
    perf = time.perf_counter
    while time.monotonic() < deadline:
        chosen = rng.choices(mids, k=batch)
        claims = tuple(Claim(job, index + i, mid, seqs[mid]) for i, mid in enumerate(chosen))
        index += batch
        started = perf()
        res = store.commit(Transaction(sched, claims, TxnMode.INCREMENTAL, Detection.FINE))
        latencies.append(perf() - started)
        committed += len(res.committed)
        rejected += len(res.rejected)
        commits += 1
        attempts += res.attempts
    return {"committed": committed, "rejected": rejected, "commits": commits,
            "attempts": attempts, "latencies": latencies, "end": time.monotonic(),
            "cpu_s": time.process_time() - cpu0}


def paced_loop(commit: Callable[[Transaction], Any], mids: Sequence[str], seqs: dict[str, int],
               batch: int, rate: float, seed: int, t0: float, deadline: float
               ) -> dict[str, Any]:
    """Commit ``rate`` transactions of B claims per second (committer 0's job); record
    each commit's revision and wall-clock send and reply times."""
    rng = random.Random(seed)
    job, sched = job_id(0), scheduler_name(0)
    interval = 1.0 / rate
    pause = t0 - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    commits: list[tuple[int, float, float]] = []
    index = rejected = 0
    due = time.monotonic()
    while due < deadline:
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        chosen = rng.choices(mids, k=batch)
        claims = tuple(Claim(job, index + i, mid, seqs[mid]) for i, mid in enumerate(chosen))
        index += batch
        sent = time.time()
        res = commit(Transaction(sched, claims, TxnMode.INCREMENTAL, Detection.FINE))
        commits.append((res.revision, sent, time.time()))
        rejected += len(res.rejected)
        # No bursts to catch up: a late commit moves the schedule.
        due = max(due + interval, time.monotonic())
    return {"commits": commits, "rejected": rejected, "end": time.monotonic()}


def follow_loop(arrivals: list[tuple[int, float]], t0: float, deadline: float
                ) -> dict[str, Any]:
    """The follower only waits: its replica's listener records arrivals meanwhile."""
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return {"arrivals": list(arrivals), "end": time.monotonic()}


def _register(client: CellClient, committer: int) -> RemoteStore:
    store = RemoteStore(client)
    store.register_instance(InstanceRecord(scheduler_name(committer), f"bench-{committer}",
                                           "bench", time.time()), INSTANCE_TTL)
    return store


def _service_machines(client: CellClient) -> tuple[list[str], dict[str, int]]:
    seqs = {m["id"]: int(m["seq"]) for m in client.list_machines()}
    return sorted(seqs), seqs


def _prepare(kind: str, p: dict[str, Any], kv: EtcdKV,
             cleanup: list[Callable[[], None]]) -> Callable[[float, float], dict[str, Any]]:
    """Everything a round needs before its clock starts; returns the timed part."""
    if kind == "direct":
        counting = CountingKV(kv)
        store = CellStore(counting, p["cell"])
        store.load()
        if p.get("follow"):
            replica = Replica(kv, p["cell"]).start()
            cleanup.append(replica.stop)
            store.follow(replica)
        return functools.partial(commit_loop, store, counting, p["committer"],
                                 TxnMode.INCREMENTAL, Detection.FINE, p["batch"], p["seed"], 0)
    if kind == "raw":
        raw = RawCommitter(kv, p["prefix"], p["machines"], p["batch"], p["seed"])
        raw.prepare()
        return functools.partial(_raw_loop, raw)
    if kind in ("service", "paced-service", "follow-service"):
        client = CellClient([p["address"]])
        cleanup.append(client.close)
        if kind == "follow-service":
            return _follower(remote_replica(client, p["cell"]), cleanup)
        remote = _register(client, p["committer"])
        mids, seqs = _service_machines(client)
        if kind == "service":
            return functools.partial(service_loop, remote, mids, seqs, p["committer"],
                                     p["batch"], p["seed"])
        return functools.partial(paced_loop, remote.commit, mids, seqs, p["batch"],
                                 p["rate"], p["seed"])
    if kind == "paced-direct":
        store = CellStore(kv, p["cell"])
        store.load()
        view = store.view.machines
        seqs = {mid: m.seq for mid, m in view.items()}
        return functools.partial(paced_loop, store.commit, sorted(seqs), seqs, p["batch"],
                                 p["rate"], p["seed"])
    if kind == "follow-direct":
        return _follower(Replica(kv, p["cell"]), cleanup)
    raise ValueError(f"unknown round kind {kind!r}")


def _raw_loop(raw: RawCommitter, t0: float, deadline: float) -> dict[str, Any]:
    """``RawCommitter.loop`` in this benchmark's result shape."""
    r = raw.loop(t0, deadline)
    return {"committed": r["placements"], "rejected": 0, "commits": r["commits"],
            "attempts": r["txns"], "latencies": r["latencies"], "end": r["end"],
            "cpu_s": r["cpu_s"]}


def _follower(replica: Replica, cleanup: list[Callable[[], None]]
              ) -> Callable[[float, float], dict[str, Any]]:
    arrivals: list[tuple[int, float]] = []

    def applied(snap: CellSnapshot) -> None:
        arrivals.append((snap.revision, time.time()))

    replica.on_change(applied)
    replica.start()
    cleanup.append(replica.stop)
    return functools.partial(follow_loop, arrivals)


def worker_main(conn: Connection, endpoint: str, wid: int = 0) -> None:
    """One scheduler process: runs whatever round the parent sends, each with fresh
    clients (an etcd connection is kept for the direct rounds)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    kv = EtcdKV([endpoint])
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            cleanup: list[Callable[[], None]] = []
            try:
                run = _prepare(msg[0], msg[1], kv, cleanup)
                # As every long-running omega process does once its copy is loaded
                # (scheduler, agent, server): keep the collector off the cell.
                tune_for_large_heap()
                conn.send(("ready",))
                go = conn.recv()
                if go[0] == "stop":
                    return
                conn.send(("result", run(go[1], go[2])))
            except Exception:
                conn.send(("error", traceback.format_exc()))
            finally:
                for undo in reversed(cleanup):
                    with contextlib.suppress(Exception):
                        undo()
    finally:
        kv.close()


class Workers(CommitWorkers):
    """The scheduler processes (spawned once, reused by every round)."""

    def __init__(self, endpoint: str, count: int) -> None:
        super().__init__(endpoint, count, worker_main, "scheduler")

    def run_jobs(self, jobs: Sequence[tuple[str, dict[str, Any], float]], seconds: float,
                 meter: CpuMeter, on_start: Callable[[], None] = lambda: None,
                 ) -> tuple[float, list[dict[str, Any]], dict[str, float | None]]:
        """Worker i runs jobs[i] = (kind, params, extra seconds); the workers are
        prepared one after the other in order (a follower is listening before the
        committer starts), then ``on_start()`` runs and all start at t0. Returns t0,
        results, CPU seen."""
        for i, (kind, params, _) in enumerate(jobs):
            self.conns[i].send((kind, params))
            self._recv(i, REPLY_SLACK)
        on_start()
        t0 = time.monotonic() + 0.05
        meter.start()
        for i, (_, _, extra) in enumerate(jobs):
            self.conns[i].send(("go", t0, t0 + seconds + extra))
        results = [self._recv(i, seconds + jobs[i][2] + REPLY_SLACK)[1]
                   for i in range(len(jobs))]
        return t0, results, meter.stop()


def emit_goals(rounds: Sequence[dict[str, Any]], emit: Callable[[str], None]) -> None:
    """Issue 35's goals (and the service's old one: half the direct rate). A run may
    hold several leader rounds (``--paths`` lists a path more than once): each goal is
    judged on their median, with every round's figure shown."""
    leads = [r for r in rounds if r["path"] == "leader" and r["processes"] == GOAL_PROCESSES]
    if leads:
        anchors = ", ".join(f"{name} {rate:,}/s" for name, rate in ANCHORS)
        rates = ", ".join(f"{r['placements_per_s']:,.0f}" for r in leads)
        emit(f"leader, {GOAL_PROCESSES} processes: {rates} placements/s (anchors: "
             f"{anchors}; other% {_pct(leads[0]['other_cpu_pct']).strip()})")
        # (what, the rounds' field, bound, whether the figure must be at least the bound)
        checks: list[tuple[str, str, float, bool]] = [
            (f"goal 1: >= {GOAL_OVER_RAW} of raw etcd's minimal Txn", "over_raw",
             GOAL_OVER_RAW, True),
            (f"goal 2: >= {GOAL_OVER_DIRECT:g}x the direct committers", "over_direct",
             GOAL_OVER_DIRECT, True),
            (f"goal 3: <= {GOAL_TXNS} etcd Txns per commit", "etcd_txns_per_commit",
             GOAL_TXNS, False),
        ]
        for what, field, bound, at_least in checks:
            emit(f"{what}: {goal_verdict([r[field] for r in leads], bound, at_least)}")
    for r in rounds:
        if r["path"] == "no-lead" and r["over_direct"] is not None:
            emit(f"service without a leader, {r['processes']} process(es): "
                 f"{r['over_direct']:.2f} of the direct rate (its goal: >= {GOAL_RATIO})")


def goal_verdict(values: Sequence[float | None], bound: float, at_least: bool) -> str:
    """The figures of a goal's rounds and the verdict on their median ("not measured"
    where no round measured it), with how many rounds passed alone."""
    got = sorted(v for v in values if v is not None)
    if not got:
        return "- -> not measured"
    def ok(v: float) -> bool:
        return v >= bound if at_least else v <= bound
    mid = statistics.median(got)
    shown = ", ".join(f"{v:.2f}" for v in values if v is not None)
    return (f"{shown} (median {mid:.2f}; {sum(map(ok, got))} of {len(got)} rounds pass) "
            f"-> {'PASS' if ok(mid) else 'MISS'}")


# -- the server process --------------------------------------------------------------------


class Server:
    """``omega server`` for one cell, as a child process that dies with us."""

    def __init__(self, etcd: str, cell: str, log_dir: Path, *extra: str,
                 tree: str | None = None, floor: str | None = None) -> None:
        port = free_ports(1)[0]
        self.address = f"127.0.0.1:{port}"
        # -v: the leader logs its batches when it stops (--keep-logs shows them).
        # ``tree``: the server's code from another checkout (--baseline).
        # ``floor``: the server with the floor's Commit (benchmarks/_leader_floor.py).
        args = ("-v", "server", "--etcd", etcd, "--listen", self.address, "--cell", cell,
                "--insecure", *extra)
        command = (omega(*args) if floor is None else
                   [sys.executable, str(_HERE / "_leader_floor.py"), floor, *args])
        # The floor's server writes its stages' CPU here when it exits.
        self.stages = log_dir / f"stages-{cell}.json" if floor is not None else None
        env = ({"PYTHONPATH": tree, "PYTHONSAFEPATH": "1"} if tree else
               {STAGES_ENV: str(self.stages)} if self.stages is not None else None)
        self.child = Child(f"server-{cell}", command,
            log_dir / f"server-{cell}.log",
            # PYTHONSAFEPATH: ``python -m`` puts the working directory first on sys.path
            # otherwise, and run from this checkout's root that is this tree's code.
            env=env)
        try:
            wait_until_serving(self.address, timeout=60, alive=self.child.running)
        except Exception:
            tail = self.child.log_tail()
            self.child.stop()
            raise RuntimeError(f"the server for {cell} did not start:\n{tail}") from None

    @property
    def pid(self) -> int:
        return self.child.pid

    def stop(self) -> None:
        code = self.child.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"warning: server exited with {code}:\n{self.child.log_tail()}",
                  file=sys.stderr)

    def stage_cpu(self) -> dict[str, float]:
        """After ``stop``: the floor's server's CPU seconds per stage of a commit
        (benchmarks/_leader_floor.py), {} for a plain server."""
        if self.stages is None or not self.stages.exists():
            return {}
        doc = json.loads(self.stages.read_text())
        return {k: float(v) for k, v in doc["seconds"].items()}


# -- etcd's own counters -------------------------------------------------------------------


def etcd_counters(endpoint: str) -> dict[str, float]:
    """etcd's counts of Txn calls answered (read-only ones included) and of raft
    proposals committed (every write, a Txn whose compares failed included), from its
    /metrics page on the client port."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as f:
        text = f.read().decode()
    out = {"txns": 0.0, "proposals": 0.0}
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total{") and 'grpc_method="Txn"' in line:
            out["txns"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("etcd_server_proposals_committed_total "):
            out["proposals"] = float(line.rsplit(" ", 1)[1])
    return out


# -- CPU and load ---------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of a process; None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by thread name (those of one name added up:
    Python's threads all read ``python``, gRPC's C threads name themselves)."""
    out: dict[str, float] = collections.defaultdict(float)
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    head, _, tail = f.read().rpartition(")")
                stat = tail.split()
                out[head.partition("(")[2]] += (int(stat[11]) + int(stat[12])) / _TICK
            except (OSError, ValueError, IndexError):
                continue
    return dict(out)


def _all_cpu() -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                text = f.read()
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            out[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
        except (OSError, ValueError, IndexError):
            continue
    return out


def busiest_others(ours: set[int], seconds: float = 1.0) -> list[tuple[str, int, float]]:
    """Processes outside the benchmark by CPU share (% of one core) over ``seconds``."""
    if not os.path.isdir("/proc"):
        return []
    before = _all_cpu()
    time.sleep(seconds)
    after = _all_cpu()
    rows = []
    for pid, (name, cpu) in after.items():
        if pid in ours or pid not in before:
            continue
        pct = 100 * (cpu - before[pid][1]) / seconds
        if pct >= 1.0:
            rows.append((name, pid, pct))
    return sorted(rows, key=lambda r: -r[2])[:5]


def describe_load(when: str, ours: set[int]) -> tuple[str, dict[str, Any]]:
    load = os.getloadavg()
    others = busiest_others(ours)
    listed = ", ".join(f"{name} (pid {pid}) {pct:.0f}%" for name, pid, pct in others)
    text = (f"load {when}: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
            f"other processes over 1 s: {listed or 'none above 1% of a core'}")
    return text, {"load_average": load, "others": [
        {"name": n, "pid": p, "pct_of_core": round(c, 1)} for n, p, c in others]}


# -- figures -------------------------------------------------------------------------------


def summarize(t0: float, results: Sequence[dict[str, Any]], cpu: dict[str, float | None],
              server_cpu_s: float | None, etcd_delta: dict[str, float] | None = None,
              ) -> dict[str, Any]:
    wall = max(r["end"] for r in results) - t0
    lat = sorted(x for r in results for x in r["latencies"])
    commits = sum(r["commits"] for r in results)
    committed = sum(r["committed"] for r in results)
    rejected = sum(r["rejected"] for r in results)
    client_cpu = sum(r["cpu_s"] for r in results)
    etcd_cpu = cpu.get("etcd_cpu_s")

    def per_commit(total: float | None) -> float | None:
        return None if total is None else 1e3 * total / max(1, commits)

    busy = [x for x in (client_cpu, server_cpu_s, etcd_cpu) if x is not None]
    return {
        "wall_s": wall,
        "placements_per_s": committed / wall,
        "commits_per_s": commits / wall,
        "p50_ms": percentile(lat, 0.50) * 1e3,
        "p99_ms": percentile(lat, 0.99) * 1e3,
        "committed": committed,
        "rejected": rejected,
        "commits": commits,
        # etcd's own count when there is one (the service paths' Txns are the server's).
        "etcd_txns_per_commit": (etcd_delta["txns"] / max(1, commits) if etcd_delta
                                 else sum(r["attempts"] for r in results) / max(1, commits)),
        "etcd_writes_per_commit": (etcd_delta["proposals"] / max(1, commits)
                                   if etcd_delta else None),
        "rejected_pct": 100.0 * rejected / max(1, committed + rejected),
        "client_cpu_ms_per_commit": per_commit(client_cpu),
        "server_cpu_ms_per_commit": per_commit(server_cpu_s),
        "etcd_cpu_ms_per_commit": per_commit(etcd_cpu),
        "cores_used": sum(busy) / wall,
        "other_cpu_pct": cpu.get("other_cpu_pct"),
    }


def sync_latencies(commits: Sequence[tuple[int, float, float]],
                   arrivals: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """For each commit: first arrival at or past its revision, minus its reply time
    (and minus its send time)."""
    arrivals = sorted(arrivals)
    revs = [r for r, _ in arrivals]
    times = [t for _, t in arrivals]
    # Revisions only grow, so the earliest arrival at or past r is a suffix minimum.
    earliest = times[:]
    for i in range(len(earliest) - 2, -1, -1):
        earliest[i] = min(earliest[i], earliest[i + 1])
    from_reply: list[float] = []
    from_send: list[float] = []
    missing = 0
    for rev, sent, replied in commits:
        i = bisect.bisect_left(revs, rev)
        if i == len(revs):
            missing += 1
            continue
        from_reply.append(earliest[i] - replied)
        from_send.append(earliest[i] - sent)
    from_reply.sort()
    from_send.sort()
    rtt = sorted(replied - sent for _, sent, replied in commits)
    return {
        "commits": len(commits), "missing": missing,
        "p50_ms": percentile(from_reply, 0.50) * 1e3,
        "p99_ms": percentile(from_reply, 0.99) * 1e3,
        "max_ms": (from_reply[-1] * 1e3) if from_reply else float("nan"),
        "from_send_p50_ms": percentile(from_send, 0.50) * 1e3,
        "from_send_p99_ms": percentile(from_send, 0.99) * 1e3,
        "commit_p50_ms": percentile(rtt, 0.50) * 1e3,
        "commit_p99_ms": percentile(rtt, 0.99) * 1e3,
        "negative": sum(1 for x in from_reply if x < 0),
    }


def _ms(value: float | None, width: int = 7) -> str:
    return f"{'?':>{width}}" if value is None else f"{value:>{width}.1f}"


def _pct(value: float | None) -> str:
    return f"{'?':>6}" if value is None else f"{value:>6.0f}"


HEADER = (f"{'path':<12} {'proc':>4} {'place/s':>8} {'commit/s':>8} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'rej%':>5} {'txn/c':>5} {'wr/c':>5} {'sch ms':>7} {'srv ms':>7} "
          f"{'etcd ms':>7} {'cores':>5} {'/raw':>5} {'/dir':>5} {'other%':>6}")


def _ratio(value: float | None) -> str:
    return f"{'-' if value is None else f'{value:.2f}':>5}"


def row(path: str, n: int, s: dict[str, Any], over_raw: float | None,
        over_direct: float | None) -> str:
    wr = s.get("etcd_writes_per_commit")
    return (f"{path:<12} {n:>4} {s['placements_per_s']:>8.0f} {s['commits_per_s']:>8.1f} "
            f"{s['p50_ms']:>7.1f} {s['p99_ms']:>7.1f} {s['rejected_pct']:>5.1f} "
            f"{s['etcd_txns_per_commit']:>5.2f} {'-' if wr is None else f'{wr:.2f}':>5} "
            f"{_ms(s['client_cpu_ms_per_commit'])} "
            f"{_ms(s['server_cpu_ms_per_commit'])} {_ms(s['etcd_cpu_ms_per_commit'])} "
            f"{s['cores_used']:>5.2f} {_ratio(over_raw)} {_ratio(over_direct)} "
            f"{_pct(s['other_cpu_pct'])}")


# -- py-spy ----------------------------------------------------------------------------------


class PySpy:
    """``py-spy record`` on one process for a fixed time, collapsed stacks to a file."""

    def __init__(self, pid: int, seconds: float, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        exe = shutil.which("py-spy")
        if exe is None:
            print("warning: --py-spy given but py-spy is not installed", file=sys.stderr)
            return
        self.proc = subprocess.Popen(
            # --gil: only the thread holding the GIL, i.e. where the Python CPU goes
            # (without it, threads blocked in C (gRPC, locks) count as busy, and
            # --nonblocking under load caught almost no samples).
            [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
             "--rate", "250", "--format", "raw", "--output", str(out), "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self) -> bool:
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.out.exists()


def top_frames(path: Path, count: int = 12) -> tuple[list[tuple[str, float]],
                                                   list[tuple[str, float]]]:
    """From py-spy's collapsed stacks (threads on the CPU only): the functions most often
    on top of the stack (self %) and most often anywhere on it (total %), as shares of
    all samples."""
    on_top: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        samples = int(n)
        total += samples
        on_top[frames[-1]] += samples
        for f in set(frames):
            if not f.startswith(("process ", "thread ")):
                anywhere[f] += samples
    if not total:
        return [], []
    return ([(f, 100 * n / total) for f, n in on_top.most_common(count)],
            [(f, 100 * n / total) for f, n in anywhere.most_common(count)])


# -- the benchmark -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="short rounds (1.5 s each), for a smoke check")
    ap.add_argument("--seconds", type=float,
                    help="seconds per throughput round (default 5; 1.5 with --quick)")
    ap.add_argument("--no-fsync", action="store_true",
                    help="run etcd with --unsafe-no-fsync (default: fsync on, as in production)")
    ap.add_argument("--batch", type=int, default=50, help="claims per transaction (B)")
    ap.add_argument("--max-txn-ops", type=int, default=DEFAULT_MAX_TXN_OPS,
                    help="etcd's --max-txn-ops (ops per Txn; every client learns it from "
                    f"etcd; default {DEFAULT_MAX_TXN_OPS})")
    ap.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                    help=f"rounds per process count, in order (default "
                    f"{','.join(DEFAULT_PATHS)}): raw etcd, direct committers, the service "
                    "with its commit leader (one batch at a time, the default), that leader "
                    "pipelined (--commit-pipeline), the service without one "
                    f"(--no-commit-leader); also {', '.join(FLOORS)}: the leader's floor "
                    "(benchmarks/_leader_floor.py)")
    ap.add_argument("--processes", default=",".join(map(str, PROCESS_COUNTS)),
                    help="scheduler process counts, comma-separated (default 1,2,4)")
    ap.add_argument("--machines", type=int, default=MACHINES)
    ap.add_argument("--sync-rate", type=float, default=SYNC_RATE,
                    help=f"commits per second in the sync-latency rounds (default {SYNC_RATE:g})")
    ap.add_argument("--sync-seconds", type=float,
                    help="seconds of each sync-latency round (default 10; 2 with --quick)")
    ap.add_argument("--direct-follow", action="store_true",
                    help="direct committers' stores follow a Replica of the cell, as the "
                         "server's store handles do (commit_throughput's --follow-replica)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline", metavar="DIR",
                    help="another checkout of this repository (git worktree or archive): "
                    "a path named with @base (leader@base, pipe@base, no-lead@base) runs "
                    "its server from DIR, with the leader's mode given explicitly, to "
                    "compare two versions of the server in one run")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the servers' logs (their folder is printed at the end); a "
                    "leader's log says how many commits its batches held and how busy it was")
    ap.add_argument("--json", metavar="OUT", help="also write every figure to this file")
    ap.add_argument("--py-spy", metavar="DIR", dest="pyspy",
                    help="record the server with py-spy during every service round")
    args = ap.parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.5 if args.quick else 5.0
    if args.sync_seconds is None:
        args.sync_seconds = 2.0 if args.quick else 10.0
    try:
        counts = sorted({int(x) for x in args.processes.split(",") if x.strip()})
    except ValueError:
        ap.error("--processes takes comma-separated integers")
    if not counts or counts[0] < 1:
        ap.error("--processes takes positive integers")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p.removesuffix("@base") not in PATHS
               or (p.endswith("@base") and (p in ("raw@base", "direct@base")
                                            or p.removesuffix("@base") in FLOORS
                                            or not args.baseline))]
    if unknown or not paths:
        ap.error(f"--paths: {', '.join(unknown) or 'none given'}: each one of "
                 f"{', '.join(PATHS)} (or leader, pipe, no-lead with @base, given "
                 "--baseline)")
    if args.baseline and not (Path(args.baseline) / "cellstate" / "api" / "server.py").is_file():
        ap.error(f"--baseline {args.baseline}: not a checkout of this repository "
                 "(no cellstate/api/server.py)")
    if args.sync_rate <= 0 or args.batch < 1:
        ap.error("--sync-rate and --batch must be positive")
    if not 16 <= args.max_txn_ops <= 100_000:
        ap.error(f"--max-txn-ops: {args.max_txn_ops} is not between 16 and 100000")
    if args.pyspy:
        os.makedirs(args.pyspy, exist_ok=True)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    command = " ".join(["python", "benchmarks/service_throughput.py",
                        *(sys.argv[1:] if argv is None else argv)])
    out: dict[str, Any] = {
        "benchmark": "service_throughput", "command": command,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "seconds": args.seconds, "batch": args.batch, "machines": args.machines,
        "fsync": not args.no_fsync, "max_txn_ops": args.max_txn_ops,
        "sync_rate": args.sync_rate,
        "sync_seconds": args.sync_seconds, "direct_follow": args.direct_follow,
        "rounds": [], "sync": {},
    }
    lines: list[str] = []

    def emit(line: str = "") -> None:
        lines.append(line)
        print(line, flush=True)

    text, out["load_before"] = describe_load("before start", {os.getpid()})
    emit(text)
    log_dir = Path(tempfile.mkdtemp(prefix="svc-bench-"))
    etcd: LocalEtcd | None = None
    workers: Workers | None = None
    kv: EtcdKV | None = None
    server: Server | None = None
    meter = CpuMeter()
    cell_no = iter(range(1_000_000))
    started = time.monotonic()
    try:
        etcd = LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True,
                         max_txn_ops=args.max_txn_ops)
        etcd.start()
        out["etcd_version"] = etcd.version
        kv = EtcdKV([etcd.endpoint])
        workers = Workers(etcd.endpoint, max(max(counts), 2))
        worker_pids = [p.pid for p in workers.procs if p.pid is not None]
        meter.pids.extend(worker_pids)
        meter.etcd_pid = etcd.pid
        ours = {os.getpid(), *worker_pids, *([etcd.pid] if etcd.pid else [])}

        emit(f"service throughput: {args.machines} machines (cpu={MACHINE_CPU:g}, "
             f"mem={MACHINE_MEM:g}), tasks cpu={TASK_CPU:g} mem={TASK_MEM:g}, "
             f"B={args.batch} claims per transaction (incremental, fine), "
             f"{args.seconds:g} s per round; direct stores "
             + ("follow a replica (--direct-follow)" if args.direct_follow else
                "learn others' writes from failed guards (no replica), the server's follow "
                "its replica"))
        emit(f"host: {os.cpu_count()} cores, Python {platform.python_version()}; etcd "
             f"{etcd.version}, fsync {'OFF (--unsafe-no-fsync)' if args.no_fsync else 'on'}, "
             f"--max-txn-ops={args.max_txn_ops}; "
             "server: one `omega server` process (4 store handles)")
        if etcd.version in UNSAFE_VERSIONS:
            emit(f"note: etcd {etcd.version} is fine for a benchmark, not for production")
        emit("place/s = committed claims per second of wall time over all processes; "
             "rej = claims rejected; txn/c = etcd Txns per commit; sch/srv/etcd ms = CPU ms "
             "per commit of the scheduler processes, the server, etcd; cores = their CPU over "
             "wall time; svc/dir = service place/s over direct place/s (same N, same run); "
             "other% = share of all cores used by processes outside the benchmark")
        emit()
        emit(HEADER)

        def new_cell(n: int) -> str:
            assert kv is not None
            cell = f"svc-bench-{next(cell_no)}"
            setup_cell(kv, cell, args.machines, n)
            return cell

        def drop_cell(cell: str) -> None:
            assert kv is not None
            delete_prefix(kv, CellStore(kv, cell).keys.root)

        def timed(jobs: list[tuple[str, dict[str, Any], float]],
                  server: Server | None = None) -> dict[str, Any]:
            """Run one round; its figures with etcd's counts over it."""
            assert etcd is not None and workers is not None
            before: dict[str, float] = {}

            def start() -> None:  # after the workers loaded their cells
                assert etcd is not None
                before.update(etcd_counters(etcd.endpoint))

            cpu_before = proc_cpu_s(server.pid) if server is not None else None
            threads_before = thread_cpu_s(server.pid) if server is not None else {}
            t0, results, cpu = workers.run_jobs(jobs, args.seconds, meter, start)
            after = etcd_counters(etcd.endpoint)
            cpu_after = proc_cpu_s(server.pid) if server is not None else None
            threads = ({k: v - threads_before.get(k, 0.0)
                        for k, v in thread_cpu_s(server.pid).items()}
                       if server is not None else {})
            server_cpu = (None if cpu_before is None or cpu_after is None
                          else cpu_after - cpu_before)
            delta = {k: after[k] - before[k] for k in after}
            fig = summarize(t0, results, cpu, server_cpu, delta)
            if threads:
                fig["server_threads_cpu_s"] = {k: round(v, 2) for k, v in
                                               sorted(threads.items(), key=lambda kv: -kv[1])}
            return fig

        for n in counts:
            base: dict[str, dict[str, Any]] = {}
            for path in paths:
                cell = new_cell(n) if path != "raw" else ""
                seeds = [args.seed + 1000 * n + i for i in range(n)]
                spy: PySpy | None = None
                if path == "raw":
                    prefix = f"/omega/svc-raw-{n}/".encode()
                    jobs = [("raw", {"prefix": prefix + b"w%d/" % i, "machines": args.machines,
                                     "batch": args.batch, "seed": seeds[i]}, 0.0)
                            for i in range(n)]
                    fig = timed(jobs)
                    delete_prefix(kv, prefix)
                elif path == "direct":
                    # Today's path: the commit benchmark's committer loop, in these processes.
                    jobs = [("direct", {"cell": cell, "committer": i, "batch": args.batch,
                                        "seed": seeds[i], "follow": args.direct_follow}, 0.0)
                            for i in range(n)]
                    fig = timed(jobs)
                else:
                    # Through an `omega server`: with its commit leader (one batch at a
                    # time, the default), its leader pipelined (pipe), or (no-lead)
                    # committing on its own store handles as before issue 35.
                    from_baseline = path.endswith("@base")
                    kind = path.removesuffix("@base")
                    extra = {"no-lead": ("--no-commit-leader",),
                             "pipe": ("--commit-pipeline",),
                             # The baseline's default may differ: say which leader.
                             "leader": ("--no-commit-pipeline",) if from_baseline else (),
                             "leader-timed": (),
                             }.get(kind, ("--no-commit-leader",))  # the floors commit alone
                    server = Server(etcd.endpoint, cell, log_dir, *extra,
                                    tree=args.baseline if from_baseline else None,
                                    floor=kind if kind in FLOORS else None)
                    meter.pids.append(server.pid)
                    jobs = [("service", {"cell": cell, "committer": i, "batch": args.batch,
                                         "seed": seeds[i], "address": server.address}, 0.0)
                            for i in range(n)]
                    if args.pyspy:
                        spy = PySpy(server.pid, args.seconds,
                                    Path(args.pyspy) / f"server-{path}-{n}p.txt")
                    fig = timed(jobs, server)
                    meter.pids.remove(server.pid)
                    server.stop()
                    stages = server.stage_cpu()
                    if stages:
                        fig["stage_cpu_ms_per_commit"] = {
                            k: round(1e3 * v / max(1, fig["commits"]), 2)
                            for k, v in sorted(stages.items(), key=lambda kv: -kv[1])}
                    server = None
                if cell:
                    drop_cell(cell)
                base[path] = fig
                over_raw = (fig["placements_per_s"] / max(1e-9, base["raw"]["placements_per_s"])
                            if "raw" in base and path != "raw" else None)
                over_direct = (fig["placements_per_s"]
                               / max(1e-9, base["direct"]["placements_per_s"])
                               if "direct" in base and path not in ("raw", "direct") else None)
                emit(row(path, n, fig, over_raw, over_direct))
                if fig.get("stage_cpu_ms_per_commit"):
                    emit("  server stages, CPU ms per commit (inclusive): " + ", ".join(
                        f"{k} {v:.2f}" for k, v in fig["stage_cpu_ms_per_commit"].items()))
                if ((args.pyspy or path in FLOORS)
                        and fig.get("server_threads_cpu_s")):
                    emit("  server CPU s by thread: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in fig["server_threads_cpu_s"].items() if v))
                out["rounds"].append({"path": path, "processes": n, "over_raw": over_raw,
                                      "over_direct": over_direct, **fig})
                if spy is not None and spy.wait():
                    out.setdefault("py_spy", {})[f"{path} {n}"] = str(spy.out)

        # Sync latency: a paced committer and a follower in another process.
        emit()
        emit(f"sync latency: one process commits {args.sync_rate:g} transactions/s of "
             f"B={args.batch} claims ({args.sync_rate * args.batch:,.0f} placements/s) for "
             f"{args.sync_seconds:g} s; another process's local copy: time from the commit's reply "
             "to the copy having applied it")
        emit(f"{'follower':<22} {'commits':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
             f"{'<0':>4} {'from send p50/p99':>18} {'commit p50/p99':>15} {'other%':>6}")
        for path in ("service", "direct"):
            cell = new_cell(1)
            params: dict[str, Any] = {"cell": cell, "committer": 0, "batch": args.batch,
                                      "rate": args.sync_rate, "seed": args.seed}
            if path == "service":
                server = Server(etcd.endpoint, cell, log_dir)
                meter.pids.append(server.pid)
                params["address"] = server.address
            # The follower (worker 1) is prepared, loaded and listening first.
            jobs = [(f"follow-{path}", params, SYNC_TAIL), (f"paced-{path}", params, 0.0)]
            _, results, cpu = workers.run_jobs(jobs, args.sync_seconds, meter)
            if server is not None:
                meter.pids.remove(server.pid)
                server.stop()
                server = None
            drop_cell(cell)
            s = sync_latencies(results[1]["commits"], results[0]["arrivals"])
            s["other_cpu_pct"] = cpu.get("other_cpu_pct")
            s["rejected"] = results[1]["rejected"]
            out["sync"][path] = s
            name = "remote_replica (sync)" if path == "service" else "Replica (etcd watch)"
            emit(f"{name:<22} {s['commits']:>7} {s['p50_ms']:>7.2f} {s['p99_ms']:>7.2f} "
                 f"{s['max_ms']:>7.2f} {s['negative']:>4} "
                 f"{s['from_send_p50_ms']:>8.2f}/{s['from_send_p99_ms']:<9.2f} "
                 f"{s['commit_p50_ms']:>6.2f}/{s['commit_p99_ms']:<8.2f} "
                 f"{_pct(s['other_cpu_pct'])}")
            if s["missing"]:
                emit(f"warning: {s['missing']} commit(s) never reached the {path} follower")

        emit()
        emit_goals(out["rounds"], emit)
        p99 = out["sync"]["service"]["p99_ms"]
        emit(f"sync goal: p99 < {GOAL_SYNC_P99_MS:g} ms through the service at "
             f"{args.sync_rate:g} commits/s: {p99:.2f} ms (direct etcd replica: "
             f"{out['sync']['direct']['p99_ms']:.2f} ms) -> "
             f"{'PASS' if p99 < GOAL_SYNC_P99_MS else 'MISS'}")
        noisy = [f"{r['path']} {r['processes']}p {r['other_cpu_pct']:.0f}%"
                 for r in out["rounds"]
                 if r["other_cpu_pct"] is not None and r["other_cpu_pct"] > NOISY_PCT]
        noisy += [f"sync {p} {s['other_cpu_pct']:.0f}%" for p, s in out["sync"].items()
                  if s["other_cpu_pct"] is not None and s["other_cpu_pct"] > NOISY_PCT]
        if noisy:
            emit(f"warning: other processes used more than {NOISY_PCT:g}% of the CPU during "
                 f"({', '.join(noisy)}): the machine was shared; compare within this run only")
        text, out["load_after"] = describe_load("at the end", ours)
        emit(text)
        for n, path in sorted(out.get("py_spy", {}).items()):
            emit()
            by_self, by_total = top_frames(Path(path))
            emit(f"server profile, {n} process(es) (py-spy, {path}), % of on-CPU samples; "
                 "on top of the stack (self):")
            for frame, pct in by_self:
                emit(f"  {pct:5.1f}%  {frame}")
            emit("  anywhere on the stack (total):")
            for frame, pct in by_total:
                emit(f"  {pct:5.1f}%  {frame}")
        emit(f"total time {time.monotonic() - started:.0f} s")
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the workers, the server and etcd", file=sys.stderr)
        return 130
    finally:
        if server is not None:
            server.stop()
        if workers is not None:
            workers.stop()
        if kv is not None:
            kv.close()
        if etcd is not None:
            etcd.stop()
        if args.keep_logs:
            print(f"server logs kept in {log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    out["table"] = lines
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps({k: v for k, v in out.items() if k != "table"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

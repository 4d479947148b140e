#!/usr/bin/env python
"""Soak: etcd's database size under sustained commits, with compaction and maintenance.

    python benchmarks/soak.py [--minutes 30] [--committers 2] [--sample 30] [--json out.json]

Starts its own etcd (``LocalEtcd`` with the production flags: fsync on, periodic
auto-compaction, the space quota; ``--no-fsync`` turns fsync off) and the maintenance
loop a cellstate server runs (:class:`cellstate.maintenance.Maintainer`), fills a cell
of ``--machines`` machines and then keeps it at a steady utilization: each committer
process (``commit_throughput.Workers``, one job each) commits incremental transactions
of ``--batch`` claims on random machines and, once it has ``--utilization`` of the cell's
CPU (its share) running, releases its oldest task for every new one, one etcd
transaction per release as an agent reports it. Every ``--sample`` seconds it reads the
member's ``dbSize`` (the file, what the quota counts), ``dbSizeInUse``, the revision and
the maintenance loop's actions, and prints a row; at the end it says whether the size
levelled off under ``--bound-mib`` and writes everything to ``--json``.

Released tasks: ``--finished recycle`` (default) reports them lost, which makes their
index claimable again, so each committer cycles through a fixed set of task records
and the cell's live data stays constant: what is left to grow is etcd's history, the
thing compaction and defragmentation must bound. ``--finished keep`` reports them
finished, as agents do; every finished task's record then stays in the cell for good
(nothing deletes finished jobs' records), and the live data grows with every task run.

"Levelled off": the largest file size of the last third of the run is at most
``--level-tolerance`` (5%) above that of the middle third, and no sample exceeded the
bound. Bytes written are the keys and values of the puts of every committed etcd
transaction (placements and releases), as the store sent them.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import random
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT, _ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from commit_throughput import (  # noqa: E402
    CountingKV,
    CpuMeter,
    Workers,
    job_id,
    percentile,
    scheduler_name,
)

from cellstate.kv.etcd import EtcdKV, EtcdNoSpaceError  # noqa: E402
from cellstate.maintenance import (  # noqa: E402
    DEFAULT_QUOTA_BACKEND_BYTES,
    Maintainer,
    MaintenancePolicy,
    MaintenanceReport,
)
from cellstate.model import (  # noqa: E402
    Claim,
    Detection,
    Job,
    Machine,
    Resources,
    TaskState,
    Transaction,
    TxnMode,
)
from cellstate.store import CellStore, StoreError  # noqa: E402
from omega.etcd_launcher import (  # noqa: E402
    AUTO_COMPACTION_MODE,
    DEFAULT_AUTO_COMPACTION_RETENTION,
    LocalEtcd,
)

MiB = 1024 * 1024
CELL = "soak"
MACHINE_CPU, MACHINE_MEM = 32.0, 128.0
TASKS_PER_JOB = 1_000_000
REPLY_SLACK = 300.0


# -- the committer process -------------------------------------------------------------


class SoakCommitter:
    """One committer's state, kept across sample rounds: its running tasks (oldest
    first) and the task indices it may claim next."""

    def __init__(self, kv: EtcdKV, p: dict[str, Any], wid: int) -> None:
        self.counting = CountingKV(kv)
        self.store = CellStore(self.counting, p["cell"])
        self.job, self.sched = job_id(wid), scheduler_name(wid)
        self.target = int(p["running"])
        self.batch = int(p["batch"])
        self.outcome = TaskState.LOST if p["recycle"] else TaskState.FINISHED
        self.recycle = bool(p["recycle"])
        self.rng = random.Random(p["seed"])
        self.running: collections.deque[tuple[int, str]] = collections.deque()
        self.free: collections.deque[int] = collections.deque()  # pending indices to reuse
        self.next_index = 0
        self.store.load()
        self.mids = sorted(self.store.view.machines)

    def _indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch and self.free:
            out.append(self.free.popleft())
        while len(out) < self.batch:
            out.append(self.next_index)
            self.next_index += 1
        return out

    def run(self, t0: float, deadline: float) -> dict[str, Any]:
        self.counting.reset()
        placed = rejected = released = commits = nospace = release_errors = 0
        latencies: list[float] = []
        pause = t0 - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        cpu0 = time.process_time()
        while time.monotonic() < deadline:
            machines = self.store.view.machines
            indices = self._indices()
            claims = tuple(Claim(self.job, i, mid, machines[mid].seq)
                           for i, mid in zip(indices, self.rng.choices(self.mids, k=len(indices)),
                                             strict=True))
            started = time.perf_counter()
            try:
                res = self.store.commit(Transaction(self.sched, claims, TxnMode.INCREMENTAL,
                                                    Detection.FINE))
            except EtcdNoSpaceError:
                nospace += 1
                self.free.extendleft(reversed(indices))
                time.sleep(1.0)  # etcd is read-only: wait for the maintenance loop
                continue
            latencies.append(time.perf_counter() - started)
            commits += 1
            placed += len(res.committed)
            rejected += len(res.rejected)
            self.running.extend((c.index, c.machine) for c in res.committed)
            self.free.extend(r.claim.index for r in res.rejected)
            while len(self.running) > self.target and time.monotonic() < deadline:
                index, mid = self.running[0]
                try:
                    self.store.release_task(f"{self.job}/{index}", self.outcome, mid)
                except EtcdNoSpaceError:
                    nospace += 1
                    time.sleep(1.0)
                    continue
                except StoreError:
                    release_errors += 1
                self.running.popleft()
                released += 1
                if self.recycle:
                    self.free.append(index)
        lat = sorted(latencies)
        c = self.counting
        return {
            "placed": placed, "rejected": rejected, "released": released, "commits": commits,
            "nospace_errors": nospace, "release_errors": release_errors,
            "write_txns": c.write_txns, "failed_write_txns": c.failed_write_txns,
            "put_bytes": c.ok_bytes, "puts": c.ok_puts, "running": len(self.running),
            "task_records": self.next_index, "commit_p50_ms": percentile(lat, 0.5) * 1e3,
            "commit_p99_ms": percentile(lat, 0.99) * 1e3, "cpu_s": time.process_time() - cpu0,
            "end": time.monotonic(),
        }


def soak_worker(conn: Connection, endpoint: str, wid: int) -> None:
    """A committer process (``Workers`` target): rounds of ``run`` on one SoakCommitter."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    kv = EtcdKV([endpoint], timeout=30.0)
    committer: SoakCommitter | None = None
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            try:
                if committer is None:
                    committer = SoakCommitter(kv, msg[1], wid)
                conn.send(("ready",))
                go = conn.recv()
                if go[0] == "stop":
                    return
                conn.send(("result", committer.run(go[1], go[2])))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    finally:
        kv.close()


# -- setup and sampling ------------------------------------------------------------------


def setup_cell(kv: EtcdKV, machines: int, committers: int, task: Resources) -> None:
    store = CellStore(kv, CELL)
    cap = Resources.of(cpu=MACHINE_CPU, mem=MACHINE_MEM)
    store.add_machines([Machine(f"m{i:05d}", cap) for i in range(machines)])
    for c in range(committers):
        store.submit_job(Job(job_id(c), "soak", scheduler_name(c), TASKS_PER_JOB, task))


def levelled_off(sizes: Sequence[int], bound: int, tolerance: float) -> tuple[bool, str]:
    """Whether the series stopped growing under ``bound`` (see the module docstring)."""
    if len(sizes) < 6:
        return False, "too few samples to tell (need at least 6)"
    third = len(sizes) // 3
    middle, last = max(sizes[third:2 * third]), max(sizes[2 * third:])
    peak = max(sizes)
    growth = last / middle - 1 if middle else float("inf")
    ok = peak <= bound and growth <= tolerance
    why = (f"peak {peak / MiB:.0f} MiB vs bound {bound / MiB:.0f} MiB; largest of the last "
           f"third {last / MiB:.0f} MiB vs middle third {middle / MiB:.0f} MiB "
           f"({100 * growth:+.1f}%, tolerance {100 * tolerance:.0f}%)")
    return ok, why


HEADER = (f"{'min':>5} {'revision':>9} {'rev/s':>6} {'place/s':>7} {'rel/s':>6} "
          f"{'MiB/s wr':>8} {'dbSize':>7} {'inUse':>7} {'running':>7} {'nospace':>7} "
          f"{'p99 ms':>6} {'other%':>6}  maintenance")


def _fmt_row(s: dict[str, Any]) -> str:
    other = "?" if s["other_cpu_pct"] is None else f"{s['other_cpu_pct']:.0f}"
    return (f"{s['t_s'] / 60:>5.1f} {s['revision']:>9} {s['revisions_per_s']:>6.0f} "
            f"{s['placed_per_s']:>7.0f} {s['released_per_s']:>6.0f} "
            f"{s['written_mib_per_s']:>8.2f} {s['db_size'] / MiB:>7.1f} "
            f"{s['db_size_in_use'] / MiB:>7.1f} {s['running']:>7} {s['nospace_errors']:>7} "
            f"{s['commit_p99_ms']:>6.0f} {other:>6}  {'; '.join(s['maintenance']) or '-'}")


class RecordingMaintainer(Maintainer):
    """The server's maintenance loop, keeping every pass's report (it runs in a thread;
    the sampler takes the actions of the passes since the previous sample)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports: list[MaintenanceReport] = []
        self._taken = 0

    def run_once(self) -> MaintenanceReport:
        report = super().run_once()
        self.reports.append(report)
        return report

    def new_actions(self) -> list[str]:
        reports, self._taken = self.reports[self._taken:], len(self.reports)
        return [a for r in reports for a in (*r.actions, *r.errors)
                if "maintenance lock" not in a]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to commit")
    ap.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--committers", type=int, default=2)
    ap.add_argument("--machines", type=int, default=2000)
    ap.add_argument("--task-cpu", type=float, default=1.0)
    ap.add_argument("--task-mem", type=float, default=2.0)
    ap.add_argument("--utilization", type=float, default=0.5,
                    help="share of the cell's CPU kept running")
    ap.add_argument("--batch", type=int, default=50, help="claims per transaction")
    ap.add_argument("--finished", choices=("recycle", "keep"), default="recycle",
                    help="recycle: report released tasks lost and claim them again (constant "
                         "live data); keep: report them finished (their records stay)")
    ap.add_argument("--retention", type=float, default=DEFAULT_AUTO_COMPACTION_RETENTION,
                    help="auto-compaction retention, seconds")
    ap.add_argument("--revision-compaction", type=int, metavar="N",
                    help="for comparison: etcd's revision mode keeping N revisions (the "
                         "setting before periodic compaction) instead of the launcher's")
    ap.add_argument("--quota-mib", type=float, default=DEFAULT_QUOTA_BACKEND_BYTES / MiB)
    ap.add_argument("--bound-mib", type=float, default=512.0,
                    help="the stated bound the file size must stay under")
    ap.add_argument("--level-tolerance", type=float, default=0.05)
    ap.add_argument("--maintenance-interval", type=float, default=10.0)
    ap.add_argument("--no-maintenance", action="store_true",
                    help="for comparison: no maintenance loop (no defragmentation)")
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    if args.committers < 1 or args.machines < 1 or not 0 < args.utilization < 1:
        ap.error("--committers and --machines must be positive, --utilization in (0, 1)")

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    quota = int(args.quota_mib * MiB)
    bound = int(args.bound_mib * MiB)
    task = Resources.of(cpu=args.task_cpu, mem=args.task_mem)
    per_machine = int(min(MACHINE_CPU / args.task_cpu, MACHINE_MEM / args.task_mem))
    running_total = int(args.utilization * per_machine * args.machines)
    meta: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/soak.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(), "fsync": not args.no_fsync,
        "auto_compaction": (f"revision {args.revision_compaction}" if args.revision_compaction
                            else f"{AUTO_COMPACTION_MODE} {args.retention:g}s"),
        "quota_bytes": quota, "bound_bytes": bound, "running_target": running_total,
        **{k: v for k, v in vars(args).items() if k not in ("json",)},
    }
    samples: list[dict[str, Any]] = []
    server: LocalEtcd | None = None
    kv: EtcdKV | None = None
    workers: Workers | None = None
    maintainer: RecordingMaintainer | None = None
    verdict: dict[str, Any] = {}
    try:
        # etcd takes the last of repeated flags: extra_args override the launcher's.
        compaction = (["--auto-compaction-mode=revision",
                       f"--auto-compaction-retention={args.revision_compaction}"]
                      if args.revision_compaction else [])
        server = LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True,
                           auto_compaction_retention=args.retention, quota_backend_bytes=quota,
                           extra_args=compaction)
        server.start()
        meta.update(etcd_version=server.version, etcd_binary=server.binary)
        kv = EtcdKV([server.endpoint], timeout=30.0)
        setup_cell(kv, args.machines, args.committers, task)
        maintainer = RecordingMaintainer(kv, "soak", MaintenancePolicy(
            interval=args.maintenance_interval, quota_bytes=quota))
        if not args.no_maintenance:
            maintainer.start()
        workers = Workers(server.endpoint, args.committers, target=soak_worker,
                          role="soak-committer")
        meter = CpuMeter()
        meter.pids.extend(p.pid for p in workers.procs if p.pid is not None)
        meter.etcd_pid = server.pid
        load = os.getloadavg()
        emit(f"soak: {args.machines} machines (cpu {MACHINE_CPU:g}, mem {MACHINE_MEM:g}), "
             f"tasks cpu {args.task_cpu:g} mem {args.task_mem:g}, {running_total} kept running "
             f"({100 * args.utilization:.0f}% of the CPU), {args.committers} committer "
             f"process(es), {args.batch} claims per transaction, released tasks "
             f"{'recycled (reported lost)' if args.finished == 'recycle' else 'kept (finished)'}")
        emit(f"etcd {server.version}, fsync {'OFF' if args.no_fsync else 'on'}, "
             f"auto-compaction {meta['auto_compaction']}, quota "
             f"{quota / MiB:.0f} MiB; maintenance "
             f"{'OFF' if args.no_maintenance else f'every {args.maintenance_interval:g} s'}; bound "
             f"{bound / MiB:.0f} MiB; {args.minutes:g} min; host {os.cpu_count()} cores, load "
             f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start (a shared machine)")
        emit("rev/s, place/s, rel/s: per second of the sample; MiB/s wr: keys + values put by "
             "committed etcd Txns; dbSize: the file (quota counts it); inUse: its used part; "
             "other%: CPU share of processes outside the soak")
        emit("")
        emit(HEADER)
        start = time.monotonic()
        end = start + 60 * args.minutes
        share = running_total // args.committers
        params = [{"cell": CELL, "running": share, "batch": args.batch,
                   "recycle": args.finished == "recycle", "seed": args.seed + i}
                  for i in range(args.committers)]
        last_rev = kv.member_status(server.endpoint).revision
        while (now := time.monotonic()) < end:
            seconds = min(args.sample, end - now)
            t0, results, cpu = workers.round("soak", params, seconds, meter)
            wall = max(r["end"] for r in results) - t0
            st = kv.member_status(server.endpoint)
            s = {
                "t_s": time.monotonic() - start, "revision": st.revision,
                "revisions_per_s": (st.revision - last_rev) / wall,
                "placed_per_s": sum(r["placed"] for r in results) / wall,
                "released_per_s": sum(r["released"] for r in results) / wall,
                "written_mib_per_s": sum(r["put_bytes"] for r in results) / wall / MiB,
                "db_size": st.db_size, "db_size_in_use": st.db_size_in_use,
                "running": sum(r["running"] for r in results),
                "task_records": sum(r["task_records"] for r in results),
                "nospace_errors": sum(r["nospace_errors"] for r in results),
                "release_errors": sum(r["release_errors"] for r in results),
                "commit_p99_ms": max(r["commit_p99_ms"] for r in results),
                "other_cpu_pct": cpu["other_cpu_pct"], "etcd_cpu_s": cpu["etcd_cpu_s"],
                "maintenance": maintainer.new_actions(), "workers": results,
            }
            last_rev = st.revision
            samples.append(s)
            emit(_fmt_row(s))
        sizes = [s["db_size"] for s in samples]
        ok, why = levelled_off(sizes, bound, args.level_tolerance)
        written = sum(s["written_mib_per_s"] * args.sample for s in samples)
        load = os.getloadavg()
        verdict = {"levelled_off": ok, "why": why, "peak_db_size": max(sizes, default=0),
                   "final_db_size": sizes[-1] if sizes else 0,
                   "written_mib": written, "load_average_at_end": load,
                   "nospace_errors": sum(s["nospace_errors"] for s in samples)}
        emit("")
        emit(f"written: about {written:.0f} MiB of keys and values in "
             f"{(samples[-1]['t_s'] if samples else 0) / 60:.1f} min; etcd revision "
             f"{samples[-1]['revision'] if samples else 0}; NOSPACE errors seen by committers: "
             f"{verdict['nospace_errors']}; load average {load[0]:.2f} {load[1]:.2f} "
             f"{load[2]:.2f} at the end")
        emit(f"levelled off under {bound / MiB:.0f} MiB: {'YES' if ok else 'NO'} ({why})")
    except KeyboardInterrupt:
        print("\ninterrupted; stopping", file=sys.stderr)
        return 130
    finally:
        if workers is not None:
            workers.stop()
        if maintainer is not None:
            maintainer.stop()
        if kv is not None:
            kv.close()
        if server is not None:
            server.stop()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "samples": samples, "verdict": verdict,
                           "table": lines}, f, indent=2, default=str)
    return 0 if verdict.get("levelled_off") else 1


if __name__ == "__main__":
    sys.exit(main())

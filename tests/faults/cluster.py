"""The fault suite's cell: real processes on loopback under a steady load.

``FaultCell`` starts a 3-member etcd (no compaction, so the checker can read every
revision), two cellstate servers (``cellstate-a`` and ``cellstate-b``, each naming the
etcd members in another order), two agents of 6 machines each, the batch scheduler
twice (``batch-0``, ``batch-1``) and the service scheduler once (``service``), all as
``omega`` processes (tests/e2e/cluster.py starts them), and the load driver
(tests/faults/driver.py). ``cellstate-a`` is the one faults hit: the driver,
``batch-0``, ``service`` and ``agent-0`` name it first, the others name ``cellstate-b``
first.

After a fault, :meth:`FaultCell.settle` quiets the driver, waits for every job to end,
stops the processes and walks etcd's history (tests/faults/checker.py);
:meth:`FaultCell.broken_promises` lists what the suite promises after any fault and
does not hold. Everything started is stopped by :func:`fault_cell`, also when a test
fails (task processes that outlived a killed agent included).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cellstate.api.client import CellClient
from cellstate.api.leader import leader_key
from cellstate.cell import CellSnapshot, task_view
from cellstate.invariants import layout_violations
from cellstate.jobinfo import job_summary
from cellstate.keys import Keyspace
from cellstate.kv.base import range_all
from cellstate.kv.etcd import EtcdKV
from cellstate.model import JobState, MachineState, TaskState
from cellstate.store import CellStore
from omega.etcd_launcher import LocalEtcdCluster
from tests.e2e.cluster import Cluster
from tests.etcd_fixture import etcd_args_for_tests
from tests.faults.checker import Ack, History, acks_of, read_log, walk

CELL = "default"
MACHINES_PER_AGENT = 6
# Seconds: an agent's machines go down this long after it stops. Short, for short
# tests, but not shorter: an agent renews its lease between sending task reports, and
# a few hundred tasks ending together take seconds to report.
AGENT_TTL = 5
# Seconds: a scheduler instance's lease (the driver's too). As long as an agent's, so
# that a client that fails over within a couple of seconds keeps its lease.
SCHEDULER_TTL = 5
FINAL_STATES = frozenset({"finished", "failed", "killed"})
SETTLE_TIMEOUT = 60.0  # every job must end within this long once the load stops


class FaultCell:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.etcd = LocalEtcdCluster(
            # The history checker reads every revision: nothing may be compacted away.
            3, **etcd_args_for_tests(extra_args=["--auto-compaction-retention=0"]))
        self.procs: Cluster | None = None
        self.kv: EtcdKV | None = None
        self.acks_path = workdir / "acks.jsonl"
        self.marker_file = workdir / "task-runs.log"
        self.quiet_file = workdir / "driver.quiet"
        self.faults: list[tuple[str, float]] = []  # (what, wall clock)
        self.measures: dict[str, Any] = {}
        self.history: History | None = None
        self.settled: CellSnapshot | None = None  # the cell once every job had ended
        self.settle_seconds: float | None = None
        self.settle_revision = 0  # etcd's revision when the load stopped

    # -- starting ---------------------------------------------------------------------

    def start(self, *, markers: bool = False, driver_args: tuple[str, ...] = (),
              server_args: tuple[str, ...] = ()) -> None:
        began = time.monotonic()
        self.etcd.start()
        ends = self.etcd.endpoints
        self.kv = EtcdKV(ends)
        # Plaintext: the load driver plays a user and a scheduler at once.
        self.procs = c = Cluster(",".join(ends), self.workdir, tls=False)
        c.server("cellstate-a", ",".join(ends), wait=False, extra=server_args)
        c.server("cellstate-b", ",".join(ends[1:] + ends[:1]), wait=False, extra=server_args)
        # Clients stay with the first server that answers: both must serve before
        # any starts, or a client meant for cellstate-a may settle on cellstate-b.
        c.wait_serving("cellstate-a")
        c.wait_serving("cellstate-b")
        spec = c.spec("cell", 2 * MACHINES_PER_AGENT, cpu=8)
        for i, order in enumerate((self.a_first, self.b_first)):
            c.start(f"agent-{i}", "agent", "--cellstate", order, "--spec", str(spec),
                    "--index", str(i), "--of", "2", "--id", f"agent-{i}",
                    "--ttl", str(AGENT_TTL), "--allow-command-from", "*",
                    "--allow-command", "/",
                    # Its tasks write markers into this test's (private) folder.
                    "--run-as", pwd.getpwuid(os.geteuid()).pw_name)
        config = self.workdir / "scheduler.toml"
        config.write_text(f"[scheduler]\nlease_ttl = {SCHEDULER_TTL}\nretry_delay = 0.5\n"
                          "max_retry_delay = 2.0\n")
        for name, sched, inst, order in (("batch-0", "batch", "b0", self.a_first),
                                         ("batch-1", "batch", "b1", self.b_first),
                                         ("service", "service", "s0", self.a_first)):
            c.start(name, "scheduler", "--config", str(config), "--cellstate", order,
                    "--name", sched, "--instance", inst, "--seed", str(len(c.children)))
        # The driver starts now and waits for the start file: its interpreter starts
        # while the others come up (it took 2-3 s at load 9 after them).
        start_file = self.workdir / "driver.start"
        c.spawn("driver", [sys.executable, "-m", "tests.faults.driver", "--cellstate",
                           self.a_first, "--out", str(self.acks_path),
                           "--quiet-file", str(self.quiet_file), "--ttl", str(SCHEDULER_TTL),
                           "--start-file", str(start_file),
                           *(["--marker-file", str(self.marker_file)] if markers else []),
                           *driver_args])
        self.wait("every machine up and every scheduler instance live", self._ready)
        start_file.touch()
        self.wait("the driver's first commit", lambda: bool(self.commit_acks()))
        self.measure(start_s=round(time.monotonic() - began, 1))

    @property
    def a_first(self) -> str:
        p = self._procs.server_ports
        return f"127.0.0.1:{p['cellstate-a']},127.0.0.1:{p['cellstate-b']}"

    @property
    def b_first(self) -> str:
        p = self._procs.server_ports
        return f"127.0.0.1:{p['cellstate-b']},127.0.0.1:{p['cellstate-a']}"

    @property
    def _procs(self) -> Cluster:
        assert self.procs is not None, "the cell is not started"
        return self.procs

    def _ready(self) -> bool:
        snap = self.snapshot()
        up = [m for m in snap.machines.values() if m.state is MachineState.UP]
        return len(up) == 2 * MACHINES_PER_AGENT and len(snap.instances) == 3

    # -- looking -----------------------------------------------------------------------

    def snapshot(self) -> CellSnapshot:
        """The cell now, read from etcd."""
        assert self.kv is not None
        return CellStore(self.kv, CELL).read_snapshot()

    def revision(self) -> int:
        assert self.kv is not None
        return self.kv.range(b"\x00").revision

    def log(self) -> list[dict[str, Any]]:
        return read_log(self.acks_path) if self.acks_path.exists() else []

    def commit_acks(self) -> list[Ack]:
        """The driver's acknowledged commits so far."""
        return [a for a in acks_of(self.log()) if a.op == "commit"]

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 60.0) -> float:
        """Wait until ``done()``; returns the seconds it took. Fails, with the processes'
        logs, on a timeout or when a process exits that nobody killed."""
        start = time.monotonic()
        while not done():
            dead = [n for n, ch in self._procs.children.items() if not ch.running()
                    and ch.popen.returncode not in (0, -signal.SIGKILL)]
            assert not dead, f"{dead} exited while waiting for {what}\n{self._procs.logs()}"
            assert time.monotonic() - start < timeout, \
                f"timed out after {timeout:g} s waiting for {what}\n{self._jobs_text()}\n" \
                f"{self._procs.logs()}"
            time.sleep(0.1)
        return time.monotonic() - start

    def _jobs_text(self) -> str:
        snap = self.snapshot()
        lines = []
        for j in snap.jobs.values():
            s = job_summary(snap, j)
            if s.state not in FINAL_STATES or s.reason:
                lines.append(f"job {j.id} ({j.scheduler}): {s.state} {s.task_states} {s.reason}")
        return "jobs not ended, or with a reason:\n" + "\n".join(lines)

    def load_for(self, seconds: float) -> None:
        """Let the load run (and fail early if a process died on its own)."""
        deadline = time.monotonic() + seconds
        self.wait(f"{seconds:g} s of load", lambda: time.monotonic() >= deadline,
                  timeout=seconds + 5)

    # -- faults ------------------------------------------------------------------------

    def fault(self, what: str, name: str, sig: int) -> float:
        """Send ``sig`` to process ``name``; returns (and records) the wall-clock time."""
        t = time.time()
        self._procs.signal(name, sig)
        self.faults.append((what, t))
        return t

    def deprioritize(self, name: str) -> None:
        """Give every thread of process ``name`` the lowest CPU priority (nice 19), so
        that on a busy machine this process (at its own priority) runs first when it
        wakes: a fault timed by a watch event then lands before the victim gets much
        further. Linux nices threads one by one; a restart starts at the usual
        priority."""
        pid = self._procs.children[name].pid
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PROCESS, int(tid), 19)

    def send(self, name: str, sig: int) -> None:
        """Send a signal that is not itself the fault (a SIGCONT, say)."""
        self._procs.signal(name, sig)

    def client(self) -> CellClient:
        """A client of both servers (close it: use ``with``)."""
        return self._procs.client()

    def kill_etcd(self, index: int) -> float:
        t = time.time()
        self.etcd.members[index].kill()
        self.faults.append((f"SIGKILL etcd member {index}", t))
        return t

    def stall_etcd(self, index: int, sig: int = signal.SIGSTOP) -> float:
        """Freeze (SIGSTOP) or wake (SIGCONT) etcd member ``index``: to its clients, a
        network stall. Returns (and, for a freeze, records) the wall-clock time."""
        member = self.etcd.members[index]
        t = time.time()
        member.pause() if sig == signal.SIGSTOP else member.resume()
        if sig == signal.SIGSTOP:
            self.faults.append((f"SIGSTOP etcd member {index}", t))
        return t

    def restart_etcd(self, index: int) -> float:
        """Restart a killed member on its data; returns the seconds until it served."""
        start = time.monotonic()
        self.etcd.members[index].restart()
        return time.monotonic() - start

    def restart(self, name: str) -> float:
        """Start ``name`` again; returns the seconds until it was up (a server: serving)."""
        start = time.monotonic()
        self._procs.restart(name)
        return time.monotonic() - start

    def commit_leader(self) -> str | None:
        """The name of the server that leads commits now (its address is the value of
        the election key, cellstate/api/leader.py), or None while none does."""
        assert self.kv is not None
        kvs = self.kv.range(leader_key(CELL)).kvs
        if not kvs:
            return None
        ports = self._procs.server_ports
        address = kvs[0].value.decode()
        return next((n for n, p in ports.items() if address == f"127.0.0.1:{p}"), address)

    def agent_machines(self, agent: str) -> set[str]:
        return {m.id for m in self.snapshot().machines.values() if m.agent == agent}

    # -- measuring ---------------------------------------------------------------------

    def write_recovery(self, since: float, until: float) -> dict[str, float | None]:
        """From the driver's log (it writes every 0.3 s or so): the longest time
        without any acknowledged write (submit, commit, kill) from ``since`` to
        ``until``, the same before ``since`` for comparison, and how long after
        ``since`` the first write both sent and acknowledged after it came back."""
        times = sorted({a.t1 for a in acks_of(self.log())})

        def longest_gap(first: float, last: float) -> float | None:
            inside = [t for t in times if first <= t <= last]
            gaps = [b - a for a, b in zip([first, *inside], [*inside, last], strict=True)]
            return round(max(gaps), 2) if gaps else None

        first_write = next((r["t1"] - since for r in self.log()
                            if r["op"] in ("submit", "commit", "kill") and r["t0"] >= since),
                           None)
        return {"write_gap_s": longest_gap(since, until),
                "write_gap_before_s": longest_gap(max([since - 3.0, *times[:1]]), since),
                "first_write_after_s": round(first_write, 2) if first_write is not None
                else None}

    def acks_between(self, first: float, last: float) -> int:
        return sum(1 for a in acks_of(self.log()) if first <= a.t1 <= last)

    def measure(self, **values: Any) -> None:
        self.measures.update(values)

    # -- settling and checking -------------------------------------------------------

    def settle(self) -> History:
        """Stop the load, wait for every job to end, stop the processes, walk etcd's
        history. The history is kept in ``self.history``."""
        c = self._procs
        self.quiet_file.touch()  # the driver submits and kills no more
        self.settle_revision = self.revision()
        start = time.monotonic()
        deadline = start + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            snap = self.snapshot()
            if all(job_summary(snap, j).state in FINAL_STATES for j in snap.jobs.values()):
                self.settled = snap
                self.settle_seconds = round(time.monotonic() - start, 2)
                break
            time.sleep(0.2)
        if self.settled is None:
            self.settled = self.snapshot()
        stopping = time.monotonic()
        c.stop()
        walking = time.monotonic()
        acks = acks_of(self.log())
        assert self.kv is not None
        self.history = walk(self.kv, CELL, acks, self.revision())
        self.measure(stop_s=round(walking - stopping, 1),
                     walk_s=round(time.monotonic() - walking, 1),
                     revisions_checked=self.history.revisions,
                     acks_checked=self.history.acks_checked,
                     jobs=len(self.history.final.jobs), settle_s=self.settle_seconds)
        return self.history

    def broken_promises(self) -> list[str]:
        """What the suite promises after every fault and does not hold (empty: all
        good). Call after :meth:`settle`."""
        assert self.history is not None and self.settled is not None
        out = self.history.problems()
        snap = self.settled
        for job in snap.jobs.values():
            s = job_summary(snap, job)
            if s.state not in FINAL_STATES:
                out.append(f"job {job.id} ({job.scheduler}) is still {s.state} "
                           f"{SETTLE_TIMEOUT:g} s after the load stopped: {s.task_states}")
            status = snap.statuses.get(job.id)
            if status is not None and status.state is JobState.ABANDONED:
                out.append(f"job {job.id} was abandoned: {status.reason}")
            if status is not None and status.state is JobState.KILLED:
                running = [i for i in range(job.task_count)
                           if task_view(snap, f"{job.id}/{i}").state is TaskState.RUNNING]
                if running:
                    out.append(f"killed job {job.id} still has tasks {running} running")
        out.extend(f"task process still running after the test: {r}"
                   for r in self.live_task_processes())
        # The keys as stored, which a snapshot cannot show (cellstate/keys.py): one
        # allocation key per task, machine records that count theirs.
        assert self.kv is not None
        keys = Keyspace(CELL)
        out.extend(f"stored keys: {v}" for v in
                   layout_violations(keys, range_all(self.kv, keys.root).kvs))
        return out

    # -- task runs (marker mode) -------------------------------------------------------

    def task_runs(self) -> dict[str, dict[str, list[str]]]:
        """task -> {"start": [machine...], "end": [machine...]} from the marker file."""
        runs: dict[str, dict[str, list[str]]] = {}
        if not self.marker_file.exists():
            return runs
        for line in self.marker_file.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                what, task, machine, _pid = parts
                runs.setdefault(task, {"start": [], "end": []})[what].append(machine)
        return runs

    def _marker_pids(self) -> set[int]:
        if not self.marker_file.exists():
            return set()
        return {int(p[3]) for p in (ln.split() for ln in self.marker_file.read_text().splitlines())
                if len(p) == 4 and p[3].isdigit()}

    def live_task_processes(self) -> list[str]:
        """Task processes (marker mode) still alive: a task's ``sh`` names the marker
        file on its command line, so a recycled pid is not mistaken for one."""
        out = []
        for pid in sorted(self._marker_pids()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if str(self.marker_file).encode() in cmdline and stat.split()[2] != "Z":
                command = cmdline.replace(b"\0", b" ").decode(errors="replace")
                out.append(f"pid {pid}: {command[:120]}")
        return out

    def kill_task_processes(self) -> None:
        for pid in self._marker_pids():
            with contextlib.suppress(OSError):
                if str(self.marker_file).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.killpg(pid, signal.SIGKILL)  # its own session: sh and its sleep

    # -- reporting and stopping --------------------------------------------------------

    def report(self, scenario: str) -> dict[str, Any]:
        """The scenario's figures: printed, kept in the work dir and, when
        $OMEGA_FAULTS_REPORT names a file, appended to it (docs/reliability.md)."""
        doc = {"scenario": scenario, **self.measures}
        line = json.dumps(doc, sort_keys=True)
        print(line)
        (self.workdir / "report.json").write_text(line + "\n")
        target = os.environ.get("OMEGA_FAULTS_REPORT")
        if target:
            with open(target, "a") as f:
                f.write(line + "\n")
        return doc

    def stop(self) -> None:
        try:
            if self.procs is not None:
                self.procs.stop()
        finally:
            self.kill_task_processes()
            if self.kv is not None:
                self.kv.close()
            self.etcd.stop()


@contextlib.contextmanager
def fault_cell(workdir: Path) -> Iterator[FaultCell]:
    cell = FaultCell(workdir)
    try:
        yield cell
    finally:
        cell.stop()

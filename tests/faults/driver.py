"""The fault suite's load driver: a process that keeps a steady load on the cell and
writes down everything the service acknowledged, one JSON line each.

It submits jobs for the real scheduler processes (batch, service) and for itself,
places its own jobs' tasks by committing claims as the scheduler ``driver`` (it
registers an instance and keeps its lease alive, like any scheduler), and kills some
jobs. Only what came back acknowledged is logged as done (``submit``, ``commit``: one
line per committed claim, ``kill``); everything else is an ``error`` line. Each line
has the call's wall-clock start ``t0`` and end ``t1`` and, for acks, the revision the
service reported. The checker (tests/faults/checker.py) holds etcd's history to it.

    python -m tests.faults.driver --cellstate A,B --out acks.jsonl [--seed N] ...

With ``--start-file`` it starts, imports and waits until that file exists before its
first request: the test starts it while the rest of the cell comes up, so that its
interpreter's start overlaps theirs.

Once the file ``--quiet-file`` exists: no more submissions or kills, only placing the
driver's own jobs until they are done (the test then waits for every job to end).
SIGTERM: stop. (Not a signal for quieting: any signal wakes the SIGTERM watcher.)
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from cellstate.api.client import CellClient, RemoteStore
from cellstate.kv.base import KVError
from cellstate.model import Claim, InstanceRecord, Transaction
from cellstate.store import AlreadyExistsError, StoreError
from omega.proc import die_with_parent
from omega.signals import stop_event_on_signals

SCHEDULER = "driver"
PLACEABLE = ("pending", "lost", "preempted")


class Log:
    """Acknowledgements and errors as JSON lines, flushed one by one (the test reads
    them while the driver runs, and after a crash)."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def write(self, **record: Any) -> None:
        with self._lock:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


class Driver:
    def __init__(self, client: CellClient, log: Log, args: argparse.Namespace) -> None:
        self.client = client
        self.store = RemoteStore(client)
        self.log = log
        self.args = args
        self.rng = random.Random(args.seed)
        self.lease: int | None = None
        self.submitted = 0
        self.mine: set[str] = set()  # the jobs it submitted (acknowledged)
        self.quiet_file = Path(args.quiet_file) if args.quiet_file else None
        self.machines: list[str] = []
        self.machines_at = 0.0

    # -- registration ---------------------------------------------------------------

    def register(self) -> None:
        t0 = time.time()
        try:
            self.lease = self.store.register_instance(
                InstanceRecord(SCHEDULER, self.args.instance, SCHEDULER, t0), self.args.ttl)
            self.log.write(op="register", lease=self.lease, t0=t0, t1=time.time())
        except AlreadyExistsError:
            pass  # our previous lease lives on after all; keep-alives will tell
        except (KVError, StoreError) as e:
            self._error("register", e, t0)

    def keep_alive(self, stop: threading.Event) -> None:
        while not stop.wait(self.args.ttl / 3):
            lease = self.lease
            if lease is None:
                continue
            t0 = time.time()
            try:
                if self.client.keep_alive(lease) <= 0:
                    self.log.write(op="lease_lost", lease=lease, t0=t0, t1=time.time())
                    self.lease = None
            except KVError as e:
                self._error("keep_alive", e, t0)

    # -- load -----------------------------------------------------------------------

    def job_doc(self) -> dict[str, Any]:
        self.submitted += 1
        jid = f"{self.args.prefix}{self.submitted:04}"
        roll = self.rng.random()
        if roll < 0.45:
            scheduler, tasks = "batch", self.rng.randint(1, 4)
        elif roll < 0.7:
            scheduler, tasks = "service", self.rng.randint(1, 2)
        else:
            scheduler, tasks = SCHEDULER, self.rng.randint(1, 3)
        duration = round(self.rng.uniform(*self.args.durations), 2)
        doc: dict[str, Any] = {
            "id": jid, "owner": "faults", "scheduler": scheduler, "task_count": tasks,
            "task_resources": {"cpu": 1, "mem": 1},
            "kind": "service" if scheduler == "service" else "batch",
        }
        if self.args.marker_file:
            # A real process per task that notes its start and its end, so the test can
            # tell how often each task really ran to completion.
            marker = self.args.marker_file
            doc["command"] = ["sh", "-c", (
                f'echo "start $OMEGA_TASK $OMEGA_MACHINE $$" >> {marker}; sleep {duration}; '
                f'echo "end $OMEGA_TASK $OMEGA_MACHINE $$" >> {marker}')]
        else:
            doc["duration"] = duration
        return doc

    def submit(self) -> str | None:
        doc = self.job_doc()
        t0 = time.time()
        try:
            rev = self.client.submit_job(doc)
        except (KVError, StoreError, ValueError) as e:
            self._error("submit", e, t0, job=doc["id"])
            return None
        self.log.write(op="submit", job=doc["id"], scheduler=doc["scheduler"],
                       tasks=doc["task_count"], rev=rev, t0=t0, t1=time.time())
        self.mine.add(str(doc["id"]))
        return str(doc["id"])

    def kill(self, job: str) -> None:
        t0 = time.time()
        try:
            rev = self.client.kill_job(job, "killed by the fault suite's driver", "driver")
        except (KVError, StoreError) as e:
            self._error("kill", e, t0, job=job)
            return
        self.log.write(op="kill", job=job, rev=rev, t0=t0, t1=time.time())

    def kill_one(self) -> None:
        """Kill a job of its own whose tasks all run (not one a scheduler may be
        placing: that race is its own test, ``--kill-fresh``). Never a job the test
        submitted: a test waits for its gang job to run, and a gang killed while the
        test restarted a server never ran again (the wait timed out)."""
        try:
            jobs = self.client.list_jobs()
        except (KVError, StoreError) as e:
            self._error("list_jobs", e, time.time())
            return
        running = [j["spec"]["id"] for j in jobs if j["spec"]["id"] in self.mine
                   and j["state"] == "running"
                   and j["task_states"] == {"running": j["spec"]["task_count"]}]
        if running:
            self.kill(self.rng.choice(running))

    def refresh_machines(self) -> None:
        if time.time() - self.machines_at < 1.0 and self.machines:
            return
        try:
            self.machines = [m["id"] for m in self.client.list_machines(state="up")]
            self.machines_at = time.time()
        except (KVError, StoreError) as e:
            self._error("list_machines", e, time.time())

    def place_own(self) -> None:
        """Claim the driver's own placeable tasks on random machines that are up."""
        if self.lease is None:
            self.register()
            if self.lease is None:
                return
        try:
            jobs = self.client.list_jobs(scheduler=SCHEDULER)
        except (KVError, StoreError) as e:
            self._error("list_jobs", e, time.time())
            return
        for j in jobs:
            if j["state"] in ("killed", "abandoned") or not any(
                    j["task_states"].get(s) for s in PLACEABLE):
                continue
            self.refresh_machines()
            if not self.machines:
                return
            jid = j["spec"]["id"]
            try:
                tasks = self.client.get_job(jid).get("tasks", [])
            except (KVError, StoreError) as e:
                self._error("get_job", e, time.time(), job=jid)
                continue
            claims = tuple(Claim(jid, t["index"], self.rng.choice(self.machines))
                           for t in tasks if t["state"] in PLACEABLE)
            if claims:
                self.commit(Transaction(SCHEDULER, claims))

    def commit(self, txn: Transaction) -> None:
        t0 = time.time()
        try:
            res = self.store.commit(txn)
        except StoreError as e:  # e.g. our instance is not registered any more
            self._error("commit", e, t0)
            if "not registered" in str(e):
                self.lease = None
            return
        except (KVError, ValueError) as e:
            self._error("commit", e, t0)
            return
        t1 = time.time()
        for c in res.committed:
            self.log.write(op="commit", task=c.task, machine=c.machine, rev=res.revision,
                           t0=t0, t1=t1)
        if res.rejected:
            self.machines_at = 0.0  # a machine may have gone down: look again
            self.log.write(op="rejected", tasks=[r.claim.task for r in res.rejected],
                           reasons=sorted({r.reason.value for r in res.rejected}), t0=t0, t1=t1)

    def _error(self, call: str, e: Exception, t0: float, **extra: Any) -> None:
        self.log.write(op="error", call=call, kind=type(e).__name__, error=str(e)[:300],
                       t0=t0, t1=time.time(), **extra)

    # -- the loop -------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self.register()
        keeper = threading.Thread(target=self.keep_alive, args=(stop,), name="keep-alive",
                                  daemon=True)
        keeper.start()
        now = time.time()
        next_submit, next_kill = now, now + self.args.kill_every
        while not stop.is_set():
            now = time.time()
            quiet = self.quiet_file is not None and self.quiet_file.exists()
            if not quiet and now >= next_submit:
                next_submit = now + self.args.submit_every
                job = self.submit()
                if job is not None and self.args.kill_fresh and self.rng.random() < 0.5:
                    # Right after submitting: a scheduler may be deciding on it now.
                    time.sleep(self.rng.uniform(0.0, 0.05))
                    self.kill(job)
            if not quiet and not self.args.kill_fresh and now >= next_kill:
                next_kill = now + self.args.kill_every
                self.kill_one()
            self.place_own()
            stop.wait(self.args.tick)
        if self.lease is not None:
            try:
                self.store.deregister_instance(SCHEDULER, self.args.instance, self.lease)
            except (KVError, StoreError) as e:
                self._error("deregister", e, time.time())


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.faults.driver")
    p.add_argument("--cellstate", required=True, help="endpoints, comma-separated, in order")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--instance", default="d0")
    p.add_argument("--prefix", default="j")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ttl", type=int, default=3)
    p.add_argument("--submit-every", type=float, default=0.3)
    p.add_argument("--kill-every", type=float, default=2.0)
    p.add_argument("--kill-fresh", action="store_true",
                   help="kill half of the jobs right after submitting them")
    p.add_argument("--tick", type=float, default=0.1)
    p.add_argument("--durations", type=float, nargs=2, default=(1.0, 2.5))
    p.add_argument("--marker-file", default="", help="tasks run sh, noting start and end here")
    p.add_argument("--quiet-file", default="", help="once this file exists, only place")
    p.add_argument("--start-file", default="", help="begin once this file exists")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    die_with_parent()  # a test that dies leaves no driver behind
    args = parse(argv)
    stop = stop_event_on_signals()
    if args.start_file:
        while not Path(args.start_file).exists():
            if stop.wait(0.05):
                return
    log = Log(args.out)
    client = CellClient([e for e in args.cellstate.split(",") if e])
    driver = Driver(client, log, args)
    try:
        driver.run(stop)
    finally:
        client.close()
        log.close()


if __name__ == "__main__":
    main()

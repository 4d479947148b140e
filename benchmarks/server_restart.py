"""How long a cellstate server takes from exec to serving after a SIGKILL, at rest and
under a competing CPU load (issue 36: 15.6 s in a campaign on a loaded host, 1.0 s in
the fault suite).

A local etcd holds a cell of ``--machines`` machines and ``--jobs`` jobs of 10 tasks,
half of them running; a server process is started, killed with SIGKILL once serving,
and started again, ``--rounds`` times. Each start is timed from Popen to the gRPC
health check answering SERVING, and the server's own announce line says where the time
went (interpreter and imports, recovery, the cell's load, listening). ``--load N``
runs N CPU-bound processes throughout. The host's load average is printed with each
run (`uptime`).

    python benchmarks/server_restart.py [--machines 2000] [--jobs 500] [--rounds 5] [--load 0]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cellstate.api.client import wait_until_serving
from cellstate.kv.etcd import EtcdKV
from cellstate.model import Claim, Job, Machine, Resources, Transaction
from cellstate.store import CellStore
from omega.etcd_launcher import LocalEtcd, free_ports
from omega.proc import omega

BURN = "while True:\n    pass\n"
PHASES = re.compile(r"serving ([\d.]+) s after exec \((.*)\)")


def build(endpoint: str, machines: int, jobs: int) -> None:
    kv = EtcdKV([endpoint])
    try:
        store = CellStore(kv, "default")
        store.add_machines([Machine(f"m{i:05}", Resources.of(cpu=32, mem=128),
                                    rack=f"r{i // 40}", failure_domain=f"fd{i // 400}")
                            for i in range(machines)])
        for j in range(jobs):
            store.submit_job(Job(f"j{j:05}", "alice", "batch", 10, Resources.of(cpu=1, mem=1),
                                 submitted_at=1.0))
            if j % 2 == 0:
                store.commit(Transaction("batch", tuple(
                    Claim(f"j{j:05}", i, f"m{(j * 10 + i) % machines:05}") for i in range(10))))
    finally:
        kv.close()


def start_once(endpoint: str, log: Path) -> tuple[float, str]:
    port = free_ports(1)[0]
    started = time.monotonic()
    with log.open("w") as out:
        child = subprocess.Popen(omega("server", "--insecure", "--etcd", endpoint, "--listen",
                                       f"127.0.0.1:{port}", "-v"),
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_serving(f"127.0.0.1:{port}", 120.0, lambda: child.poll() is None)
        took = time.monotonic() - started
        deadline = time.monotonic() + 10
        phases = ""
        while not phases and time.monotonic() < deadline:
            found = PHASES.search(log.read_text())
            phases = f"{found.group(1)} s after exec: {found.group(2)}" if found else ""
            time.sleep(0.05)
        return took, phases
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--machines", type=int, default=2000)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--load", type=int, default=0, help="CPU-bound processes alongside")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = LocalEtcd(data_dir=Path(tmp) / "etcd")
        etcd.start()
        burners: list[subprocess.Popen[bytes]] = []
        try:
            build(etcd.endpoint, args.machines, args.jobs)
            burners = [subprocess.Popen([sys.executable, "-c", BURN])
                       for _ in range(args.load)]
            times = []
            for r in range(args.rounds):
                took, phases = start_once(etcd.endpoint, Path(tmp) / f"server-{r}.log")
                times.append(took)
                print(f"start {r + 1}: serving {took:.2f} s after Popen ({phases}); "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
            print(f"{args.machines} machines, {args.jobs} jobs, {args.load} burners: median "
                  f"{statistics.median(times):.2f} s, max {max(times):.2f} s; uptime: "
                  + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        finally:
            for b in burners:
                b.kill()
                b.wait()
            etcd.stop()


if __name__ == "__main__":
    main()

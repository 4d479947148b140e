#!/usr/bin/env python
"""CPU per commit of the commit leader's core, without gRPC: a ``GroupCommitter`` over a
``CellStore`` that follows a ``Replica``, in one process, against a real etcd.

    python benchmarks/leader_core.py [--seconds S] [--rounds R] [--clients N]
        [--modes one-at-a-time,pipelined] [--baseline DIR] [--no-fsync] [--json OUT]

Each round starts a fresh process (this script with ``--child``) that loads a cell of
2,000 machines into its replica, runs N client threads (4 by default) that each commit
transactions of B=50 claims (their own job's tasks on machines picked at random, as
``service_throughput.py``'s scheduler processes do) straight into the committer for S
seconds, and reports commits per second and the process's CPU milliseconds per commit
(client threads included: building a transaction costs about 0.1 ms of it). The
leader's replica gets the records the leader writes back on the watch, as a server's
does; ``taken`` is the share of them it took as the leader wrote them rather than
decoding them (``Replica.expect``).

``--baseline DIR``: the same rounds with the code of another checkout of the
repository (its ``cellstate`` on the child's path), alternating with this one, so that
two versions of the leader are compared in one run. The machine is shared: the load
average is printed before and after; compare figures of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
MACHINES = 2000
BATCH = 50
MODES = ("one-at-a-time", "pipelined")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One round, in this process (the code on ``sys.path``: this tree or a baseline)."""
    # The packages first, from the child's path (PYTHONPATH: this tree or a baseline):
    # the commit benchmark imported after them puts this tree's root on sys.path.
    from cellstate.api.leader import GroupCommitter
    from cellstate.gc_tuning import tune_for_large_heap
    from cellstate.kv.etcd import EtcdKV
    from cellstate.model import Claim, Detection, Transaction, TxnMode
    from cellstate.replica import Replica
    from cellstate.store import CellStore
    from cellstate.store.base import StoreOptions
    from omega.etcd_launcher import LocalEtcd

    sys.path.insert(0, str(_HERE))
    from commit_throughput import job_id, scheduler_name, setup_cell

    pipelined = args.mode == "pipelined"
    etcd = LocalEtcd(unsafe_no_fsync=args.no_fsync, quiet_version_warning=True)
    etcd.start()
    try:
        kv = EtcdKV([etcd.endpoint])
        setup_cell(kv, "core", MACHINES, args.clients)
        replica = Replica(kv, "core").start()
        store = CellStore(kv, "core", options=StoreOptions(
            per_machine_writes="always" if pipelined else "never"))
        store.follow(replica)
        committer = GroupCommitter(store, pipeline=pipelined).start()
        mids = sorted(replica.snapshot().machines)
        tune_for_large_heap()  # as `omega server` does once its cell is loaded
        deadline = time.monotonic() + args.seconds
        counts = [0] * args.clients
        errors: list[BaseException] = []

        def client(i: int) -> None:
            rng = random.Random(args.seed + i)
            index = 0
            try:
                while time.monotonic() < deadline:
                    claims = tuple(Claim(job_id(i), index + k, m, 0)
                                   for k, m in enumerate(rng.choices(mids, k=BATCH)))
                    index += BATCH
                    committer.commit([Transaction(scheduler_name(i), claims,
                                                  TxnMode.INCREMENTAL, Detection.FINE)])
                    counts[i] += 1
            except BaseException as e:  # reported below
                errors.append(e)

        cpu0, t0 = time.process_time(), time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        time.sleep(0.5)  # the watch's echo of the last writes
        taken = getattr(replica, "known_taken", None)
        committer.close()
        replica.stop()
        if errors:
            raise errors[0]
        commits = sum(counts)
        return {"commits": commits, "commits_per_s": commits / wall,
                "cpu_ms_per_commit": 1000 * cpu / max(1, commits),
                "batches": committer.batches,
                # About two records a claim (its task, its machine) come back.
                "taken": None if taken is None else taken / max(1, 2 * BATCH * commits)}
    finally:
        etcd.stop()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per tree and mode")
    ap.add_argument("--clients", type=int, default=4, help="client threads")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"leader modes, comma-separated (default {','.join(MODES)})")
    ap.add_argument("--baseline", metavar="DIR",
                    help="another checkout of this repository to compare with")
    ap.add_argument("--no-fsync", action="store_true", help="etcd with --unsafe-no-fsync")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=MODES[0], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: {args.modes!r}: each one of {', '.join(MODES)}")
    if args.seconds <= 0 or args.rounds < 1 or args.clients < 1:
        ap.error("--seconds, --rounds and --clients must be positive")
    if args.baseline and not (Path(args.baseline) / "cellstate" / "store" / "claims.py").is_file():
        ap.error(f"--baseline {args.baseline}: not a checkout of this repository "
                 "(no cellstate/store/claims.py)")
    trees = [("this", str(_HERE.parent))]
    if args.baseline:
        trees.append(("base", str(Path(args.baseline).resolve())))
    print(f"leader core: {MACHINES} machines, B={BATCH}, {args.clients} client threads, "
          f"{args.seconds:g} s rounds, fsync {'off' if args.no_fsync else 'on'}; "
          f"load average before: {load()}")
    print(f"{'tree':<5} {'mode':<14} {'commits/s':>9} {'cpu ms/commit':>13} "
          f"{'commits/batch':>13} {'taken':>6}")
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for mode in modes:
            for name, tree in trees:  # alternating, so that load drifts hit both
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", mode,
                       "--seconds", str(args.seconds), "--clients", str(args.clients),
                       "--seed", str(args.seed), *(["--no-fsync"] if args.no_fsync else [])]
                proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": tree},
                                      capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                fig = json.loads(proc.stdout.strip().splitlines()[-1])
                rounds.append({"tree": name, "mode": mode, **fig})
                taken = "-" if fig["taken"] is None else f"{fig['taken']:.2f}"
                print(f"{name:<5} {mode:<14} {fig['commits_per_s']:>9.1f} "
                      f"{fig['cpu_ms_per_commit']:>13.2f} "
                      f"{fig['commits'] / max(1, fig['batches']):>13.1f} {taken:>6}",
                      flush=True)
    print(f"load average after: {load()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

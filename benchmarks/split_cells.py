#!/usr/bin/env python
"""A simulation of a cell split by machine range over several etcd clusters, each range
with its own commit leader: what the split costs a commit in latency, sub-commits and
conflicts, beside what it buys in throughput (docs/scaling.md).

    python benchmarks/split_cells.py [--ranges 1,2,4,8] [--schedulers 8] [--batch 50]
        [--service-ms 17] [--spread 0.5] [--local 0.0,0.9] [--gangs 0.1]
        [--commits 20000] [--seed 1]

A discrete-event simulation (virtual time, no etcd): ``--schedulers`` processes commit
in a closed loop (each sends its next commit when the last is answered). A commit has B
claims: with probability ``--local`` all of them are on machines of one range (a
placement policy that keeps a commit in one range when it can), else each claim's
machine is anywhere in the cell (as today's schedulers pick). The commit goes to every
range it touches as one sub-commit, in parallel; each range's leader serves sub-commits
one at a time (no batching: an upper bound on queueing) with a service time drawn from a
log-normal distribution whose median is ``--service-ms`` scaled by the sub-commit's
share of B claims plus a fixed half (a write's round trip and fsync do not shrink with
fewer claims), and ``--spread`` its log-space sigma. One range is one cell as today (the
median defaults to the measured leader's time per commit with 4 processes: 57 commits/s,
docs/scaling.md).

An incremental commit is answered when its last sub-commit is. A gang (a fraction
``--gangs`` of commits) that spans ranges cannot be one etcd Txn: it goes through the
staged protocol (holds in every range, then the commit point in the first range and the
holds flipped): two rounds of sub-commits and one write more. Its holds keep the claimed
resources from everyone else from the first round to the flip: the table shows the
share of all commits' claims that would find a machine held by a spanning gang in that
window (an upper bound on the extra conflicts the split causes: a claim conflicts only
if the held resources were the ones it needed).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections.abc import Sequence
from typing import Any

import attrs


@attrs.define
class Leader:
    """One range's commit leader: a FIFO server."""

    free_at: float = 0.0
    busy: float = 0.0

    def serve(self, now: float, service: float) -> float:
        start = max(now, self.free_at)
        self.free_at = start + service
        self.busy += service
        return self.free_at


@attrs.frozen
class Params:
    ranges: int
    schedulers: int
    batch: int
    service_ms: float
    spread: float
    local: float
    gangs: float
    commits: int
    machines_per_range: int = 2000


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def simulate(p: Params, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    leaders = [Leader() for _ in range(p.ranges)]
    mu = math.log(p.service_ms / 1e3)

    def service(claims: int) -> float:
        share = 0.5 + 0.5 * claims / p.batch
        return share * math.exp(rng.gauss(mu, p.spread))

    def ranges_of() -> dict[int, int]:
        if rng.random() < p.local:
            return {rng.randrange(p.ranges): p.batch}
        touched: dict[int, int] = {}
        for _ in range(p.batch):
            r = rng.randrange(p.ranges)
            touched[r] = touched.get(r, 0) + 1
        return touched

    events: list[tuple[float, int]] = [(0.0, s) for s in range(p.schedulers)]
    heapq.heapify(events)
    latencies: list[float] = []
    spans: list[int] = []
    subcommits = writes = 0
    held_claim_s = 0.0  # claims held by spanning gangs, times the seconds held
    end = 0.0
    while len(latencies) < p.commits:
        now, s = heapq.heappop(events)
        touched = ranges_of()
        gang = rng.random() < p.gangs
        staged = gang and len(touched) > 1
        rounds = 2 if staged else 1
        t = now
        for _ in range(rounds):
            t = max(leaders[r].serve(t, service(n)) for r, n in touched.items())
            subcommits += len(touched)
            writes += len(touched)
        if staged:
            first = min(touched)
            t = leaders[first].serve(t, service(1))  # the commit point
            writes += 1
            held_claim_s += p.batch * (t - now)
        latencies.append(t - now)
        spans.append(len(touched))
        end = max(end, t)
        heapq.heappush(events, (t, s))
    machines = p.ranges * p.machines_per_range
    committed_per_s = p.batch * len(latencies) / end
    return {
        "ranges": p.ranges, "local": p.local,
        "placements_per_s": committed_per_s,
        "p50_ms": 1e3 * percentile(latencies, 0.5),
        "p99_ms": 1e3 * percentile(latencies, 0.99),
        "ranges_per_commit": sum(spans) / len(spans),
        "writes_per_commit": writes / len(latencies),
        "leader_busy": sum(x.busy for x in leaders) / (end * p.ranges),
        # Average claims held at once by spanning gangs, over the cell's machines: the
        # chance a claim lands on a machine one of them holds.
        "held_share": held_claim_s / end / machines,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--ranges", default="1,2,4,8")
    ap.add_argument("--schedulers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--service-ms", type=float, default=17.0)
    ap.add_argument("--spread", type=float, default=0.5)
    ap.add_argument("--local", default="0.0,0.9",
                    help="shares of commits kept in one range, comma-separated")
    ap.add_argument("--gangs", type=float, default=0.1)
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    try:
        ranges = [int(x) for x in args.ranges.split(",") if x.strip()]
        locals_ = [float(x) for x in args.local.split(",") if x.strip()]
    except ValueError:
        ap.error("--ranges takes integers and --local fractions, comma-separated")
    if not ranges or min(ranges) < 1:
        ap.error("--ranges: positive integers")
    if not locals_ or not all(0 <= x <= 1 for x in locals_):
        ap.error("--local: fractions between 0 and 1")
    if args.schedulers < 1 or args.batch < 1 or args.commits < 1 or args.service_ms <= 0:
        ap.error("--schedulers, --batch, --commits and --service-ms must be positive")
    if not 0 <= args.gangs <= 1 or args.spread < 0:
        ap.error("--gangs is a fraction and --spread is not negative")

    print(f"split cells: {args.schedulers} schedulers in a closed loop, B={args.batch}, "
          f"one leader's median service {args.service_ms:g} ms (sigma {args.spread:g}), "
          f"{100 * args.gangs:g}% gangs, {args.commits} commits per row (virtual time)")
    print(f"{'ranges':>6} {'local':>5} {'place/s':>8} {'x1':>5} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'rng/c':>5} {'wr/c':>5} {'busy':>5} {'held%':>6}")
    rows = []
    for local in locals_:
        base = None
        for r in ranges:
            row = simulate(Params(r, args.schedulers, args.batch, args.service_ms,
                                  args.spread, local, args.gangs, args.commits), args.seed)
            base = base or row["placements_per_s"]
            rows.append(row)
            print(f"{r:>6} {local:>5.2f} {row['placements_per_s']:>8.0f} "
                  f"{row['placements_per_s'] / base:>5.2f} {row['p50_ms']:>7.1f} "
                  f"{row['p99_ms']:>7.1f} {row['ranges_per_commit']:>5.2f} "
                  f"{row['writes_per_commit']:>5.2f} {row['leader_busy']:>5.2f} "
                  f"{100 * row['held_share']:>6.3f}")
    print("x1 = over one range; rng/c = ranges a commit touches; wr/c = etcd writes per "
          "commit; busy = leaders' utilisation; held% = chance a claim meets a spanning "
          "gang's hold")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

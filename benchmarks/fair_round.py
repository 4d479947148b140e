"""CPU time of one fair-scheduler decision on a full cell (issue 13): MACHINES machines
of 16 CPUs are filled with 1-CPU tasks of four batch users (jobs of 100 tasks), then a
backlog of BACKLOG batch tasks and eight interactive users' jobs (8 tasks each) wait,
and one decision is timed: reading the shares, ordering the users' queues, placing
and choosing victims to preempt (the interactive tasks preempt batch tasks).

Over the simulator's in-memory cell (the store's real validation), on the scheduler
runtime as the simulator drives it. CPU time of this process (the machine is shared).

    python benchmarks/fair_round.py [--machines 25,200,500] [--backlog 2000]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from cellstate.model import Job, Machine, Resources
from schedulers.fair import FairPolicy
from schedulers.runtime import Attempt, RuntimeConfig, SchedulerInstance
from simulator.cell import SimCell
from simulator.engine import Clock

BATCH = ("bea", "bob", "bill", "bo")
INTERACTIVE = tuple(f"i{n}" for n in range(8))


def job(jid: str, owner: str, tasks: int, at: float) -> Job:
    return Job(jid, owner, "fair", tasks, Resources.of(cpu=1, mem=2), duration=3600.0,
               submitted_at=at)


def measure(machines: int, backlog: int, preempt: bool) -> tuple[float, int, int, int]:
    cell = SimCell()
    cell.add_machines(Machine(f"m{i:05d}", Resources.of(cpu=16, mem=64), rack=f"r{i // 40}")
                      for i in range(machines))
    clock = Clock()
    inst = SchedulerInstance(FairPolicy(preempt=preempt, min_runtime=0.0,
                                        max_preemptions_per_round=100,
                                        max_preemptions_per_minute=1000),
                             cell, cell, scheduler="fair", instance="0", clock=clock,
                             rng=random.Random(1), config=RuntimeConfig(
                                 lease_ttl=10**9, idle_wait=math.inf))
    inst.start()
    n = 0
    for k in range(machines * 16 // 100):
        n += 1
        cell.submit_job(job(f"b{n}", BATCH[k % 4], 100, 0.0))
    while isinstance(a := inst.decide(), Attempt):  # fill the cell
        inst.finish(a)
        if not a.plan.claims:
            break
    clock.now = 100.0
    for k in range(backlog // 100):
        n += 1
        cell.submit_job(job(f"b{n}", BATCH[k % 4], 100, clock.now))
    for k, user in enumerate(INTERACTIVE):
        cell.submit_job(job(f"i{k}", user, 8, clock.now))
    clock.now = 200.0
    started = time.process_time()
    a = inst.decide()
    spent = time.process_time() - started
    assert isinstance(a, Attempt)
    running = sum(len(m.allocations) for m in cell.snapshot().machines.values())
    evicting = sum(1 for c in a.plan.claims if c.evict)
    return spent, running, len(a.plan.claims), evicting


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machines", default="25,200,500")
    p.add_argument("--backlog", type=int, default=2000, help="batch tasks waiting")
    args = p.parse_args()
    print(f"{'machines':>8} {'running':>8} {'preempt':>8} {'cpu ms':>8} {'claims':>7} "
          f"{'evicting':>8}")
    for machines in (int(m) for m in args.machines.split(",")):
        for preempt in (False, True):
            spent, running, claims, evicting = measure(machines, args.backlog, preempt)
            print(f"{machines:8d} {running:8d} {preempt!s:>8} {spent * 1000:8.1f} "
                  f"{claims:7d} {evicting:8d}", flush=True)


if __name__ == "__main__":
    main()

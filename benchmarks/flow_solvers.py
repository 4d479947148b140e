"""Min-cost-flow solvers on Firmament-shaped networks: OR-Tools from scratch against our
Firmament solver (schedulers/flow/mcf) from scratch and warm, round after round.

The networks are built here directly as ``Arrays`` (no scheduler code): a cell of
MACHINES machines (racks of 40, 12 slots each) with ``use`` of its slots running
tasks and 10% of its slots' worth of tasks waiting, in jobs of 100 tasks.

* **quincy**: one node per task, with arcs to its job's unscheduled aggregator
  U_j (-> sink), to the cluster aggregator X, to 3 preferred machines and 1-2
  preferred racks of its job's input; a running task also has its continuation arc
  to its machine. X -> racks -> machines -> sink (capacity 12). About 1M arcs at
  12,500 machines and 90%.
* **spread** (load spreading): every task -> X (and U_j; a running task also to its
  machine), X -> every machine, machine -> sink by 4 tiers of 3 slots with rising
  cost (convex in the load).
* **bigjob**: quincy at 90%, and the round's arrivals are one job of BIGJOB tasks
  preferring 2 racks (Firmament's relaxation edge case, Fig. 9).

Each round between solves: 1% of the running tasks end (nodes and arcs removed, their
slots reused by the next arcs), 1,500 tasks arrive (15 jobs of 100), and the
unscheduled cost of every waiting task grows by 10. Printed per network: OR-Tools
from scratch, each algorithm from scratch, each algorithm warm (median of ROUNDS
rounds, the state carried from round to round), and OR-Tools / warm. Times are CPU
seconds of this process (time.process_time: in a race both threads count) and wall.

Figures of the paper (seed 003): ``--sizes`` is Fig. 7 (time vs cluster size),
``--use`` Fig. 8 (utilisation), ``--bigjob-sizes`` Fig. 9, and cold vs warm Fig. 11.

    python benchmarks/flow_solvers.py [--sizes 1250,12500] [--use 0.5,0.9]
        [--policies quincy,spread] [--bigjob-sizes 3000] [--rounds 3]
        [--algorithms auto] [--no-cold-ours] [--seed 1]
    python benchmarks/flow_solvers.py --inputs /work/solver-inputs/seq12500.pkl
        [--inputs more.pkl] [--algorithms auto,cost-scaling] [--repeats 3]

``--inputs``: rounds saved from the real flow scheduler (a pickled list of
``Arrays``); per round OR-Tools from scratch and each algorithm warm, same run.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

import numpy as np
import numpy.typing as npt

from schedulers.flow.mcf.solver import Algorithm
from schedulers.flow.network import Arrays
from schedulers.flow.solvers import OrToolsSolver, Solution

I64 = npt.NDArray[np.int64]
SLOTS = 12
RACK = 40
WIDTH = 8  # arcs a task can own
JOB = 100


class Cell:
    """A synthetic flow network with FlowNetwork's slot and node-index reuse."""

    def __init__(self, machines: int, use: float, policy: str, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.policy = policy
        self.machines = machines
        self.racks = (machines + RACK - 1) // RACK
        # Fixed nodes: sink 0, X 1, racks, machines.
        self.sink, self.x = 0, 1
        self.rack0 = 2
        self.mach0 = 2 + self.racks
        self.n = self.mach0 + machines
        self.free_nodes: list[int] = []
        self.supply = np.zeros(self.n, dtype=np.int64)
        size = 1 << 16
        self.tail = np.zeros(size, dtype=np.int64)
        self.head = np.zeros(size, dtype=np.int64)
        self.cap = np.zeros(size, dtype=np.int64)
        self.cost = np.zeros(size, dtype=np.int64)
        self.live = np.zeros(size, dtype=bool)
        self.top = 0  # slots below are used or in free_slots
        self.free_slots: list[int] = []
        self.tasks: dict[int, tuple[int, int, I64, int]] = {}  # node: job, machine, slots, U slot
        self.jobs: dict[int, list[int]] = {}  # job id: [U node, U->sink slot, tasks]
        self.job_racks: dict[int, I64] = {}
        self.next_job = 0
        self._fixed_arcs()
        running = int(use * machines * SLOTS)
        # Machines filled in random order, SLOTS each, up to `running` tasks.
        order = np.repeat(self.rng.permutation(machines), SLOTS)[:running]
        self.rng.shuffle(order)
        for j0 in range(0, running, JOB):
            ms = order[j0:j0 + JOB]
            job = self._new_job(len(ms))
            for m in ms:
                self._add_task(job, int(m))
        self.add_jobs(int(0.1 * machines * SLOTS) // JOB, JOB)

    # -- storage ---------------------------------------------------------------------

    def _slot(self) -> int:
        if self.free_slots:
            return self.free_slots.pop()
        if self.top == len(self.tail):
            for name in ("tail", "head", "cap", "cost", "live"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        self.top += 1
        return self.top - 1

    def _arc(self, t: int, h: int, cap: int, cost: int) -> int:
        s = self._slot()
        self.tail[s], self.head[s], self.cap[s], self.cost[s] = t, h, cap, cost
        self.live[s] = True
        return s

    def _node(self) -> int:
        if self.free_nodes:
            return self.free_nodes.pop()
        self.n += 1
        if self.n > len(self.supply):
            self.supply = np.concatenate([self.supply, np.zeros_like(self.supply)])
        return self.n - 1

    def _fixed_arcs(self) -> None:
        for m in range(self.machines):
            node = self.mach0 + m
            if self.policy == "spread":
                self._arc(self.x, node, SLOTS, 0)
                for tier in range(4):
                    self._arc(node, self.sink, SLOTS // 4, 40 * tier)
            else:
                self._arc(self.rack0 + m // RACK, node, SLOTS, 0)
                self._arc(node, self.sink, SLOTS, 0)
        if self.policy != "spread":
            for r in range(self.racks):
                inrack = min(RACK, self.machines - r * RACK)
                self._arc(self.x, self.rack0 + r, inrack * SLOTS, 0)

    # -- jobs and tasks ----------------------------------------------------------------

    def _new_job(self, size: int, racks: int = 0) -> int:
        job = self.next_job
        self.next_job += 1
        u = self._node()
        self.supply[u] = 0
        self.jobs[job] = [u, self._arc(u, self.sink, size, 0), 0]
        k = racks or int(self.rng.integers(1, 3))
        self.job_racks[job] = self.rng.choice(self.racks, size=min(k, self.racks),
                                              replace=False)
        return job

    def _add_task(self, job: int, machine: int) -> None:
        node = self._node()
        self.supply[node] = 1
        self.supply[self.sink] -= 1
        u, _, _ = self.jobs[job]
        self.jobs[job][2] += 1
        rng = self.rng
        slots = np.full(WIDTH, -1, dtype=np.int64)
        wait = 5000 if machine >= 0 else 2000
        uslot = self._arc(node, u, 1, wait)
        slots[0] = uslot
        slots[1] = self._arc(node, self.x, 1, 1000)
        k = 2
        if self.policy != "spread":
            racks = self.job_racks[job]
            for r in racks:
                slots[k] = self._arc(node, self.rack0 + int(r), 1, int(rng.integers(500, 700)))
                k += 1
            for _ in range(3):
                r = int(racks[int(rng.integers(len(racks)))])
                m = min(r * RACK + int(rng.integers(RACK)), self.machines - 1)
                slots[k] = self._arc(node, self.mach0 + m, 1, int(rng.integers(100, 400)))
                k += 1
        if machine >= 0:
            slots[k] = self._arc(node, self.mach0 + machine, 1, 50)
        self.tasks[node] = (job, machine, slots, uslot)

    def _drop_task(self, node: int) -> None:
        job, _, slots, _ = self.tasks.pop(node)
        for s in slots[slots >= 0]:
            self.live[s] = False
            self.free_slots.append(int(s))
        self.supply[node] = 0
        self.supply[self.sink] += 1
        self.free_nodes.append(node)
        rec = self.jobs[job]
        rec[2] -= 1
        self.cap[rec[1]] -= 1
        if rec[2] == 0:
            self.live[rec[1]] = False
            self.free_slots.append(rec[1])
            self.free_nodes.append(rec[0])
            del self.jobs[job]

    def add_jobs(self, jobs: int, size: int, racks: int = 0) -> None:
        for _ in range(jobs):
            job = self._new_job(size, racks)
            for _ in range(size):
                self._add_task(job, -1)

    def churn(self, arrivals: Callable[[], None]) -> None:
        """One round's changes: 1% of running tasks end, arrivals, waits grow."""
        running = [v for v, t in self.tasks.items() if t[1] >= 0]
        ending = self.rng.choice(len(running), size=len(running) // 100, replace=False)
        for i in ending:
            self._drop_task(running[int(i)])
        waiting = np.array([t[3] for t in self.tasks.values() if t[1] < 0], dtype=np.int64)
        self.cost[waiting] += 10
        arrivals()

    def arrays(self) -> Arrays:
        slots = np.flatnonzero(self.live[:self.top] & (self.cap[:self.top] > 0))
        return Arrays(self.n, self.supply[:self.n].copy(), self.tail[slots], self.head[slots],
                      np.zeros(len(slots), dtype=np.int64), self.cap[slots], self.cost[slots],
                      np.zeros(len(slots), dtype=np.int8), slots)


# -- timing ------------------------------------------------------------------------------


def timed(fn: Callable[[], Solution]) -> tuple[Solution, float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    sol = fn()
    return sol, time.process_time() - c0, time.perf_counter() - w0


def fmt(cpu: float, wall: float) -> str:
    return f"{cpu * 1000:8.1f} {wall * 1000:8.1f}"


def compile_first() -> None:
    from schedulers.flow.mcf import FirmamentSolver

    t0 = time.perf_counter()
    cell = Cell(40, 0.5, "quincy", 0)
    algs: tuple[Algorithm, ...] = ("relax", "cost-scaling")
    for alg in algs:
        FirmamentSolver(alg).solve(cell.arrays())
    print(f"numba first call (compile or load from cache): {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    for alg in algs:
        FirmamentSolver(alg).solve(cell.arrays())
    print(f"same calls again (compiled): {(time.perf_counter() - t0) * 1000:.1f} ms")


def run_case(label: str, make: Callable[[], Cell], arrivals: Callable[[Cell], None],
             algorithms: Sequence[str], rounds: int, cold_ours: bool) -> None:
    from schedulers.flow.mcf import FirmamentSolver

    cell = make()
    net = cell.arrays()
    print(f"\n== {label}: {net.nodes} nodes, {len(net.tail)} arcs, "
          f"{int(net.supply[net.supply > 0].sum())} units")
    ref, c, w = timed(partial(OrToolsSolver().solve, net))
    print(f"  {'ortools cold':34s} {fmt(c, w)}   cost {ref.cost}")
    ortools_cpu = [c]
    solvers = {a: FirmamentSolver(cast(Algorithm, a)) for a in algorithms}
    for a, s in solvers.items():
        if not cold_ours and a not in ("relax",):
            s.solve(net)
            continue
        sol, c, w = timed(partial(s.solve, net))
        st = s.last
        assert st is not None
        ok = "ok" if sol.cost == ref.cost else f"WRONG {sol.cost}"
        print(f"  {a + ' cold':34s} {fmt(c, w)}   {ok} ({st.algorithm}, ops {st.ops})")
    warm: dict[str, list[tuple[float, float]]] = {a: [] for a in algorithms}
    info: dict[str, list[str]] = {a: [] for a in algorithms}
    for _ in range(rounds):
        cell.churn(lambda: arrivals(cell))
        net = cell.arrays()
        ref, c, w = timed(partial(OrToolsSolver().solve, net))
        ortools_cpu.append(c)
        for a, s in solvers.items():
            sol, c, w = timed(partial(s.solve, net))
            st = s.last
            assert st is not None
            if sol.cost != ref.cost:
                print(f"  !! {a} warm gave {sol.cost}, OR-Tools {ref.cost}")
            warm[a].append((c, w))
            info[a].append(f"{st.algorithm[0]}{'+' if st.fallback else ''}")
    orm = statistics.median(ortools_cpu)
    print(f"  {'ortools from scratch (median)':34s} {orm * 1000:8.1f}")
    for a in algorithms:
        c = statistics.median(x[0] for x in warm[a])
        w = statistics.median(x[1] for x in warm[a])
        print(f"  {a + ' warm (median of ' + str(rounds) + ')':34s} {fmt(c, w)}   "
              f"ortools/warm {orm / max(c, 1e-9):6.1f}x  [{' '.join(info[a])}]")


def run_inputs(path: str, algorithms: Sequence[str], repeats: int) -> None:
    """Saved rounds (a pickled list of Arrays, consecutive rounds of one graph
    manager): per round OR-Tools from scratch and each algorithm carried warm from the
    first round, CPU ms as the median of ``repeats`` passes over the whole sequence."""
    from schedulers.flow.mcf import FirmamentSolver

    with open(path, "rb") as f:
        nets = cast(list[Arrays], pickle.load(f))  # our own saved inputs: trusted
    net = nets[0]
    print(f"\n== {path}: {len(nets)} rounds, round 0: {net.nodes} nodes, "
          f"{len(net.tail)} arcs, {int(net.supply[net.supply > 0].sum())} units")
    cpu: dict[str, list[list[float]]] = {k: [[] for _ in nets]
                                         for k in ("ortools", *algorithms)}
    path_of: dict[str, list[str]] = {a: ["" for _ in nets] for a in algorithms}
    for _ in range(repeats):
        solvers = {a: FirmamentSolver(cast(Algorithm, a)) for a in algorithms}
        for i, net in enumerate(nets):
            ref, c, _ = timed(partial(OrToolsSolver().solve, net))
            cpu["ortools"][i].append(c)
            for a, s in solvers.items():
                sol, c, _ = timed(partial(s.solve, net))
                st = s.last
                assert st is not None
                cpu[a][i].append(c)
                wrong = "" if sol.cost == ref.cost else f" WRONG {sol.cost} != {ref.cost}"
                path_of[a][i] = f"{st.algorithm[0]}{'+' if st.fallback else ''}{wrong}"
    print(f"  CPU ms per round, median of {repeats}; [r=relax c=cost scaling, "
          "+ = auto fell back]; round 0 is cold")
    print("  round " + "".join(f"{k:>22s}" for k in cpu))
    for i in range(len(nets)):
        cells = [f"{statistics.median(cpu['ortools'][i]) * 1000:22.1f}"]
        cells += [f"{statistics.median(cpu[a][i]) * 1000:17.1f} [{path_of[a][i]:2s}]"
                  for a in algorithms]
        print(f"  {i:5d} " + "".join(cells))
    if len(nets) > 1:
        orm = statistics.median(statistics.median(c) for c in cpu["ortools"][1:])
        for a in algorithms:
            w = statistics.median(statistics.median(c) for c in cpu[a][1:])
            print(f"  {a + ' warm rounds 1-' + str(len(nets) - 1) + ' (median)':34s} "
                  f"{w * 1000:8.1f}   ortools {orm * 1000:.1f}, ortools/warm "
                  f"{orm / max(w, 1e-9):6.1f}x")


def churn_jobs(cell: Cell) -> None:
    cell.add_jobs(15, JOB)


def big_job(size: int, cell: Cell) -> None:
    cell.add_jobs(1, size, racks=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1250,12500", help="machines, comma separated")
    p.add_argument("--use", default="0.5,0.9", help="slot utilisations")
    p.add_argument("--policies", default="quincy,spread")
    p.add_argument("--bigjob-sizes", default="3000", help="'' for none")
    p.add_argument("--rounds", type=int, default=3)
    # Every algorithm is slow warm on the 12,500-machine synthetic quincy cells
    # (relax ~17 s a round at 50%, cost scaling and auto ~6 s): ask for them explicitly.
    p.add_argument("--algorithms", default="auto")
    p.add_argument("--no-cold-ours", action="store_true",
                   help="skip our from-scratch timings (except relax)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--inputs", action="append", default=[], metavar="FILE.pkl",
                   help="saved rounds (a pickled list of Arrays) to run instead of the "
                        "synthetic cells; repeatable")
    p.add_argument("--repeats", type=int, default=3,
                   help="with --inputs: passes over each sequence (median reported)")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    compile_first()
    algorithms = args.algorithms.split(",")
    if args.inputs:
        for path in args.inputs:
            run_inputs(path, algorithms, args.repeats)
        print(f"\nload average at end: {os.getloadavg()}")
        return
    print("\ntimes in ms: CPU (process), wall; warm: [winner per round, r=relax "
          "c=cost scaling, + = auto fell back]")
    for machines in map(int, args.sizes.split(",")):
        for policy in args.policies.split(","):
            for use in map(float, args.use.split(",")):
                run_case(f"{policy} {machines} machines {use:.0%}",
                         partial(Cell, machines, use, policy, args.seed), churn_jobs,
                         algorithms, args.rounds, not args.no_cold_ours)
        for size in [int(s) for s in args.bigjob_sizes.split(",") if s]:
            run_case(f"bigjob {size} quincy {machines} machines 90%",
                     partial(Cell, machines, 0.9, "quincy", args.seed),
                     partial(big_job, size), algorithms, args.rounds,
                     not args.no_cold_ours)
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

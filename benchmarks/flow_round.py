"""Round latency of the flow scheduler, split into graph update, solve, extraction and
commit (issues 10 and 33), beside Firmament's published figures.

A cell of MACHINES machines (12 slots each: 12 CPU, 48 GB; racks of 40) is filled to
a slot use with running tasks of the flow scheduler (jobs of 10-200 one-slot tasks;
under Quincy each job's input lies on 3-8 machines of one or two racks). Then:

* **from scratch**: a graph manager that has never seen the cell builds the network
  (1,500 tasks waiting), solves it, extracts claims and commits them;
* **incremental**: ROUNDS times, 1% of the running tasks end and 1,500 tasks arrive
  (15 jobs of 100), and a round updates the network from the replica's change sets.
  As a scheduler process does (``FlowPolicy.absorb``), the network takes in the
  changes that come between rounds as they come: the last round's commits, then the
  tasks that ended; the round that the arrivals start updates only for them. The
  CPU time of that is printed as ``between``; ``--no-absorb`` leaves every change to
  the round, as the simulator's flow scheduler does.

Policies: ``quincy-task`` is Quincy over Firmament's network with a node per task (each
task's own input, one block of 1 GB with three copies placed as HDFS places them, so on
3 machines of 2 racks), solved by our incremental solver (``FirmamentSolver``: each
round starts from the last round's flow and prices); each round's network is also
solved from scratch by OR-Tools (timed apart, its answer checked equal in cost), and
the ratios are printed. ``quincy`` and ``load-spread`` are the grouped networks (a job's
waiting tasks one node; running tasks one node per machine and kind) solved by
OR-Tools from scratch, as rounds were before: the baseline the per-task round is held
to (at most 2x), in the same run.

Scenario ``bigjob``: at 90% slot use, each incremental round one job of 3,000 tasks
arrives in place of the 1,500 tasks (load-spreading; with ``--bigjob-policy
quincy-task``, Quincy with per-task nodes). ``steady``: 1% of the running tasks and
1,500 more end, so the cell stays where the usual rounds keep it (about 90%);
``rising``: only 1% ends, so the cell fills by about 1% a round (91-95% over five
rounds: Fig. 8's range as well as Fig. 9's). The first round, one job on the 90% cell,
is also printed on its own.

The process collects garbage as a scheduler process does (``RoundCollector``: never
inside a round, after it once enough young objects accumulated); the CPU of those
collections is printed per round as ``between rounds``.

Everything is in one process over the memory store (the store's real validation and
commit code; no etcd), with the replica feeding change sets as in a scheduler process.
The parts are timed in CPU time of this process (the machine is shared: other
processes' share of the cores stays out), and the whole round in wall time too.

    python benchmarks/flow_round.py [--machines 1250,12500] [--use 0.5,0.9]
                                    [--policies quincy-task,quincy,load-spread]
                                    [--rounds 5] [--no-bigjob] [--no-absorb]
                                    [--bigjob-policy load-spread]
                                    [--bigjob-fill steady,rising]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from collections.abc import Sequence

import attrs

from cellstate.cell import CellSnapshot
from cellstate.gc_tuning import RoundCollector
from cellstate.keys import KeyKind
from cellstate.kv.memory import MemoryKV
from cellstate.model import Block, Claim, Job, Machine, Resources, TaskState, Transaction
from cellstate.replica import Replica
from cellstate.store import CellStore
from schedulers.api import CellView
from schedulers.flow.costs import make_cost_model
from schedulers.flow.extract import extract
from schedulers.flow.graph import GraphManager
from schedulers.flow.mcf import FirmamentSolver
from schedulers.flow.mcf.compile import warm as warm_kernels
from schedulers.flow.solvers import OrToolsSolver, Solver

SLOTS = 12
RACK = 40
SCHED = "flow"
TASK = Resources.of(cpu=1, mem=4)
BIGJOB = 3000  # tasks of the big job (Fig. 9: relaxation degrades past ~3,000)

#: Firmament (seed 003): relaxation's average runtime at 12,500 machines, Quincy policy,
#: about 50% slot use (Fig. 7, §4.2); where relaxation struggles: past ~93% use (Fig. 8)
#: and, under load-spreading, a job of over ~3,000 tasks arriving at once (Fig. 9);
#: incremental cost scaling 25% (Quincy) to 50% (load-spreading) faster than from
#: scratch (Fig. 11).
PEER = {
    "quincy-task": "Firmament: relaxation < 200 ms average at 12,500 machines, Quincy, "
                   "~50% slots (Fig. 7); slower than cost scaling past ~93% (Fig. 8)",
    "quincy": "Firmament: relaxation < 200 ms average at 12,500 machines (Fig. 7)",
    "load-spread": "Firmament: incremental cost scaling 50% faster than from scratch "
                   "under load-spreading (Fig. 11)",
    "bigjob": "Firmament: relaxation degrades for a single job over ~3,000 tasks under "
              "load-spreading; it races cost scaling (Fig. 9)",
}


@attrs.define
class Timing:
    update: float = 0.0
    solve: float = 0.0
    extract: float = 0.0
    commit: float = 0.0
    between: float = 0.0  # taking changes in before the round (absorb), CPU
    wall: float = 0.0  # the whole round, wall clock
    placed: int = 0
    moved: int = 0
    nodes: int = 0
    arcs: int = 0
    ortools: float = 0.0  # OR-Tools from scratch on the same network (0: not run)
    algorithm: str = ""  # what solved it (FirmamentSolver.last)
    gc: float = 0.0  # CPU in the cyclic collector during update, solve and extraction
    collect: float = 0.0  # CPU of the process's collections between rounds (before this)

    @property
    def total(self) -> float:
        return self.update + self.solve + self.extract + self.commit


class GcClock:
    """CPU seconds spent in the cyclic garbage collector (gc.callbacks), so a round's
    times can say how much of them was a collection that happened to fall there."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._at = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._at = time.process_time()
        else:
            self.spent += time.process_time() - self._at

    def close(self) -> None:
        gc.callbacks.remove(self._tick)


class Cell:
    def __init__(self, machines: int, policy: str, rng: random.Random) -> None:
        self.per_task = policy == "quincy-task"
        self.kv = MemoryKV()
        self.store = CellStore(self.kv)
        self.rng = rng
        self.policy = policy
        self.ids = [f"m{i:05}" for i in range(machines)]
        self.store.add_machines([Machine(mid, Resources.of(cpu=SLOTS, mem=4 * SLOTS),
                                         rack=f"r{i // RACK:03}")
                                 for i, mid in enumerate(self.ids)])
        self.replica = Replica(self.kv)
        self.replica.load()
        self.changes: set[tuple[KeyKind, str]] | None = None
        self.replica.on_changes(self._changed)
        self.njobs = 0
        self.running: dict[str, str] = {}  # task -> machine

    def _changed(self, snap: CellSnapshot, changed: list[tuple[KeyKind, str]] | None) -> None:
        if changed is None or self.changes is None:
            self.changes = None
        else:
            self.changes.update(changed)

    def take_changes(self) -> frozenset[tuple[KeyKind, str]] | None:
        while self.replica.pump(timeout=0):
            pass
        out = frozenset(self.changes) if self.changes is not None else None
        self.changes = set()
        return out

    def job(self, tasks: int, now: float) -> Job:
        jid = f"j{self.njobs:05}"
        self.njobs += 1
        data: tuple[tuple[str, float], ...] = ()
        if self.per_task:
            blocks = tuple((self._block(),) for _ in range(tasks))
            held: dict[str, float] = {}
            for (b,) in blocks:
                for mid in b.on:
                    held[mid] = held.get(mid, 0.0) + b.size
            return Job(jid, "bench", SCHED, tasks, TASK, submitted_at=now,
                       input=tuple(sorted(held.items())), task_input=blocks)
        if self.policy == "quincy":
            first = self.rng.randrange(len(self.ids))
            span = [self.ids[(first + k) % len(self.ids)] for k in range(2 * RACK)]
            holders = sorted(set(self.rng.sample(span, self.rng.randint(3, 8))))
            data = tuple((mid, float(self.rng.randint(1, 20))) for mid in holders)
        return Job(jid, "bench", SCHED, tasks, TASK, submitted_at=now, input=data)

    def _block(self) -> Block:
        """One block of 1 GB, three copies as HDFS places them: a random machine, then
        two machines of another rack."""
        n = len(self.ids)
        first = self.rng.randrange(n)
        racks = n // RACK
        other = (first // RACK + self.rng.randrange(1, racks)) % racks
        second, third = self.rng.sample(range(other * RACK, other * RACK + RACK), 2)
        return Block(1.0, (self.ids[first], self.ids[second], self.ids[third]))

    def fill(self, use: float, now: float) -> None:
        """Running tasks of the flow scheduler up to ``use`` of the slots, spread
        evenly (placed by a plain claim, as a restarted scheduler would find them)."""
        total = round(use * SLOTS * len(self.ids))
        order = [mid for _ in range(SLOTS) for mid in self.ids]
        at = 0
        claims: list[Claim] = []
        while at < total:
            job = self.job(min(self.rng.randint(10, 200), total - at), now)
            self.store.submit_job(job)
            for i in range(job.task_count):
                mid = order[at + i]
                claims.append(Claim(job.id, i, mid))
                self.running[f"{job.id}/{i}"] = mid
            at += job.task_count
            if len(claims) > 4000:
                self._commit_all(claims)
                claims = []
        self._commit_all(claims)

    def _commit_all(self, claims: list[Claim]) -> None:
        by_job: dict[str, list[Claim]] = {}
        for c in claims:
            by_job.setdefault(c.job, []).append(c)
        txns = [Transaction(SCHED, tuple(cs), job=j) for j, cs in by_job.items()]
        for res in self.store.commit_many(txns):
            assert res.ok, res.rejected[:1]

    def end(self, fraction: float, more: int = 0) -> None:
        """End a fraction of the running tasks and ``more`` besides."""
        tasks = sorted(self.running)
        count = min(round(fraction * len(tasks)) + more, len(tasks))
        for tid in self.rng.sample(tasks, count):
            self.store.release_task(tid, TaskState.FINISHED, self.running.pop(tid))

    def arrive(self, tasks: int, per_job: int, now: float) -> None:
        for _ in range(tasks // per_job):
            self.store.submit_job(self.job(per_job, now))


def absorb(cell: Cell, graph: GraphManager, now: float) -> float:
    """The changes so far taken into the network between rounds; CPU seconds."""
    changes = cell.take_changes()
    snap = cell.replica.snapshot()
    t0 = time.process_time()
    graph.update(snap, changes, now)
    return time.process_time() - t0


def round_(cell: Cell, graph: GraphManager, now: float, solver: Solver,
           compare: bool) -> Timing:
    """One round; ``compare``: also solve its network with OR-Tools from scratch
    (outside the round's times) and check that both found the same optimal cost."""
    t = Timing()
    changes = cell.take_changes()
    snap = cell.replica.snapshot()
    w0 = time.perf_counter()
    clock = GcClock()
    t0 = time.process_time()
    graph.update(snap, changes, now)
    t1 = time.process_time()
    net = graph.net.arrays(compact=not solver.slot_arrays)
    sol = solver.solve(net)
    t2 = time.process_time()
    if isinstance(solver, FirmamentSolver) and solver.last is not None:
        t.algorithm = f"{solver.last.algorithm}{'' if solver.last.warm else ' cold'}"
    if compare:
        w_or = time.perf_counter()
        gc_before = clock.spent
        o0 = time.process_time()
        # OR-Tools gets the network as it takes it best: live arcs that can carry
        # flow only (gathering them is not counted).
        ref = OrToolsSolver().solve(graph.net.arrays())
        t.ortools = time.process_time() - o0
        w0 += time.perf_counter() - w_or  # not part of the round
        assert ref.cost == sol.cost, (ref.cost, sol.cost)
        # The extraction is timed from here on: the comparison is not the round's.
        skipped = time.process_time() - t2
        t0, t1, t2 = t0 + skipped, t1 + skipped, t2 + skipped
        clock.spent = gc_before  # a collection during the comparison is not the round's
    view = CellView(snap, SCHED)
    ex = extract(graph, net, sol.flow, view, snap)
    graph.note_moved(ex.moved, now)
    t3 = time.process_time()
    clock.close()
    by_job: dict[str, list[Claim]] = {}
    for c in ex.claims:
        by_job.setdefault(c.job, []).append(c)
    # A round may place nothing (a small cell already full): nothing to commit then.
    results = cell.store.commit_many(
        [Transaction(SCHED, tuple(cs), job=j) for j, cs in by_job.items()]) if by_job else []
    t4 = time.process_time()
    t.wall = time.perf_counter() - w0
    for res in results:
        for c in res.committed:
            cell.running[c.task] = c.machine  # placed, or moved there
        for tid in res.evicted:
            cell.running.pop(tid, None)
    t.update, t.solve, t.extract, t.commit = t1 - t0, t2 - t1, t3 - t2, t4 - t3
    t.gc = clock.spent
    t.placed, t.moved = ex.placed, ex.migrated + ex.preempted
    t.nodes, t.arcs = graph.net.node_count, graph.net.arc_count
    return t


def collect(collector: RoundCollector) -> float:
    """The scheduler process's collection after a step (schedulers/process.py: never
    inside one); CPU seconds."""
    t0 = time.process_time()
    collector.between(idle=True)
    return time.process_time() - t0


def scenario(machines: int, use: float, policy: str, rounds: int, bigjob: str,
             between: bool, collector: RoundCollector, seed: int = 7,
             algorithm: str = "auto") -> tuple[Timing, list[Timing]]:
    """``bigjob``: "" (the usual arrivals), "steady" or "rising" (module doc)."""
    # The cells of earlier scenarios are garbage in reference cycles (a replica and its
    # callbacks), frozen by the collector's passes: left there, they made later
    # scenarios' solves up to twice as slow as in a process of their own.
    collector.full()
    rng = random.Random(seed)
    cell = Cell(machines, policy, rng)
    now = 1000.0
    cell.fill(use, now)
    collector.full()  # as a scheduler process does after loading the cell
    arrive = min(1500, round(0.01 * use * SLOTS * machines * 10))
    if bigjob:
        cell.store.submit_job(cell.job(BIGJOB, now))
    else:
        for _ in range(max(arrive // 100, 1)):
            cell.store.submit_job(cell.job(100, now))
    model = make_cost_model("quincy" if policy == "quincy-task" else policy)
    graph = GraphManager(model, SCHED, move_guard=60.0)
    solver: Solver = (FirmamentSolver(algorithm) if cell.per_task  # type: ignore[arg-type]
                      else OrToolsSolver())
    compare = cell.per_task
    cold = round_(cell, graph, now, solver, compare)
    warm = []
    for _ in range(rounds):
        now += 1.0
        collected = collect(collector)
        spent = absorb(cell, graph, now) if between else 0.0  # the last round's commits
        collected += collect(collector)
        cell.end(0.01, BIGJOB - arrive if bigjob == "steady" else 0)
        spent += absorb(cell, graph, now) if between else 0.0
        collected += collect(collector)
        if bigjob:
            cell.store.submit_job(cell.job(BIGJOB, now))
        else:
            cell.arrive(arrive, 100, now)
        t = round_(cell, graph, now, solver, compare)
        t.between, t.collect = spent, collected
        warm.append(t)
    return cold, warm


def _ms(x: float) -> str:
    return f"{1000 * x:7.1f}"


def report(name: str, cold: Timing, warm: Sequence[Timing]) -> None:
    def med(f: str) -> float:
        return float(statistics.median(getattr(t, f) for t in warm))
    print(f"{name:<34} scratch {_ms(cold.total)} ms (upd {_ms(cold.update)} solve "
          f"{_ms(cold.solve)} ext {_ms(cold.extract)} commit {_ms(cold.commit)}; "
          f"{cold.nodes} nodes {cold.arcs} arcs, placed {cold.placed}; wall "
          f"{_ms(cold.wall)})")
    decide = statistics.median(t.update + t.solve + t.extract for t in warm)
    work = statistics.median(t.between + t.update + t.solve + t.extract for t in warm)
    print(f"{'':<34} incr    {_ms(statistics.median(t.total for t in warm))} ms, decision "
          f"{_ms(decide)} ms, wall {_ms(statistics.median(t.wall for t in warm))} ms; "
          f"between {_ms(med('between'))} ms, between + decision {_ms(work)} ms")
    print(f"{'':<34}         (upd "
          f"{_ms(med('update'))} solve {_ms(med('solve'))} ext {_ms(med('extract'))} commit "
          f"{_ms(med('commit'))}; garbage collector in upd + solve + ext, per round: "
          f"{', '.join(f'{1000 * t.gc:.0f}' for t in warm)} ms, between rounds "
          f"{', '.join(f'{1000 * t.collect:.0f}' for t in warm)} ms; "
          f"{warm[-1].nodes} nodes {warm[-1].arcs} arcs, placed "
          f"{statistics.median(t.placed for t in warm):.0f}, moved "
          f"{statistics.median(t.moved for t in warm):.0f}) median of {len(warm)}")
    if warm[0].ortools:
        ort = med("ortools")
        print(f"{'':<34}         solved by: {', '.join(t.algorithm for t in warm)} "
              f"(cold: {cold.algorithm}); OR-Tools from scratch on the same networks "
              f"{_ms(ort)} ms (cold round's {_ms(cold.ortools)}): "
              f"{ort / max(med('solve'), 1e-9):.1f}x our solve, "
              f"{ort / max(decide, 1e-9):.1f}x our whole decision")


def first_bigjob(t: Timing) -> None:
    """The first incremental round of the big-job scenario on its own: one 3,000-task
    job arriving at 90%."""
    decide = t.update + t.solve + t.extract
    line = (f"{'':<34} first round alone (one job, 90%): decision {_ms(decide)} ms "
            f"(upd {_ms(t.update)} solve {_ms(t.solve)} ext {_ms(t.extract)}; "
            f"{t.algorithm}; of it the garbage collector {1000 * t.gc:.0f} ms)")
    if t.ortools:
        line += (f"; OR-Tools {_ms(t.ortools)} ms: {t.ortools / max(t.solve, 1e-9):.1f}x "
                 f"our solve, {t.ortools / max(decide, 1e-9):.1f}x our whole decision")
    print(line)


def goals(done: dict[tuple[str, int, float], list[Timing]], machines: int, use: float
          ) -> None:
    """Issue 33's goals as same-run ratios: the per-task round against OR-Tools from
    scratch on its networks (at least 10x) and against the grouped round (at most 2x)."""
    task = done.get(("quincy-task", machines, use))
    if task is None:
        return

    def decision(ts: list[Timing]) -> float:
        return float(statistics.median(t.update + t.solve + t.extract for t in ts))

    mine = decision(task)
    ort = float(statistics.median(t.ortools for t in task))
    line = (f"goals {machines} machines {use:.0%}: OR-Tools from scratch / our round "
            f"{ort / mine:.1f}x (goal >= 10x; / our solve "
            f"{ort / float(statistics.median(t.solve for t in task)):.1f}x)")
    grouped = done.get(("quincy", machines, use))
    if grouped is not None:
        line += (f"; our round / today's grouped round {mine / decision(grouped):.2f}x "
                 f"(goal <= 2x; {1000 * mine:.0f} vs {1000 * decision(grouped):.0f} ms)")
    print(line)


def _fills(text: str) -> str:
    for fill in text.split(","):
        if fill not in ("steady", "rising"):
            raise argparse.ArgumentTypeError(
                f"{fill!r} is not a big-job fill (steady or rising)")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", default="1250,12500")
    ap.add_argument("--use", default="0.5,0.9")
    ap.add_argument("--policies", default="quincy-task,quincy,load-spread")
    ap.add_argument("--algorithm", default="auto",
                    choices=["auto", "race", "relax", "cost-scaling"],
                    help="FirmamentSolver's algorithm for the per-task rounds")
    ap.add_argument("--bigjob-policy", default="load-spread",
                    choices=["load-spread", "quincy-task"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-bigjob", action="store_true")
    ap.add_argument("--bigjob-fill", default="steady,rising", type=_fills,
                    help="the big-job scenarios to run: steady, rising (module doc)")
    ap.add_argument("--no-absorb", action="store_true",
                    help="no update between rounds: each round takes every change")
    args = ap.parse_args()
    between = not args.no_absorb
    # As a scheduler process's (schedulers/process.py): no collection inside a round,
    # the young garbage collected after it; full passes only between scenarios.
    collector = RoundCollector(full_every=float("inf"))
    collector.start()
    warm_kernels()  # as a flow scheduler does at start (FlowPolicy.warm_up)
    print(f"load average {os.getloadavg()[0]:.2f}; times in CPU ms of this process; "
          f"changes taken in between rounds: {'yes' if between else 'no'}")
    done: dict[tuple[str, int, float], list[Timing]] = {}
    for machines in (int(x) for x in args.machines.split(",")):
        for policy in args.policies.split(","):
            for use in (float(x) for x in args.use.split(",")):
                cold, warm = scenario(machines, use, policy, args.rounds, "", between,
                                      collector, algorithm=args.algorithm)
                report(f"{policy} {machines} machines {use:.0%}", cold, warm)
                done[(policy, machines, use)] = warm
            print(f"{'':<34} peer: {PEER.get(policy, '')}")
        for use in (float(x) for x in args.use.split(",")):
            goals(done, machines, use)
        for fill in ([] if args.no_bigjob else args.bigjob_fill.split(",")):
            cold, warm = scenario(machines, 0.9, args.bigjob_policy, args.rounds, fill,
                                  between, collector, algorithm=args.algorithm)
            report(f"bigjob {BIGJOB} tasks {machines} machines {args.bigjob_policy} {fill}",
                   cold, warm)
            first_bigjob(warm[0])
            if warm[0].ortools:
                decision = statistics.median(t.update + t.solve + t.extract for t in warm)
                ort = statistics.median(t.ortools for t in warm)
                print(f"goals bigjob {fill} {machines} machines: OR-Tools from scratch / our "
                      f"round {ort / decision:.1f}x (goal >= 10x)")
            print(f"{'':<34} peer: {PEER['bigjob']}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

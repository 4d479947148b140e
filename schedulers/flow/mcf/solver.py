"""Firmament's min-cost-flow solver (seed 003, §4-6): relaxation and cost scaling,
raced or chosen per round, warm-started from the previous round.

Why warm: between two rounds a few percent of the network changes (tasks end and
arrive, waiting tasks' costs grow), so last round's optimal flow and prices are
nearly optimal for this round. The solver keeps, per arc *slot*, the flow and the
arc's ends (a slot whose ends changed holds another arc), and a price per node index.
A warm solve starts from the old flow clipped into the new bounds (new arcs at their
lower bound), which leaves imbalances where supplies or arcs changed, and repairs
only what the changes broke:

* **relaxation** first restores reduced-cost optimality by saturating arcs of
  negative and emptying arcs of positive reduced cost (more imbalance), then routes
  the imbalances by dual ascent (``kernels.relax``);
* **cost scaling** starts from the same reduced-cost optimal flow, so ε = 1 (scaled)
  from the start (``warm_phases``), and one refine with global price updates
  (``kernels.global_update``: every excess gets an admissible path to a deficit at
  once) routes the imbalances (``kernels.cost_scaling``).

Both start from one fused set-up pass (``kernels.prepare``: warm flow, new nodes'
prices, the repair, the forward star) and end with one (``kernels.finish``: flow,
cost, the per-slot state), into arrays kept from solve to solve. Given the graph
manager's arrays (every arc at its slot's index, no lower bounds, the network's
change stamps: ``Arrays.arc_version``), the set-up looks only at the slots and nodes
that changed since the last solve (``kernels.prepare_changes``): the flow, excesses,
degrees and per-slot ends are kept as they were left, so a round's set-up costs its
changes and one copy of the star, not a pass over every arc's numbers.

Stale state is never wrong, only slow: any flow and prices are a valid start for
both algorithms. Prices of nodes with no reused arc (new tasks, reused indexes) are
set so that their cheapest out-arc has reduced cost 0.

How the two are combined (``algorithm``):

* ``"race"``: both run at once in two threads (the kernels release the GIL); the
  first to finish sets a shared abort flag that the other checks every few thousand
  arcs. Firmament does this (§6.1).
* ``"auto"`` (default): relaxation with a work budget of ``relax_budget`` times
  (nodes + arcs) arc scans (``warm_budget``, 1, on a warm start: a usual warm round
  needs under a fifth of one, and a contended one spends all of it before cost
  scaling finishes in a few passes' time: at 4, a 90%-full round of 1.1 M arcs
  spent 106-110 ms in relaxation before handing over, at 1 37-43 ms; the budget
  is checked inside a tree too, which is then dropped: one tree of a large job on a
  full cluster cost 1.7 M arc scans past it), and (warm) of ``big_trees`` trees
  that each cost over ``big_tree`` times (nodes + arcs), or one tree that passes
  half of them together (dropped); past any of these, cost scaling carries on from
  relaxation's state (it is consistent and reduced-cost optimal, so it is a warm
  start like any other: its first refine has nothing to saturate). Before cost
  scaling, when at most ``reverse_units`` units are left, shortest paths grown from
  the deficits route them (``kernels.reverse_paths``, within ``reverse_budget``
  times (nodes + arcs) arc scans): where relaxation's last trees never end (a
  3,000-task job arriving on a 90%-full cell: each spans ~20,000 nodes and 0.8 M
  arcs), the deficits they must reach sit one price step from the sink, and a
  search from them finds each unit's path in ~15,000 arc scans, 5-10 ms for the
  round's last 2-4 units where cost scaling's global update alone looked at 1 M
  arcs (105-170 ms with its price refine, same states). This avoids
  relaxation's bad cases (contention: §4.3, Fig. 8-9: in a full cluster every new
  task's tree spans the network before each small price rise) without paying for
  a second thread every round.
* ``"relax"``, ``"cost-scaling"``: one algorithm only.

The warm state is the winner's: relaxation's prices satisfy reduced-cost
optimality; cost scaling's are ε-optimal in scaled costs, so they are divided by
the scale and moved by label correcting until they satisfy it exactly ("price
refine", §6.3; ``kernels.exact_prices``: the heads of violated arcs raised first,
which after a large job's round touches ~200 nodes where lowering the tails
touched ~126,000), so the next warm start is valid for either algorithm.

Aggregators (the cluster aggregator X has an in-arc per task) would make every
scan of their adjacency cost a pass over the tasks; but an in-arc is residual
backwards only while it carries flow, and X's carry none in a full cluster, so the
kernels skip a wide node's in-arcs while none of them carries flow (``_reach``).

Integer range: cost scaling multiplies costs by n+1 and its prices grow to about
n (n+1) max|cost|. It refuses (``SolveError``) when 4 (n+1)^2 max|cost| passes
2^62 (e.g. 150,000 nodes with costs over ~10^7); ``"auto"`` and ``"race"`` then run
relaxation alone, whose prices stay within n max|cost|.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar, Literal, cast

import attrs
import numpy as np
import numpy.typing as npt

import schedulers.flow.mcf.kernels as K
from schedulers.flow.network import Arrays
from schedulers.flow.solvers import Solution, SolveError

Algorithm = Literal["auto", "race", "relax", "cost-scaling"]
ALGORITHMS: tuple[Algorithm, ...] = ("auto", "race", "relax", "cost-scaling")

I64 = npt.NDArray[np.int64]
_NO_BUDGET = 2**62
_RELAX_SCRATCH = 9  # int64 words per node that relax and drain work in
_REVERSE_SCRATCH = 7  # ... and reverse_paths, in the same words
_RANGE = 2**62


@attrs.frozen
class SolveStats:
    """What the last solve did."""

    algorithm: str  # the algorithm whose flow was returned: "relax" or "cost-scaling"
    warm: bool  # started from the previous round's state
    seconds: float  # wall time of the whole solve
    relax_cpu: float  # CPU seconds in relaxation (its thread's, in a race)
    cost_scaling_cpu: float  # CPU seconds in cost scaling (and its price refine)
    repaired: int  # units of excess the start had to route (imbalance made by changes)
    reused_arcs: int  # arcs that took their flow from the previous round
    fallback: bool  # auto: relaxation ran out of budget and cost scaling finished
    augmentations: int
    price_rises: int
    pushes: int
    relabels: int
    phases: int  # cost scaling's refine phases
    global_updates: int  # cost scaling's global price updates
    ops: int  # arcs looked at, both algorithms
    reverse_paths: int = 0  # auto: paths routed from the deficits after relaxation
    kept_star: bool = False  # the forward star was built from the previous round's
    changes_only: bool = False  # set up from the changed slots alone (prepare_changes)


@attrs.define
class _Run:
    """One algorithm's working copy of the state, and what it did."""

    x: I64
    e: I64
    pi: I64
    stats: I64 = attrs.field(factory=lambda: np.zeros(K.NSTATS, dtype=np.int64))
    status: int = K.DONE
    moved: int = 0  # units make_optimal moved (relaxation's repair)
    optimal: bool = False  # x is reduced-cost optimal already (prepare made it so)
    scratch: I64 | None = None  # relaxation's (_RELAX_SCRATCH n), reused; None: new
    cpu: float = 0.0
    error: str = ""
    exact: bool = True  # its prices make the flow reduced-cost optimal


@attrs.define
class _Kept:
    """What a set-up from the changes alone needs of the last solve besides the flow
    (in the solver's kept ``x``) and its ends (``_ends_of``)."""

    source: object  # the network the arrays came from
    version: int  # its version then
    n: int
    m: int
    cmax: int  # an upper bound on max |cost| (costs that left are not taken out)


class FirmamentSolver:
    """Min-cost flow by relaxation and/or cost scaling, warm-started (module doc).

    ``algorithm``: "auto", "race", "relax" or "cost-scaling". ``warm``: keep the
    state between calls (False: every call is from scratch). ``relax_budget``: in
    "auto", relaxation's arc scans per (nodes + arcs) before cost scaling takes over
    (``warm_budget`` when warm-started);
    ``big_tree``, ``big_trees``: warm, it also hands over after ``big_trees`` trees
    that cost ``big_tree`` times (nodes + arcs) arc scans or more each (a full
    cluster), or in one tree that passes half of them together.
    ``reverse_units``, ``reverse_budget``: in "auto", when relaxation hands over with
    at most ``reverse_units`` units of excess left, paths from the deficits route
    them within ``reverse_budget`` times (nodes + arcs) arc scans before cost scaling
    is called (0: never).
    ``alpha``: cost scaling's ε divisor per phase. ``warm_phases``: a warm cost
    scaling starts at the from-scratch first ε divided by alpha this many more times
    (or at the flow's largest violation, if that is larger); the default, 20, means
    ε = 1. ``global_update``: cost scaling updates every price globally
    (``kernels.global_update``, about one pass over the arcs) at the start of each
    refine and whenever its relabels have looked at this many times (nodes + arcs)
    arcs since the last; 0: never.
    """

    name: ClassVar[str] = "firmament"
    slot_arrays: ClassVar[bool] = True

    def __init__(self, algorithm: Algorithm = "auto", *, warm: bool = True,
                 relax_budget: float = 30.0, warm_budget: float = 1.0, alpha: int = 8,
                 warm_phases: int = 20, global_update: float = 0.3,
                 big_tree: float = 0.125, big_trees: int = 4,
                 reverse_budget: float = 0.5, reverse_units: int = 64) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
        if alpha < 2:
            raise ValueError("alpha must be at least 2")
        self.algorithm: Algorithm = algorithm
        self.warm = warm
        self.relax_budget = relax_budget
        self.warm_budget = warm_budget
        self.alpha = alpha
        self.warm_phases = warm_phases
        self.global_update = global_update
        self.big_tree = big_tree
        self.big_trees = big_trees
        self.reverse_budget = reverse_budget
        self.reverse_units = reverse_units
        self.last: SolveStats | None = None
        self.reset()

    def reset(self) -> None:
        """Forget the previous round: the next solve is from scratch."""
        self._ends_of: I64 = np.empty(0, dtype=np.int64)  # per slot: tail << 31 | head
        self._flow_of: I64 = np.empty(0, dtype=np.int64)
        self._pi: I64 | None = None
        self._star: _Star | None = None
        self._kept: _Kept | None = None
        self._flow_in_x = False  # the last solve left its flow per slot in x only
        self._buf = _Buffers()

    # -- the solve ---------------------------------------------------------------------

    def solve(self, net: Arrays) -> Solution:
        wall = time.perf_counter()
        n = int(net.nodes)
        supply = np.ascontiguousarray(net.supply[:n], dtype=np.int64)
        if int(supply.sum()) != 0:
            raise SolveError(f"firmament: supplies sum to {int(supply.sum())}, not 0")
        tail = np.ascontiguousarray(net.tail, dtype=np.int64)
        head = np.ascontiguousarray(net.head, dtype=np.int64)
        lower = np.ascontiguousarray(net.lower, dtype=np.int64)
        capacity = np.ascontiguousarray(net.capacity, dtype=np.int64)
        cost = np.ascontiguousarray(net.cost, dtype=np.int64)
        slots = np.ascontiguousarray(net.arcs, dtype=np.int64)
        m = len(tail)
        if n >= 2**31:
            raise SolveError(f"firmament: {n} nodes; node indexes must fit in 31 bits")
        warm = self.warm and self._pi is not None
        algorithm = self.algorithm
        # Relaxation first on this state: the start is made reduced-cost optimal in
        # the same passes (a racer's copy and cost scaling's start are not).
        optimal = algorithm in ("auto", "relax", "cost-scaling")
        pi = np.zeros(n, dtype=np.int64)
        old = 0
        if warm:
            assert self._pi is not None
            old = min(n, len(self._pi))
            pi[:old] = self._pi[:old]
        b = self._buf
        # The forward star is built from the previous round's (module doc), in the
        # other of two buffers; half-arc numbers in 32 bits when they fit (half the
        # memory).
        kept, self._star = self._star, None
        side = 1 - kept.side if kept is not None else 0
        start = b.i64(f"start{side}", n + 1)
        wide = 2 * m >= 2**31
        adj = b.i64(f"adj{side}", 2 * m) if wide else b.i32(f"adj{side}", 2 * m)
        star = warm and kept is not None and kept.wide == wide
        dirty = self._changed_slots(net, star, n, m)
        changes = dirty is not None
        has_lower = not changes and bool(lower.any())
        x, e = b.kept_i64("x", m), b.kept_i64("e", n)
        cap = b.i64("cap", m) if has_lower else capacity
        if star:
            assert kept is not None
            old_n, old_m, old_start, old_adj = kept.n, kept.m, kept.start, kept.adj
        else:
            old_n, old_m, old_start, old_adj = 0, 0, start[:0], adj[:0]
        if changes:
            assert dirty is not None and self._kept is not None and net.node_born is not None
            self._grow_slots(m)
            bad, reused, imbalance, moved, cmax, smax, ident = K.prepare_changes(
                n, old_n, supply, b.kept_i64("supply", n), tail, head, capacity, cost,
                dirty, net.node_born, self._kept.version, self._ends_of, x, e, pi,
                b.kept_i64("deg", n), b.kept_i64("outdeg", n), b.kept_true(m), optimal,
                start, adj, old_start, old_adj, b.bools("seen", n), b.i64("de", n),
                b.i64("fpos", n), b.i64("bpos", n), b.i64("best", n),
                b.i64("fresh", len(dirty)), b.i64("ins", len(dirty)), b.bools("touched", n))
            cmax = max(int(cmax), self._kept.cmax)
        else:
            # The flow per slot of the last solve: in x where it was set up from its
            # changes (x is by slot then; read before written at each index).
            prev_flow = self._flow_of
            if self._flow_in_x:
                prev_flow = x if net.arc_version is not None else x.copy()
            bad, reused, imbalance, moved, cmax, smax, ident = K.prepare(
                n, supply, tail, head, lower, capacity, cost, slots,
                self._ends_of, prev_flow, old, warm, optimal, has_lower,
                pi, x, cap, e, start, adj, b.bools("seen", n), b.i64("de", n),
                b.i64("fpos", n), b.i64("bpos", n), b.i64("best", n), b.i64("fresh", m),
                star, old_n, old_m, old_start, old_adj, b.bools("same", max(m, old_m)),
                b.i64("ins", m))
        if bad >= 0:
            raise SolveError("firmament: an arc's lower bound exceeds its capacity")
        # Kept once the solve has finished: the next star is built from it and from
        # the ends finish keeps, which must be of the same round.
        built = _Star(side, n, m, wide, start, adj) if self.warm and ident else None
        g = _Graph(n, start, adj, tail, head, cap, cost)
        relax_run = cs_run = None
        fallback = False
        cs_ok = self._cs_fits(n, cmax)
        if algorithm in ("auto", "race") and not cs_ok:
            algorithm = "relax"
        if algorithm == "cost-scaling":
            if not cs_ok:
                raise SolveError(self._range_message(n, cmax))
            cs_run = _Run(x, e, pi)
            # The set-up made the start reduced-cost optimal (``optimal``).
            self._cost_scaling(g, cs_run, warm, _NO_BUDGET, np.zeros(1, np.int64),
                               optimal=optimal)
            winner = cs_run
        elif algorithm == "relax":
            relax_run = _Run(x, e, pi, optimal=optimal, moved=moved,
                             scratch=b.i64("relax", _RELAX_SCRATCH * n))
            self._relax(g, relax_run, _NO_BUDGET, np.zeros(1, np.int64))
            winner = relax_run
        elif algorithm == "auto":
            relax_run = _Run(x, e, pi, optimal=optimal, moved=moved,
                             scratch=b.i64("relax", _RELAX_SCRATCH * n))
            budget = int((self.warm_budget if warm else self.relax_budget) * (n + m))
            # The big-tree rule is for warm rounds: from scratch, the first trees of
            # a full cluster span it before prices settle, and relaxation is still
            # the faster finish (Fig. 7).
            big = int(self.big_tree * (n + m)) if warm else _NO_BUDGET
            self._relax(g, relax_run, budget, np.zeros(1, np.int64), big, self.big_trees)
            winner = relax_run
            if (relax_run.status == K.BUDGET and self.reverse_budget > 0
                    and int(relax_run.e[relax_run.e > 0].sum()) <= self.reverse_units):
                self._reverse(g, relax_run, int(self.reverse_budget * (n + m)))
            if relax_run.status == K.BUDGET:
                fallback = True
                cs_run = _Run(relax_run.x, relax_run.e, relax_run.pi)
                self._cost_scaling(g, cs_run, True, _NO_BUDGET, np.zeros(1, np.int64),
                                   optimal=True)
                winner = cs_run
        else:
            relax_run = _Run(x.copy(), e.copy(), pi.copy())
            cs_run = _Run(x.copy(), e.copy(), pi.copy())
            winner = self._race(g, relax_run, cs_run, warm)
        for run in (relax_run, cs_run):
            if run is not None and run.status == K.INFEASIBLE:
                raise SolveError(f"firmament: infeasible network ({run.error})")
        if winner.status != K.DONE:  # pragma: no cover - every path above finishes
            raise SolveError(f"firmament: no solution (status {winner.status})")
        if winner.x is not x:  # a racer's copy: the kept state is in x
            x[:] = winner.x
            e[:] = 0
        if changes:
            flow = x.copy()
            total, exact = K.flow_cost(x, cost)
        else:
            if self.warm:
                self._grow_slots(int(smax) + 1)
            flow, total, exact = K.finish(x, lower if has_lower else lower[:0], cost,
                                          slots, tail, head,
                                          self._ends_of, self._flow_of,
                                          self.warm, bool(ident))
        if not exact:
            total = sum(int(f) * int(c) for f, c in zip(flow.tolist(), cost.tolist(),
                                                        strict=True))
        if self.warm:  # only differences of prices matter: keep them near zero
            self._pi = winner.pi - (int(winner.pi.max()) if n else 0)
            self._star = built
            self._keep(net, n, m, int(cmax), changes, has_lower, bool(ident),
                       winner.exact and built is not None, start, tail, supply)
        if relax_run is not None:
            imbalance += relax_run.moved
        self.last = self._stats(winner is cs_run, warm, wall, relax_run, cs_run,
                                int(imbalance), int(reused), fallback, star, changes)
        return Solution(flow, int(total))

    def _changed_slots(self, net: Arrays, star: bool, n: int, m: int) -> I64 | None:
        """The slots changed since the last solve, if this one can be set up from them
        alone (module doc; ``star``: the last solve's star is at hand); None: set up
        from every arc."""
        k = self._kept
        if (not star or k is None or net.arc_version is None or net.source is not k.source
                or n < k.n or m < k.m):
            return None
        out = self._buf.i64("dirty", m)
        count = K.changed_slots(np.ascontiguousarray(net.arc_version, dtype=np.int64),
                                k.version, np.ascontiguousarray(net.lower, dtype=np.int64),
                                out)
        return out[:count] if count >= 0 else None

    def _keep(self, net: Arrays, n: int, m: int, cmax: int, changes: bool,
              has_lower: bool, ident: bool, exact: bool, start: I64, tail: I64,
              supply: I64) -> None:
        """What the next solve needs to be set up from its changes alone, or None where
        it cannot be: arrays without change stamps or with lower bounds, prices that do
        not make the flow reduced-cost optimal (unchanged arcs are not looked at)."""
        self._flow_in_x = changes
        if net.arc_version is None or has_lower or not ident or not exact:
            self._kept = None
            return
        if not changes:  # counted from scratch; kept up to date by prepare_changes
            b = self._buf
            b.kept_i64("deg", n)[:] = np.diff(start[:n + 1])
            b.kept_i64("outdeg", n)[:] = np.bincount(tail, minlength=n)[:n]
            b.kept_i64("supply", n)[:] = supply
            b.kept_true(m)
            self._flow_in_x = True
        self._kept = _Kept(net.source, net.version, n, m, cmax)

    # -- the algorithms ----------------------------------------------------------------

    def _relax(self, g: _Graph, run: _Run, budget: int, abort: I64, big: int = _NO_BUDGET,
               max_big: int = _NO_BUDGET) -> None:
        t0 = time.thread_time()
        if not run.optimal:
            run.moved = K.make_optimal(g.tail, g.head, g.cap, g.cost, run.x, run.e, run.pi)
        ws = np.empty(_RELAX_SCRATCH * g.n, dtype=np.int64) if run.scratch is None else run.scratch
        K.drain(g.n, g.start, g.adj, g.tail, g.head, g.cap, g.cost, run.x, run.e, run.pi,
                4 * (g.n + len(g.tail)), ws)
        run.status = K.relax(g.n, g.start, g.adj, g.tail, g.head, g.cap, g.cost,
                             run.x, run.e, run.pi, budget, abort, run.stats, big, max_big,
                             ws)
        if run.status == K.INFEASIBLE:
            run.error = "relaxation: excess with no residual arc out of its tree"
        run.cpu += time.thread_time() - t0

    def _reverse(self, g: _Graph, run: _Run, budget: int) -> None:
        """Relaxation's state handed to ``kernels.reverse_paths``: DONE if it routed
        everything left, else BUDGET with a consistent state for cost scaling."""
        t0 = time.thread_time()
        assert run.scratch is not None
        ws = run.scratch[:_REVERSE_SCRATCH * g.n]
        run.status = K.reverse_paths(g.n, g.start, g.adj, g.tail, g.head, g.cap, g.cost,
                                     run.x, run.e, run.pi, run.stats[K.ST_OPS] + budget,
                                     run.stats, ws)
        run.cpu += time.thread_time() - t0

    def _cost_scaling(self, g: _Graph, run: _Run, warm: bool, budget: int,
                      abort: I64, optimal: bool = False) -> None:
        """``optimal``: the flow is reduced-cost optimal for ``run.pi`` already
        (relaxation's state, or the set-up's), so its violation is 0 without a pass
        over the arcs to find it, and the first refine has nothing to saturate."""
        t0 = time.thread_time()
        scale = g.n + 1
        limit = _RANGE // (4 * scale)
        if int(np.abs(run.pi).max(initial=0)) > limit:
            run.pi[:] = 0  # stale prices too far apart to scale: start from zero
            optimal = False
        p = run.pi * scale
        cmax = int(np.abs(g.cost).max(initial=0))
        eps = max(1, cmax * scale // self.alpha)
        if warm:
            # The flow is already V-optimal (V: its largest violation), but an excess
            # needs ε near the price gaps it must cross, or two nodes relabel each
            # other up by ε at a time; so ε starts at V or max cost over alpha^k.
            violation = 0 if optimal else int(
                K.max_violation(g.tail, g.head, g.cap, g.cost, run.x, p, scale))
            eps = max(violation, eps // self.alpha ** self.warm_phases, 1)
        run.status = K.cost_scaling(g.n, g.start, g.adj, g.tail, g.head, g.cap, g.cost,
                                    run.x, run.e, p, scale, eps, self.alpha, budget,
                                    abort, run.stats,
                                    int(self.global_update * (g.n + len(g.tail))),
                                    optimal)
        if run.status == K.INFEASIBLE:
            run.error = "cost scaling: a node's price passed the feasibility bound"
        if run.status == K.DONE:
            # Price refine: ε-optimal scaled prices -> exact reduced-cost optimality.
            run.pi = p // scale
            if not K.exact_prices(g.n, g.start, g.adj, g.tail, g.head, g.cap, g.cost,
                                  run.x, run.pi, 50 * (g.n + 1), g.n + 1):
                run.pi[:] = 0  # not settled: the next warm start uses zero prices
                run.exact = False
        run.cpu += time.thread_time() - t0

    def _race(self, g: _Graph, relax_run: _Run, cs_run: _Run, warm: bool) -> _Run:
        abort = np.zeros(1, dtype=np.int64)
        order: list[_Run] = []
        lock = threading.Lock()

        def finish(run: _Run) -> None:
            with lock:
                if run.status in (K.DONE, K.INFEASIBLE) and not order:
                    order.append(run)
                    abort[0] = 1

        def go_relax() -> None:
            self._relax(g, relax_run, _NO_BUDGET, abort)
            finish(relax_run)

        def go_cs() -> None:
            self._cost_scaling(g, cs_run, warm, _NO_BUDGET, abort)
            finish(cs_run)

        other = threading.Thread(target=go_cs, name="firmament-cost-scaling")
        other.start()
        go_relax()
        other.join()
        if not order:  # pragma: no cover - one of them always finishes
            raise SolveError("firmament race: neither algorithm finished")
        return order[0]

    # -- bookkeeping -------------------------------------------------------------------

    @staticmethod
    def _cs_fits(n: int, cmax: int) -> bool:
        return 4 * (n + 1) ** 2 * max(int(cmax), 1) < _RANGE

    @staticmethod
    def _range_message(n: int, cmax: int) -> str:
        return (f"firmament cost scaling: max |cost| {cmax} times (n+1)^2 = {(n + 1) ** 2} "
                f"(times 4) passes 2^62; prices would overflow int64. Use relaxation, "
                f"or smaller costs")

    def _grow_slots(self, size: int) -> None:
        """The per-slot arrays cover ``size`` slots (grown by a quarter beyond it,
        keeping what they hold: a set-up from the changes reads the ends kept)."""
        have = len(self._ends_of)
        if have < size:
            size += size // 4
            ends = np.full(size, -1, dtype=np.int64)
            ends[:have] = self._ends_of
            flow = np.zeros(size, dtype=np.int64)
            flow[:have] = self._flow_of
            self._ends_of, self._flow_of = ends, flow

    @staticmethod
    def _stats(cs_won: bool, warm: bool, wall: float, relax_run: _Run | None,
               cs_run: _Run | None, imbalance: int, reused: int,
               fallback: bool, kept_star: bool, changes_only: bool) -> SolveStats:
        zero = np.zeros(K.NSTATS, dtype=np.int64)
        rs = relax_run.stats if relax_run is not None else zero
        cs = cs_run.stats if cs_run is not None else zero
        return SolveStats(
            algorithm="cost-scaling" if cs_won else "relax", warm=warm,
            seconds=time.perf_counter() - wall,
            relax_cpu=relax_run.cpu if relax_run is not None else 0.0,
            cost_scaling_cpu=cs_run.cpu if cs_run is not None else 0.0,
            repaired=imbalance, reused_arcs=reused, fallback=fallback,
            augmentations=int(rs[K.ST_AUGMENT]), price_rises=int(rs[K.ST_RISE]),
            pushes=int(cs[K.ST_PUSH]), relabels=int(cs[K.ST_RELABEL]),
            phases=int(cs[K.ST_PHASES]), global_updates=int(cs[K.ST_UPDATES]),
            ops=int(rs[K.ST_OPS] + cs[K.ST_OPS]), reverse_paths=int(rs[K.ST_PATHS]),
            kept_star=kept_star,
            changes_only=changes_only)


class _Buffers:
    """Arrays reused from solve to solve (grown, never shrunk): fresh m-sized arrays
    cost page faults and zeroing each round. A view's contents are undefined; the
    kernels write every entry they read."""

    def __init__(self) -> None:
        self._arrays: dict[str, npt.NDArray[np.generic]] = {}

    def _get(self, name: str, size: int, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
        have = self._arrays.get(name)
        if have is None or len(have) < size:
            have = np.empty(size + size // 4 + 16, dtype=dtype)
            self._arrays[name] = have
        return have[:size]

    def i64(self, name: str, size: int) -> I64:
        return cast(I64, self._get(name, size, np.int64))

    def kept_i64(self, name: str, size: int) -> I64:
        """As ``i64``, but its contents are kept from call to call (grown with zeros)."""
        have = self._arrays.get(name)
        if have is not None and len(have) < size:
            grown = np.zeros(size + size // 4 + 16, dtype=np.int64)
            grown[:len(have)] = have
            self._arrays[name] = grown
        return self.i64(name, size)

    def kept_true(self, size: int) -> npt.NDArray[np.bool_]:
        """A bool per slot, True: ``prepare_changes`` puts back what it clears."""
        have = self._arrays.get("keep")
        if have is None or len(have) < size:
            self._arrays["keep"] = np.ones(size + size // 4 + 16, dtype=np.bool_)
        return self.bools("keep", size)

    def i32(self, name: str, size: int) -> npt.NDArray[np.int32]:
        return cast(npt.NDArray[np.int32], self._get(name, size, np.int32))

    def bools(self, name: str, size: int) -> npt.NDArray[np.bool_]:
        return cast(npt.NDArray[np.bool_], self._get(name, size, np.bool_))


@attrs.frozen
class _Star:
    """The forward star a solve built (its arcs each at the index of its slot), in
    buffer ``side`` of two: the next solve builds its own from it in the other."""

    side: int
    n: int
    m: int
    wide: bool  # half-arcs in int64
    start: I64
    adj: npt.NDArray[np.int32] | I64


@attrs.frozen
class _Graph:
    """The round's network as the kernels take it (shared, read-only, by racers)."""

    n: int
    start: I64
    adj: npt.NDArray[np.int32] | I64
    tail: I64
    head: I64
    cap: I64
    cost: I64

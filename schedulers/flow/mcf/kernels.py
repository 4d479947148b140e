"""The numba kernels of the Firmament-style solvers (one module, so one on-disk cache).

Conventions shared by every kernel (the solver module sets them up):

* arcs are ``0..m-1`` with ``tail``, ``head``, ``cap`` (capacity minus lower bound),
  ``cost`` and ``x`` (flow minus lower bound, ``0 <= x <= cap``);
* ``e[v]`` is node v's *excess*: supply (lower bounds shifted in) plus inflow minus
  outflow; a feasible flow has ``e == 0`` everywhere;
* the residual network is stored as half-arcs in a forward star (CSR, ``start``,
  ``adj``): half-arc ``2a`` goes tail->head with residual ``cap - x`` and cost
  ``cost``, half-arc ``2a+1`` goes head->tail with residual ``x`` and cost ``-cost``;
* a node's price ``pi`` enters reduced costs as ``rc = cost - pi[from] + pi[to]``.
  Prices only *rise* at nodes with excess (in both algorithms), and a flow is optimal
  when every residual half-arc has ``rc >= 0`` (reduced-cost optimality).

Every kernel leaves ``x``, ``e`` and the prices consistent whenever it returns, also
when it stops early (work budget spent, or told to stop through ``abort[0] != 0``),
so another kernel can carry on from where it stopped. Status codes: ``DONE``,
``BUDGET`` (stopped early, state consistent), ``ABORTED`` (the other racer won),
``INFEASIBLE``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

DONE = 0
BUDGET = 1
ABORTED = 2
INFEASIBLE = -1
NOT_CONVERGED = 3

INF = np.int64(2**62)

#: Counters a kernel reports in its ``stats`` array.
ST_OPS = 0  # arcs looked at: the unit of the work budget
ST_AUGMENT = 1  # relaxation: augmentations
ST_RISE = 2  # relaxation: price rises
ST_PUSH = 3  # cost scaling: pushes
ST_RELABEL = 4  # cost scaling: relabels
ST_PHASES = 5  # cost scaling: refine phases
ST_UPDATES = 6  # cost scaling: global price updates
ST_PATHS = 7  # reverse_paths: shortest paths from the deficits
NSTATS = 8

_CHECK = 4095  # look at the abort flag every 4,096 arcs
_LOOK = 64  # relaxation looks ahead from joining nodes of at most this degree
_WIDE = 256  # nodes of more half-arcs skip their in-arcs while none carries flow


# -- in-arcs without flow ---------------------------------------------------------------
# An aggregator's half-arcs are mostly backward ones (the cluster aggregator X has one
# in-arc per task, ~150,000, and 300 out-arcs), and a backward half-arc is residual
# only while its arc carries flow: in a full cluster none of X's does (tasks go to
# their preferred machines or to their job's unscheduled aggregator). So every scan
# of such a node's adjacency that wants residual half-arcs (a relaxation tree, a
# price rise, a relabel, a Dijkstra) stops after its forward half-arcs while the node
# has no in-arc with flow. ``flows[v]`` counts v's in-arcs with flow (-1: not
# counted yet; counted on the first scan that needs it, then kept up to date where
# the kernel moves flow), ``back[v]`` is where v's backward half-arcs begin.


@njit(cache=True, nogil=True)
def _reach(u, start, adj, x, flows, back):  # type: ignore[no-untyped-def]
    """The end of u's half-arcs that can be residual (see above)."""
    end = start[u + 1]
    if end - start[u] <= _WIDE:
        return end
    c = flows[u]
    if c < 0:
        lo = start[u]  # the first backward half-arc: forward ones are listed first
        hi = end
        while lo < hi:
            mid = (lo + hi) >> 1
            if adj[mid] & 1 == 0:
                lo = mid + 1
            else:
                hi = mid
        back[u] = lo
        c = 0
        for k in range(lo, end):
            if x[adj[k] >> 1] > 0:
                c += 1
        flows[u] = c
    return back[u] if c == 0 else end


@njit(cache=True, nogil=True)
def _moved(a, before, after, head, flows):  # type: ignore[no-untyped-def]
    """Keep ``flows`` counted after arc a's flow went from ``before`` to ``after``."""
    if (before == 0) != (after == 0):
        v = head[a]
        if flows[v] >= 0:
            flows[v] += 1 if after > 0 else -1


@njit(cache=True, nogil=True)
def _place(n, tail, head, start, fpos, bpos, adj):  # type: ignore[no-untyped-def]
    """The forward star of the residual half-arcs by counting sort: ``start[v + 1]``
    holds v's degree and ``fpos[v]`` its out-degree on entry; fills ``start`` (prefix
    sums) and ``adj``: each node's forward half-arcs (out-arcs, towards the sink
    side) before its backward ones, each part in arc order."""
    for v in range(n):
        start[v + 1] += start[v]
    for v in range(n):
        bpos[v] = start[v] + fpos[v]
        fpos[v] = start[v]
    for a in range(tail.shape[0]):
        t = tail[a]
        h = head[a]
        adj[fpos[t]] = 2 * a
        fpos[t] += 1
        adj[bpos[h]] = 2 * a + 1
        bpos[h] += 1


@njit(cache=True, nogil=True)
def _restar(n, old_n, tail, head, same, old_start, old_adj,  # type: ignore[no-untyped-def]
            ins, nins, start, fpos, bpos, adj, touched):
    """``_place`` from the previous round's star (``old_start``, ``old_adj``, nodes
    ``old_n``): each node's half-arcs whose arc is the same (``same[a]``: same index,
    same ends) are copied in their old order, then the ``nins`` arcs of ``ins`` (every
    other arc) are placed after them as ``_place`` places arcs. The old star is read
    node by node and the new one written in order, so only the changed arcs cost a
    scattered write; each node's forward half-arcs still come before its backward
    ones. ``start``/``fpos`` hold degrees as for ``_place``. A node that no arc was
    added to or taken from (``touched[v]`` False) has its half-arcs copied as they
    were without looking each one's arc up in ``same`` (a scattered read per
    half-arc: the copy of a 1.2 M-arc star took 42-47 ms that way, against 10-19 ms
    for a plain copy of its array)."""
    for v in range(n):
        start[v + 1] += start[v]
    for v in range(n):
        bpos[v] = start[v] + fpos[v]
        fpos[v] = start[v]
    for v in range(min(n, old_n)):
        if not touched[v]:
            o = old_start[v]
            f = start[v]
            for k in range(start[v + 1] - f):
                adj[f + k] = old_adj[o + k]
            continue
        f = fpos[v]
        b = bpos[v]
        for k in range(old_start[v], old_start[v + 1]):
            hh = old_adj[k]
            if same[hh >> 1]:
                if hh & 1 == 0:
                    adj[f] = hh
                    f += 1
                else:
                    adj[b] = hh
                    b += 1
        fpos[v] = f
        bpos[v] = b
    for i in range(nins):
        a = ins[i]
        t = tail[a]
        h = head[a]
        adj[fpos[t]] = 2 * a
        fpos[t] += 1
        adj[bpos[h]] = 2 * a + 1
        bpos[h] += 1


@njit(cache=True, nogil=True)
def _optimal_arc(a, t, h, cap, cost, x, pi, de):  # type: ignore[no-untyped-def]
    """make_optimal for one arc, its excess changes into ``de``; returns units moved."""
    r = cost[a] - pi[t] + pi[h]
    d = 0
    if r < 0:
        d = cap[a] - x[a]
    elif r > 0:
        d = -x[a]
    if d != 0:
        x[a] += d
        de[t] -= d
        de[h] += d
    return abs(d)


@njit(cache=True, nogil=True)
def prepare(n, supply, tail, head, lower, capacity, cost,  # type: ignore[no-untyped-def]
            slots, prev_ends, prev_flow, old_nodes, warm, optimal, has_lower,
            pi, x, cap, e, start, adj, seen, de, fpos, bpos, best, fresh,
            star, old_n, old_m, old_start, old_adj, same, ins):
    """Everything a solve needs before its algorithm runs, in two passes over the arcs
    (the starting flow, prices for new nodes, the reduced-cost repair and the forward
    star, fused so that each arc array is read about once).

    Warm, an arc whose slot held the same (tail, head) last round (``prev_ends``,
    ``prev_flow`` by slot) takes its old flow clipped into [lower, capacity]; any
    other arc starts at its lower bound. A node that no reused arc touches (a new
    task, a reused index) gets the price that gives its cheapest out-arc reduced
    cost 0 (with no out-arc, its dearest in-arc), in two rounds so that a new node
    next to another new node (a task and its new job's aggregator) uses the other's.

    Fills (caller-allocated, every entry written): ``cap`` (capacity minus lower
    bound; with no lower bound anywhere, ``has_lower`` False, the caller passes
    ``capacity`` itself and it is not written), ``x`` (the warm flow, or the lower
    bounds when cold, shifted), ``e`` (excesses), ``start``/``adj`` (``_place``);
    warm, the prices of the nodes with no reused arc in ``pi``; with ``optimal``, the
    flow made reduced-cost optimal (as ``make_optimal``). ``seen``, ``de``, ``fpos``,
    ``bpos``, ``best`` (n) and ``fresh`` (m) are scratch.

    ``star``: the previous round's star (``old_start``, ``old_adj`` over ``old_n``
    nodes and ``old_m`` arcs) was built with every arc at the index of its slot, and
    the new one is built from it (``_restar``): an arc that kept its slot, its ends
    and its index keeps its place; ``same`` (max(m, old_m)) and ``ins`` (m) are
    scratch. Returns (bad arc or -1, reused arcs, positive excess before the
    optimality repair, units that repair moved, max |cost|, max slot, whether every
    arc sits at the index of its slot).
    """
    m = tail.shape[0]
    for v in range(n):
        e[v] = supply[v]
        de[v] = 0
        seen[v] = False
        fpos[v] = 0
        start[v] = 0
    start[n] = 0
    bad = -1
    reused = 0
    moved = 0
    cmax = 0
    smax = -1
    nfresh = 0
    nins = 0
    ident = 0
    ns = prev_ends.shape[0]
    for a in range(m):
        t = tail[a]
        h = head[a]
        lo = 0
        c = capacity[a]
        if has_lower:
            lo = lower[a]
            c -= lo
            cap[a] = c
        if c < 0 and bad < 0:
            bad = a
        cmax = max(cmax, abs(cost[a]))
        s = slots[a]
        smax = max(smax, s)
        f = lo
        old = False
        if warm and s < ns and prev_ends[s] == (t << 31) | h:
            f = min(max(prev_flow[s], lo), capacity[a])
            reused += 1
            seen[t] = True
            seen[h] = True
            old = True
        xa = f - lo
        e[t] -= f
        e[h] += f
        start[t + 1] += 1
        start[h + 1] += 1
        fpos[t] += 1
        if optimal and (old or not warm):  # make_optimal, inline
            r = cost[a] - pi[t] + pi[h]
            d = 0
            if r < 0:
                d = c - xa
            elif r > 0:
                d = -xa
            if d != 0:
                xa += d
                de[t] -= d
                de[h] += d
                moved += abs(d)
        x[a] = xa
        if warm and not old:
            fresh[nfresh] = a
            nfresh += 1
        if s == a:
            ident += 1
        if star:
            kept = old and s == a
            same[a] = kept
            if not kept:
                ins[nins] = a
                nins += 1
    if bad >= 0:
        return bad, reused, 0, 0, cmax, smax, ident == m
    if warm:
        moved += _fresh_arcs(n, tail, head, cap, cost, x, pi, de, seen, fresh, nfresh,
                             old_nodes, best, bpos, optimal)
    imbalance = 0
    for v in range(n):
        if e[v] > 0:
            imbalance += e[v]
        e[v] += de[v]
    if star:
        for a in range(m, old_m):
            same[a] = False
        # Every node looked at arc by arc: a full set-up does not track which changed.
        _restar(n, old_n, tail, head, same, old_start, old_adj, ins, nins, start, fpos,
                bpos, adj, np.ones(n, dtype=np.bool_))
    else:
        _place(n, tail, head, start, fpos, bpos, adj)
    return bad, reused, imbalance, moved, cmax, smax, ident == m


@njit(cache=True, nogil=True)
def changed_slots(version, since, lower, out):  # type: ignore[no-untyped-def]
    """The slots whose ``version`` is past ``since`` into ``out``, in order; returns
    their count, or -1 if one of them has a lower bound (``prepare_changes`` takes
    none)."""
    k = 0
    for a in range(version.shape[0]):
        if version[a] > since:
            if lower[a] != 0:
                return -1
            out[k] = a
            k += 1
    return k


@njit(cache=True, nogil=True)
def prepare_changes(n, old_n, supply, old_supply,  # type: ignore[no-untyped-def]
                    tail, head, capacity, cost, dirty, born, since, ends_of, x, e, pi,
                    deg, outdeg, same, optimal, start, adj, old_start, old_adj, seen,
                    de, fpos, bpos, best, fresh, ins, touched):
    """``prepare`` from the previous solve's state, looking only at what changed: the
    slots ``dirty`` (each once) whose arcs changed since that solve and the nodes
    ``born`` after it (``since``), with every arc at the index of its slot and no
    lower bounds (the graph manager's arrays; the caller checks).

    Kept from the previous solve, each updated here where it changed: ``x`` (flow
    per slot), ``ends_of`` (ends per slot), ``e`` (zero everywhere after a solve;
    ``old_supply`` is what it was made with), ``deg`` and ``outdeg`` (half-arcs and
    out-arcs per node, every slot counted as ``_place`` counts it), ``same`` (True
    for every slot; False only inside this call) and the star ``old_start``/``old_adj``
    over ``old_n`` nodes. A changed arc between the same nodes (neither born since)
    keeps its flow clipped into its capacity and is made reduced-cost optimal;
    another starts empty, and a node born since is priced from its arcs as
    ``prepare`` prices new nodes. The new star is ``_restar``'s from the old one.
    Returns as ``prepare`` does (bad is always -1: there are no lower bounds)."""
    m = tail.shape[0]
    for v in range(old_n, n):
        e[v] = 0
        old_supply[v] = 0
        deg[v] = 0
        outdeg[v] = 0
    for v in range(n):
        d = supply[v] - old_supply[v]
        if d != 0:
            e[v] += d
            old_supply[v] = supply[v]
        de[v] = 0
        seen[v] = born[v] <= since
        touched[v] = False
    moved = 0
    cmax = 0
    nfresh = 0
    nins = 0
    for i in range(dirty.shape[0]):
        a = dirty[i]
        t = tail[a]
        h = head[a]
        ends = (t << 31) | h
        old = ends_of[a]
        cmax = max(cmax, abs(cost[a]))
        if old == ends and seen[t] and seen[h]:
            # The same arc with new numbers (most often a cost that moves with time):
            # its flow clipped into its capacity, then made optimal for its cost.
            f = x[a]
            c = min(max(f, 0), capacity[a])
            if c != f:
                x[a] = c
                e[t] += f - c
                e[h] -= f - c
            if optimal:
                moved += _optimal_arc(a, t, h, capacity, cost, x, pi, de)
            continue
        if old >= 0:  # the slot's last arc leaves with its flow
            t0 = old >> 31
            h0 = old & 0x7FFFFFFF
            f = x[a]
            e[t0] += f
            e[h0] -= f
            deg[t0] -= 1
            deg[h0] -= 1
            outdeg[t0] -= 1
            touched[t0] = True
            touched[h0] = True
        touched[t] = True
        touched[h] = True
        deg[t] += 1
        deg[h] += 1
        outdeg[t] += 1
        x[a] = 0
        fresh[nfresh] = a
        nfresh += 1
        same[a] = False
        ins[nins] = a
        nins += 1
        ends_of[a] = ends
    moved += _fresh_arcs(n, tail, head, capacity, cost, x, pi, de, seen, fresh, nfresh,
                         old_n, best, bpos, optimal)
    imbalance = 0
    start[0] = 0
    for v in range(n):
        if e[v] > 0:
            imbalance += e[v]
        e[v] += de[v]
        start[v + 1] = deg[v]
        fpos[v] = outdeg[v]
    _restar(n, old_n, tail, head, same, old_start, old_adj, ins, nins, start, fpos,
            bpos, adj, touched)
    for i in range(nins):
        same[ins[i]] = True
    return -1, m - nfresh, imbalance, moved, cmax, m - 1, True


@njit(cache=True, nogil=True)
def flow_cost(x, cost):  # type: ignore[no-untyped-def]
    """sum(x * cost), and whether the int64 sum is exact (as ``finish``)."""
    total = 0
    bound = 0.0
    for a in range(x.shape[0]):
        total += x[a] * cost[a]
        bound += abs(float(x[a]) * float(cost[a]))
    return total, bound < 2.0**62


@njit(cache=True, nogil=True)
def _fresh_arcs(n, tail, head, cap, cost, x, pi, de,  # type: ignore[no-untyped-def]
                seen, fresh, nfresh, old_nodes, best, bpos, optimal):
    """The set-up's last step for the arcs that start empty (``fresh``): the new
    nodes priced from them, then (``optimal``) each made reduced-cost optimal, its
    excess changes into ``de``; returns the units moved."""
    _price_fresh(n, tail, head, cost, pi, seen, fresh, nfresh, old_nodes, best, bpos)
    moved = 0
    if optimal:
        for i in range(nfresh):
            a = fresh[i]
            moved += _optimal_arc(a, tail[a], head[a], cap, cost, x, pi, de)
    return moved


@njit(cache=True, nogil=True)
def _price_fresh(n, tail, head, cost, pi, seen, fresh,  # type: ignore[no-untyped-def]
                 nfresh, old_nodes, best_out, best_in):
    """The new nodes' prices (``prepare``), from the arcs that are not reused only
    (every arc of a node that no reused arc touches is one of them)."""
    for v in range(old_nodes, n):
        seen[v] = False
    for v in range(n):
        if not seen[v]:
            pi[v] = 0
    for _ in range(2):
        for i in range(nfresh):
            a = fresh[i]
            best_out[tail[a]] = INF
            best_in[tail[a]] = -INF
            best_out[head[a]] = INF
            best_in[head[a]] = -INF
        for i in range(nfresh):
            a = fresh[i]
            t = tail[a]
            h = head[a]
            if not seen[t]:
                c = cost[a] + pi[h]
                if c < best_out[t]:
                    best_out[t] = c
            if not seen[h]:
                c = pi[t] - cost[a]
                if c > best_in[h]:
                    best_in[h] = c
        for i in range(nfresh):
            a = fresh[i]
            for v in (tail[a], head[a]):
                if not seen[v]:
                    if best_out[v] < INF:
                        pi[v] = best_out[v]
                    elif best_in[v] > -INF:
                        pi[v] = best_in[v]


@njit(cache=True, nogil=True)
def finish(x, lower, cost, slots, tail, head,  # type: ignore[no-untyped-def]
           ends_of, flow_of, keep, ident):
    """The returned flow (x plus lower bounds, a new array; ``lower`` empty: none),
    its cost (and whether the int64 sum is exact: False when sum |flow * cost| may
    pass 2^62), and, with
    ``keep``, each arc's ends (tail << 31 | head) and flow by slot for the next warm
    start (slots not live this round get -1). ``ident``: every arc is at the index
    of its slot."""
    m = x.shape[0]
    flow = np.empty(m, dtype=np.int64)
    total = 0
    bound = 0.0
    has_lower = lower.shape[0] == m
    for a in range(m):
        f = x[a] + lower[a] if has_lower else x[a]
        flow[a] = f
        total += f * cost[a]
        bound += abs(float(f) * float(cost[a]))
    if keep:
        # Slots no arc holds this round get -1: with every arc at the index of its
        # slot (``ident``, the graph manager's arrays), those past the last arc.
        if ident:
            ends_of[m:] = -1
        else:
            ends_of[:] = -1
        for a in range(m):
            s = slots[a]
            ends_of[s] = (tail[a] << 31) | head[a]
            flow_of[s] = flow[a]
    return flow, total, bound < 2.0**62


@njit(cache=True, nogil=True)
def make_optimal(tail, head, cap, cost, x, e, pi):  # type: ignore[no-untyped-def]
    """Saturate every arc whose reduced cost is negative and empty every arc whose
    reduced cost is positive (reduced-cost optimality, relaxation's precondition);
    returns the units of flow moved (the imbalance made)."""
    moved = 0
    for a in range(tail.shape[0]):
        moved += _optimal_arc(a, tail[a], head[a], cap, cost, x, pi, e)
    return moved


@njit(cache=True, nogil=True)
def max_violation(tail, head, cap, cost, x, p, scale):  # type: ignore[no-untyped-def]
    """The largest reduced-cost violation of the residual half-arcs under prices
    ``p`` and costs times ``scale``: the ε the flow is ε-optimal for."""
    worst = 0
    for a in range(tail.shape[0]):
        r = cost[a] * scale - p[tail[a]] + p[head[a]]
        if r < 0 and x[a] < cap[a]:
            worst = max(worst, -r)
        elif r > 0 and x[a] > 0:
            worst = max(worst, r)
    return worst


# -- relaxation -------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _augment(s, w, pred, tail, head, cap, x, e, flows):  # type: ignore[no-untyped-def]
    """Send min(e[s], -e[w], path residual) along the tree path s -> w."""
    d = min(e[s], -e[w])
    v = w
    while v != s:
        h = pred[v]
        a = h >> 1
        if h & 1 == 0:
            d = min(d, cap[a] - x[a])
            v = tail[a]
        else:
            d = min(d, x[a])
            v = head[a]
    v = w
    while v != s:
        h = pred[v]
        a = h >> 1
        before = x[a]
        if h & 1 == 0:
            x[a] += d
            v = tail[a]
        else:
            x[a] -= d
            v = head[a]
        _moved(a, before, x[a], head, flows)
    e[s] -= d
    e[w] += d


@njit(cache=True, nogil=True)
def relax(n, start, adj, tail, head, cap, cost, x, e, pi,  # type: ignore[no-untyped-def]
          budget, abort, stats, big, max_big, ws):
    """Relaxation (dual ascent, after Bertsekas' RELAX), as Firmament runs it.

    Precondition: reduced-cost optimality (``make_optimal``); it holds throughout.
    From a node s with excess, grow a tree S over residual half-arcs of reduced cost
    0. When the tree reaches a node with a deficit, augment along the tree path.
    When no balanced half-arc leaves S, raising the prices of S is a dual ascent
    step (the dual gains e(S) per unit): S's prices rise by the smallest reduced
    cost of a residual half-arc leaving S, which makes it balanced. If none leaves
    S while e(S) > 0, the network is infeasible.

    Unlike RELAX, R(S) (the balanced capacity out of S) is not kept, so a rise waits
    until S cannot grow: keeping R costs a scan of every node's whole adjacency as
    it joins, and the aggregators (X, racks) have one arc per task. Instead, as
    Firmament's arc prioritisation does (§5.3.1), the tree grows depth first, each
    node's arcs towards the sink side first (``_place`` lists forward half-arcs
    first), with a look-ahead for a deficit among a joining node's arcs when it has
    few; so a new task usually reaches a free slot in a few steps.

    Where the cluster is full, a new task's tree spreads over most of the network
    before each (small) rise, and relaxation needs thousands of them (Fig. 8). So
    besides the work ``budget`` it stops (``BUDGET``) after ``max_big`` trees (ending
    in an augmentation or a rise) that cost at least ``big`` arc scans each, for cost
    scaling to carry on. The budget is looked at inside a tree as well (a tree that
    passes it is dropped, nothing having changed): one tree of a 3,000-task job on a
    90%-full cell cost 1.7 M arc scans, more than the whole budget, for one rise.
    ``ws`` (9n) is scratch.
    """
    mark = ws[0:n]
    pred = ws[n:2 * n]
    cur = ws[2 * n:3 * n]
    tree = ws[3 * n:4 * n]
    stack = ws[4 * n:5 * n]
    queue = ws[5 * n:6 * n]
    inq = ws[6 * n:7 * n]
    flows = ws[7 * n:8 * n]
    back = ws[8 * n:9 * n]
    mark[:] = 0
    pred[:] = -1
    inq[:] = 0
    flows[:] = -1
    half = max(max_big // 2, 1)
    giant = big * half if big < INF // half else INF
    qh = 0
    qn = 0
    for v in range(n):
        if e[v] > 0:
            queue[(qh + qn) % n] = v
            qn += 1
            inq[v] = True
    ops = stats[ST_OPS]
    check = ops + _CHECK
    stamp = 0
    bigs = 0
    while qn > 0:
        if ops > budget:
            stats[ST_OPS] = ops
            return BUDGET
        if abort[0] != 0:
            stats[ST_OPS] = ops
            return ABORTED
        s = queue[qh]
        qh = (qh + 1) % n
        qn -= 1
        inq[s] = False
        if e[s] <= 0:
            continue
        # Stay with s until its excess is gone: after a rise the next tree holds the
        # last one and more (its arcs stay balanced), whereas switching roots lets
        # two trees undo each other's balanced arcs and creep up in small rises.
        while e[s] > 0:
            if ops > budget:
                stats[ST_OPS] = ops
                return BUDGET
            if abort[0] != 0:
                stats[ST_OPS] = ops
                return ABORTED
            stamp += 1
            began = ops
            mark[s] = stamp
            pred[s] = -1
            cur[s] = start[s]
            tree[0] = s
            size = 1
            stack[0] = s
            top = 1
            target = -1
            while top > 0:
                u = stack[top - 1]
                found = -1
                k = cur[u]
                end = _reach(u, start, adj, x, flows, back)
                while k < end:
                    h = adj[k]
                    k += 1
                    a = h >> 1
                    if h & 1 == 0:
                        w = head[a]
                        r = cap[a] - x[a]
                        c = cost[a]
                    else:
                        w = tail[a]
                        r = x[a]
                        c = -cost[a]
                    if r > 0 and mark[w] != stamp and c - pi[u] + pi[w] == 0:
                        found = h
                        break
                ops += k - cur[u]
                cur[u] = k
                if found < 0:
                    top -= 1
                    continue
                a = found >> 1
                w = head[a] if found & 1 == 0 else tail[a]
                mark[w] = stamp
                pred[w] = found
                if e[w] < 0:
                    target = w
                    break
                tree[size] = w
                size += 1
                cur[w] = start[w]
                stack[top] = w
                top += 1
                if start[w + 1] - start[w] <= _LOOK:
                    for k in range(start[w], start[w + 1]):
                        h = adj[k]
                        a = h >> 1
                        if h & 1 == 0:
                            z = head[a]
                            r = cap[a] - x[a]
                            c = cost[a]
                        else:
                            z = tail[a]
                            r = x[a]
                            c = -cost[a]
                        if e[z] < 0 and r > 0 and mark[z] != stamp and c - pi[w] + pi[z] == 0:
                            mark[z] = stamp
                            pred[z] = h
                            target = z
                            break
                    ops += start[w + 1] - start[w]
                    if target >= 0:
                        break
                if ops >= check:
                    check = ops + _CHECK
                    if abort[0] != 0:
                        stats[ST_OPS] = ops
                        return ABORTED
                    if ops > budget or ops - began > giant:
                        # Past the budget inside a tree: drop the tree (nothing has
                        # changed yet), so one tree spanning a full cluster cannot
                        # overrun the budget many times over. One tree as dear as
                        # half of ``max_big`` big ones is dropped at once: after a
                        # 3,000-task job's arrival on a 90% cell the last units' tree
                        # spans the network, and half the budget went on one that
                        # never ended (650,000 arc scans, 20-25 ms).
                        stats[ST_OPS] = ops
                        return BUDGET
            if target >= 0:
                _augment(s, target, pred, tail, head, cap, x, e, flows)
                stats[ST_AUGMENT] += 1
            else:
                # S cannot grow: raise its prices by the smallest positive reduced cost
                # of a residual half-arc leaving it.
                delta = INF
                for i in range(size):
                    u = tree[i]
                    end = _reach(u, start, adj, x, flows, back)
                    for k in range(start[u], end):
                        h = adj[k]
                        a = h >> 1
                        if h & 1 == 0:
                            w = head[a]
                            r = cap[a] - x[a]
                            c = cost[a]
                        else:
                            w = tail[a]
                            r = x[a]
                            c = -cost[a]
                        if r > 0 and mark[w] != stamp:
                            rc = c - pi[u] + pi[w]
                            if rc < delta:
                                delta = rc
                    ops += end - start[u]
                if delta == INF:
                    stats[ST_OPS] = ops
                    return INFEASIBLE
                for i in range(size):
                    pi[tree[i]] += delta
                stats[ST_RISE] += 1
            if ops - began >= big:
                bigs += 1
                if bigs >= max_big:  # the state is consistent: stop here
                    stats[ST_OPS] = ops
                    return BUDGET
    stats[ST_OPS] = ops
    return DONE


@njit(cache=True, nogil=True)
def drain(n, start, adj, tail, head, cap, cost, x, e, pi, limit, ws):  # type: ignore[no-untyped-def]
    """Move deficits downstream, keeping reduced-cost optimality: Firmament's
    efficient task removal (§5.3.2), generalised.

    A task that ends leaves a deficit at its machine, whose flow to the sink is no
    longer fed; from there the relaxation's trees would have to find it across the
    whole zero-reduced-cost component. Instead a deficit node v takes back flow from
    one of its out-arcs (the deficit moves to that arc's head, eventually the sink,
    where new tasks' flow is wanted anyway), lowering v's price first if that arc is
    not balanced, and only as far as every residual arc into v allows (if an in-arc
    binds first, v keeps the lower price and its deficit). At most ``limit`` arcs are
    looked at (networks with cycles could pass a deficit around). ``ws`` (2n) is
    scratch."""
    queue = ws[0:n]
    inq = ws[n:2 * n]
    inq[:] = 0
    qh = 0
    qn = 0
    for v in range(n):
        if e[v] < 0:
            queue[qn] = v
            qn += 1
            inq[v] = True
    ops = 0
    moved = 0
    while qn > 0 and ops < limit:
        v = queue[qh]
        qh = (qh + 1) % n
        qn -= 1
        inq[v] = False
        while e[v] < 0 and ops < limit:
            # v's out-arcs (forward half-arcs, listed first) hold the flow to take
            # back; its in-arcs matter only if the best of those is not balanced.
            back = -1
            back_rc = INF
            k = start[v]
            end = start[v + 1]
            while k < end:
                h = adj[k]
                if h & 1 == 1:
                    break
                a = h >> 1
                if x[a] > 0 and head[a] != v:
                    rcb = -(cost[a] - pi[v] + pi[head[a]])
                    if rcb < back_rc:
                        back_rc = rcb
                        back = a
                k += 1
            ops += k - start[v] + 1
            if back < 0:
                break
            min_in = INF
            if back_rc > 0:
                for j in range(k, end):
                    a = adj[j] >> 1
                    if x[a] < cap[a] and tail[a] != v:
                        rci = cost[a] - pi[tail[a]] + pi[v]
                        if rci < min_in:
                            min_in = rci
                ops += end - k
            if back_rc > 0:
                if back_rc > min_in:
                    pi[v] -= min_in
                    break
                pi[v] -= back_rc
            w = head[back]
            d = min(-e[v], x[back])
            x[back] -= d
            e[v] += d
            e[w] -= d
            moved += d
            if e[w] < 0 and not inq[w]:
                queue[(qh + qn) % n] = w
                qn += 1
                inq[w] = True
    return moved


# -- shortest paths from the deficits ------------------------------------------------


@njit(cache=True, nogil=True)
def _sift_up(i, key, v, hv, pos, dist):  # type: ignore[no-untyped-def]
    """Put node v (distance ``key``) at heap index i or above it."""
    while i > 0:
        p = (i - 1) >> 1
        w = hv[p]
        if dist[w] <= key:
            break
        hv[i] = w
        pos[w] = i
        i = p
    hv[i] = v
    pos[v] = i


@njit(cache=True, nogil=True)
def _pop_min(size, hv, pos, dist):  # type: ignore[no-untyped-def]
    """Take the heap's least node out; returns the new size (the node was hv[0])."""
    pos[hv[0]] = -1
    size -= 1
    if size == 0:
        return 0
    v = hv[size]
    key = dist[v]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and dist[hv[c + 1]] < dist[hv[c]]:
            c += 1
        if dist[hv[c]] >= key:
            break
        hv[i] = hv[c]
        pos[hv[i]] = i
        i = c
    hv[i] = v
    pos[v] = i
    return size


@njit(cache=True, nogil=True)
def _excess_through(w, via, tail, head, e):  # type: ignore[no-untyped-def]
    """The excess node whose zero-reduced-cost half-arc ``via[w]`` reaches w, if it
    still has excess; else -1."""
    h = via[w]
    if h < 0:
        return -1
    a = h >> 1
    s = tail[a] if h & 1 == 0 else head[a]
    return s if e[s] > 0 else -1


@njit(cache=True, nogil=True)
def reverse_paths(n, start, adj, tail, head, cap, cost, x, e, pi,  # type: ignore[no-untyped-def]
                  budget, stats, ws):
    """Route what excess is left by successive shortest paths grown from the
    deficits: the mirror of relaxation's trees, for the rounds where those never end.

    Precondition: reduced-cost optimality (relaxation's state); it holds throughout.
    After a large job arrives on a full cell, relaxation routes all but a few units;
    each of the last ones' trees (over half-arcs of reduced cost 0) spans ~20,000
    nodes and 0.8 M arcs without meeting a deficit: the deficits it must reach
    (machines where tasks ended, whose residual in-arcs all have a positive reduced
    cost) sit alone one price step away. Grown from those deficits instead, Dijkstra
    over residual half-arcs backwards (lengths are reduced costs, >= 0) crosses that
    step at once, to the sink and then every full machine at the same distance: a
    plateau as wide as relaxation's tree. So the excess nodes' own half-arcs of
    reduced cost 0 mark their ends first, and the search stops the moment it labels
    an excess node or a marked node at the distance being settled (D: no node is
    nearer, so that is the excess's distance), usually at the first scan of the
    plateau (the sink's). Then every settled node v (distance d(v) <= D) gets the
    price pi[v] + d(v) - D, which keeps every residual half-arc's reduced cost >= 0
    (the unsettled nodes are at distance >= D) and makes the path tight, and the path
    takes min(excess, deficit, residual capacities) units. Prices here fall where
    relaxation raises them: only differences matter.

    Stops with ``BUDGET`` once ``budget`` half-arcs have been looked at in all, or
    where no excess can be reached from the deficits left (for cost scaling to
    finish, or to find the network infeasible); the state is consistent after every
    path. ``stats[ST_PATHS]`` counts the paths. ``ws`` (7n) is scratch."""
    dist = ws[0:n]
    pos = ws[n:2 * n]
    hv = ws[2 * n:3 * n]
    pred = ws[3 * n:4 * n]
    touched = ws[4 * n:5 * n]
    via = ws[5 * n:6 * n]
    marks = ws[6 * n:7 * n]
    deficits = 0
    excesses = 0
    for v in range(n):
        dist[v] = INF
        pos[v] = -1
        via[v] = -1
        if e[v] < 0:
            deficits += 1
        elif e[v] > 0:
            excesses += 1
    sinks = np.empty(deficits, dtype=np.int64)
    sources = np.empty(excesses, dtype=np.int64)
    deficits = 0
    excesses = 0
    for v in range(n):
        if e[v] < 0:
            sinks[deficits] = v
            deficits += 1
        elif e[v] > 0:
            sources[excesses] = v
            excesses += 1
    ops = stats[ST_OPS]
    while True:
        size = 0
        nt = 0
        for i in range(deficits):
            v = sinks[i]
            if e[v] < 0:
                dist[v] = 0
                pred[v] = -1
                touched[nt] = v
                nt += 1
                hv[size] = v
                pos[v] = size
                size += 1
        if size == 0:
            stats[ST_OPS] = ops
            return DONE  # supplies sum to zero: no deficit left, no excess either
        nm = 0
        for i in range(excesses):
            s = sources[i]
            if e[s] <= 0:
                continue
            ops += start[s + 1] - start[s]
            for k in range(start[s], start[s + 1]):
                h = adj[k]
                a = h >> 1
                if h & 1 == 0:
                    w = head[a]
                    zero = x[a] < cap[a] and cost[a] - pi[s] + pi[w] == 0
                else:
                    w = tail[a]
                    zero = x[a] > 0 and -cost[a] - pi[s] + pi[w] == 0
                if zero and via[w] < 0:
                    via[w] = h
                    marks[nm] = w
                    nm += 1
        hit = -1
        level = 0
        while size > 0 and hit < 0:
            v = hv[0]
            level = dist[v]
            size = _pop_min(size, hv, pos, dist)
            pos[v] = -2  # settled
            if e[v] > 0 or _excess_through(v, via, tail, head, e) >= 0:
                hit = v
                break
            if ops > budget:
                break
            ops += start[v + 1] - start[v]
            for k in range(start[v], start[v + 1]):
                h = adj[k]
                a = h >> 1
                # The residual half-arc u -> v, if any, and its reduced cost.
                if h & 1 == 0:
                    if x[a] == 0:
                        continue
                    u = head[a]
                    ln = -cost[a] + pi[v] - pi[u]
                else:
                    if x[a] == cap[a]:
                        continue
                    u = tail[a]
                    ln = cost[a] - pi[u] + pi[v]
                if pos[u] == -2:
                    continue
                nd = level + max(ln, 0)
                if nd >= dist[u]:
                    continue
                if dist[u] == INF:
                    touched[nt] = u
                    nt += 1
                    dist[u] = nd
                    pred[u] = h
                    _sift_up(size, nd, u, hv, pos, dist)
                    size += 1
                else:
                    dist[u] = nd
                    pred[u] = h
                    _sift_up(pos[u], nd, u, hv, pos, dist)
                if nd == level and (e[u] > 0 or _excess_through(u, via, tail, head, e) >= 0):
                    hit = u  # no node is nearer: its distance is final
                    break
        if hit >= 0:
            for i in range(nt):
                w = touched[i]
                if pos[w] == -2:
                    pi[w] += dist[w] - level
            src = hit if e[hit] > 0 else _excess_through(hit, via, tail, head, e)
            # The path's capacity: the excess's own half-arc to the hit node (if it is
            # not the excess), then the search's half-arcs to a deficit.
            d = e[src]
            if src != hit:
                a = via[hit] >> 1
                d = min(d, cap[a] - x[a] if via[hit] & 1 == 0 else x[a])
            w = hit
            while pred[w] >= 0:
                h = pred[w]
                a = h >> 1
                if h & 1 == 0:
                    d = min(d, x[a])
                    w = tail[a]
                else:
                    d = min(d, cap[a] - x[a])
                    w = head[a]
            d = min(d, -e[w])
            e[w] += d
            e[src] -= d
            if src != hit:
                a = via[hit] >> 1
                if via[hit] & 1 == 0:
                    x[a] += d
                else:
                    x[a] -= d
            w = hit
            while pred[w] >= 0:
                h = pred[w]
                a = h >> 1
                if h & 1 == 0:
                    x[a] -= d
                    w = tail[a]
                else:
                    x[a] += d
                    w = head[a]
            stats[ST_PATHS] += 1
        for i in range(nt):
            w = touched[i]
            dist[w] = INF
            pos[w] = -1
        for i in range(nm):
            via[marks[i]] = -1
        if hit < 0:
            stats[ST_OPS] = ops
            return BUDGET


# -- cost scaling -----------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _bucket_in(v, b, enode, enext, used, bhead):  # type: ignore[no-untyped-def]
    """Put an entry for node v in bucket b (entries are never taken out: one whose
    node has been settled or moved to another bucket since is skipped when met)."""
    enode[used] = v
    enext[used] = bhead[b]
    bhead[b] = used
    return used + 1


@njit(cache=True, nogil=True)
def _rebucket(n, dist, state, base, enode, enext, bhead):  # type: ignore[no-untyped-def]
    """Buckets from scratch for the window at ``base``: an entry for every unsettled
    node of finite distance inside it; returns the entries used."""
    width = bhead.shape[0]
    for b in range(width):
        bhead[b] = -1
    used = 0
    for v in range(n):
        if state[v] == 0 and dist[v] - base < width:
            used = _bucket_in(v, dist[v] - base, enode, enext, used, bhead)
    return used


@njit(cache=True, nogil=True)
def global_update(n, start, adj, tail, head, cap, cost, x, e, p,  # type: ignore[no-untyped-def]
                  scale, eps, bound, dist, state, bhead, size):
    """Goldberg's global price update for an ε-optimal pseudoflow (scaled prices
    ``p``): each node's distance to the nearest deficit, in units of ε, over
    residual half-arcs of length floor(rc / ε) + 1 (0 for admissible ones), by
    Dijkstra backwards from every deficit; then p[v] += dist(v) ε, so every excess
    gets an admissible path to a deficit.

    Dijkstra keeps one bucket per distance (Dial) in a window of ``len(bhead)``
    distances, moved on past an empty window. A bucket is a list of entries that
    are only ever added (a node whose distance falls gets a new entry, the old one
    is skipped when met): unlinking a node from a doubly linked bucket cost two more
    scattered writes per distance update, and a round's update makes ~400,000 of
    them. It stops at the level D where the last excess node is settled; the
    unsettled nodes count as D (their tentative distances are at least D and no
    settled node's is more, so ε-optimality holds). Returns the arcs looked at, or
    -1 if an excess node has no residual path to any deficit (infeasible). Applies
    nothing (returns the arcs) if a price would pass ``bound``. ``dist``, ``state``
    (n) and ``bhead`` are scratch; ``size`` (at least n + 1) entries are kept."""
    width = bhead.shape[0]
    # Entries: at most one per node from a rebucketing, plus one per distance
    # update after it; when they run out the buckets are rebuilt (_rebucket).
    enode = np.empty(size, dtype=np.int64)
    entry_next = np.empty(size, dtype=np.int64)
    left = 0  # excess nodes not yet settled
    for v in range(n):
        dist[v] = INF
        state[v] = 0  # 1: settled
        if e[v] > 0:
            left += 1
    if left == 0:
        return 0
    for v in range(n):
        if e[v] < 0:
            dist[v] = 0
    base = np.int64(0)
    used = _rebucket(n, dist, state, base, enode, entry_next, bhead)
    ops = 0
    level = 0  # bucket index: distance base + level
    while left > 0:
        while level < width and bhead[level] < 0:
            level += 1
        if level == width:  # move the window to the nearest unsettled node
            base = INF
            for v in range(n):
                if state[v] == 0 and dist[v] < base:
                    base = dist[v]
            if base == INF:
                return -1
            used = _rebucket(n, dist, state, base, enode, entry_next, bhead)
            ops += n
            level = 0
            continue
        k = bhead[level]
        bhead[level] = entry_next[k]
        v = enode[k]
        if state[v] != 0 or dist[v] != base + level:
            continue  # settled already, or moved to a nearer bucket
        state[v] = 1
        if e[v] > 0:
            left -= 1
            if left == 0:
                break
        top = dist[v]
        ops += start[v + 1] - start[v]
        for k in range(start[v], start[v + 1]):
            h = adj[k]
            a = h >> 1
            # The reverse of half-arc h goes u -> v.
            if h & 1 == 0:
                u = head[a]
                if x[a] == 0:
                    continue
                rc = -cost[a] * scale - p[u] + p[v]
            else:
                u = tail[a]
                if x[a] == cap[a]:
                    continue
                rc = cost[a] * scale - p[u] + p[v]
            if state[u] != 0:
                continue
            ln = rc // eps + 1
            if ln < 0:
                ln = 0
            nd = top + ln
            if nd >= dist[u]:
                continue
            dist[u] = nd
            if nd - base < width:
                if used == size:
                    used = _rebucket(n, dist, state, base, enode, entry_next, bhead)
                else:
                    used = _bucket_in(u, nd - base, enode, entry_next, used, bhead)
    top = base + level
    for v in range(n):
        if state[v] == 0:
            dist[v] = top
        if p[v] + dist[v] * eps > bound:
            return ops
    for v in range(n):
        p[v] += dist[v] * eps
    return ops


@njit(cache=True, nogil=True)
def cost_scaling(n, start, adj, tail, head, cap, cost, x, e, p,  # type: ignore[no-untyped-def]
                 scale, eps, alpha, budget, abort, stats, update_every, optimal):
    """Goldberg's cost scaling: push-relabel refines of ε-optimal pseudoflows, FIFO.

    Costs are multiplied by ``scale`` (n+1), so a flow ε-optimal with ε = 1 in scaled
    units is optimal. ``eps`` is the first phase's ε: from scratch, the largest
    scaled cost over ``alpha``; warm, the flow's largest reduced-cost violation, so
    a flow that the changes barely disturbed starts near the end. Each refine
    saturates the half-arcs with reduced cost below -ε (so the pseudoflow is
    ε-optimal), then discharges every excess along admissible half-arcs (reduced
    cost < 0), relabelling a node to the cheapest residual neighbour's price plus ε
    when it has none.

    A feasible network keeps each relabelled node's price below the starting prices
    plus n (max scaled cost + ε) (a node with excess has a residual path to a
    deficit, whose price does not move); past that bound the network is infeasible.

    With ``update_every`` > 0, a global price update (``global_update``) runs at
    the start of each refine and again once relabels have looked at
    ``update_every`` arcs (a node's relabel counts its degree plus one): it
    gives every excess an admissible path to a deficit at once, where relabels
    alone raise the prices of a crowd of excesses ε at a time (a full cluster, where
    new tasks must end up unscheduled: Fig. 8).

    ``optimal``: the flow is reduced-cost optimal for the prices ``p / scale``
    (relaxation's state), so the first refine's saturation pass would change nothing
    and is skipped (a pass over every arc, 10-20 ms at a million arcs).
    """
    m = tail.shape[0]
    queue = np.empty(n, dtype=np.int64)
    inq = np.zeros(n, dtype=np.bool_)
    cur = np.empty(n, dtype=np.int64)
    dist = np.empty(n, dtype=np.int64)
    state = np.empty(n, dtype=np.int64)
    bhead = np.empty(n + 1, dtype=np.int64)
    cmax = 0
    for a in range(m):
        cmax = max(cmax, abs(cost[a]))
    ops = stats[ST_OPS]
    saturate = not optimal
    while True:
        if saturate:
            for a in range(m):
                r = cost[a] * scale - p[tail[a]] + p[head[a]]
                d = 0
                if r < -eps:
                    d = cap[a] - x[a]
                elif r > eps:
                    d = -x[a]
                if d != 0:
                    x[a] += d
                    e[tail[a]] -= d
                    e[head[a]] += d
            ops += m
        saturate = True
        pmax = -INF
        for v in range(n):
            pmax = max(pmax, p[v])
        bound = pmax + (n + 1) * (cmax * scale + eps)
        relabels = 0
        if update_every > 0:
            done = global_update(n, start, adj, tail, head, cap, cost, x, e, p, scale,
                                 eps, bound, dist, state, bhead, 2 * n + 1)
            if done < 0:
                stats[ST_OPS] = ops
                return INFEASIBLE
            ops += done
            stats[ST_UPDATES] += 1
        qh = 0
        qn = 0
        for v in range(n):
            cur[v] = start[v]
            inq[v] = False
            if e[v] > 0:
                queue[(qh + qn) % n] = v
                qn += 1
                inq[v] = True
        while qn > 0:
            if ops > budget:
                stats[ST_OPS] = ops
                return BUDGET
            if abort[0] != 0:
                stats[ST_OPS] = ops
                return ABORTED
            v = queue[qh]
            qh = (qh + 1) % n
            qn -= 1
            inq[v] = False
            while e[v] > 0:
                if cur[v] == start[v + 1]:
                    # Relabel: the cheapest residual neighbour, plus ε.
                    best = INF
                    for k in range(start[v], start[v + 1]):
                        h = adj[k]
                        a = h >> 1
                        if h & 1 == 0:
                            if x[a] < cap[a]:
                                best = min(best, cost[a] * scale + p[head[a]])
                        elif x[a] > 0:
                            best = min(best, -cost[a] * scale + p[tail[a]])
                    ops += start[v + 1] - start[v]
                    if best == INF or best + eps > bound:
                        stats[ST_OPS] = ops
                        return INFEASIBLE
                    p[v] = best + eps
                    cur[v] = start[v]
                    stats[ST_RELABEL] += 1
                    relabels += start[v + 1] - start[v] + 1
                    if update_every > 0 and relabels >= update_every:
                        relabels = 0
                        done = global_update(n, start, adj, tail, head, cap, cost, x, e,
                                             p, scale, eps, bound, dist, state, bhead, 2 * n + 1)
                        if done < 0:
                            stats[ST_OPS] = ops
                            return INFEASIBLE
                        ops += done
                        stats[ST_UPDATES] += 1
                        for u in range(n):  # admissible arcs may lie behind cur
                            cur[u] = start[u]
                    continue
                h = adj[cur[v]]
                a = h >> 1
                ops += 1
                if h & 1 == 0:
                    w = head[a]
                    r = cap[a] - x[a]
                    rc = cost[a] * scale - p[v] + p[w]
                else:
                    w = tail[a]
                    r = x[a]
                    rc = -cost[a] * scale - p[v] + p[w]
                if r > 0 and rc < 0:
                    d = min(e[v], r)
                    if h & 1 == 0:
                        x[a] += d
                    else:
                        x[a] -= d
                    e[v] -= d
                    e[w] += d
                    stats[ST_PUSH] += 1
                    if e[w] > 0 and not inq[w]:
                        queue[(qh + qn) % n] = w
                        qn += 1
                        inq[w] = True
                    if d == r:
                        cur[v] += 1
                else:
                    cur[v] += 1
        stats[ST_PHASES] += 1
        if eps <= 1:
            break
        eps = max(1, eps // alpha)
    stats[ST_OPS] = ops
    return DONE


@njit(cache=True, nogil=True)
def exact_prices(n, start, adj, tail, head, cap, cost, x, pi, limit,  # type: ignore[no-untyped-def]
                 up_limit):
    """Price refine: move prices until every residual half-arc has reduced cost >= 0,
    by label correcting (no negative cycle exists when the flow is optimal). Turns
    cost scaling's ε-optimal prices (divided by the scale) into prices that satisfy
    reduced-cost optimality exactly, as relaxation and the next warm start need.

    A violated half-arc u -> w can be mended by lowering u or by raising w, and the
    two can differ by orders of magnitude: after a round that cost scaling finished
    for relaxation (a large job arriving on a full cluster), its global updates have
    raised nearly every price by about the same amount, and lowering the tails of the
    few hundred violated half-arcs spreads back over ~126,000 nodes (3.6 M arcs looked
    at), where raising their heads stops after ~200 nodes. So prices are raised first
    (forward label correcting from the violated half-arcs' heads), within ``up_limit``
    node scans; if that does not settle, they are put back and lowered (backward from
    the tails), within ``limit`` node scans. Returns False if that did not settle."""
    queue = np.empty(n, dtype=np.int64)
    inq = np.zeros(n, dtype=np.bool_)
    flows = np.full(n, -1, dtype=np.int64)
    back = np.empty(n, dtype=np.int64)
    keep = pi.copy()
    if _refine(n, start, adj, tail, head, cap, cost, x, pi, up_limit, True, queue, inq,
               flows, back):
        return True
    pi[:] = keep
    inq[:] = False
    return _refine(n, start, adj, tail, head, cap, cost, x, pi, limit, False, queue, inq,
                   flows, back)


@njit(cache=True, nogil=True)
def _refine(n, start, adj, tail, head, cap, cost, x, pi, limit,  # type: ignore[no-untyped-def]
            up, queue, inq, flows, back):
    """``exact_prices`` in one direction: ``up`` raises heads, else lowers tails.
    ``inq`` is all False on entry; ``flows`` (-1) and ``back`` serve ``_reach``."""
    qn = 0
    for a in range(tail.shape[0]):
        r = cost[a] - pi[tail[a]] + pi[head[a]]
        v = -1
        if r < 0 and x[a] < cap[a]:
            v = head[a] if up else tail[a]
        elif r > 0 and x[a] > 0:
            v = tail[a] if up else head[a]
        if v >= 0 and not inq[v]:
            queue[qn] = v
            qn += 1
            inq[v] = True
    qh = 0
    scans = 0
    while qn > 0:
        scans += 1
        if scans > limit:
            return False
        v = queue[qh]
        qh = (qh + 1) % n
        qn -= 1
        inq[v] = False
        if up:
            # The least price that every residual half-arc into v allows.
            best = pi[v]
            for k in range(start[v], start[v + 1]):
                h = adj[k]
                a = h >> 1
                if h & 1 == 0:
                    if x[a] > 0:
                        best = max(best, pi[head[a]] + cost[a])
                elif x[a] < cap[a]:
                    best = max(best, pi[tail[a]] - cost[a])
            if best == pi[v]:
                continue
            pi[v] = best
            # Residual half-arcs out of v may be violated now.
            for k in range(start[v], _reach(v, start, adj, x, flows, back)):
                h = adj[k]
                a = h >> 1
                if h & 1 == 0:
                    u = head[a]
                    ok = x[a] < cap[a] and cost[a] - pi[v] + pi[u] < 0
                else:
                    u = tail[a]
                    ok = x[a] > 0 and -cost[a] - pi[v] + pi[u] < 0
                if ok and not inq[u]:
                    queue[(qh + qn) % n] = u
                    qn += 1
                    inq[u] = True
        else:
            # The greatest price that every residual half-arc out of v allows.
            best = pi[v]
            for k in range(start[v], _reach(v, start, adj, x, flows, back)):
                h = adj[k]
                a = h >> 1
                if h & 1 == 0:
                    if x[a] < cap[a]:
                        best = min(best, cost[a] + pi[head[a]])
                elif x[a] > 0:
                    best = min(best, -cost[a] + pi[tail[a]])
            if best == pi[v]:
                continue
            pi[v] = best
            # Residual half-arcs into v may be violated now.
            for k in range(start[v], start[v + 1]):
                h = adj[k]
                a = h >> 1
                if h & 1 == 0:
                    u = head[a]
                    ok = x[a] > 0 and -cost[a] - pi[u] + pi[v] < 0
                else:
                    u = tail[a]
                    ok = x[a] < cap[a] and cost[a] - pi[u] + pi[v] < 0
                if ok and not inq[u]:
                    queue[(qh + qn) % n] = u
                    qn += 1
                    inq[u] = True
    return True

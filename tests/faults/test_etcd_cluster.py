"""LocalEtcdCluster: three members of one cluster that keep serving when one dies and
take a restarted member back with its data; stopping leaves nothing behind."""

from __future__ import annotations

import os

import pytest

from cellstate.kv.base import Put
from cellstate.kv.etcd import EtcdKV
from omega.etcd_launcher import LocalEtcdCluster
from tests.etcd_fixture import etcd_args_for_tests

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def test_a_cluster_survives_its_leader_and_takes_it_back() -> None:
    cluster = LocalEtcdCluster(3, **etcd_args_for_tests())
    try:
        cluster.start()
        assert len(set(cluster.endpoints)) == 3
        with EtcdKV(cluster.endpoints, timeout=20.0) as kv:
            before = kv.txn([], [Put(b"/k", b"before")]).revision
            leader = cluster.leader()
            cluster.members[leader].kill()
            assert cluster.leader(timeout=30) != leader
            after = kv.txn([], [Put(b"/k", b"after")]).revision
            cluster.members[leader].restart()
        # The restarted member serves the whole history, its own and what it missed.
        with EtcdKV([cluster.members[leader].endpoint]) as member:
            assert member.range(b"/k", revision=before).kvs[0].value == b"before"
            assert member.range(b"/k", revision=after).kvs[0].value == b"after"
        pids = [m.pid for m in cluster.members]
        dirs = [m.data_dir for m in cluster.members]
    finally:
        cluster.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(d.exists() for d in dirs)

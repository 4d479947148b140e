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


def test_a_client_moves_past_a_stalled_member() -> None:
    """A member that stops answering with its connections open (paused: a stall, a
    partition) does not hold a client's calls for their whole timeout: each attempt
    gets ``attempt_timeout``, then the next member is tried."""
    cluster = LocalEtcdCluster(3, **etcd_args_for_tests())
    try:
        cluster.start()
        with EtcdKV(cluster.endpoints, timeout=8.0, attempt_timeout=0.5) as kv:
            kv.txn([], [Put(b"/s", b"before")])
            stalled = cluster.members[0]
            assert kv.endpoints[0] == stalled.endpoint  # the client's first choice
            stalled.pause()
            try:
                # The raft leader may be the stalled one: the others elect another.
                written = kv.txn([], [Put(b"/s", b"during")]).revision
                assert kv.range(b"/s").kvs[0].mod_revision == written
            finally:
                stalled.resume()
    finally:
        cluster.stop()


def test_attempt_timeout_must_be_positive() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="attempt_timeout must be positive"):
            EtcdKV(["127.0.0.1:1"], attempt_timeout=bad)

"""An operator changes a scheduler's limits live (``SetLimits``, ``omega limits``): the
change is one guarded rewrite of the cell's config, the store judges claims by it from
that revision on, a field not given keeps its value, and a bad change is refused with
the field named and the config left as it was. Who may do it: tests/api/test_authz.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cellstate.api.pb.v1 import cellstate_pb2 as pb, cellstate_pb2_grpc as pb_grpc
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import (
    CellConfig,
    Claim,
    InstanceRecord,
    Reason,
    Resources,
    SchedulerLimits,
    UserQuota,
)
from cellstate.store import CellStore
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import client_for, run_omega, running_server

LIMITS = CellConfig({
    "batch": SchedulerLimits(max_precedence=4, max_resources=Resources.of(cpu=6, mem=100)),
})


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, CellStore]]:
    """Batch holds 2 cpu and 2 GiB of its 6 and 100, precedence up to 4."""
    store = CellStore(kv)
    store.add_machines([machine("m0", cpu=8)])
    store.set_config(LIMITS)
    store.register_instance(InstanceRecord("batch", "0"), 60)
    store.submit_job(job("j", tasks=4, cpu=1))
    assert store.commit(txn([Claim("j", 0, "m0"), Claim("j", 1, "m0")])).ok
    with running_server(kv) as server:
        yield server, store


def test_a_raised_limit_keeps_the_fields_not_given_and_the_store_judges_by_it(
        live: tuple[CellStateServer, CellStore]) -> None:
    server, store = live
    with client_for(server) as client:
        done = client.set_limits("batch", {"max_resources": {"cpu": 10}})
        assert done["revision"] > 0
        assert done["max_precedence"] == 4  # not given: kept
        assert done["max_resources"] == {"cpu": 10.0}  # given: replaced whole (mem too)
        status = client.status()
    assert status["limits"]["batch"] == {"max_precedence": 4,
                                         "max_resources": {"cpu": 10.0},
                                         "shares": {}, "quotas": {},
                                         "used": {"cpu": 2.0, "mem": 2.0}}
    config = store.read_snapshot().config
    assert config.revision == done["revision"]
    assert config.limits["batch"] == SchedulerLimits(4, Resources.of(cpu=10))


def test_a_lowered_limit_refuses_the_next_claim(
        live: tuple[CellStateServer, CellStore]) -> None:
    server, store = live
    with client_for(server) as client:
        client.set_limits("batch", {"max_resources": {"cpu": 2}})
    res = store.commit(txn([Claim("j", 2, "m0")]))
    assert [(r.reason, r.detail) for r in res.rejected] == [
        (Reason.LIMIT_EXCEEDED,
         "scheduler 'batch' holds 2 cpu; this task would take it past its limit of 2")]
    with client_for(server) as client:
        client.set_limits("batch", {"max_resources": {"cpu": 3}})
    assert store.commit(txn([Claim("j", 2, "m0")])).ok


def test_the_same_limits_again_change_nothing(
        live: tuple[CellStateServer, CellStore]) -> None:
    server, store = live
    before = store.read_snapshot().config.revision
    with client_for(server) as client:
        done = client.set_limits("batch", {"max_precedence": 4})
    assert done["revision"] == 0 and done["max_precedence"] == 4
    assert store.read_snapshot().config.revision == before


def test_a_new_scheduler_gets_limits_and_a_usage_count(
        live: tuple[CellStateServer, CellStore]) -> None:
    server, store = live
    with client_for(server) as client:
        client.set_limits("service", {"max_resources": {"cpu": 3}})
        status = client.status()
    assert status["limits"]["service"]["used"] == {}
    assert set(store.read_snapshot().config.limits) == {"batch", "service"}


def test_a_scheduler_listed_with_no_limits(live: tuple[CellStateServer, CellStore],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`none` for a scheduler the config does not list yet lists it with no limits:
    with identities, that is what lets a new scheduler act (docs/security.md)."""
    server, store = live
    code, out, _ = run_omega(server, capsys, "limits", "flow", "--max-resources", "none")
    config = store.read_snapshot().config
    assert code == 0 and out == f"limits of flow set (revision {config.revision}): none\n"
    assert config.limits["flow"] == SchedulerLimits()


@pytest.mark.parametrize(("scheduler", "changes", "says"), [
    ("batch", b'{"max_resources": {"cpu": -1}}', "limits.batch.max_resources.cpu is negative"),
    ("batch", b'{"max_precedence": "high"}', "limits.batch.max_precedence must be an integer"),
    ("batch", b'{"max_precedence": 2000000}', "limits.batch.max_precedence"),
    ("batch", b'{"max_resources": {"CPU!": 1}}', "'CPU!' is not a valid dimension name"),
    ("batch", b'{"max_resources": [1]}', "limits.batch.max_resources must be an object"),
    ("batch", b'{"max_cpu": 1}', "unknown field 'max_cpu'"),
    ("batch", b'{"shares": {"alice": {}}}', "limits.batch.shares.alice: a share names"),
    ("batch", b'{"shares": {"alice": {"cpu": -1}}}', "limits.batch.shares.alice.cpu"),
    ("batch", b'{"shares": [1]}', "limits.batch.shares must be an object"),
    ("batch", b'{"quotas": {"bob": {"count": 1.5}}}', "limits.batch.quotas.bob.count"),
    ("batch", b'{"quotas": {"bob": {}}}', "limits.batch.quotas.bob: a quota caps"),
    ("batch", b'{"quotas": {"b b": {"count": 1}}}', "limits.batch.quotas.b b"),
    ("batch", b'{}', "nothing to change"),
    ("batch", b'[1]', "limits.batch must be an object"),
    ("batch", b'not json', "changes_json: not JSON"),
    ("bad name!", b'{"max_precedence": 1}', "scheduler"),
])
def test_a_bad_change_is_refused_and_leaves_the_config_as_it_was(
        live: tuple[CellStateServer, CellStore], scheduler: str, changes: bytes,
        says: str) -> None:
    server, store = live
    before = store.read_snapshot().config
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel, \
            pytest.raises(grpc.RpcError) as info:
        stub: Any = pb_grpc.CellStateStub(channel)  # type: ignore[no-untyped-call]
        stub.SetLimits(pb.SetLimitsRequest(scheduler=scheduler, changes_json=changes),
                       timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in str(info.value.details()), info.value.details()
    after = store.read_snapshot().config
    assert (after.revision, after.limits) == (before.revision, before.limits)


def test_omega_limits_sets_shows_and_removes(live: tuple[CellStateServer, CellStore],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live
    code, out, _ = run_omega(server, capsys, "limits", "batch", "--max-resources",
                             "cpu=12,mem=64")
    assert code == 0
    assert out.startswith("limits of batch set (revision ")
    assert out.rstrip().endswith("precedence up to 4; holds cpu 2 of 12, mem 2 of 64")
    code, out, _ = run_omega(server, capsys, "limits", "batch", "--max-precedence", "none")
    assert code == 0 and out.rstrip().endswith(": holds cpu 2 of 12, mem 2 of 64")
    code, out, _ = run_omega(server, capsys, "limits")
    assert code == 0 and out == "limits of batch: holds cpu 2 of 12, mem 2 of 64\n"
    code, out, _ = run_omega(server, capsys, "limits", "batch", "--json")
    assert code == 0
    assert json.loads(out) == {"batch": {"max_precedence": None,
                                         "max_resources": {"cpu": 12.0, "mem": 64.0},
                                         "shares": {}, "quotas": {},
                                         "used": {"cpu": 2.0, "mem": 2.0}}}


def test_fair_shares_and_quotas_are_set_per_user_and_kept_for_the_others(
        live: tuple[CellStateServer, CellStore], capsys: pytest.CaptureFixture[str]) -> None:
    """Cook's per-user shares and quotas live in the cell's config as limits do: an
    operator changes one user's entry, the others' stay, 'none' removes one."""
    server, store = live
    code, out, _ = run_omega(server, capsys, "limits", "batch", "--share",
                             "default=cpu=2,mem=8", "--share", "alice=cpu=4",
                             "--quota", "bob=count=3,cpu=2")
    assert code == 0, out
    assert out.rstrip().endswith("share of alice cpu 4; share of default cpu 2, mem 8; "
                                 "quota of bob count 3, cpu 2")
    code, out, _ = run_omega(server, capsys, "limits", "batch", "--share", "alice=none",
                             "--quota", "carol=count=0")
    assert code == 0
    limits = store.read_snapshot().config.limits["batch"]
    assert limits.shares == {"default": Resources.of(cpu=2, mem=8)}
    assert limits.quotas == {"bob": UserQuota(3, Resources.of(cpu=2)),
                             "carol": UserQuota(0, Resources())}
    assert limits.share_of("zed") == Resources.of(cpu=2, mem=8)  # the default's
    assert limits.quota_of("zed") is None  # no default quota: no cap
    assert (limits.max_precedence, limits.max_resources) == (4, Resources.of(cpu=6, mem=100))


@pytest.mark.parametrize(("argv", "says"), [
    (("batch", "--max-resources", "cpu"), "'cpu' is not DIMENSION=AMOUNT"),
    (("batch", "--max-resources", "cpu=lots"), "cpu: 'lots' is not a number"),
    (("batch", "--max-precedence", "high"), "'high' is not a whole number or 'none'"),
    (("--max-precedence", "3"), "name the scheduler whose limits to change"),
    (("nosuch",), "scheduler 'nosuch' has no limits in this cell"),
    (("batch", "--max-resources", "cpu=-2"), "limits.batch.max_resources.cpu is negative"),
    (("batch", "--share", "alice"), "'alice' is not USER=DIM=AMOUNT,..."),
    (("batch", "--share", "alice=cpu"), "'cpu' is not DIMENSION=AMOUNT"),
    (("batch", "--quota", "bob=count=x"), "count: 'x' is not a number"),
    (("batch", "--quota", "bob=count=1.5"), "limits.batch.quotas.bob.count"),
])
def test_omega_limits_says_what_is_wrong(live: tuple[CellStateServer, CellStore],
                                         capsys: pytest.CaptureFixture[str],
                                         argv: tuple[str, ...], says: str) -> None:
    server, store = live
    before = store.read_snapshot().config.revision
    try:
        code, _, err = run_omega(server, capsys, "limits", *argv)
    except SystemExit as e:  # a flag argparse refuses: usage and exit code 2
        code, err = int(str(e.code)), capsys.readouterr().err
    assert code != 0
    assert says in err, err
    assert store.read_snapshot().config.revision == before

"""Client failover across endpoints, the health service, and configuration files for
the server and scheduler processes (good ones; bad ones are in test_cli_demo)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cellstate.api.client import CellClient, ServiceUnavailable
from cellstate.api.config import read_toml, server_config
from cellstate.errors import ConfigError
from cellstate.kv.memory import MemoryKV
from cellstate.model import Detection, Resources, TxnMode
from cellstate.store import CellStore
from omega.etcd_launcher import free_ports
from schedulers.process import scheduler_config
from schedulers.testing import machine
from tests.api.service_fixture import running_server


def test_client_moves_to_the_next_endpoint_when_one_is_down() -> None:
    kv = MemoryKV()
    CellStore(kv).add_machine(machine("m1"))
    with running_server(kv) as server:
        dead = f"127.0.0.1:{free_ports(1)[0]}"
        with CellClient([dead, f"127.0.0.1:{server.port}"], retry_for=5) as client:
            assert client.status()["machines_up"] == 1
            assert client.endpoint.endswith(f":{server.port}")


def test_client_gives_up_after_its_retry_budget() -> None:
    with CellClient([f"127.0.0.1:{free_ports(1)[0]}"], retry_for=0.3) as client, \
            pytest.raises(ServiceUnavailable, match="cell status"):
        client.status()


def test_health_check_reports_serving_until_shutdown() -> None:
    kv = MemoryKV()
    with running_server(kv) as server, \
            grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "omega.cellstate.v1.CellState"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        server.health.enter_graceful_shutdown()
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_server_config_file_and_its_limits_reach_the_cell(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('listen = "127.0.0.1:0"\ncell = "c1"\nname = "one"\ncommitters = 2\n'
                    '[etcd]\nendpoints = "e1:2379,e2:2379"\n'
                    '[limits.batch]\nmax_precedence = 3\nmax_resources = { cpu = 10 }\n')
    config = server_config(read_toml(path), str(path))
    assert config.etcd == ("e1:2379", "e2:2379")
    assert (config.cell, config.name, config.committers) == ("c1", "one", 2)
    kv = MemoryKV()
    with running_server(kv, **{k: getattr(config, k) for k in ("cell", "limits")}):
        limits = CellStore(kv, "c1").read_snapshot().config.limits["batch"]
    assert limits.max_precedence == 3
    assert limits.max_resources == Resources.of(cpu=10)


def test_server_config_commit_pipeline() -> None:
    assert not server_config({}).commit_pipeline
    assert server_config({"commit_pipeline": True}).commit_pipeline
    assert not server_config({"commit_pipeline": False}).commit_pipeline
    with pytest.raises(ConfigError, match=r"s\.toml: .*commit_pipeline"):
        server_config({"commit_pipeline": "no"}, "s.toml")


def test_scheduler_config_file_with_flags_on_top(tmp_path: Path) -> None:
    path = tmp_path / "sched.toml"
    path.write_text('[scheduler]\nname = "batch"\ninstance = "b7"\n'
                    'cellstate = ["s0:7070", "s1:7070"]\nmode = "gang"\ndetection = "coarse"\n'
                    'max_attempts = 50\nretry_delay = 0.5\n[options]\nspread = "rack"\n')
    config = scheduler_config(read_toml(path), {"instance": "b8", "name": None}, str(path))
    assert (config.name, config.policy, config.instance) == ("batch", "batch", "b8")
    assert config.cellstate == ("s0:7070", "s1:7070")
    assert config.runtime.mode is TxnMode.GANG
    assert config.runtime.detection is Detection.COARSE
    assert (config.runtime.max_attempts, config.runtime.retry_delay) == (50, 0.5)
    assert config.runtime.options == {"spread": "rack"}

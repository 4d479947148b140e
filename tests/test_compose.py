"""docker-compose.yml and the Dockerfile, checked without a Docker engine: every
command is a valid `omega` invocation, every address names a service and a port it
listens on, etcd runs with the flags the design relies on, and the topology is the
native demo's."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellstate.api.config import addresses, server_config
from cellstate.model import Resources
from omega.cellspec import load_cell_spec, resolve_spec
from omega.cli import build_parser, scheduler_process_config
from omega.demo import DemoOptions, topology
from omega.etcd_launcher import server_flags
from schedulers.process import make_policy
from schedulers.registry import Registry
from tests.etcd_fixture import ETCD_IMAGE

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ETCD = sorted(n for n, s in SERVICES.items() if s["image"].startswith("quay.io/coreos/etcd"))
OMEGA = sorted(n for n in SERVICES if n not in ETCD)


def _flags(command: list[str]) -> dict[str, str]:
    return dict(f.removeprefix("--").split("=", 1) for f in command[1:])


def _args(name: str) -> argparse.Namespace:
    command = SERVICES[name]["command"]
    assert command[0] == "omega", f"{name}: {command}"
    try:
        return build_parser().parse_args([str(c) for c in command[1:]])
    except SystemExit:
        pytest.fail(f"{name}: `{' '.join(map(str, command))}` is not a valid omega command")


def _listen_port(name: str) -> int:
    return int(_args(name).listen.rpartition(":")[2])


def test_three_etcd_members_of_a_pinned_safe_release() -> None:
    assert ETCD == ["etcd-0", "etcd-1", "etcd-2"]
    for name in ETCD:
        image = SERVICES[name]["image"]
        assert image == ETCD_IMAGE  # the tests run against the same release
        major, minor, patch = map(int, re.fullmatch(r".*:v(\d+)\.(\d+)\.(\d+)", image).groups())  # type: ignore[union-attr]
        assert (major, minor) > (3, 5) or patch >= 6, "etcd advises 3.5.6 or later"


def test_etcd_members_form_one_cluster_with_the_designs_flags() -> None:
    # The launcher's defaults, not overrides: compose runs the settings the code does
    # (one space quota, one auto-compaction; tests/test_etcd_quota.py).
    required = _flags(["etcd", *server_flags()])
    peers = {f"{n}=http://{n}:2380" for n in ETCD}
    for name in ETCD:
        flags = _flags(SERVICES[name]["command"])
        for flag, value in required.items():
            assert flags.get(flag) == value, f"{name}: --{flag} should be {value}"
        assert flags["unsafe-no-fsync"] == "false"
        assert flags["name"] == name
        assert set(flags["initial-cluster"].split(",")) == peers
        assert flags["advertise-client-urls"] == f"http://{name}:2379"
        assert flags["initial-advertise-peer-urls"] == f"http://{name}:2380"
        assert flags["listen-client-urls"].endswith(":2379")


@pytest.mark.parametrize("name", OMEGA)
def test_every_omega_service_runs_a_valid_command(name: str) -> None:
    args = _args(name)
    assert SERVICES[name]["image"] == "omega-cell:latest"
    for dep in SERVICES[name].get("depends_on", []):
        assert dep in SERVICES, f"{name} depends on unknown service {dep}"
    if args.command == "server":
        for endpoint in addresses(args.etcd, "--etcd"):
            host, _, port = endpoint.rpartition(":")
            assert host in ETCD and port == "2379", f"{name}: {endpoint} is no etcd client URL"
    if args.command == "agent":
        assert resolve_spec(args.spec).exists()


@pytest.mark.parametrize("name", [n for n in OMEGA if "cellstate" in _args(n)])
def test_cellstate_addresses_name_servers_and_their_ports(name: str) -> None:
    for endpoint in addresses(_args(name).cellstate, "--cellstate"):
        host, _, port = endpoint.rpartition(":")
        assert host in SERVICES and _args(host).command == "server", f"{name}: {endpoint}"
        assert int(port) == _listen_port(host), f"{name}: {host} listens elsewhere"


def test_published_ports_are_the_servers_listen_ports() -> None:
    for name in OMEGA:
        for mapping in SERVICES[name].get("ports", []):
            assert _args(name).command == "server"
            assert int(mapping.split(":")[1]) == _listen_port(name)


def test_topology_is_the_native_demos() -> None:
    servers = [n for n in OMEGA if _args(n).command == "server"]
    agents = [n for n in OMEGA if _args(n).command == "agent"]
    demo = topology(DemoOptions(servers=len(servers), agents=len(agents)),
                    "etcd:2379", [7070] * len(servers), resolve_spec("demo"))
    demo_names = [n for n, _ in (*demo.servers, *demo.agents, *demo.schedulers, demo.workload)]
    assert sorted(demo_names) == OMEGA

    def role(argv: list[str]) -> tuple[Any, ...]:
        a = build_parser().parse_args(argv)
        if a.command == "agent":
            return (a.command, a.index, a.count, a.id, resolve_spec(a.spec).name)
        if a.command == "scheduler":
            config = scheduler_process_config(a)  # what the process would run
            return (a.command, config.name, config.policy, config.instance,
                    config.runtime.options)
        return (a.command, getattr(a, "name", None))

    compose_roles = {n: role([str(c) for c in SERVICES[n]["command"][1:]]) for n in OMEGA}
    for name, argv in (*demo.servers, *demo.agents, *demo.schedulers, demo.workload):
        assert compose_roles[name] == role(argv), name


@pytest.mark.parametrize("name", [n for n in OMEGA if _args(n).command == "scheduler"])
def test_every_scheduler_service_makes_its_policy(name: str) -> None:
    """Each scheduler service names an installed policy and options it accepts: the
    container would not stop at start-up on a bad flag."""
    config = scheduler_process_config(_args(name))
    policy = make_policy(Registry.from_entry_points(), config)
    assert policy.name == config.policy


def test_a_flow_scheduler_runs_beside_batch_and_service() -> None:
    configs = [scheduler_process_config(_args(n)) for n in OMEGA
               if _args(n).command == "scheduler"]
    flow = [c for c in configs if c.policy == "flow"]
    assert [(c.name, c.runtime.options.get("policy")) for c in flow] == [("flow", "quincy")]
    assert {c.name for c in configs} == {"batch", "service", "flow", "mapreduce", "fair"}
    assert "flow-0" in SERVICES["workload"]["depends_on"]


def test_a_mapreduce_scheduler_grows_the_workloads_mapreduce_jobs() -> None:
    configs = [scheduler_process_config(_args(n)) for n in OMEGA
               if _args(n).command == "scheduler"]
    mapreduce = [c for c in configs if c.policy == "mapreduce"]
    assert [(c.name, c.runtime.options.get("policy")) for c in mapreduce] == [
        ("mapreduce", "max-parallel")]
    assert "mapreduce-0" in SERVICES["workload"]["depends_on"]
    assert _args("workload").mapreduce_fraction > 0


def test_dockerfile_installs_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = pyproject["tool"]["setuptools"]["packages"]["find"]
    packages = [p.rstrip("*") for p in found["include"]]
    for package in packages:
        assert re.search(rf"^COPY {package} \./{package}$", dockerfile, re.MULTILINE), package
    assert re.search(r"^RUN pip install \. ", dockerfile, re.MULTILINE)
    assert "omega" in pyproject["project"]["scripts"]


def test_a_fair_scheduler_shares_the_pool_the_demo_gives_it() -> None:
    configs = [scheduler_process_config(_args(n)) for n in OMEGA
               if _args(n).command == "scheduler"]
    (fair,) = [c for c in configs if c.policy == "fair"]
    assert fair.runtime.options["min_runtime"] == 5
    assert _args("workload").fair_fraction > 0 and "fair-0" in SERVICES["workload"]["depends_on"]
    cpus = load_cell_spec(resolve_spec("demo")).total_capacity().get("cpu")
    pool = round(cpus * DemoOptions().fair_pool)
    for name in OMEGA:
        args = _args(name)
        if args.command != "server":
            continue
        (mount,) = SERVICES[name]["volumes"]
        source, target, _ = mount.split(":")
        assert args.config == target
        config = server_config(tomllib.loads((ROOT / source).read_text()), source)
        assert config.limits is not None
        limit = config.limits.limits_for("fair")
        assert limit is not None and limit.max_resources == Resources.of(cpu=pool)

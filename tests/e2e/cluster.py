"""A cluster of real processes for end-to-end tests: cellstate servers, agents and
schedulers, each started with the `omega` command line on free loopback ports."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cellstate.api.client import CellClient, wait_until_serving
from omega.etcd_launcher import free_ports
from omega.proc import Child, omega


class Cluster:
    def __init__(self, etcd: str, workdir: Path) -> None:
        self.etcd = etcd
        self.workdir = workdir
        self.children: dict[str, Child] = {}
        self.ports: list[int] = []

    @property
    def cellstate(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, name: str, *args: str) -> Child:
        child = Child(name, omega(*args), self.workdir / f"{name}.log")
        self.children[name] = child
        return child

    def server(self, name: str) -> int:
        port = free_ports(1)[0]
        child = self.start(name, "server", "--etcd", self.etcd, "--listen", f"127.0.0.1:{port}",
                           "--name", name)
        wait_until_serving(f"127.0.0.1:{port}", 60.0, child.running)
        self.ports.append(port)
        return port

    def spec(self, name: str, count: int, cpu: int = 4) -> Path:
        path = self.workdir / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n[layout]\nmachines_per_rack = 2\nracks_per_failure_domain = 1\n'
            f'[[types]]\nname = "small"\ncount = {count}\ncapacity = {{ cpu = {cpu}, mem = 16 }}\n')
        return path

    def client(self, port: int | None = None) -> CellClient:
        ports = [port] if port is not None else self.ports
        return CellClient([f"127.0.0.1:{p}" for p in ports], retry_for=10.0)

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{c.log_tail(30)}" for n, c in self.children.items())

    def stop(self) -> None:
        servers = [c for n, c in self.children.items() if n.startswith("cellstate")]
        others = [c for c in self.children.values() if c not in servers]
        for group in (others, servers):
            for c in group:
                c.terminate()
            for c in group:
                c.stop(timeout=15.0)


@contextmanager
def cluster(etcd: str, workdir: Path) -> Iterator[Cluster]:
    c = Cluster(etcd, workdir)
    try:
        yield c
    finally:
        c.stop()


def wait_for(what: str, done: Callable[[], bool], cluster: Cluster, timeout: float = 60.0,
             ) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        dead = [n for n, c in cluster.children.items() if not c.running()
                and c.popen.returncode not in (0, -9)]
        assert not dead, f"{dead} exited while waiting for {what}\n{cluster.logs()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{cluster.logs()}"
        time.sleep(0.2)

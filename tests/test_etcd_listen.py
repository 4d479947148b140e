"""``omega etcd --listen``: a local etcd on the port asked for, loopback only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from omega.cli import main
from omega.etcd_launcher import free_ports


@pytest.mark.etcd
def test_etcd_serves_on_the_port_asked_for(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "omega.cli", "etcd", "--listen", f"127.0.0.1:{port}",
         "--no-fsync", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "serving at" in line:
                break
        assert f"serving at 127.0.0.1:{port} " in "".join(lines), "".join(lines)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_only_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["etcd", "--listen", "0.0.0.0:2379"]) == 2
    assert "serves on 127.0.0.1 only" in capsys.readouterr().err


def test_a_taken_port_exits_4(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["etcd", "--listen", f"127.0.0.1:{s.getsockname()[1]}"]) == 4
    assert "the address is in use" in capsys.readouterr().err

"""`omega demo` killed with SIGKILL leaves nothing behind: its etcd ends and its
temporary data folder is removed (its other processes end on their own)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omega.proc import alive, process_ids


def _running_with(text: str) -> list[int]:
    """Live processes whose command line mentions ``text``."""
    found = []
    for pid in process_ids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline and alive(pid):
            found.append(pid)
    return found


@pytest.mark.etcd
@pytest.mark.slow
def test_sigkill_of_the_demo_leaves_no_etcd_and_no_data_folder() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "omega.cli", "demo", "--duration", "120", "--no-fsync"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    data: Path | None = None
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"\[\d\d:\d\d:\d\d rev \d+\] jobs", line):  # a status line came in
                break
        logs = re.search(r"^etcd .*; logs in (\S+)$", "".join(lines), re.MULTILINE)
        assert logs, "".join(lines)
        data = Path(logs.group(1)).parent
        etcd_data = f"--data-dir={data / 'etcd' / 'data'}"
        assert _running_with(etcd_data), "etcd is not running"
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 30
        while (_running_with(etcd_data) or data.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running_with(etcd_data), "etcd outlived the demo"
        assert not data.exists(), f"the demo's data folder {data} outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if data is not None:
            for pid in _running_with(str(data)):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(data, ignore_errors=True)

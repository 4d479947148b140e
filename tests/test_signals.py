"""Signals stop processes cleanly, however many arrive and whenever."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, sys, threading
from omega.signals import stop_event_on_signals
stop = stop_event_on_signals()
lock = threading.Lock()
for sig in {signals}:
    os.kill(os.getpid(), sig)
# The main thread keeps taking locks meanwhile (where a handler setting an event
# could deadlock against it).
for _ in range(100000):
    with lock:
        pass
assert stop.wait(5), "stop event not set"
print("stopped cleanly")
"""


def _run(signals: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT.format(signals=signals)],
                          capture_output=True, text=True, timeout=30)


def test_repeated_sigterms_set_the_stop_event_once_without_deadlock() -> None:
    proc = _run("[signal.SIGTERM] * 20")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "stopped cleanly"


def test_one_ctrl_c_stops_cleanly_and_a_second_ends_at_once() -> None:
    assert _run("[signal.SIGINT]").stdout.strip() == "stopped cleanly"
    # A second Ctrl-C while shutting down: the operator wants out now.
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(
        signals="[signal.SIGINT, signal.SIGINT]").replace(
        'print("stopped cleanly")', 'import time; time.sleep(10)')],
        capture_output=True, text=True, timeout=30)
    assert proc.returncode == 130, proc.stderr

"""pytest plugin: a test run stopped by SIGTERM cleans up as one stopped by Ctrl-C.

CI stops a run that overruns its time limit with SIGTERM. By default that ends the
interpreter at once: no ``finally`` block, fixture finalizer or ``atexit`` handler
runs, so every etcd, server, scheduler and agent a test started outlives the run (seen:
an etcd a test body started, still serving after the run was stopped). Here SIGTERM
raises KeyboardInterrupt in the main thread instead: the running test unwinds through
its ``finally`` blocks, pytest runs the fixtures' finalizers and reports the run as
interrupted (exit code 2), and the launchers' ``atexit`` handlers stop what is left.
SIGKILL cannot be caught; the session's shared etcd survives even that (it runs under
omega's supervisor, tests/etcd_fixture.py).

Some tests run code in this process that installs handlers of its own (a process's
``stop_event_on_signals``, the demo); after each test the SIGTERM handler is put back,
and so is SIGINT's: a pytest-xdist worker told to stop (its controller was stopped,
or died) interrupts the running test by sending itself SIGINT, and a test's handler
left in place would swallow it (the worker is then killed with nothing cleaned up). Python
runs a handler in the main thread when it next runs Python code: if the kernel hands
SIGTERM to another thread (gRPC's) while the main thread blocks in a long call, the
run stops when that call returns.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest


class _Guard:
    """The SIGTERM handler, and the hook that puts it back after each test."""

    def __init__(self) -> None:
        self.fired = False
        self.sigint = signal.getsignal(signal.SIGINT)  # Python's KeyboardInterrupt

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        # Once is enough: a second SIGTERM during the clean-up must not cut it short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self.fired or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) != self.handler:
            signal.signal(signal.SIGTERM, self.handler)
        if signal.getsignal(signal.SIGINT) != self.sigint and self.sigint is not None:
            signal.signal(signal.SIGINT, self.sigint)


def pytest_configure(config: pytest.Config) -> None:
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        # A run started in the background of a non-interactive shell (``cmd &``)
        # inherits SIGINT ignored, and so would every process a test starts: an xdist
        # worker could not interrupt its test, nor a test stop an etcd launcher or a
        # child run with it. Ctrl-C is the run's own business again.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Only where nobody else chose a handler (an embedding runner may have its own), and
    # only from the main thread (the only one Python lets install a handler).
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        guard = _Guard()
        signal.signal(signal.SIGTERM, guard.handler)
        config.pluginmanager.register(guard, "terminate-cleanly-guard")

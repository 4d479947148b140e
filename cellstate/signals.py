"""Stopping a process cleanly on SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import threading
from types import FrameType


def stop_event_on_signals() -> threading.Event:
    """An event set by the first SIGTERM or SIGINT; a second SIGINT interrupts at once
    (KeyboardInterrupt), for an operator whose shutdown hangs."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop

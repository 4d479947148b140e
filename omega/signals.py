"""Stopping a process cleanly on SIGTERM or Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import threading
from types import FrameType


def stop_event_on_signals() -> threading.Event:
    """An event set by the first SIGTERM or SIGINT; a second SIGINT ends the process at
    once (exit code 130), for an operator whose shutdown hangs.

    The event is set from a helper thread, never from the signal handler: a handler runs
    between any two bytecodes of the main thread, and setting an event takes a lock the
    main thread may hold at that moment (a second signal arriving while the first
    handler sets the event deadlocked a scheduler process). The C-level handler writes
    the signal number to a socket (``signal.set_wakeup_fd``); the thread reads it.
    """
    stop = threading.Event()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def ignore(signum: int, frame: FrameType | None) -> None:
        """Python-level no-op: the wakeup byte is what counts."""

    signal.signal(signal.SIGTERM, ignore)
    signal.signal(signal.SIGINT, ignore)

    def watch() -> None:
        interrupts = 0
        while True:
            data = reader.recv(64)
            if not data:
                return
            stop.set()
            interrupts += data.count(signal.SIGINT)
            if interrupts >= 2:
                os._exit(130)

    threading.Thread(target=watch, name="signals", daemon=True).start()
    # The socket pair lives as long as the process (kept by the closure and the fd).
    stop._omega_wakeup = (reader, writer)  # type: ignore[attr-defined]
    return stop

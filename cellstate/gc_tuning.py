"""Garbage-collector settings for long-running processes that hold a copy of a cell.

A replica of a 10,000-machine cell is a few hundred thousand long-lived objects. The
cyclic collector scans them again and again although they are immutable and acyclic
(reference counting frees them), and with default thresholds that scanning took about
half the time of a scheduling decision (benchmarks/scheduler_throughput.py: 115 vs 214
decisions per second). Freezing what was loaded at start-up and collecting less often
removes most of it. Only process entry points call this, never library code.
"""

from __future__ import annotations

import gc
import time


def tune_for_large_heap(threshold: int = 50_000) -> None:
    """Move everything alive now out of the collector's sight and raise the first
    generation's threshold. Call once, after the initial load."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, 20, 100)


class SweptCollector:
    """The cyclic collector for a simulation's main loop: off, with a sweep now and then.

    A simulation makes and frees records at a high rate, nearly none of them in cycles
    (the collector found no garbage in four simulated hours of Omega's cluster B), yet
    its automatic passes scanned the young survivors again and again: a tenth of the
    main loop. Paused, the caller calls :meth:`sweep` often (each progress step); it
    collects once ``every`` CPU seconds have passed since the last collection (what
    survives is then frozen, so each object is scanned at most once), so cyclic garbage
    made between two collections is still freed. Cycles that become garbage only after
    a collection froze them are not freed: a bounded leak, for runs that make none."""

    def __init__(self, every: float = 120.0) -> None:
        self.every = every
        self._was_enabled = gc.isenabled()
        self._paused = False
        self._last = 0.0

    def pause(self) -> None:
        """Collect, freeze what is alive, stop automatic collection."""
        gc.collect()
        gc.freeze()
        gc.disable()
        self._paused = True
        self._last = time.process_time()

    def sweep(self) -> None:
        if self._paused and time.process_time() - self._last >= self.every:
            gc.collect()
            gc.freeze()
            self._last = time.process_time()

    def resume(self) -> None:
        """Automatic collection as it was before :meth:`pause`."""
        if self._paused and self._was_enabled:
            gc.enable()
        self._paused = False

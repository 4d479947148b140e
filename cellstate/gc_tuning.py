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
from collections.abc import Callable


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


class RoundCollector:
    """The cyclic collector for a scheduler process: never inside a decision.

    A flow round at 12,500 machines leaves 50,000-150,000 new objects alive (records,
    a network's new keys), and a pass costs about a microsecond for each young object:
    one automatic pass cost 60-90 ms, against a flow round of 150-250 ms, wherever in
    the round it fell. So automatic collection is off (decisions run on the loop's
    thread; the replica's stream thread only adds records) and the loop calls
    :meth:`between` after each step: once ``young`` tracked objects have accumulated it
    collects them and freezes the survivors, so each object is looked at about once.
    Every ``full_every`` seconds, at the first idle step (or after twice that if the
    loop is never idle), everything is unfrozen and collected, so cycles that became
    garbage after being frozen are freed too: no leak, only a delay. ``clock`` is
    injected for tests."""

    def __init__(self, young: int = 50_000, full_every: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.young = young
        self.full_every = full_every
        self.clock = clock
        self.young_passes = 0
        self.full_passes = 0
        self._full_at = 0.0
        self._started = False
        self._was_enabled = gc.isenabled()

    def start(self) -> None:
        """Collect and freeze what is alive (the loaded cell), then stop automatic
        collection. Call once, after the initial load."""
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        self._full_at = self.clock()
        self._started = True

    def between(self, idle: bool) -> None:
        """After a step; ``idle``: the loop is about to wait for work."""
        if not self._started:
            return
        since = self.clock() - self._full_at
        if since >= 2 * self.full_every or (idle and since >= self.full_every):
            self.full()
        elif gc.get_count()[0] >= self.young:
            gc.collect()
            gc.freeze()
            self.young_passes += 1

    def full(self) -> None:
        """Collect everything, frozen or not, and freeze what survives."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._full_at = self.clock()
        self.full_passes += 1

    def stop(self) -> None:
        """Everything back in the collector's sight, automatic collection as before."""
        if self._started:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
            self._started = False

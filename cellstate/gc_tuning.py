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


def tune_for_large_heap(threshold: int = 50_000) -> None:
    """Move everything alive now out of the collector's sight and raise the first
    generation's threshold. Call once, after the initial load."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, 20, 100)

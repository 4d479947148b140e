"""The discrete-event core: a virtual clock, an event heap, seeded random streams.

Events are ordered by (time, priority, sequence): at equal times a lower priority runs
first, and at equal priorities the event scheduled first runs first, so a run never
depends on how the heap breaks ties. Every component draws from its own random stream,
derived from the run's seed and the component's name, so adding a component does not
shift the numbers another one sees.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable

import attrs

# Priorities at equal times. Ends free resources before anything decides at that
# instant; arrivals come before decisions so a job submitted at t can be seen at t.
END = 0
ARRIVAL = 1
COMMIT = 2
WAKE = 3
SAMPLE = 4


def stream(seed: int, name: str) -> random.Random:
    """An independent random stream for component ``name`` of a run seeded ``seed``."""
    digest = hashlib.sha256(f"{seed}\x00{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class Clock:
    """The virtual clock every component reads (injected as ``clock()``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@attrs.define
class Event:
    time: float
    priority: int
    seq: int
    action: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    """A heap of events and the clock they advance."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        self.processed = 0

    @property
    def now(self) -> float:
        return self.clock.now

    def at(self, time: float, priority: int, action: Callable[[], None]) -> Event:
        """Run ``action`` at virtual ``time`` (not before now)."""
        if time < self.clock.now:
            raise ValueError(f"event at {time} is in the past (now {self.clock.now})")
        self._seq += 1
        ev = Event(time, priority, self._seq, action)
        heapq.heappush(self._heap, (time, priority, self._seq, ev))
        return ev

    def after(self, delay: float, priority: int, action: Callable[[], None]) -> Event:
        return self.at(self.clock.now + delay, priority, action)

    def peek(self) -> float | None:
        """The time of the next event, or None if there is none."""
        while self._heap and self._heap[0][3].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Run the next event; False if there was none."""
        while self._heap:
            t, _, _, ev = heapq.heappop(self._heap)
            if ev.cancelled:
                continue
            self.clock.now = t
            self.processed += 1
            ev.action()
            return True
        return False

    def run(self, until: float, progress: Callable[[float], None] | None = None) -> None:
        """Run every event up to and including time ``until``; the clock ends there."""
        next_report = 0.0
        while True:
            t = self.peek()
            if t is None or t > until:
                break
            self.step()
            if progress is not None and self.clock.now >= next_report:
                progress(self.clock.now)
                next_report = self.clock.now + until / 200
        self.clock.now = max(self.clock.now, until)

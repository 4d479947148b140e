"""What keeps fair preemption from turning into a storm: a minimum run time before a
task may be preempted, and caps on the tasks preempted per round and per minute.

(The third guard, hysteresis, is the share rule itself: a waiting task preempts only
victims whose CRS exceeds its own by more than delta, and once it runs, the victim
waiting again sees it at a CRS at least delta below its own, so neither can take the
other's place straight back.)

A task's run time is counted from when this instance first saw it running: the cell
does not record start times, and an instance that restarts protects every running task
for the minimum run time again, which errs on the side of not preempting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

MINUTE = 60.0


class PreemptionGuard:
    def __init__(self, min_runtime: float, per_round: int, per_minute: int) -> None:
        self.min_runtime = min_runtime
        self.per_round = per_round
        self.per_minute = per_minute
        self._seen: dict[str, float] = {}  # task -> when first seen running
        self._spent: deque[tuple[float, int]] = deque()  # (when, tasks lost)
        self._round_left = per_round
        self._now = 0.0

    def begin_round(self, now: float, running: Iterable[str]) -> None:
        """Start a decision at ``now`` over the tasks that run now."""
        self._now = now
        seen = self._seen
        still = set(running)
        for t in [t for t in seen if t not in still]:
            del seen[t]
        for t in still:
            seen.setdefault(t, now)
        while self._spent and self._spent[0][0] <= now - MINUTE:
            self._spent.popleft()
        self._round_left = self.per_round

    def old_enough(self, task: str) -> bool:
        started = self._seen.get(task, self._now)
        return self._now - started >= self.min_runtime

    def started(self, task: str, default: float) -> float:
        """When this instance first saw ``task`` running (``default`` if not yet)."""
        return self._seen.get(task, default)

    def left(self) -> int:
        """How many more tasks may be preempted now."""
        in_minute = self.per_minute - sum(n for _, n in self._spent)
        return max(0, min(self._round_left, in_minute))

    def spend(self, lost: int) -> None:
        self._round_left -= lost
        self._spent.append((self._now, lost))

    def refund(self, lost: int) -> None:
        """Give back a preemption planned for a gang that then did not fit whole."""
        self._round_left += lost
        for i in range(len(self._spent) - 1, -1, -1):
            if self._spent[i] == (self._now, lost):
                del self._spent[i]
                return

"""What keeps fair preemption from turning into a storm: a minimum run time before a
task may be preempted, a cap on the preemption decisions per round (Cook's
``max-preemption``: a decision is one claim that evicts, however many tasks it
evicts) and a cap on the tasks preempted per minute.

The minimum run time and the per-minute cap are this project's additions; Cook has
neither (its rebalancer runs every few minutes and bounds only the decisions of a
cycle).

(The third guard, hysteresis, is the share rule itself: a waiting task preempts only
victims whose CRS exceeds its own by more than delta, and once it runs, the victim
waiting again sees it at a CRS at least delta below its own, so neither can take the
other's place straight back.)

A task's run time counts from when the commit that placed it was written (its task
record's ``placed_at``, read through ``started``), so an instance that restarts, or
finds a task placed again elsewhere, judges it by the cell. A task the cell does not
date (a claim still in flight) counts from when this instance first saw it running.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

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
        self._started: Callable[[str], float] = self.first_seen

    def begin_round(self, now: float, running: Iterable[str],
                    started: Callable[[str], float] | None = None) -> None:
        """Start a decision at ``now`` over the tasks that run now; ``started``: when
        a task started, as the cell says (else when this instance first saw it)."""
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
        self._started = started or self.first_seen

    def first_seen(self, task: str, default: float | None = None) -> float:
        """When this instance first saw ``task`` running (``default``, else the
        round's now, if it has not)."""
        return self._seen.get(task, self._now if default is None else default)

    def started(self, task: str) -> float:
        return self._started(task)

    def old_enough(self, task: str) -> bool:
        return self._now - self._started(task) >= self.min_runtime

    def decisions_left(self) -> int:
        """How many more preemption decisions this round allows."""
        return max(0, self._round_left)

    def tasks_left(self) -> int:
        """How many more tasks' work the per-minute cap lets preemption end."""
        return max(0, self.per_minute - sum(n for _, n in self._spent))

    def spend(self, lost: int) -> None:
        """One decision, ending ``lost`` tasks' work."""
        self._round_left -= 1
        self._spent.append((self._now, lost))

    def refund(self, decisions: int) -> None:
        """Give back the last ``decisions`` preemptions, planned for a gang that then
        did not fit whole (they are the latest spent)."""
        self._round_left += decisions
        for _ in range(decisions):
            self._spent.pop()

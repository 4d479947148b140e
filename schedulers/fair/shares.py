"""Cumulative Resource Share (Cook): how much of the cell a task's owner holds with
work at least as important as that task.

Each user orders their own tasks (``task_order``: the job's priority, higher first,
then submission, then the job and task); across users nothing is compared but shares.
A task's CRS is the resources of its owner's running tasks that come no later than it
in that order (itself included), as a share of the cell, divided by the owner's
weight. A waiting task's CRS counts itself as if it ran.

Several resource dimensions combine by the dominant share: the largest of the
per-dimension shares (as DRF and Cook's "DRU" do). A sum or a mean would let a user
who takes all of one scarce resource (every GPU) look small because they take little
of the others, and the work that needs that resource would wait while the user's
share looks fair; the dominant share charges each user for what they most deny others.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

import attrs

from cellstate.model import Job, Resources

#: A task's place in its owner's own order (smaller comes first).
OrderKey = tuple[int, float, str, int]


def task_order(job: Job, index: int) -> OrderKey:
    return (-job.priority, job.submitted_at, job.id, index)


def dominant_share(amounts: Mapping[str, float], totals: Mapping[str, float]) -> float:
    """The largest share of any dimension the cell has (dimensions it lacks count 0:
    nothing can run on them anyway)."""
    return max((amounts.get(d, 0.0) / t for d, t in totals.items() if t > 0), default=0.0)


@attrs.define
class _UserTasks:
    keys: list[OrderKey] = attrs.field(factory=list)
    tasks: list[str] = attrs.field(factory=list)
    needs: list[Resources] = attrs.field(factory=list)
    # Cumulative amounts of the first positions; a change drops those from its
    # position on, and they are extended again lazily (placing a user's tasks one by
    # one, mostly at the end of their order, costs O(1) each rather than O(tasks)).
    cum: list[dict[str, float]] = attrs.field(factory=list)


class ShareBook:
    """Every user's running tasks in the user's own order, and the cell's resources:
    the CRS of any task, running or waiting. Changes (:meth:`add`, :meth:`remove`)
    model a decision's own placements and evictions as it makes them."""

    def __init__(self, totals: Resources, weights: Mapping[str, float] | None = None,
                 default_weight: float = 1.0) -> None:
        self.totals = {d: a for d, a in totals.amounts if a > 0}
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self._users: dict[str, _UserTasks] = {}
        self._owner: dict[str, str] = {}

    def weight(self, user: str) -> float:
        return self.weights.get(user, self.default_weight)

    def users(self) -> list[str]:
        return sorted(u for u, t in self._users.items() if t.tasks)

    def add(self, user: str, key: OrderKey, task: str, need: Resources) -> None:
        if task in self._owner:
            raise ValueError(f"task {task} is in the book already")
        ut = self._users.setdefault(user, _UserTasks())
        at = bisect.bisect_left(ut.keys, key)
        ut.keys.insert(at, key)
        ut.tasks.insert(at, task)
        ut.needs.insert(at, need)
        del ut.cum[at:]
        self._owner[task] = user

    def remove(self, task: str) -> None:
        user = self._owner.pop(task)
        ut = self._users[user]
        at = ut.tasks.index(task)
        del ut.keys[at], ut.tasks[at], ut.needs[at]
        del ut.cum[at:]

    def owner(self, task: str) -> str | None:
        return self._owner.get(task)

    def running(self, user: str) -> Resources:
        """The resources the user's running tasks hold."""
        ut = self._users.get(user)
        if ut is None or not ut.tasks:
            return Resources()
        return Resources(tuple(sorted(self._cum(ut)[-1].items())))

    def share(self, user: str) -> float:
        """The user's whole weighted dominant share (the CRS of their last task)."""
        ut = self._users.get(user)
        if ut is None or not ut.tasks:
            return 0.0
        return dominant_share(self._cum(ut)[-1], self.totals) / self.weight(user)

    def crs(self, task: str) -> float:
        """The CRS of a running task in the book."""
        user = self._owner[task]
        ut = self._users[user]
        at = ut.tasks.index(task)
        return dominant_share(self._cum(ut, at + 1)[at], self.totals) / self.weight(user)

    def crs_of_all(self, user: str) -> Iterable[tuple[str, float]]:
        """(task, CRS) of every running task of the user, in the user's order."""
        ut = self._users.get(user)
        if ut is None:
            return []
        w = self.weight(user)
        return [(t, dominant_share(c, self.totals) / w)
                for t, c in zip(ut.tasks, self._cum(ut), strict=True)]

    def crs_waiting(self, user: str, key: OrderKey, need: Resources) -> float:
        """The CRS a waiting task would have: its owner's running tasks that come
        before it, plus itself."""
        ut = self._users.get(user)
        amounts = dict(need.amounts)
        if ut is not None and ut.tasks:
            before = bisect.bisect_left(ut.keys, key)
            if before:
                for d, a in self._cum(ut, before)[before - 1].items():
                    amounts[d] = amounts.get(d, 0.0) + a
        return dominant_share(amounts, self.totals) / self.weight(user)

    def _cum(self, ut: _UserTasks, upto: int | None = None) -> list[dict[str, float]]:
        """The user's cumulative amounts, correct at least for the first ``upto``
        positions (default: all)."""
        cum = ut.cum
        stop = len(ut.needs) if upto is None else upto
        run = cum[-1] if cum else {}
        for need in ut.needs[len(cum):stop]:
            run = dict(run)
            for d, a in need.amounts:
                run[d] = run.get(d, 0.0) + a
            cum.append(run)
        return cum

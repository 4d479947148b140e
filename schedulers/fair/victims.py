"""Choosing whom a waiting task preempts: the running tasks of the fair scheduler's
users whose CRS is highest, on the machine where the fewest such tasks, each above the
waiting task's CRS plus delta, make room."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

import attrs

from cellstate.model import Job, split_task_id
from schedulers.api import CellView
from schedulers.fair.shares import CellShares
from schedulers.placement import can_host


@attrs.frozen
class Victim:
    task: str
    job: str
    machine: str
    crs: float
    gang_size: int = 0  # running tasks of its gang job (0: not a gang): all lose their work


@attrs.frozen
class Preemption:
    machine: str
    victims: tuple[Victim, ...]

    @property
    def floor(self) -> float:
        """The lowest CRS among the victims: the higher, the less it costs fairness."""
        return min(v.crs for v in self.victims)

    @property
    def lost(self) -> int:
        """Tasks whose work this ends: preempting one task of a gang ends the gang, so a
        gang counts whole (once, however many of its tasks are victims)."""
        gangs = {v.job: v.gang_size for v in self.victims if v.gang_size}
        return sum(gangs.values()) + sum(1 for v in self.victims if not v.gang_size)


def choose(view: CellView, job: Job, by_machine: Mapping[str, Sequence[Victim]],
           budget: int) -> Preemption | None:
    """The preemption that makes room for one task of ``job``: on each machine, victims
    taken in order of CRS (highest first) until the task fits; of those machines, the
    one whose victims' lowest CRS is highest, then the one losing fewest tasks. None if
    no machine can be freed within ``budget`` lost tasks.

    ``by_machine``: the eligible victims per machine (none empty), highest CRS first."""
    best: Preemption | None = None
    # Machines in order of their best victim: a preemption's floor is at most that,
    # so once it falls below the best floor found, no later machine can do better.
    for mid in sorted(by_machine, key=lambda k: (-by_machine[k][0].crs, k)):
        victims = by_machine[mid]
        if best is not None and victims[0].crs < best.floor:
            break
        m = view.machine(mid)
        if m is None:
            continue
        if not can_host(view, job, m, [m.allocations[v.task] for v in victims]):
            continue  # not even all of them make room
        p = _greedy(view, job, victims, budget)
        if p is not None and (best is None or (p.floor, -p.lost) > (best.floor, -best.lost)):
            best = p
    return best


def _greedy(view: CellView, job: Job, victims: Sequence[Victim], budget: int
            ) -> Preemption | None:
    """Victims of one machine taken highest CRS first, passing over any that would
    lose more tasks than ``budget`` allows (a large gang), until the task fits."""
    m = view.machine(victims[0].machine)
    assert m is not None
    chosen: list[Victim] = []
    for v in victims:
        trial = Preemption(v.machine, (*chosen, v))
        if trial.lost > budget:
            continue
        chosen.append(v)
        if can_host(view, job, m, [m.allocations[c.task] for c in chosen]):
            return trial
    return None


def eligible(view: CellView, shares: CellShares, precedence: int, threshold: float,
             old_enough: Callable[[str], bool]) -> tuple[dict[str, list[Victim]], int]:
    """Victims per machine (highest CRS first): running tasks of the scheduler's users
    with a CRS above ``threshold`` and a precedence no higher than ``precedence``, that
    ``old_enough`` lets go; and how many more it protects. A gang job is taken whole
    or not at all: every running task of it must qualify, and each stands for the gang
    at its most important task's CRS (the gang's work ends whichever of its tasks
    goes)."""
    book = shares.book
    out: dict[str, list[Victim]] = defaultdict(list)
    young = 0
    for user in book.users():
        tail = book.above(user, threshold)  # the user's order is the order of CRS
        if not tail:
            continue
        gang_floor: dict[str, float] = {}
        gang_ok: dict[str, bool] = {}
        gang_seen: Counter[str] = Counter()
        found: list[tuple[str, float, str]] = []  # (task, crs, machine)
        for task, crs in tail:
            jid = split_task_id(task)[0]
            mid = shares.where[task]
            m = view.machine(mid)
            a = m.allocations.get(task) if m is not None else None
            ok = a is not None and a.precedence <= precedence
            if ok and not old_enough(task):
                young += 1
                ok = False
            if jid in shares.gang_sizes:
                gang_floor.setdefault(jid, crs)  # listed in the user's order
                gang_ok[jid] = gang_ok.get(jid, True) and ok
                gang_seen[jid] += 1
            if ok:
                found.append((task, crs, mid))
        for task, crs, mid in found:
            jid = split_task_id(task)[0]
            size = shares.gang_sizes.get(jid, 0)
            if size:
                # Whole or not at all: a gang task at or below the threshold keeps it.
                if not gang_ok[jid] or gang_seen[jid] < size:
                    continue
                crs = gang_floor[jid]
            out[mid].append(Victim(task, jid, mid, crs, size))
    for victims in out.values():
        victims.sort(key=lambda v: (-v.crs, v.task))
    return dict(out), young

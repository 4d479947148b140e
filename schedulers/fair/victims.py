"""Choosing whom a waiting task preempts: the running tasks of the fair scheduler's
users whose CRS is highest, on the machine where the fewest such tasks, each above the
waiting task's CRS plus delta, make room."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from cellstate.model import Job, split_task_id
from schedulers.api import CellView
from schedulers.fair.shares import CellShares, ShareBook
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


class RoundMemo:
    """What a round learns once about each running task and reuses in every search
    for victims: its job, machine and precedence do not change within a round, nor
    does whether it ran long enough (the round has one ``now``). Without it a round
    that preempts k times read every candidate's record k times (seconds of CPU at
    thousands of machines)."""

    def __init__(self, view: CellView, shares: CellShares,
                 old_enough: Callable[[str], bool], safe: float = 0.0) -> None:
        self._view = view
        self._where = shares.where
        self._old_enough = old_enough
        self.safe = safe  # Cook's safe threshold: no task with a lower CRS goes
        self._facts: dict[str, tuple[str, str, int | None, bool]] = {}
        # user -> what eligible() found among their tasks at a book version,
        # precedence and threshold (see _Found).
        self.found: dict[str, _Found] = {}

    def facts(self, task: str) -> tuple[str, str, int | None, bool]:
        """(job, machine, precedence or None if it no longer runs there, old enough)."""
        f = self._facts.get(task)
        if f is None:
            mid = self._where[task]
            m = self._view.machine(mid)
            a = m.allocations.get(task) if m is not None else None
            f = self._facts[task] = (split_task_id(task)[0], mid,
                                     None if a is None else a.precedence,
                                     self._old_enough(task))
        return f

    def forget(self, tasks: Iterable[str]) -> None:
        """Tasks claimed and taken back: the same task may be claimed elsewhere next."""
        for t in tasks:
            self._facts.pop(t, None)


def threshold_of(crs: float, delta: float) -> float:
    """The CRS a victim must exceed for a task whose CRS would be ``crs``: Cook's
    hysteresis (see ``guard``), one rule for the policy and the share view."""
    return crs + delta


@attrs.define
class Kept:
    """How many running tasks above a waiting task's threshold each filter kept from
    being its victims (a task kept by several is counted by the first that applies,
    in this order), so a reason can name every filter with its count."""

    higher: int = 0  # a higher precedence than the waiting task's
    safe: int = 0  # a CRS below the safe threshold: inside their owner's share
    young: int = 0  # run less than the minimum run time
    quota: int = 0  # another user's, while the waiting task's owner is past their quota

    def __bool__(self) -> bool:
        return bool(self.higher or self.safe or self.young or self.quota)

    def text(self, precedence: int, safe: float, min_runtime: float) -> str:
        """The filters in words, e.g. "3 task(s) above it have a higher precedence
        ...; 2 are inside their owner's share (CRS below the safe threshold 1)"."""
        parts = []
        if self.higher:
            parts.append(f"{self.higher} task(s) above it have a higher precedence than "
                         f"this task's ({precedence}), which fair preemption never takes")
        if self.safe:
            parts.append(f"{self.safe} are inside their owner's share (CRS below the safe "
                         f"threshold {safe:g})")
        if self.young:
            parts.append(f"{self.young} have run less than the minimum run time "
                         f"({min_runtime:g} s)")
        if self.quota:
            parts.append(f"{self.quota} are other users' tasks, which a task past its "
                         "owner's quota may not preempt")
        return "; ".join(parts)


def eligible(view: CellView, shares: CellShares, precedence: int, threshold: float,
             old_enough: Callable[[str], bool], memo: RoundMemo | None = None,
             only: str | None = None) -> tuple[dict[str, list[Victim]], Kept]:
    """Victims per machine (highest CRS first): running tasks of the scheduler's users
    with a CRS above ``threshold`` and at or above the memo's safe threshold, a
    precedence no higher than ``precedence``, that ``old_enough`` lets go (of user
    ``only``, if given: Cook lets a task past its owner's quota preempt only its owner's
    tasks); and how many above the threshold each filter kept out (said when nothing
    can be preempted, so a reason names every filter). A gang job is taken whole or
    not at all: every running task of it must qualify, and each stands for the gang
    at its most important task's CRS (the gang's work ends whichever of its tasks
    goes). ``memo``: the round's memo, if this is one of several searches in a round
    (its ``old_enough`` is then the memo's)."""
    memo = memo or RoundMemo(view, shares, old_enough)
    book = shares.book
    out: dict[str, list[Victim]] = defaultdict(list)
    kept = Kept()
    for user in book.users():
        f = _found(memo, book, shares.gang_sizes, user, precedence, threshold)
        kept.higher += len(f.higher) - bisect.bisect_right(f.higher, threshold)
        kept.safe += len(f.safe) - bisect.bisect_right(f.safe, threshold)
        kept.young += len(f.young) - bisect.bisect_right(f.young, threshold)
        tail = f.victims[bisect.bisect_right(f.keys, threshold):]
        if only is not None and user != only:
            kept.quota += len(tail)
            continue
        for v in tail:
            out[v.machine].append(v)
    for victims in out.values():
        victims.sort(key=lambda v: (-v.crs, v.task))
    return dict(out), kept


@attrs.define
class _Found:
    """A user's victims above ``threshold`` and the CRS of their tasks above it too
    young to go, both in the user's order (so in ascending CRS), with their positions.

    It answers a higher threshold at the same precedence by cutting both lists: a task
    (or a gang, at its lowest CRS) qualifies above a higher threshold exactly when it
    qualified and lies above. After the user's order changed from a position on (a
    victim preempted, a task claimed), what lies before that position still holds and
    only the rest is found again, unless a gang is among the tasks (a gang's members
    decide together, wherever they lie)."""

    version: int
    precedence: int
    threshold: float
    victims: list[Victim]
    keys: list[float]  # the victims' CRS
    at: list[int]  # the victims' positions
    young: list[float]
    young_at: list[int]
    gangs: bool  # a gang's task lies above the threshold
    # the CRS and positions of tasks above the threshold of a higher precedence
    higher: list[float] = attrs.field(factory=list)
    higher_at: list[int] = attrs.field(factory=list)
    # ... and of those inside their owner's share (below the safe threshold)
    safe: list[float] = attrs.field(factory=list)
    safe_at: list[int] = attrs.field(factory=list)


def _found(memo: RoundMemo, book: ShareBook, gang_sizes: Mapping[str, int], user: str,
           precedence: int, threshold: float) -> _Found:
    version = book.version(user)
    f = memo.found.get(user)
    if f is not None and f.version == version:
        if f.precedence == precedence and threshold >= f.threshold:
            return f
    elif (f is not None and not f.gangs and f.precedence == precedence
          and threshold >= f.threshold):
        q = book.changed_since(user, f.version)
        k, ky = bisect.bisect_left(f.at, q), bisect.bisect_left(f.young_at, q)
        kh = bisect.bisect_left(f.higher_at, q)
        ks = bisect.bisect_left(f.safe_at, q)
        rest = _user_victims(book, gang_sizes, user, precedence, f.threshold, memo, q)
        f = memo.found[user] = _Found(
            version, precedence, f.threshold, f.victims[:k] + rest.victims,
            f.keys[:k] + rest.keys, f.at[:k] + rest.at, f.young[:ky] + rest.young,
            f.young_at[:ky] + rest.young_at, rest.gangs, f.higher[:kh] + rest.higher,
            f.higher_at[:kh] + rest.higher_at, f.safe[:ks] + rest.safe,
            f.safe_at[:ks] + rest.safe_at)
        return f
    f = memo.found[user] = _user_victims(book, gang_sizes, user, precedence, threshold,
                                         memo)
    return f


def _user_victims(book: ShareBook, gang_sizes: Mapping[str, int], user: str,
                  precedence: int, threshold: float, memo: RoundMemo, start: int = 0,
                  ) -> _Found:
    """What :class:`_Found` holds, for the user's tasks from position ``start`` on."""
    tail = book.above(user, threshold)  # the user's order is the order of CRS
    first = book.size(user) - len(tail)
    skip = max(0, start - first)
    gang_floor: dict[str, float] = {}
    gang_ok: dict[str, bool] = {}
    gang_seen: Counter[str] = Counter()
    found: list[tuple[str, float, str, str, int]] = []  # (task, crs, machine, job, at)
    young: list[float] = []
    young_at: list[int] = []
    higher: list[float] = []
    higher_at: list[int] = []
    safe: list[float] = []
    safe_at: list[int] = []
    for i, (task, crs) in enumerate(tail[skip:], first + skip):
        jid, mid, prec, old = memo.facts(task)
        ok = prec is not None and prec <= precedence
        if prec is not None and prec > precedence:
            higher.append(crs)
            higher_at.append(i)
        if ok and crs < memo.safe:
            safe.append(crs)
            safe_at.append(i)
            ok = False
        if ok and not old:
            young.append(crs)
            young_at.append(i)
            ok = False
        if jid in gang_sizes:
            gang_floor.setdefault(jid, crs)  # listed in the user's order
            gang_ok[jid] = gang_ok.get(jid, True) and ok
            gang_seen[jid] += 1
        if ok:
            found.append((task, crs, mid, jid, i))
    victims: list[tuple[float, int, Victim]] = []
    for task, crs, mid, jid, i in found:
        size = gang_sizes.get(jid, 0)
        if size:
            # Whole or not at all: a gang task at or below the threshold keeps it.
            if not gang_ok[jid] or gang_seen[jid] < size:
                continue
            crs = gang_floor[jid]
        victims.append((crs, i, Victim(task, jid, mid, crs, size)))
    if gang_seen:
        victims.sort(key=lambda x: x[0])  # a gang's tasks stand at its lowest CRS
    return _Found(book.version(user), precedence, threshold, [v for _, _, v in victims],
                  [c for c, _, _ in victims], [i for _, i, _ in victims], young, young_at,
                  bool(gang_seen), higher, higher_at, safe, safe_at)

"""A deliberately simple, sequential model of the transaction contract.

It shares no code with the store: plain dicts, one loop, the rules written out again
from DESIGN.md. The property test runs the same interleaving of operations through the
store and through this model and requires the same outcome."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MModel:
    capacity: dict[str, float]  # machine -> cpu
    up: dict[str, bool] = field(default_factory=dict)
    version: dict[str, int] = field(default_factory=dict)  # bumps on any machine change
    on: dict[str, str] = field(default_factory=dict)  # running task -> machine
    state: dict[str, str] = field(default_factory=dict)  # task -> state (absent: pending)
    need: dict[str, float] = field(default_factory=dict)  # job -> cpu per task
    precedence: dict[str, int] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # job -> scheduler
    tasks: dict[str, int] = field(default_factory=dict)  # job -> task count

    def __post_init__(self) -> None:
        for m in self.capacity:
            self.up.setdefault(m, True)
            self.version.setdefault(m, 0)

    def used(self, m: str) -> float:
        return sum(self.need[t.split("/")[0]] for t, mm in self.on.items() if mm == m)

    def commit(
        self,
        scheduler: str,
        claims: list[tuple[str, int, str, int, tuple[str, ...]]],
        gang: bool,
        coarse: bool,
    ) -> tuple[list[str], dict[str, str]]:
        """claims: (job, index, machine, seen version, victims). Returns the committed
        task ids and a reason per rejected task id."""
        on, state, version = dict(self.on), dict(self.state), dict(self.version)
        touched: set[str] = set()
        ok: list[str] = []
        bad: dict[str, str] = {}
        for job, index, m, seen, victims in claims:
            tid = f"{job}/{index}"
            reason = self._check(scheduler, job, index, m, seen, victims, coarse, on, state)
            if reason:
                bad[tid] = reason
                continue
            for v in victims:
                del on[v]
                state[v] = "preempted"
            on[tid] = m
            state[tid] = "running"
            touched.add(m)
            ok.append(tid)
        if gang and bad:
            return [], {**{t: "gang_aborted" for t in ok}, **bad}
        self.on, self.state = on, state
        for m in touched:
            version[m] += 1
        self.version = version
        return ok, bad

    def _check(
        self, scheduler: str, job: str, index: int, m: str, seen: int,
        victims: tuple[str, ...], coarse: bool, on: dict[str, str], state: dict[str, str],
    ) -> str:
        if job not in self.owner or self.owner[job] != scheduler or index >= self.tasks[job]:
            return "invalid"
        tid = f"{job}/{index}"
        if state.get(tid, "pending") not in ("pending", "lost", "preempted"):
            return "task_already_placed"
        if m not in self.capacity:
            return "unknown_machine"
        if coarse and self.version[m] != seen:
            return "sequence_changed"
        if not self.up[m]:
            return "machine_down"
        for v in victims:
            if on.get(v) != m:
                return "invalid"
            if self.precedence[v.split("/")[0]] >= self.precedence[job]:
                return "precedence_too_low"
        used = sum(self.need[t.split("/")[0]] for t, mm in on.items() if mm == m)
        freed = sum(self.need[v.split("/")[0]] for v in victims)
        if used - freed + self.need[job] > self.capacity[m] + 1e-9:
            return "insufficient_resources"
        return ""

    def release(self, tid: str, outcome: str) -> bool:
        if self.state.get(tid) != "running":
            return False
        m = self.on.pop(tid)
        self.state[tid] = outcome
        self.version[m] += 1
        return True

    def set_up(self, m: str, up: bool) -> None:
        if self.up[m] == up:
            self.version[m] += 1  # the store rewrites the machine anyway
            return
        self.up[m] = up
        self.version[m] += 1
        if not up:
            for t, mm in list(self.on.items()):
                if mm == m:
                    del self.on[t]
                    self.state[t] = "lost"

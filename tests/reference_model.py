"""A deliberately simple, sequential model of the transaction contract.

It shares no code with the store: plain dicts, one loop, the rules written out again
from DESIGN.md and docs/architecture.md ("What the store checks"). The property test
runs the same interleaving of operations through the store and through this model and
requires the same outcome. Resources are dicts of dimension to amount (cpu, mem, disk,
gpu, ...); every dimension is checked, on machines and against schedulers' limits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# (job, index, machine, seen version, victims, fallbacks as (machine, seen), moves from)
MClaim = tuple[str, int, str, int, tuple[str, ...], tuple[tuple[str, int], ...], str]


Amounts = dict[str, float]  # dimension -> amount; a missing dimension is 0

_SLACK = 1e-9


def _over(amount: float, cap: float) -> bool:
    return amount > cap + _SLACK * max(cap, 1.0)


@dataclass
class MModel:
    capacity: dict[str, Amounts]  # machine -> what it has
    up: dict[str, bool] = field(default_factory=dict)
    version: dict[str, int] = field(default_factory=dict)  # bumps on any machine change
    on: dict[str, str] = field(default_factory=dict)  # running task -> machine
    state: dict[str, str] = field(default_factory=dict)  # task -> state (absent: pending)
    need: dict[str, Amounts] = field(default_factory=dict)  # job -> per task
    precedence: dict[str, int] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # job -> scheduler
    tasks: dict[str, int] = field(default_factory=dict)  # job -> task count
    gang_jobs: set[str] = field(default_factory=set)  # jobs placed all or nothing
    killed: set[str] = field(default_factory=set)
    allowed: dict[str, set[str]] = field(default_factory=dict)  # job -> machines its
    #   selector matches (absent: any)
    per_machine: dict[str, int] = field(default_factory=dict)  # job -> max tasks per machine
    limit: dict[str, Amounts] = field(default_factory=dict)  # scheduler -> most it may hold

    def __post_init__(self) -> None:
        for m in self.capacity:
            self.up.setdefault(m, True)
            self.version.setdefault(m, 0)

    def used(self, m: str, on: dict[str, str] | None = None) -> Amounts:
        return self._sum(t for t, mm in (self.on if on is None else on).items() if mm == m)

    def _sum(self, tids: Iterable[str]) -> Amounts:
        total: Amounts = {}
        for t in tids:
            for d, a in self.need[t.split("/")[0]].items():
                total[d] = total.get(d, 0.0) + a
        return total

    def held(self, scheduler: str, on: dict[str, str] | None = None) -> Amounts:
        """What ``scheduler``'s running tasks hold, over the whole cell."""
        return self._sum(t for t in (self.on if on is None else on)
                         if self.owner[t.split("/")[0]] == scheduler)

    def commit(
        self,
        scheduler: str,
        claims: list[MClaim],
        gang: bool,
        coarse: bool,
    ) -> tuple[list[tuple[str, str]], dict[str, str]]:
        """claims: (job, index, machine, seen version, victims, fallbacks as (machine,
        seen version), machine it moves from or ""). Returns (task id, machine taken) of
        the committed claims and a reason per rejected task id."""
        on, state, version = dict(self.on), dict(self.state), dict(self.version)
        touched: set[str] = set()
        ok: list[tuple[str, str]] = []
        bad: dict[str, str] = self._gang_job_refusals(claims, gang)
        for job, index, m, seen, victims, fallbacks, moves_from in claims:
            tid = f"{job}/{index}"
            if tid in bad:
                continue
            reason = self._check_task(scheduler, job, index, moves_from, on, state)
            taken = ""
            if not reason:
                # The first machine that passes; else the first machine's reason.
                for cand, cand_seen in ((m, seen), *fallbacks):
                    why = self._check_machine(scheduler, job, cand, cand_seen, victims,
                                              coarse, on, moves_from)
                    if not why:
                        taken = cand
                        break
                    reason = reason or why
            if not taken:
                bad[tid] = reason
                continue
            for v in victims:
                del on[v]
                state[v] = "preempted"
            if moves_from:
                touched.add(on.pop(tid))
            on[tid] = taken
            state[tid] = "running"
            touched.add(taken)
            ok.append((tid, taken))
        if gang and bad:
            return [], {**{t: "gang_aborted" for t, _ in ok}, **bad}
        self.on, self.state = on, state
        for m in touched:
            version[m] += 1
        self.version = version
        return ok, bad

    def _gang_job_refusals(self, claims: list[MClaim], gang: bool) -> dict[str, str]:
        """A gang job's claims come in a gang transaction claiming every one of its
        tasks that is pending, lost or preempted. A killed job takes no placement: its
        claims are refused as job_ended (``_check_task``) whatever they cover."""
        out: dict[str, str] = {}
        for job in ({c[0] for c in claims} & self.gang_jobs) - self.killed:
            mine = [c for c in claims if c[0] == job]
            claimed = {c[1] for c in mine}
            placeable = {i for i in range(self.tasks[job])
                         if self.state.get(f"{job}/{i}", "pending")
                         in ("pending", "lost", "preempted")}
            if not gang or placeable - claimed:
                out.update({f"{job}/{c[1]}": "invalid" for c in mine})
        return out

    def _check_task(
        self, scheduler: str, job: str, index: int, moves_from: str, on: dict[str, str],
        state: dict[str, str],
    ) -> str:
        if job not in self.owner or self.owner[job] != scheduler:
            return "invalid"
        if job in self.killed:
            return "job_ended"
        if index >= self.tasks[job]:
            return "invalid"
        tid = f"{job}/{index}"
        if moves_from:  # a move: the task must run where the claim says
            return "" if state.get(tid) == "running" and on.get(tid) == moves_from else "invalid"
        if state.get(tid, "pending") not in ("pending", "lost", "preempted"):
            return "task_already_placed"
        return ""

    def _check_machine(
        self, scheduler: str, job: str, m: str, seen: int, victims: tuple[str, ...],
        coarse: bool, on: dict[str, str], moves_from: str,
    ) -> str:
        if m not in self.capacity:
            return "unknown_machine"
        if coarse and self.version[m] != seen:
            return "sequence_changed"
        if not self.up[m]:
            return "machine_down"
        for v in victims:
            if on.get(v) != m:
                return "invalid"
            victim, mine = self.precedence[v.split("/")[0]], self.precedence[job]
            own = self.owner[v.split("/")[0]] == self.owner[job]
            if victim > mine or (victim == mine and not own):
                return "precedence_too_low"
        if job in self.allowed and m not in self.allowed[job]:
            return "constraint_violated"
        mine = sum(1 for t, mm in on.items() if mm == m and t.startswith(f"{job}/"))
        if self.per_machine.get(job) and mine >= self.per_machine[job]:
            return "constraint_violated"
        used, freed = self.used(m, on), self._sum(victims)
        need, cap = self.need[job], self.capacity[m]
        if any(_over(used.get(d, 0.0) - freed.get(d, 0.0) + a, cap.get(d, 0.0))
               for d, a in need.items()):
            return "insufficient_resources"
        lim = self.limit.get(scheduler)
        if lim and not moves_from:  # a move does not change what the scheduler holds
            held = self.held(scheduler, on)
            if any(_over(held.get(d, 0.0) + need.get(d, 0.0), c) for d, c in lim.items()):
                return "limit_exceeded"
        return ""

    def release(self, tid: str, outcome: str) -> bool:
        if self.state.get(tid) == outcome:
            return True  # reported again: the same answer, nothing changes
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

    def kill(self, job: str) -> None:
        """The job takes no more placements; what runs of it is killed."""
        self.killed.add(job)
        for t, m in sorted(self.on.items()):
            if t.startswith(f"{job}/"):
                del self.on[t]
                self.state[t] = "killed"
                self.version[m] += 1

    def resize(self, job: str, count: int) -> bool:
        """Shrinking below a task that was ever placed is refused."""
        if count < self.tasks[job] and any(
            int(t.split("/")[1]) >= count for t in self.state if t.startswith(f"{job}/")
        ):
            return False
        self.tasks[job] = count
        return True

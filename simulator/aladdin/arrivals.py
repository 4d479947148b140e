"""Aladdin+H with applications arriving and ending over hours (the counterpart of the
paper's Fig. 11b/c): the placement experiment's cell and application mix, but the
applications come as a Poisson process and each ends after an exponential lifetime,
so the cell fragments as they come and go, and repacking has work.

**The arrival process** (the file's ``[arrivals]``; all in virtual time):

* lifetimes: exponential with mean ``life_hours``;
* arrivals: Poisson, at the rate that keeps ``occupancy`` of the cell's cores asked
  for on average (Little's law: rate = occupancy * cores / (life * mean cores of an
  application));
* the run starts at the steady state: the applications alive at time 0 (a Poisson
  number of mean rate * life, each with an exponential remaining life: lifetimes are
  memoryless) are submitted at once, then ``hours`` of arrivals and ends follow;
* an application that ends is killed (``kill_job``): its running tasks are released
  and its waiting ones are withdrawn.

The applications are drawn, in order, from the placement experiment's generator
(``workload.jobs``: Table 4's task mix, affinity groups, anti-affinity), so the mix
is the same; the same file and seed give the same events for every scheduler.

**What a run measures** (``ArrivalsResult``):

* ``migrations``: tasks moved by the scheduler (claims with ``moves_from``
  committed), the paper's Fig. 11c;
* ``busy_s``: the CPU seconds the scheduler's steps took over the whole run (the
  time to place all tasks, Fig. 11b; CPU time, since the machine is shared), and
  ``ms_per_task`` that over the tasks placed;
* per-application wait, in virtual seconds from its submission to the placement of
  its last task (median, p95, p99, max), ``waited``: applications that were not
  placed whole in the round that followed their arrival (wait > ``PROMPT``), and
  ``never``: those that ended before they were placed whole;
* ``machines_used``: the mean, over the samples taken every ``SAMPLE`` virtual
  seconds from ``SAMPLE`` on, of the machines running a task; ``cpu_eff``: the cores their tasks ask
  for over those machines' cores, likewise averaged;
* for Aladdin with groups that follow the cell: ``regroups`` and ``regroup_ms``.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from cellstate.invariants import constraint_violations, violations
from cellstate.model import JobState, JobStatus, Machine
from schedulers.flow import FlowPolicy
from schedulers.flow.mcf.compile import warm as warm_kernels
from schedulers.testing import Harness
from simulator.aladdin.run import _quantile, make_policy
from simulator.aladdin.workload import (
    App,
    Experiment,
    ExperimentError,
    SchedulerSpec,
    _number,
    jobs,
    load_experiment,
    machines,
    scheduler_specs,
)

#: An application placed within this many virtual seconds of its arrival did not wait
#: (the scheduler's next round).
PROMPT = 2.0
#: Virtual seconds between samples of the machines used.
SAMPLE = 600.0


@attrs.frozen
class ArrivalProcess:
    hours: float = 4.0
    life_hours: float = 2.0
    occupancy: float = 0.85
    seed: int = 1


@attrs.frozen
class ArrivalsExperiment:
    name: str
    base: Experiment  # the cell and application mix (its schedulers are not used)
    process: ArrivalProcess
    schedulers: tuple[SchedulerSpec, ...]


def load_arrivals(path: Path, root: Path | None = None) -> ArrivalsExperiment:
    """Read an arrivals experiment file: ``base`` (a placement experiment file, for its
    cell and mix), ``scale``, ``[arrivals]`` and ``[[scheduler]]``."""
    where = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ExperimentError(f"{where}: {e}") from None
    unknown = sorted(set(doc) - {"name", "base", "scale", "arrivals", "scheduler"})
    if unknown:
        raise ExperimentError(f"{where}: unknown field(s) {', '.join(unknown)}")
    if not isinstance(doc.get("base"), str):
        raise ExperimentError(f"{where}: base (the placement experiment file whose cell "
                              "and mix it uses) is missing")
    root = root or Path.cwd()
    base = load_experiment(root / doc["base"], root)
    if "scale" in doc:
        scale = _number(doc["scale"], f"{where}: scale", 1e-6, 1.0)
        base = attrs.evolve(base, scale=scale)
    arr = doc.get("arrivals", {})
    if not isinstance(arr, dict):
        raise ExperimentError(f"{where}: arrivals must be a table")
    extra = sorted(set(arr) - {"hours", "life_hours", "occupancy", "seed"})
    if extra:
        raise ExperimentError(f"{where}: arrivals: unknown field(s) {', '.join(extra)}")
    kw: dict[str, Any] = {}
    for key, lo, hi in (("hours", 0.01, 1000.0), ("life_hours", 0.001, 10_000.0),
                        ("occupancy", 0.01, 1.0)):
        if key in arr:
            kw[key] = _number(arr[key], f"{where}: arrivals.{key}", lo, hi)
    if "seed" in arr:
        kw["seed"] = int(_number(arr["seed"], f"{where}: arrivals.seed", 0, 2**31,
                                 whole=True))
    return ArrivalsExperiment(str(doc.get("name", path.stem)), base, ArrivalProcess(**kw),
                              scheduler_specs(doc.get("scheduler"), where))


@attrs.frozen
class Event:
    at: float  # virtual seconds from the start
    app: int  # index into the applications
    ends: bool  # False: it arrives


def events(exp: ArrivalsExperiment, cell: Sequence[Machine]) -> tuple[list[App], list[Event]]:
    """The applications, in arrival order, and every arrival and end (sorted by time;
    at one time, ends first). The same experiment gives the same events."""
    p = exp.process
    cores = sum(m.capacity.get("cpu") for m in cell)
    life = 3600.0 * p.life_hours
    horizon = 3600.0 * p.hours
    # A pool of the mix comfortably larger than the run needs, in its shuffled order.
    pool_load = p.occupancy * (1 + 1.5 * p.hours / p.life_hours) * 1.3 + 0.2
    pool = jobs(attrs.evolve(exp.base, load=pool_load), cores)
    mean_cores = sum(a.job.task_count * a.job.task_resources.get("cpu")
                     for a in pool) / len(pool)
    rate = p.occupancy * cores / (life * mean_cores)  # applications per second
    rng = random.Random(p.seed)
    out: list[Event] = []
    apps: list[App] = []

    def add(at: float, lives: float) -> None:
        if len(apps) >= len(pool):
            raise ExperimentError(f"{exp.name}: the application pool ({len(pool)}) ran out")
        apps.append(pool[len(apps)])
        out.append(Event(at, len(apps) - 1, False))
        if at + lives < horizon:
            out.append(Event(at + lives, len(apps) - 1, True))

    for _ in range(_poisson(rng, rate * life)):
        add(0.0, rng.expovariate(1 / life))
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= horizon:
            break
        add(t, rng.expovariate(1 / life))
    out.sort(key=lambda e: (e.at, not e.ends, e.app))
    return apps, out


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (normal approximation past 50; exact below)."""
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, prod = math.exp(-mean), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return k


@attrs.frozen
class ArrivalsResult:
    scheduler: str
    machines: int
    applications: int
    tasks: int
    placed: int
    migrations: int
    busy_s: float
    ms_per_task: float
    wait_median_s: float
    wait_p95_s: float
    wait_p99_s: float
    wait_max_s: float
    waited: int
    never: int
    machines_used: float
    cpu_eff: float
    audit: int
    regroups: int
    regroup_ms: float
    wall_s: float
    #: sha256 of every committed claim in commit order (virtual time, task, machine,
    #: machine left): equal digests mean the same placements at the same times.
    placements: str = ""

    def row(self) -> dict[str, Any]:
        return attrs.asdict(self)


class ArrivalsRun:
    def __init__(self, spec: SchedulerSpec, cell: Sequence[Machine], apps: Sequence[App],
                 evs: Sequence[Event]) -> None:
        self.spec = spec
        self.cell = list(cell)
        self.apps = list(apps)
        self.events = list(evs)
        self.h = Harness()
        self.placed_at: dict[str, float] = {}

    def run(self) -> ArrivalsResult:
        h = self.h
        wall0 = time.perf_counter()
        h.admin.add_machines(self.cell)
        policy = make_policy(self.spec)
        if isinstance(policy, FlowPolicy):
            # The solver's kernels load (or compile, the first time) on first use: not
            # part of the time to place.
            warm_kernels()
        inst = h.add(policy, scheduler=self.spec.name)
        log = h.committer(inst).log
        seen = 0
        start = self.start = h.clock.now
        submitted: dict[str, float] = {}
        tasks_of: dict[str, int] = {}
        # task -> virtual seconds from the start to its placement
        placed_at = self.placed_at
        ended: set[str] = set()
        migrations = 0
        digest = hashlib.sha256()
        busy = 0.0
        samples: list[tuple[int, float]] = []
        next_sample = SAMPLE
        k = 0
        horizon = max((e.at for e in self.events), default=0.0)
        while True:
            # Times compared as the clock has them (start + offset), so that an event's
            # time and the clock set to it agree to the last bit.
            while k < len(self.events) and start + self.events[k].at <= h.clock.now:
                self._apply(self.events[k], submitted, tasks_of, ended)
                k += 1
            if h.clock.now >= start + next_sample:
                samples.append(self._sample())
                next_sample += SAMPLE
            h.pump()
            t0 = time.process_time()
            delay = inst.step()
            busy += time.process_time() - t0
            for rec in log[seen:]:
                if rec.result is None:
                    continue
                for c in rec.result.committed:
                    digest.update(f"{h.clock.now - start:.6f} {c.task} {c.machine} "
                                  f"{c.moves_from}\n".encode())
                    if c.moves_from:
                        migrations += 1
                    elif c.task not in placed_at:
                        placed_at[c.task] = h.clock.now - start
            seen = len(log)
            if k >= len(self.events) and h.clock.now >= start + horizon and delay > 0:
                break
            if delay > 0:
                wake = [h.clock.now + delay, start + next_sample]
                if k < len(self.events):
                    wake.append(start + self.events[k].at)
                h.clock.now = max(h.clock.now, min(wake))
        snap = h.snapshot()
        broken = violations(snap)
        if broken:
            raise AssertionError(f"{self.spec.name}: the cell's invariants broke: {broken[:3]}")
        waits: list[float] = []
        waited = never = 0
        for jid, at in submitted.items():
            times = [placed_at.get(f"{jid}/{i}") for i in range(tasks_of[jid])]
            if any(x is None for x in times):
                if jid in ended:
                    never += 1
                continue
            w = max(x for x in times if x is not None) - at
            waits.append(w)
            waited += w > PROMPT
        regroups, regroup_ms = 0, 0.0
        if isinstance(policy, FlowPolicy) and policy.planner is not None:
            regroups = int(getattr(policy.planner, "regroups", 0))
            regroup_ms = 1000 * float(getattr(policy.planner, "regroup_seconds", 0.0))
        used = [u for u, _ in samples]
        eff = [e for _, e in samples]
        return ArrivalsResult(
            self.spec.name, len(self.cell), len(submitted), sum(tasks_of.values()),
            len(placed_at), migrations, busy, 1000 * busy / max(len(placed_at), 1),
            _quantile(waits, 0.5), _quantile(waits, 0.95), _quantile(waits, 0.99),
            max(waits, default=float("nan")), waited, never,
            sum(used) / max(len(used), 1), sum(eff) / max(len(eff), 1),
            len(constraint_violations(snap)), regroups, regroup_ms,
            time.perf_counter() - wall0, digest.hexdigest())

    def _apply(self, e: Event, submitted: dict[str, float], tasks_of: dict[str, int],
               ended: set[str]) -> None:
        # The pool's ids are unique (each application is drawn once), and rules
        # between applications name them: kept as they are.
        job = self.apps[e.app].job
        now = self.h.clock.now
        if e.ends:
            self.h.admin.kill_job(JobStatus(job.id, JobState.KILLED, "the application ended",
                                            by="experiment", at=now))
            ended.add(job.id)
            return
        self.h.admin.submit_job(attrs.evolve(job, scheduler=self.spec.name, submitted_at=now))
        submitted[job.id] = now - self.start
        tasks_of[job.id] = job.task_count

    def _sample(self) -> tuple[int, float]:
        snap = self.h.snapshot()
        used = 0
        cores = asked = 0.0
        for m in snap.machines.values():
            if m.allocations:
                used += 1
                cores += m.capacity.get("cpu")
                asked += m.settled_used.get("cpu")
        return used, asked / cores if cores else 0.0


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The runs as a markdown table (docs/results/aladdin.md quotes it)."""
    head = ("| scheduler | applications (tasks) | placed | migrations | time to place all "
            "(s) | ms / task | wait median / p95 / p99 / max (s) | waited | never placed | "
            "machines used (mean) | cpu eff. | audit | regroups (ms) |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | ---: |\n")
    out = []
    for r in rows:
        out.append(
            f"| {r['scheduler']} | {r['applications']:,} ({r['tasks']:,}) | {r['placed']:,} | "
            f"{r['migrations']:,} | {r['busy_s']:.1f} | {r['ms_per_task']:.2f} | "
            f"{r['wait_median_s']:.1f} / {r['wait_p95_s']:.1f} / {r['wait_p99_s']:.1f} / "
            f"{r['wait_max_s']:.1f} | {r['waited']:,} | {r['never']:,} | "
            f"{r['machines_used']:,.0f} | {100 * float(r['cpu_eff']):.1f}% | {r['audit']} | "
            f"{r['regroups']} ({r['regroup_ms']:.0f}) |")
    return head + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m simulator.aladdin.arrivals")
    p.add_argument("experiment", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", help="comma-separated scheduler names to run")
    p.add_argument("--hours", type=float, help="override the file's arrivals.hours")
    p.add_argument("--scale", type=float, help="override the file's scale (the share of "
                   "each machine type)")
    args = p.parse_args(argv)
    prog = "python -m simulator.aladdin.arrivals"
    try:
        exp = load_arrivals(args.experiment)
    except ExperimentError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.hours is not None:
        if not 0 < args.hours <= 1000:
            print(f"{prog}: --hours must be in (0, 1000], got {args.hours:g}", file=sys.stderr)
            return 2
        exp = attrs.evolve(exp, process=attrs.evolve(exp.process, hours=args.hours))
    if args.scale is not None:
        if not 0 < args.scale <= 1:
            print(f"{prog}: --scale must be in (0, 1], got {args.scale:g}", file=sys.stderr)
            return 2
        exp = attrs.evolve(exp, base=attrs.evolve(exp.base, scale=args.scale))
    only = set(args.only.split(",")) if args.only else None
    unknown = sorted(only - {s.name for s in exp.schedulers}) if only else []
    if unknown:
        print(f"{prog}: --only names no scheduler of {exp.name}: {', '.join(unknown)} (it "
              f"has {', '.join(s.name for s in exp.schedulers)})", file=sys.stderr)
        return 2
    cell = machines(exp.base)
    apps, evs = events(exp, cell)
    tasks = sum(a.job.task_count for a in apps)
    at_start = sum(1 for e in evs if e.at == 0 and not e.ends)
    print(f"{exp.name}: {len(cell):,} machines; {len(apps):,} applications ({tasks:,} tasks), "
          f"{at_start:,} alive at the start; {sum(e.ends for e in evs):,} end within "
          f"{exp.process.hours:g} h", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in exp.schedulers:
        if only is not None and spec.name not in only:
            continue
        res = ArrivalsRun(spec, cell, apps, evs).run()
        rows.append(res.row())
        print(f"  {spec.name:<18} placed {res.placed:>6,} moved {res.migrations:>5,} busy "
              f"{res.busy_s:7.1f}s wait p95 {res.wait_p95_s:8.1f}s waited {res.waited:>5,} "
              f"never {res.never:>4,} used {res.machines_used:7.0f} audit {res.audit} "
              f"({res.wall_s:.0f}s)", flush=True)
        (args.out / "results.json").write_text(json.dumps(
            {"experiment": exp.name, "scale": exp.base.scale,
             "process": attrs.asdict(exp.process), "machines": len(cell),
             "applications": len(apps), "tasks": tasks, "runs": rows}, indent=1))
        (args.out / "results.md").write_text(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Small hand-checkable simulations: a few machines, jobs from a trace, fixed
decision times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cellstate.model import JobKind
from simulator.config import (
    Architecture,
    CellSpec,
    DecisionTime,
    SchedulerSpec,
    SimConfig,
)
from simulator.sim import Simulation
from simulator.workload import Distribution, JobClass

FIXED = Distribution.fixed(1.0)
CLASSES = (JobClass("batch", JobKind.BATCH, FIXED, FIXED, FIXED),
           JobClass("service", JobKind.SERVICE, FIXED, FIXED, FIXED))


def trace(tmp: Path, jobs: list[dict[str, Any]]) -> Path:
    path = tmp / "trace.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def job(submit: float, cls: str, tasks: int = 1, duration: float = 100.0, cpu: float = 1.0,
        **extra: Any) -> dict[str, Any]:
    return {"submit": submit, "class": cls, "tasks": tasks, "duration": duration, "cpu": cpu,
            "mem": 1.0, **extra}


def sched(name: str, t_job: float, serves: tuple[str, ...] | None = None,
          **kw: Any) -> SchedulerSpec:
    return SchedulerSpec(name, serves or (name,), default=DecisionTime(t_job, 0.0), **kw)


def simulate(tmp: Path, arch: Architecture, schedulers: tuple[SchedulerSpec, ...],
             jobs: list[dict[str, Any]], machines: int = 1, cpu: float = 4.0,
             horizon: float = 100.0, **kw: Any) -> tuple[Simulation, dict[str, Any]]:
    config = SimConfig(arch, schedulers, CLASSES, CellSpec(machines, cpu, 16.0), prefill=None,
                       horizon=horizon, day=horizon, trace=str(trace(tmp, jobs)),
                       sample_interval=1.0, **kw)
    sim = Simulation(config)
    return sim, sim.run()

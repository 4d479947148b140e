"""The flow scheduler decides the same way whatever Python's hash seed: the simulator
promises the same result from the same seed, and set or dict order of strings differs
from process to process unless the code sorts where order decides."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    from schedulers.flow import FlowPolicy
    from schedulers.testing import Harness, job, machine, settled

    for policy in ("load-spread", "quincy", "trivial"):
        h = Harness()
        h.admin.add_machines([machine(f"m{i}", cpu=8, rack=f"r{i % 3}") for i in range(9)])
        h.submit([job(f"j{k}", tasks=3 + k, cpu=1 + k % 2, scheduler="flow")
                  for k in range(6)])
        h.add(FlowPolicy(policy=policy))
        h.run(settled, max_steps=200)
        snap = h.snapshot()
        print(policy, sorted((t, r.machine) for t, r in snap.tasks.items()))
""")


def run(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, check=True, timeout=120).stdout


def test_placements_do_not_depend_on_the_hash_seed() -> None:
    first = run("1")
    assert first.count("m") > 30  # it placed tasks at all
    for seed in ("2", "3"):
        assert run(seed) == first

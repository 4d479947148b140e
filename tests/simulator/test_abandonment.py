"""Which attempts that placed nothing make a job abandoned: ``[retry] fruitless``."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.experiment import load
from simulator.point import run_one
from simulator.workload import InputError

# Ten 4-CPU machines, prefilled for the whole run; one job of 8 one-CPU tasks at
# t = 200, retried every second until the horizon (150 attempts) unless abandoned.
CELL = """\
horizon = 350
seed = 1

[cell]
machines = 10
cpu = 4
mem = 16

[prefill]
utilization = {utilization}
tasks = 1
cpu = 1
mem = 1

[[workload]]
name = "batch"
interarrival = {{dist = "fixed", value = 200}}
tasks = 8
cpu = 1
mem = 1
duration = 10000

[[scheduler]]
name = "batch"
serves = ["batch"]

[retry]
max_fruitless = 5
{rule}
"""


def _run(tmp_path: Path, utilization: float, rule: str) -> dict[str, object]:
    path = tmp_path / "exp.toml"
    line = f'fruitless = "{rule}"' if rule else ""
    path.write_text(CELL.format(utilization=utilization, rule=line), encoding="utf-8")
    exp = load(path)
    return run_one(exp.runs[0].point, 0, exp).metrics


# utilization 0.9: the job places 4 of its tasks, then nothing; 1.0: never anything.
@pytest.mark.parametrize(("utilization", "rule", "abandoned"), [
    (0.9, "", 1),            # the default: 5 fruitless attempts in a row
    (0.9, "in-a-row", 1),
    (0.9, "from-start", 0),  # it placed a task once: only the 1,000 attempts count
    (0.9, "off", 0),
    (1.0, "from-start", 1),  # the released simulator's rule: nothing placed, ever
    (1.0, "off", 0),         # the paper's: only the 1,000 attempts
])
def test_fruitless_rule(tmp_path: Path, utilization: float, rule: str,
                        abandoned: int) -> None:
    metrics = _run(tmp_path, utilization, rule)
    assert metrics["batch_abandoned"] == abandoned
    assert metrics["batch_unscheduled"] == 1 - abandoned


def test_an_unknown_rule_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"line 29, field 'retry.fruitless': str "
                                         r"'sometimes' is not one of in-a-row, from-start, off"):
        _run(tmp_path, 0.9, "sometimes")

"""docs/plugins.md's cost-model example runs: the flow scheduler with it packs tasks."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from schedulers.flow import FlowPolicy
from schedulers.flow.costs import CostModel, CostModelError
from schedulers.testing import Harness, job, machine
from schedulers.testing.harness import settled

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def packing_module() -> ModuleType:
    found = re.findall(r"<!-- cost-model: packing.py -->\n```python\n(.*?)```",
                       DOC.read_text(), re.S)
    assert len(found) == 1, "the guide has one packing.py block"
    module = ModuleType("packing")
    exec(compile(found[0], "docs/plugins.md:packing.py", "exec"), module.__dict__)
    return module


def run(model: CostModel) -> Counter[str]:
    h = Harness()
    for i in range(6):
        h.admin.add_machine(machine(f"m{i}", cpu=8, mem=32))
    h.submit([job("a", tasks=5, scheduler="flow"), job("b", tasks=6, scheduler="flow")])
    h.add(FlowPolicy(policy=model))
    h.run(settled, max_steps=50)
    snap = h.snapshot()
    return Counter(t.machine for t in snap.tasks.values() if t.machine)


def test_the_guides_packing_model_fills_the_fewest_machines() -> None:
    packing = packing_module().PackingCostModel()
    used = run(packing)
    assert sum(used.values()) == 11
    # 11 one-cpu tasks on 8-cpu machines: two machines, the first one full.
    assert len(used) == 2, used
    assert sorted(used.values()) == [3, 8]


def test_load_spreading_on_the_same_cell_uses_every_machine() -> None:
    from schedulers.flow.costs import LoadSpreadingCostModel

    used = run(LoadSpreadingCostModel())
    assert len(used) == 6, used  # the contrast the packing test relies on


def test_the_guides_model_refuses_options_it_does_not_declare() -> None:
    cls = packing_module().PackingCostModel
    with pytest.raises(CostModelError, match=r"packing: unknown option.*bogus"):
        cls(bogus=1)
    assert cls(scale=10).options["scale"] == 10.0

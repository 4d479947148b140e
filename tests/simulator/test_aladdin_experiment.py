"""The Aladdin+H placement experiment: its file is read strictly, the cell and jobs
follow Tables 3 and 4 and the constraint shares it states, and a small run measures
what docs/results/aladdin.md reports."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import attrs
import pytest

from cellstate.fit import self_affine
from simulator.aladdin.run import Run
from simulator.aladdin.workload import (
    ExperimentError,
    SchedulerSpec,
    jobs,
    load_experiment,
    machines,
    task_counts,
)

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "experiments" / "aladdin" / "alibaba_placement.toml"


def test_the_cell_is_table_3_scaled() -> None:
    exp = load_experiment(FILE, ROOT)
    full = machines(exp)
    assert len(full) == 13_764 and len(exp.machine_types) == 23
    small = machines(attrs.evolve(exp, scale=0.01))
    # Each type keeps its share, at least one machine.
    assert len(small) == sum(max(1, round(n * 0.01)) for _, _, n, _ in exp.machine_types)
    assert len({m.id for m in small}) == len(small)


def test_tasks_follow_table_4_shares_and_the_load() -> None:
    exp = load_experiment(FILE, ROOT)
    cores = sum(m.capacity.get("cpu") for m in machines(exp))
    counts = task_counts(exp, cores)
    table = [t.count for t in exp.tasks]
    assert sum(table) == 116_414  # the table's own total
    biggest = max(range(len(table)), key=table.__getitem__)
    assert exp.tasks[biggest].key == "8-16384"
    share = counts[biggest] / sum(counts)
    assert share == pytest.approx(30_048 / 116_414, abs=1e-3)
    asked = sum(c * t.cpu for c, t in zip(counts, exp.tasks, strict=True))
    assert asked == pytest.approx(0.5 * cores, rel=1e-3)


def test_constraints_come_in_the_stated_shares() -> None:
    exp = load_experiment(FILE, ROOT)
    cell = machines(exp)
    apps = jobs(exp, sum(m.capacity.get("cpu") for m in cell))
    n = sum(a.job.task_count for a in apps)
    by_kind: Counter[str] = Counter()
    for a in apps:
        by_kind[a.kind] += a.job.task_count
    grouped = by_kind["group"] / n
    anti = (by_kind["spread"] + by_kind["spread+cross"] + by_kind["heavy-averse"]) / n
    assert grouped == pytest.approx(0.2, abs=0.01)
    assert anti == pytest.approx(0.5, abs=0.02)
    for a in apps:
        j = a.job
        if a.kind == "group":
            assert j.gang and self_affine(j) and 2 <= j.task_count <= 4
        elif a.kind != "free":
            assert j.constraints.max_per_machine == 1
    heavy = sum(a.job.task_count for a in apps if ("tier", "heavy") in a.job.labels)
    assert heavy >= 2_000  # "cannot be co-located with at least other 2,000 tasks"
    assert by_kind["heavy-averse"] > 0
    # The same file and seed, the same jobs.
    again = jobs(exp, sum(m.capacity.get("cpu") for m in cell))
    assert [a.job for a in again] == [a.job for a in apps]


@pytest.mark.parametrize(("text", "error"), [
    ("load = 2", "load must be a number from 0 to 1, got 2"),
    ("tasks = [[8, 16384]]", "tasks[0] must be [cpu, MB of RAM, tasks]"),
    ("heavy_types = ['9-9']", "heavy_types names '9-9', which is no task type"),
    ("[[scheduler]]\nname = 'x'", "scheduler[0] (x) needs one of flow or policy"),
    ("colour = 'blue'", "unknown field(s) colour"),
])
def test_a_bad_file_is_refused_naming_the_field(tmp_path: Path, text: str, error: str) -> None:
    base = ("cell = 'omega/cells/alibaba.toml'\ntasks = [[8, 16384, 10]]\n"
            if not text.startswith("tasks") else "cell = 'omega/cells/alibaba.toml'\n")
    if "scheduler" not in text:
        text += "\n[[scheduler]]\nname = 'a'\nflow = 'aladdin'"
    f = tmp_path / "x.toml"
    f.write_text(base + text + "\n")
    with pytest.raises(ExperimentError, match=error.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_experiment(f, ROOT)


def test_a_small_run_places_everything_and_measures_it() -> None:
    exp = attrs.evolve(load_experiment(FILE, ROOT), scale=0.005)
    cell = machines(exp)
    apps = jobs(exp, sum(m.capacity.get("cpu") for m in cell))
    tasks = sum(a.job.task_count for a in apps)
    results = {name: Run(SchedulerSpec(name, **kw), cell, apps, budget=120).run()
               for name, kw in (("aladdin-4", {"flow": "aladdin"}),
                                ("firstfit", {"policy": "firstfit"}),
                                ("tetris-1", {"policy": "tetris", "options": {"blind": 1}}))}
    for r in results.values():
        assert r.placed == tasks and r.unplaced == 0 and r.audit == 0
        assert 0 < r.machines_used <= len(cell)
        # Eq. 11: the placed tasks' demand per used machine.
        asked = sum(a.job.task_count * a.job.task_resources.get("cpu") for a in apps)
        assert r.rs_cpu * r.machines_used == pytest.approx(asked)
        assert 0 < r.cpu_eff <= 1 and 0 < r.mem_eff <= 1
        assert r.latency_median_s <= r.latency_p99_s <= r.wall_s + 1e-9
        assert r.streamed > 0 and r.stream_median_ms <= r.stream_p99_ms
    # Aladdin proposes no violation; the blind Tetris proposes some, which the store
    # refuses, and places everything once it respects the rules.
    assert results["aladdin-4"].refused == 0
    assert results["tetris-1"].refused > 0


@pytest.mark.parametrize(("flags", "error"), [
    (["--budget", "-3"], "--budget must be a positive number of seconds, got -3"),
    (["--budget", "nan"], "--budget must be a positive number of seconds, got nan"),
    (["--only", "firstfit,nope"], "--only names no scheduler of alibaba_placement: nope (it has "),
    (["--scale", "0"], "--scale must be in (0, 1]"),
])
def test_the_command_refuses_bad_flags_before_running(
        flags: list[str], error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.aladdin.__main__ import main

    out = tmp_path / "out"
    assert main([str(FILE), "--out", str(out), *flags]) == 2
    assert error in capsys.readouterr().err
    assert not out.exists()

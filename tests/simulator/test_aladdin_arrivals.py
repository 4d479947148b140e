"""The Aladdin+H arrivals experiment (simulator/aladdin/arrivals.py): its file is read
strictly, the same file gives the same events, the process keeps the stated share of
the cores asked for, and a short run accounts for every application it submits."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from simulator.aladdin.arrivals import (
    ArrivalsExperiment,
    ArrivalsRun,
    events,
    load_arrivals,
    main,
)
from simulator.aladdin.workload import ExperimentError, machines

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "experiments" / "aladdin" / "alibaba_arrivals.toml"


def small(hours: float = 0.05, scale: float = 0.01) -> ArrivalsExperiment:
    exp = load_arrivals(FILE, ROOT)
    return attrs.evolve(exp, base=attrs.evolve(exp.base, scale=scale),
                        process=attrs.evolve(exp.process, hours=hours))


def test_the_same_file_gives_the_same_events() -> None:
    exp = load_arrivals(FILE, ROOT)
    cell = machines(exp.base)
    apps, evs = events(exp, cell)
    again_apps, again = events(exp, cell)
    assert evs == again and [a.job for a in apps] == [a.job for a in again_apps]
    assert evs == sorted(evs, key=lambda e: (e.at, not e.ends, e.app))
    horizon = 3600 * exp.process.hours
    assert all(0 <= e.at < horizon for e in evs)
    # Every application arrives once; one ends at most once, after it arrives.
    arrive = {e.app: e.at for e in evs if not e.ends}
    assert sorted(arrive) == list(range(len(apps)))
    for e in evs:
        if e.ends:
            assert e.at >= arrive[e.app]
    assert len({a.job.id for a in apps}) == len(apps)


def test_the_cores_asked_for_at_the_start_are_the_stated_occupancy() -> None:
    exp = load_arrivals(FILE, ROOT)
    cell = machines(exp.base)
    apps, evs = events(exp, cell)
    cores = sum(m.capacity.get("cpu") for m in cell)
    alive = [apps[e.app].job for e in evs if e.at == 0 and not e.ends]
    asked = sum(j.task_count * j.task_resources.get("cpu") for j in alive)
    assert asked / cores == pytest.approx(exp.process.occupancy, rel=0.1)


def test_a_short_run_accounts_for_every_application() -> None:
    exp = small()
    cell = machines(exp.base)
    apps, evs = events(exp, cell)
    spec = next(s for s in exp.schedulers if s.name == "aladdin-4")
    res = ArrivalsRun(spec, cell, apps, evs).run()
    assert res.applications == len(apps)
    assert res.tasks == sum(a.job.task_count for a in apps)
    assert res.placed <= res.tasks and res.audit == 0
    ended = {e.app for e in evs if e.ends}
    assert res.never <= len(ended)


def test_the_same_run_gives_the_same_placements() -> None:
    """The placement digest (every committed claim, in order, with its virtual time)
    is what the results are compared by across code changes: two runs of one file
    give the same one, and a run that placed tasks has one of its own."""
    exp = small(hours=0.02)
    cell = machines(exp.base)
    apps, evs = events(exp, cell)
    spec = next(s for s in exp.schedulers if s.name == "aladdin-4")
    one, two = (ArrivalsRun(spec, cell, apps, evs).run() for _ in range(2))
    assert one.placed > 0 and len(one.placements) == 64
    assert one.placements == two.placements


def test_medea_batches_each_window_and_moves_nothing() -> None:
    """Medea in the arrivals run (the file's row: its programs every 10 s): every
    application accounted for, no migrations (Medea does not move tasks), nothing
    broken, and every task placed by a periodic run (at a multiple of 10 s from the
    start), not as it arrived."""
    pytest.importorskip("ortools")
    exp = small()
    cell = machines(exp.base)
    apps, evs = events(exp, cell)
    spec = next(s for s in exp.schedulers if s.name == "medea")
    assert spec.options["window"] == 10
    run = ArrivalsRun(spec, cell, apps, evs)
    res = run.run()
    assert res.applications == len(apps) and res.placed == len(run.placed_at) > 0
    assert res.migrations == 0 and res.audit == 0
    assert all(abs(t / 10 - round(t / 10)) < 1e-6 for t in run.placed_at.values())
    assert any(t > 0 for t in run.placed_at.values())  # arrivals after the start too


@pytest.mark.parametrize(("text", "error"), [
    ('base = "experiments/aladdin/alibaba_placement.toml"\nwhat = 1\n',
     "unknown field(s) what"),
    ("[arrivals]\nhours = 1\n", "base (the placement experiment file"),
    ('base = "experiments/aladdin/alibaba_placement.toml"\n[arrivals]\noccupancy = 2\n'
     '[[scheduler]]\nname = "x"\npolicy = "firstfit"\n',
     "arrivals.occupancy must be a number from 0.01 to 1, got 2"),
    ('base = "experiments/aladdin/alibaba_placement.toml"\n[arrivals]\nlife = 2\n',
     "arrivals: unknown field(s) life"),
    ('base = "experiments/aladdin/alibaba_placement.toml"\n[[scheduler]]\nname = "x"\n',
     "needs one of flow or policy"),
])
def test_bad_files_are_refused_with_the_field(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ExperimentError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_arrivals(f, ROOT)


def test_the_command_refuses_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main([str(FILE), "--out", str(tmp_path), "--only", "nosuch"]) == 2
    assert "--only names no scheduler" in capsys.readouterr().err
    assert main([str(FILE), "--out", str(tmp_path), "--hours", "0"]) == 2
    assert "--hours must be in (0, 1000]" in capsys.readouterr().err
    assert main([str(FILE), "--out", str(tmp_path), "--scale", "1.5"]) == 2
    assert "--scale must be in (0, 1], got 1.5" in capsys.readouterr().err

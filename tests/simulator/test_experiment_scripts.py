"""The research scripts under experiments/ refuse bad flags at once, saying which and
why, before they run or write anything."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "flags", "error"), [
    ("experiments/omega/run.py", ["--jobs", "0"],
     "argument --jobs: must be a whole number of at least 1, got '0'"),
    ("experiments/omega/run.py", ["--only", "fig99"], "argument --only: invalid choice: 'fig99'"),
    ("experiments/omega_hifi/regenerate.py", ["--jobs", "-1"],
     "argument --jobs: must be a whole number of at least 1, got '-1'"),
    ("experiments/omega/run.py", ["--scheduler", "my-laptop"],
     "argument --scheduler: must be a Dask scheduler address such as tcp://10.0.0.5:8786, "
     "got 'my-laptop'"),
    ("experiments/omega_hifi/regenerate.py", ["--scheduler", "127.0.0.1:8786", "--jobs", "2"],
     "argument --jobs: sizes the embedded local cluster; with --scheduler"),
    ("experiments/omega_hifi/regenerate.py", ["--hours", "0"],
     "argument --hours: must be a positive number, got '0'"),
    ("experiments/omega_hifi/regenerate.py", ["--seeds", "two"],
     "argument --seeds: must be a positive number, got 'two'"),
])
def test_a_bad_flag_is_refused_before_anything_runs(script: str, flags: list[str], error: str,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / script), *flags, "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert error in done.stderr
    assert not out.exists()


def test_omega_only_is_repeatable_and_runs_every_file_named() -> None:
    # "--only a --only b" once kept only b: each occurrence must add to the list.
    done = subprocess.run([sys.executable, str(ROOT / "experiments/omega/run.py"), "--short",
                           "--only", "fig7_two_level", "--only", "semantics", "fig8_batch_rate",
                           "--list"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    named = [line.split(":")[0] for line in done.stdout.splitlines()
             if not line.startswith(" ")]
    assert named == ["fig7_two_level", "semantics", "fig8_batch_rate"]
    # The short profile's fig7 points: clusters A, B, C at three t_job(service) values.
    assert "fig7_two_level: 9 points" in done.stdout


def test_omega_day_profile_runs_only_the_files_it_names_at_a_day() -> None:
    # --day: a day of the points --long runs shorter (Fig. 14), the other files skipped.
    done = subprocess.run([sys.executable, str(ROOT / "experiments/omega/run.py"), "--day",
                           "--only", "fig8_batch_rate", "fig14_conflict_modes", "--list"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    named = [line.split(":")[0] for line in done.stdout.splitlines()
             if not line.startswith(" ")]
    assert named == ["fig14_conflict_modes"]
    points = [line for line in done.stdout.splitlines() if line.startswith(" ")]
    assert len(points) == 12  # the four conflict modes, three seeds
    assert all(line.endswith("horizon 86400 s") for line in points)


def test_omega_profiles_are_exclusive() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "experiments/omega/run.py"), "--day",
                           "--long", "--list"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 2
    assert "argument --long: not allowed with argument --day" in done.stderr


def _figures() -> Any:
    spec = importlib.util.spec_from_file_location("omega_figures",
                                                  ROOT / "experiments/omega/figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    return figures


def _timing(out: Path, rows: list[str]) -> None:
    (out / "fig8_batch_rate").mkdir(parents=True)
    (out / "fig8_batch_rate/timing.csv").write_text(
        "cluster,seed,batch_rate,horizon_s,cpu_s,prefill_cpu_s\n" + "".join(
            r + "\n" for r in rows))


def test_omega_cpu_estimate_prices_each_point_by_its_own_runs_first(tmp_path: Path) -> None:
    # A long profile that ran only B at 1x must not price Fig. 8's saturated rates at
    # 1x's cost: a point's own runs here first, then its runs in the reference profile,
    # then its cluster's mean there.
    figures = _figures()
    rates = [1, 2, 2.5, 3, 4, 5, 6, 7, 8, 9.5, 10]
    _timing(tmp_path / "long", ["B,1,1,1000,11,1"])  # 0.01 CPU s per simulated s
    _timing(tmp_path / "short", [f"{c},1,{r},1000,{r},0" for c in "ABC" for r in rates
                                 if (c, r) != ("C", 9.5)])  # r / 1000 per simulated s
    rows = figures.timing(tmp_path / "long", ["fig8_batch_rate"], tmp_path / "short")
    c_mean = sum(r for r in rates if r != 9.5) / 10 / 1000
    per_seed = 0.01 + sum(r / 1000 for c in "ABC" for r in rates
                          if (c, r) not in (("B", 1), ("C", 9.5))) + c_mean
    hours = (99 * 1.0 + 604800 * 3 * per_seed) / 3600
    row = next(r for r in rows if r.startswith("| fig8_batch_rate |"))
    assert row.endswith(f"| 99 x 604800 s | {hours:,.1f} |"), (row, hours)
    assert rows[-1].endswith("priced by a mean, not by their point's own runs: "
                             "fig8_batch_rate 3 of 99.")
    assert "else in ../short/" in rows[-1]


def _section(tables: Path, name: str) -> list[str]:
    lines = tables.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"## {name}")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start:end]


def test_omega_no_run_draws_from_committed_results_without_points(tmp_path: Path) -> None:
    # A clone has results.json, results.csv and timing.csv, not points/ (gitignored).
    committed = ROOT / "docs/results/omega-long/day"
    out = tmp_path / "day"
    shutil.copytree(committed, out)
    for points in out.glob("*/points"):
        shutil.rmtree(points)
    for drawn in [*out.glob("*.png"), out / "tables.md"]:
        drawn.unlink()
    done = subprocess.run([sys.executable, str(ROOT / "experiments/omega/run.py"), "--day",
                           "--no-run", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (out / "fig14_conflict_modes.png").stat().st_size > 0
    assert not list(out.glob("*/points"))
    assert (_section(out / "tables.md", "fig14_conflict_modes")
            == _section(committed / "tables.md", "fig14_conflict_modes"))


@pytest.mark.parametrize(("make", "error"), [
    (None, "does not exist; run without --no-run first"),
    ("fig14_conflict_modes/points",
     "holds no <name>/results.json (fig14_conflict_modes: points/ of a sweep not finished; "
     "run without --no-run to finish it)"),
])
def test_omega_no_run_without_results_says_so(make: str | None, error: str,
                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    if make is not None:
        (out / make).mkdir(parents=True)
    done = subprocess.run([sys.executable, str(ROOT / "experiments/omega/run.py"), "--no-run",
                           "--out", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 2
    assert f"argument --no-run: nothing to draw: {out} {error}" in done.stderr
    assert make is not None or not out.exists()

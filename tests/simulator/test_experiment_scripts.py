"""The research scripts under experiments/ refuse bad flags at once, saying which and
why, before they run or write anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert len(points) == 3  # the three modes the claims compare, one seed
    assert not [line for line in points if "Coarse/Gang" in line]
    assert all(line.endswith("horizon 86400 s") for line in points)


def test_omega_profiles_are_exclusive() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "experiments/omega/run.py"), "--day",
                           "--long", "--list"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 2
    assert "argument --long: not allowed with argument --day" in done.stderr


def test_omega_tables_name_the_axes_the_cpu_estimate_did_not_see(tmp_path: Path) -> None:
    # The paper-length CPU estimate counts the points not run at the cost of those run:
    # the table's note must name each axis whose values the runs leave out.
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("omega_figures",
                                                  ROOT / "experiments/omega/figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    runs = [{"point": {"cluster": "B", "seed": 1, "batch_rate": r}, "metrics": {}}
            for r in (1, 6)]
    (tmp_path / "fig8_batch_rate").mkdir()
    (tmp_path / "fig8_batch_rate/results.json").write_text(json.dumps({"runs": runs}))
    assert figures._partial(tmp_path / "nothing", figures.FILE_ORDER) == []
    note = " ".join(figures._partial(tmp_path, figures.FILE_ORDER))
    assert "fig8_batch_rate (cluster B of 3; batch_rate 1, 6 of 11)" in note
    assert "seed" not in note.split("axis:")[1]

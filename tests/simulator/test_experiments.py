"""Experiment files: determinism of results, and errors that name file, line, field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.experiment import load
from simulator.workload import InputError, load_trace

ROOT = Path(__file__).resolve().parents[2]

SMALL = """\
name = "tiny"
architecture = "shared"
horizon = 300
seed = 3

[cell]
machines = 50

[prefill]
utilization = 0.5
tasks = 10

[[workload]]
name = "batch"
interarrival = {dist = "exponential", mean = 5}
tasks = {dist = "exponential", mean = 10}
duration = {dist = "exponential", mean = 60}

[[workload]]
name = "service"
interarrival = {dist = "exponential", mean = 20}
tasks = {dist = "fixed", value = 3}
duration = 500

[[scheduler]]
name = "batch"
serves = ["batch"]
instances = 2

[[scheduler]]
name = "service"
serves = ["service"]
decision = {service = {t_job = 5.0, t_task = 0.01}}

[[sweep]]
name = "t_job_service"
set = ["scheduler.service.decision.service.t_job"]
values = [1, 10]

[[plot]]
x = "t_job_service"
y = ["batch_wait_mean_s", "service_wait_mean_s", "batch_busyness"]
"""


def test_same_file_and_seed_give_identical_data(tmp_path: Path) -> None:
    exp = tmp_path / "tiny.toml"
    exp.write_text(SMALL)
    assert main([str(exp), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    # Another process with another string-hash seed: set orders must not matter.
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "simulator", str(exp), "--out", str(tmp_path / "b"),
                    "--no-progress"], check=True, cwd=ROOT, env=env, capture_output=True)
    for name in ("results.json", "results.csv"):
        a = (tmp_path / "a" / "tiny" / name).read_bytes()
        assert a == (tmp_path / "b" / "tiny" / name).read_bytes()
    assert (tmp_path / "a" / "tiny" / "plot1.png").stat().st_size > 1000
    (tmp_path / "a" / "tiny" / "plot1.png").unlink()
    assert main([str(exp), "--out", str(tmp_path / "a"), "--replot"]) == 0
    assert (tmp_path / "a" / "tiny" / "plot1.png").stat().st_size > 1000
    assert main([str(exp), "--out", str(tmp_path / "c"), "--no-progress", "--seed", "4"]) == 0
    assert ((tmp_path / "c" / "tiny" / "results.json").read_bytes()
            != (tmp_path / "a" / "tiny" / "results.json").read_bytes())


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('machines = 50', 'machines = "many"', "line 7, field 'cell.machines': must be a number"),
    ('instances = 2', 'instances = 2\nspeed = 3',
     "line 29, field 'scheduler.0.speed': unknown field"),
    ('tasks = {dist = "fixed", value = 3}', 'tasks = {dist = "normal", value = 3}',
     "line 22, field 'workload.1.tasks.dist': 'normal' is not one of fixed"),
    ('architecture = "shared"', 'architecture = "mesos"',
     "line 2, field 'architecture': str 'mesos' is not one of"),
    ('serves = ["service"]', 'serves = ["services"]',
     "line 32, field 'scheduler.1.serves': 'services' is not a workload class"),
    ('x = "t_job_service"', 'x = "t_job"', "line 41, field 'plot.0.x': 't_job' is not a sweep"),
    ('horizon = 300', 'horizon = [', "not valid TOML"),
    ('instances = 2', 'instances = 2\noptions = {fallbacks = [1]}',
     "line 29, field 'scheduler.0.options.fallbacks': must be a string, number or boolean"),
])
def test_bad_experiment_file_names_line_and_field(tmp_path: Path, old: str, new: str,
                                                   expected: str) -> None:
    exp = tmp_path / "bad.toml"
    assert old in SMALL
    exp.write_text(SMALL.replace(old, new, 1))
    with pytest.raises(InputError) as e:
        load(exp)
    assert str(exp) in str(e.value)
    assert expected in str(e.value)


def test_bad_sweep_value_names_the_run(tmp_path: Path) -> None:
    exp = tmp_path / "bad.toml"
    exp.write_text(SMALL.replace("values = [1, 10]", 'values = [1, "slow"]'))
    with pytest.raises(InputError, match=r"line 33, field 'scheduler.1.decision.service.t_job'"
                                         r": must be a number.*t_job_service': 'slow'"):
        load(exp)


def test_cli_reports_bad_file_and_exits_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "bad.toml"
    exp.write_text(SMALL.replace("machines = 50", "machines = -5"))
    assert main([str(exp), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m simulator: error: {exp}, line 7")
    assert "line 7, field 'cell.machines': must be positive" in err


@pytest.mark.parametrize("jobs", ["0", "-2", "x"])
def test_cli_refuses_a_worker_count_below_one(jobs: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "ok.toml"
    exp.write_text(SMALL)
    with pytest.raises(SystemExit) as info:
        main([str(exp), "--jobs", jobs, "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    assert (f"error: argument --jobs: must be a whole number of at least 1, got '{jobs}'"
            in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


KINDS = {"batch": __import__("cellstate.model").model.JobKind.BATCH}


@pytest.mark.parametrize(("suffix", "text", "expected"), [
    (".jsonl", '{"submit": 0, "class": "batch", "tasks": 2, "cpu": 1, "mem": 1}\n'
               '{"submit": 1, "class": "batch", "tasks": -2, "cpu": 1, "mem": 1}\n',
     "line 2, field 'tasks': -2 is below the minimum 1"),
    (".jsonl", '{"submit": 0, "class": "batch", "tasks": 2, "cpu": 1, "mem": 1}\n\n'
               '{"submit": 1, "class": "batch", "tasks": 2, "cpu": 1,\n',
     "line 3: not JSON"),
    (".jsonl", '{"submit": 0, "class": "bulk", "tasks": 2, "cpu": 1, "mem": 1}\n',
     "line 1, field 'class': 'bulk' is not a workload class"),
    (".csv", "submit,class,tasks,duration,cpu,mem\n0,batch,2,10,1,1\n3,batch,2,ten,1,1\n",
     "line 3, field 'duration': 'ten' is not a finite number"),
    (".csv", "submit,class,tasks,cpu\n0,batch,2,1\n", "line 1: the header lacks field(s) mem"),
    (".jsonl", '{"submit": 0, "class": "batch", "tasks": 2, "cpu": 1, "mem": 1, "gpu": 1}\n',
     "line 1, field 'gpu': unknown field"),
])
def test_bad_trace_names_line_and_field(tmp_path: Path, suffix: str, text: str,
                                        expected: str) -> None:
    path = tmp_path / f"trace{suffix}"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load_trace(path, KINDS)
    assert str(path) in str(e.value) and expected in str(e.value)


def test_trace_rows_load_in_submission_order(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit,class,tasks,duration,cpu,mem,id\n5,batch,2,10,1,1,b\n"
                    "1,batch,3,,0.5,2,a\n")
    specs = load_trace(path, KINDS)
    assert [(s.id, s.submit, s.tasks, s.duration, s.cpu) for s in specs] == [
        ("a", 1.0, 3, None, 0.5), ("b", 5.0, 2, 10.0, 1.0)]


def test_fallbacks_cut_the_conflicts_of_busy_batch_schedulers(tmp_path: Path) -> None:
    """Four batch schedulers on a small busy cell: with two fallbacks per claim, claims
    fall back and fewer transactions conflict (simulated, so exact)."""
    import json

    busy = (SMALL.replace("instances = 2", "instances = 4\noptions = {fallbacks = 0}")
            .replace("machines = 50", "machines = 300")
            .replace("interarrival = {dist = \"exponential\", mean = 5}",
                     "interarrival = {dist = \"exponential\", mean = 0.5}", 1)
            .replace("duration = {dist = \"exponential\", mean = 60}",
                     "duration = {dist = \"exponential\", mean = 15}", 1)
            .replace('values = [1, 10]', 'values = [1]')
            + '\n[[sweep]]\nname = "fallbacks"\nset = ["scheduler.batch.options.fallbacks"]\n'
              'values = [0, 2]\n')
    exp = tmp_path / "busy.toml"
    exp.write_text(busy)
    assert main([str(exp), "--out", str(tmp_path), "--no-progress"]) == 0
    runs = json.loads((tmp_path / "tiny" / "results.json").read_text())["runs"]
    by = {r["point"]["fallbacks"]: r["metrics"] for r in runs}
    assert by[0]["batch_fallbacks_taken"] == 0 and by[2]["batch_fallbacks_taken"] > 0
    assert by[0]["batch_conflicted"] > 0
    assert by[2]["batch_conflicted"] * 4 < by[0]["batch_conflicted"]

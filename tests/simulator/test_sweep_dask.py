"""Sweeps on Dask (simulator/sweep.py), with real processes: an embedded LocalCluster
gives what one process gives, byte for byte; a separate `dask scheduler` with two
`dask worker` processes runs a sweep through --scheduler and finishes it when a
worker is killed mid-point; a killed driver's sweep resumes without running its
finished points again; a failing point is tried twice, then reported."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulator import sweep
from simulator.cli import main
from simulator.experiment import load
from simulator.runner import run_experiment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Four points of a few seconds each (two values of t_job, two seeds).
TINY = """\
name = "tiny"
architecture = "shared"
horizon = 1200
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

[[scheduler]]
name = "batch"
serves = ["batch"]

[[sweep]]
name = "t_job"
set = ["scheduler.batch.decision.default.t_job"]
values = [0.1, 3]

[[sweep]]
name = "seed"
set = ["seed"]
values = [1, 2]

[[plot]]
x = "t_job"
y = ["batch_wait_mean_s"]
"""
DATA = ("results.json", "results.csv")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sweep") / "tiny.toml"
    path.write_text(TINY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(tiny: Path) -> dict[str, bytes]:
    """The data files of the sweep run in this one process, point after point."""
    out = tiny.parent / "one-process"
    run_experiment(load(tiny), out, show=False)
    return {name: (out / name).read_bytes() for name in DATA}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    # The workers unpickle the sweep's task by module name: they need this checkout.
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A process in a session of its own, so that it and its children stop together."""
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT,
                                env=_env(), cwd=ROOT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the process's whole session (e.g. a driver's LocalCluster workers)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _simulate(tiny: Path, out: Path, *flags: str) -> list[str]:
    return ["-m", "simulator", str(tiny), "--out", str(out), "--no-progress", *flags]


def _data(out: Path) -> dict[str, bytes]:
    return {name: (out / "tiny" / name).read_bytes() for name in DATA}


def _run(args: list[str], log: Path, timeout: float = 240) -> str:
    proc = _start(args, log)
    try:
        rc = proc.wait(timeout)
    finally:
        _stop(proc)
    text = log.read_text(encoding="utf-8")
    assert rc == 0, text
    return text


def test_local_cluster_gives_what_one_process_gives(tiny: Path, reference: dict[str, bytes],
                                                     tmp_path: Path) -> None:
    text = _run(_simulate(tiny, tmp_path / "out", "--jobs", "2"), tmp_path / "log")
    assert "dask: scheduler tcp://127.0.0.1:" in text and "dashboard " in text
    assert _data(tmp_path / "out") == reference
    assert len(list((tmp_path / "out" / "tiny" / sweep.POINTS).glob("*.json"))) == 4


def test_a_killed_driver_resumes_without_rerunning_finished_points(
        tiny: Path, reference: dict[str, bytes], tmp_path: Path) -> None:
    out = tmp_path / "out"
    points = out / "tiny" / sweep.POINTS
    driver = _start(_simulate(tiny, out, "--jobs", "1"), tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 180
        while not list(points.glob("*.json")) and time.monotonic() < deadline:
            assert driver.poll() is None, (tmp_path / "first.log").read_text()
            time.sleep(0.05)
        # Killed outright, with its LocalCluster's workers (its session).
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(10)
    finally:
        _stop(driver)
    done = {p.name: p.stat().st_mtime_ns for p in points.glob("*.json")}
    assert 1 <= len(done) < 4, done
    assert not (out / "tiny" / "results.json").exists()
    text = _run(_simulate(tiny, out, "--jobs", "1"), tmp_path / "second.log")
    assert f"{len(done)} of 4 points done already" in text
    # The finished points were read, not run again (their files not rewritten).
    assert {n: (points / n).stat().st_mtime_ns for n in done} == done
    assert _data(out) == reference


@pytest.fixture(scope="module")
def dask_cluster(tiny: Path) -> Iterator[str]:
    """A `dask scheduler` and two `dask worker` processes on free ports of 127.0.0.1."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = tiny.parent
    procs = [_start(["-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                     "--no-dashboard"], logs / "scheduler.log")]
    try:
        for n in range(2):
            procs.append(_start(["-m", "dask", "worker", address, "--host", "127.0.0.1",
                                 "--nthreads", "1", "--no-dashboard", "--name", f"w{n}"],
                                logs / f"worker{n}.log"))
        from distributed import Client

        with Client(address, timeout="60s") as client:  # type: ignore[no-untyped-call]
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for p in procs:
            _stop(p)


def test_a_dask_cluster_finishes_a_sweep_when_a_worker_is_killed(
        tiny: Path, reference: dict[str, bytes], dask_cluster: str, tmp_path: Path) -> None:
    from distributed import Client

    out = tmp_path / "out"
    driver = _start(_simulate(tiny, out, "--scheduler", dask_cluster), tmp_path / "log")
    try:
        with Client(dask_cluster, timeout="60s") as client:  # type: ignore[no-untyped-call]
            killed = _kill_a_busy_worker(client, driver)
        rc = driver.wait(240)
    finally:
        _stop(driver)
    text = (tmp_path / "log").read_text(encoding="utf-8")
    assert rc == 0, text
    assert _data(out) == reference
    # The point the killed worker was running has its result all the same.
    index = int(killed.split("-")[1])
    assert (out / "tiny" / sweep.POINTS / sweep.point_file(load(tiny), index)).exists()


def _kill_a_busy_worker(client: Any, driver: subprocess.Popen[bytes]) -> str:
    """SIGKILL a worker process while it runs a point of the sweep; the point's key."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert driver.poll() is None, "the sweep ended before a worker could be killed"
        busy = {w: keys for w, keys in client.processing().items() if keys}
        if busy:
            worker, keys = next(iter(busy.items()))
            pid = client.run(os.getpid, workers=[worker])[worker]
            os.kill(pid, signal.SIGKILL)  # its nanny starts a new one
            return str(next(iter(keys)))
        time.sleep(0.05)
    raise AssertionError("no worker ran a point")


def test_a_failing_point_is_tried_twice_then_reported(
        tiny: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """In-process workers (threads), so that the failure can be planted."""
    from distributed import Client, LocalCluster

    real = sweep._run_point

    def flaky(exp: Any) -> bytes:
        if exp.runs[0].point == {"t_job": 3, "seed": 2}:
            raise RuntimeError("planted")
        return real(exp)

    monkeypatch.setattr(sweep, "_run_point", flaky)
    exp = load(tiny)
    with (LocalCluster(n_workers=1, threads_per_worker=1, processes=False,  # type: ignore[no-untyped-call]
                       dashboard_address="127.0.0.1:0") as local,
          Client(local) as client):  # type: ignore[no-untyped-call]
        outcome = sweep.run_sweep(exp, tmp_path / "tiny", client, show=False)
    assert [f.point for f in outcome.failed] == [{"t_job": 3, "seed": 2}]
    assert "RuntimeError: planted" in outcome.failed[0].error
    said = capsys.readouterr().err
    assert said.count("failed (RuntimeError: planted); running it again") == 1
    assert said.count("failed twice: RuntimeError: planted") == 1
    assert sum(r is not None for r in outcome.results) == 3
    assert len(list((tmp_path / "tiny" / sweep.POINTS).glob("*.json"))) == 3


@pytest.mark.parametrize(("flags", "error"), [
    (["--scheduler", "tcp://127.0.0.1"],
     "argument --scheduler: must be a Dask scheduler address such as tcp://10.0.0.5:8786, "
     "got 'tcp://127.0.0.1'"),
    (["--scheduler", "127.0.0.1:8786", "--jobs", "2"],
     "argument --jobs: sizes the embedded local cluster; with --scheduler"),
])
def test_bad_cluster_flags_are_refused(flags: list[str], error: str, tiny: Path,
                                       capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    with contextlib.suppress(SystemExit):
        assert main([str(tiny), "--out", str(tmp_path / "out"), *flags]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

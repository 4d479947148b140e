"""Sweeps on Dask distributed: every point of an experiment a task on a Dask cluster.

The cluster is a real one (``dask scheduler`` and ``dask worker`` processes on any
machines, named by the scheduler's address) or an embedded ``LocalCluster`` of worker
processes on this machine. Each finished run is stored as one file per (point, seed)
in ``OUT/<name>/points/``, written atomically by the driver (the workers need no
shared file system); a sweep started again reads those files and runs only the
points without one, so a sweep outlives its driver being killed. A point whose task
fails is submitted once more, then reported with its error while the others go on;
the experiment's results.json and plots are written once every point has its file.

A point's file name carries a digest of its run's whole configuration (seed
included), so a changed experiment file never reuses a stale result. The code is not
in the digest: after changing the simulator, remove ``points/`` to run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from tqdm import tqdm

from simulator.experiment import Experiment
from simulator.point import TimedResult, decode, encode, run_timed

if TYPE_CHECKING:
    from distributed import Client

POINTS = "points"
# A failed point is run this many times in all before it is reported.
ATTEMPTS = 2


class SweepError(Exception):
    """The sweep cannot run at all (e.g. the scheduler cannot be reached)."""


@attrs.frozen
class Failed:
    index: int
    point: dict[str, object]
    error: str


@attrs.frozen
class Outcome:
    """A sweep's results in run order (None where the point failed), what failed, and
    how many points were already done when it started."""

    results: tuple[TimedResult | None, ...]
    failed: tuple[Failed, ...]
    skipped: int

    @property
    def complete(self) -> bool:
        return not self.failed


def config_digest(exp: Experiment, index: int) -> str:
    """16 hex digits of the run's point and whole configuration (seed included)."""
    run = exp.runs[index]
    return hashlib.sha256(repr((run.point, run.config)).encode()).hexdigest()[:16]


def point_file(exp: Experiment, index: int) -> str:
    """``<axis values>-<digest>.json``: readable, and unique per run configuration."""
    run = exp.runs[index]
    digest = config_digest(exp, index)
    label = "_".join(f"{k}={v}" for k, v in run.point.items()) or "run"
    label = re.sub(r"[^A-Za-z0-9=._-]+", "-", label)[:80]
    return f"{label}-s{run.config.seed}-{digest}.json"


def write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the whole new one, never a part (a killed writer
    leaves at most a hidden temporary file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _run_point(exp: Experiment) -> bytes:
    """The task a worker runs: the one run of ``exp``, as its file's bytes."""
    return encode(run_timed(exp, 0))


@contextlib.contextmanager
def cluster(scheduler: str | None, jobs: int | None) -> Iterator[Client]:
    """A Dask client: of the scheduler at ``scheduler``, or of an embedded LocalCluster
    of ``jobs`` worker processes (default: one per CPU this process may use). Prints
    the scheduler's and the dashboard's addresses."""
    # Imported here: only a sweep needs Dask (about half a second to import).
    from distributed import Client, LocalCluster

    with contextlib.ExitStack() as stack:
        if scheduler is None:
            n = jobs or _cpus()
            # One thread per worker process: a run is pure Python and holds the GIL.
            # On 127.0.0.1 only; port 0: any free port, the dashboard's included. No
            # memory limit: a saturated week-long point can grow past a worker's share
            # of the machine, and a nanny restarting it there would only lose its work.
            local = stack.enter_context(LocalCluster(  # type: ignore[no-untyped-call]
                n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                scheduler_port=0, dashboard_address="127.0.0.1:0", memory_limit=0))
            client = stack.enter_context(Client(local))  # type: ignore[no-untyped-call]
        else:
            try:
                client = stack.enter_context(
                    Client(scheduler, timeout="20s"))  # type: ignore[no-untyped-call]
            except (OSError, TimeoutError, ValueError) as e:
                raise SweepError(f"cannot reach the Dask scheduler at {scheduler!r}: {e}") from e
        _say(f"dask: scheduler {client.scheduler.address}, dashboard {_dashboard(client)}")
        yield client


def _cpus() -> int:
    """The CPUs this process may run on (the container's or taskset's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS has no affinity call


def _dashboard(client: Client) -> str:
    info = client.scheduler_info()
    if "dashboard" not in info.get("services", {}):
        return "none (the scheduler serves one when bokeh is installed)"
    # The dashboard's pages need bokeh where the scheduler runs; without it the port
    # serves only /health and /metrics. Known for an embedded scheduler only.
    if client.cluster is not None and importlib.util.find_spec("bokeh") is None:
        return "none (pip install bokeh, or the extra omega-cell[dashboard])"
    return str(client.dashboard_link)


def run_sweep(exp: Experiment, out: Path, client: Client, show: bool = True) -> Outcome:
    """Every point of ``exp`` that ``out/points`` does not hold yet, on the client's
    cluster; returns all the results, those found and those made."""
    from distributed import as_completed

    points = out / POINTS
    points.mkdir(parents=True, exist_ok=True)
    results: list[TimedResult | None] = [None] * len(exp.runs)
    todo: list[int] = []
    for i, run in enumerate(exp.runs):
        path = points / point_file(exp, i)
        if path.exists():
            results[i] = decode(run.point, path.read_bytes())
        else:
            todo.append(i)
    skipped = len(exp.runs) - len(todo)
    if skipped:
        _say(f"{exp.name}: {skipped} of {len(exp.runs)} points done already "
             f"({points}), {len(todo)} to run")
    progress = _Progress(exp, results, client, show)
    failed: list[Failed] = []
    attempts = dict.fromkeys(todo, 0)
    owner: dict[Any, int] = {}

    def submit(i: int) -> Any:
        attempts[i] += 1
        one = attrs.evolve(exp, runs=(exp.runs[i],))
        fut = client.submit(_run_point, one, pure=False,
                            key=f"{exp.name}-{i}-attempt{attempts[i]}-{os.urandom(4).hex()}")
        owner[fut.key] = i
        return fut

    try:
        pending = as_completed([submit(i) for i in todo])  # type: ignore[no-untyped-call]
        for fut in pending:
            i = owner.pop(fut.key)
            if fut.status != "finished":
                error = _error(fut)
                if attempts[i] < ATTEMPTS:
                    _say(f"{exp.name}: point {exp.runs[i].point} failed ({error}); "
                         "running it again")
                    pending.add(submit(i))  # type: ignore[no-untyped-call]
                else:
                    failed.append(Failed(i, exp.runs[i].point, error))
                    _say(f"{exp.name}: point {exp.runs[i].point} failed twice: {error}")
                continue
            data = fut.result()
            write_atomically(points / point_file(exp, i), data)
            results[i] = decode(exp.runs[i].point, data)
            progress.done(i)
    finally:
        progress.close()
    return Outcome(tuple(results), tuple(failed), skipped)


def _error(fut: Any) -> str:
    try:
        exc = fut.exception()
    except Exception as e:  # a cancelled future has no exception to give
        exc = e
    return f"{type(exc).__name__}: {exc}"


class _Progress:
    """A bar of points done, with an ETA from what the points cost: the CPU seconds per
    simulated second of the points measured so far, times the simulated seconds left,
    over the cluster's worker threads (wall time on a loaded machine is longer)."""

    def __init__(self, exp: Experiment, results: list[TimedResult | None], client: Client,
                 show: bool) -> None:
        self.exp = exp
        self.results = results
        self.client = client
        self.bar = tqdm(total=len(exp.runs), initial=sum(r is not None for r in results),
                        desc=exp.name, unit="pt", disable=not show, file=sys.stderr,
                        dynamic_ncols=True,
                        bar_format="{desc}: {n}/{total} points |{bar}| {elapsed}{postfix}")
        self.started = time.monotonic()
        self._postfix()

    def done(self, index: int) -> None:
        self.bar.update(1)
        self._postfix()

    def close(self) -> None:
        self.bar.close()

    def _postfix(self) -> None:
        spent = sim = 0.0
        left = 0.0
        for r, run in zip(self.results, self.exp.runs, strict=True):
            length = run.config.horizon + run.config.drain
            if r is None:
                left += length
            else:
                spent += r.cpu_s
                sim += length
        if sim == 0:
            self.bar.set_postfix_str("ETA after the first point")
            return
        threads = sum(self.client.nthreads().values()) or 1  # type: ignore[no-untyped-call]
        eta = spent / sim * left / threads
        self.bar.set_postfix_str(f"ETA {_duration(eta)} ({spent / sim * 1000:.1f} CPU ms "
                                 f"per simulated s, {threads} workers)")


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

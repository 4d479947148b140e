"""pytest plugin: the flow solver's numba kernels compiled once per run, before any test.

The kernels (schedulers/flow/mcf/kernels.py) are compiled on first use and cached on
disk beside their source. In a fresh checkout (CI's) that cache is empty, and every
process that reaches a kernel before the cache has it compiles it again: each
pytest-xdist worker, and each flow scheduler, demo, benchmark or simulator process a
test starts. Compiling them all takes 30-60 s of CPU here, and whichever test came
first paid for it (test_flow_quincy's harness test took 57 s instead of 2.5 s, a
test_flow_graph one 33 s instead of 1 s).

So when the kernels' cache is older than their source (or absent), the controlling
process (the only one with ``-n 0``) starts ``python -m schedulers.flow.mcf.compile``
as the session starts, and waits for it before the first test runs: meanwhile the
workers start and collect the tests (about as long), and afterwards every process
loads the kernels from the cache. If the compile fails or takes too long the tests
go on and compile what they use themselves, as before.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from omega.proc import PARENT_ENV

KERNELS = Path(__file__).resolve().parent.parent / "schedulers" / "flow" / "mcf" / "kernels.py"
WAIT = 300.0  # seconds the first test waits for the compile at most
_COMPILE = pytest.StashKey[subprocess.Popen[bytes]]()
_STARTED = "OMEGA_TESTS_KERNELS_WARMED"  # set for the processes the tests start
# die_with_parent: a run stopped midway does not leave the compile behind.
_SCRIPT = ("from omega.proc import die_with_parent; die_with_parent(); "
           "from schedulers.flow.mcf.compile import main; main()")


def cache_is_warm(kernels: Path = KERNELS) -> bool:
    """Whether numba's index files for the kernels are all newer than their source (numba
    checks more, but a stale index here means a compile is due)."""
    if os.environ.get("NUMBA_CACHE_DIR"):  # elsewhere: let the compile look
        return False
    indexes = list(kernels.parent.glob(f"__pycache__/{kernels.stem}.*.nbi"))
    try:
        source = kernels.stat().st_mtime
        return bool(indexes) and min(p.stat().st_mtime for p in indexes) >= source
    except OSError:
        return False


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # xdist workers have it


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not _controller(config) or os.environ.get(_STARTED):
        return
    # A test run that a test starts (tests/test_etcd_launcher.py) is not held up by a
    # compile of its own: its parent run saw to it.
    os.environ[_STARTED] = "1"
    if cache_is_warm():
        return
    config.stash[_COMPILE] = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, PARENT_ENV: str(os.getpid())})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    proc = session.config.stash.get(_COMPILE, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=WAIT)
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = session.config.stash.get(_COMPILE, None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()

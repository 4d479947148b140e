"""pytest plugin: the project's modules compiled to bytecode once per run, before any
worker starts.

These machines set ``PYTHONDONTWRITEBYTECODE`` (docs/testing.md), so no process writes
a ``.pyc``: every process the tests start (servers, agents, schedulers, drivers, CLI
commands, demos, benchmarks: hundreds in a run) compiled each cellstate, omega and
schedulers module it imports from source again, about 0.3 s of CPU per process (a
server's imports: 0.98 s of CPU without them, 0.66 s with). Reading a ``.pyc`` is
still allowed with the variable set. So the controlling process writes them once as the
session starts (about 2 s of CPU), into the usual ``__pycache__`` folders, which git
ignores. Where the variable is not set this writes what the imports would have.

Python uses a ``.pyc`` only while its source's modification time and size match what
it recorded, so a module edited during a run is compiled from source again, as before.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The packages the tests' processes import; the test modules themselves are rewritten by
# pytest (its own cache), but their helpers (tests/faults/driver.py...) run as processes.
PACKAGES = ("cellstate", "omega", "schedulers", "simulator", "tests", "benchmarks")
_DONE = "OMEGA_TESTS_PRECOMPILED"  # set for the processes the tests start


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or os.environ.get(_DONE):
        return  # a worker (its controller did it), or a test run a test started
    os.environ[_DONE] = "1"
    for name in PACKAGES:
        path = ROOT / name
        if path.is_dir():
            # quiet=1: errors only (a module that does not compile fails its tests anyway)
            compileall.compile_dir(path, quiet=1, workers=1)

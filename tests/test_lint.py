"""ruff and mypy --strict are part of the suite, so CI enforces them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# mypy's incremental cache, kept per user rather than per checkout: CI checks a fresh
# clone, where a cache of its own would be empty and mypy would take a minute of CPU
# to check every module and numpy's stubs again. mypy takes a cached module only if
# its source hashes the same (whatever the checkout's path or the files' times), so
# checkouts that share it still get every changed module and its dependents checked.
MYPY_CACHE = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
              / "omega-cell" / "mypy")


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(MYPY_CACHE)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""What plugins report at the end of a test run, also when pytest-xdist runs it.

Under xdist the tests run in worker processes and the summary is written by the
controller, which sees none of the workers' state. A plugin therefore keeps what it
will report here: :func:`counts` (numbers, summed over workers) and :func:`lines`
(text, by section, in the order the workers finished). Each worker sends its own at the
end of its session (``config.workeroutput``) and the controller adds them to its own
before ``pytest_terminal_summary``; without xdist the same stash is read directly.
"""

from __future__ import annotations

from typing import Any

import pytest

_COUNTS = pytest.StashKey[dict[str, float]]()
_LINES = pytest.StashKey[dict[str, list[str]]]()
_KEY = "omega_run_summary"


def counts(config: pytest.Config) -> dict[str, float]:
    return config.stash.setdefault(_COUNTS, {})


def lines(config: pytest.Config) -> dict[str, list[str]]:
    return config.stash.setdefault(_LINES, {})


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = getattr(session.config, "workeroutput", None)
    if out is not None:  # an xdist worker
        out[_KEY] = {"counts": dict(counts(session.config)),
                     "lines": {k: list(v) for k, v in lines(session.config).items()}}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    sent = getattr(node, "workeroutput", {}).get(_KEY)
    if not sent:
        return  # a worker that crashed sends nothing
    mine = counts(node.config)
    for name, value in sent["counts"].items():
        mine[name] = mine.get(name, 0) + value
    text = lines(node.config)
    for section, added in sent["lines"].items():
        text.setdefault(section, []).extend(added)

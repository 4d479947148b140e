"""docs/operations.md documents every `omega` command (the parser's list, so a new
command without docs fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from omega.cli import _subcommands, build_parser

DOC = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()


def test_every_command_is_in_the_operations_guide() -> None:
    names = sorted(_subcommands(build_parser()).choices)
    assert "dashboard" in names and "cordon" in names  # the list is the real one
    assert [n for n in names if f"omega {n}" not in DOC] == []


def test_every_exported_metric_is_in_the_guide_and_nothing_else() -> None:
    """The names tests/e2e/test_metrics.py scrapes from live processes, against the
    guide's "Metrics" table."""
    from tests.e2e.test_metrics import AGENT, SCHEDULER, SERVER

    section = DOC.split("## Metrics (Prometheus)", 1)[1].split("\n## ", 1)[0]
    documented = {re.sub(r"_total$", "", n) for n in re.findall(r"`(omega_[a-z_]+)`", section)}
    assert documented == {*SERVER, *SCHEDULER, *AGENT}


def test_every_exit_code_is_in_the_guide() -> None:
    from omega import cliglobal

    table = DOC.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    codes = {cliglobal.OK, cliglobal.BROKEN, cliglobal.BAD_INPUT, cliglobal.UNREACHABLE,
             cliglobal.CANNOT_LISTEN, cliglobal.INTERRUPTED, cliglobal.PIPE_CLOSED}
    assert rows == codes

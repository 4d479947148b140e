"""docs/operations.md documents every `omega` command (the parser's list, so a new
command without docs fails here)."""

from __future__ import annotations

from pathlib import Path

from omega.cli import _subcommands, build_parser

DOC = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()


def test_every_command_is_in_the_operations_guide() -> None:
    names = sorted(_subcommands(build_parser()).choices)
    assert "dashboard" in names and "cordon" in names  # the list is the real one
    assert [n for n in names if f"omega {n}" not in DOC] == []

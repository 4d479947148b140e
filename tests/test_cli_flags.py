"""The ``omega`` commands that print records for scripts take ``--json`` (README.md,
"CLI"); as a global flag it is accepted anywhere, by every command
(tests/test_cli_conventions.py)."""

from __future__ import annotations

import pytest

from omega.cli import build_parser

WITH_JSON = [
    ["submit", "--file", "job.toml"],
    ["jobs"],
    ["job", "j1"],
    ["kill", "j1"],
    ["machines"],
    ["status"],
    ["shares"],
    ["why", "j1"],
    ["check", "--etcd", "127.0.0.1:2379"],
    ["recover", "--etcd", "127.0.0.1:2379"],
]


@pytest.mark.parametrize("argv", WITH_JSON, ids=lambda a: a[0])
def test_commands_that_take_json(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--json"]).json is True
    assert build_parser().parse_args(argv).json is False

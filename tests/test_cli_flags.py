"""Which ``omega`` commands take ``--json`` (README.md, "CLI"): the ones that print
records for scripts; the long-running processes and the demo do not."""

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
    ["check", "--etcd", "127.0.0.1:2379"],
    ["recover", "--etcd", "127.0.0.1:2379"],
]
WITHOUT_JSON = [["demo"], ["etcd"], ["server"], ["agent", "--spec", "cell.toml"],
                ["scheduler", "batch"],
                ["workload"]]


@pytest.mark.parametrize("argv", WITH_JSON, ids=lambda a: a[0])
def test_commands_that_take_json(argv: list[str]) -> None:
    assert build_parser().parse_args([*argv, "--json"]).json is True
    assert build_parser().parse_args(argv).json is False


@pytest.mark.parametrize("argv", WITHOUT_JSON, ids=lambda a: a[0])
def test_commands_that_do_not(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--json"])
    assert "unrecognized arguments: --json" in capsys.readouterr().err

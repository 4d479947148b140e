"""Every process's log lines: UTC timestamps, text or one JSON object a line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from omega import logfmt
from omega.cli import main


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.getLogger(logfmt.ANNOUNCE).setLevel(logging.NOTSET)


def test_json_lines_parse_and_carry_the_traceback(restore_logging: None) -> None:
    out = io.StringIO()
    logfmt.configure(logging.INFO, "json", out, force=True)
    logging.getLogger("cellstate.api.server").warning("%d machine(s) down", 3)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("omega.agent").exception("step failed")
    logging.getLogger("omega.agent").debug("not shown at INFO")
    first, second = (json.loads(x) for x in out.getvalue().splitlines())
    assert first["msg"] == "3 machine(s) down" and first["level"] == "WARNING"
    assert first["logger"] == "cellstate.api.server" and isinstance(first["pid"], int)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert "RuntimeError: boom" in second["exc"]


def test_announcements_show_at_the_default_level_and_modules_do_not(
        restore_logging: None) -> None:
    out = io.StringIO()
    logfmt.configure(logging.WARNING, "text", out, force=True)
    logfmt.announce("serving on port %d", 7070)
    logging.getLogger("omega.etcd_launcher").info("an INFO line of a module")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO announce: serving on "
                        r"port 7070", lines[0])


def test_a_bad_log_format_in_the_environment_is_named(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OMEGA_LOG_FORMAT", "xml")
    assert main(["jobs", "--insecure"]) == 2
    assert "$OMEGA_LOG_FORMAT: 'xml' is not one of text, json" in capsys.readouterr().err


def test_the_flag_is_global(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["jobs", "--log-format", "yaml"])
    assert e.value.code == 2 and "invalid choice: 'yaml'" in capsys.readouterr().err

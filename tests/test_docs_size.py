"""Docs a newcomer can read (issue 34, item 12): the README starts with the two
commands and stays short, linking the rest; docs/performance.md is a page of what holds
now, its dated history left to git; docs/simulator.md does not call a wired command
unwired."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_starts_with_the_two_commands_and_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
    block = lines[lines.index("```sh") + 1:]
    assert block[0].startswith("pip install -e . && omega demo")
    assert block[1].startswith("pip install -e '.[dev]' && python -m pytest")
    assert lines.index("```sh") <= 2  # right under the title


def test_the_performance_page_is_what_holds_now() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    assert len(text.splitlines()) <= 400
    assert "## Goals and where they stand" in text and "## How to reproduce" in text


def test_the_simulator_guide_knows_omega_simulate_is_wired_in() -> None:
    assert "once wired into the main CLI" not in (ROOT / "docs" / "simulator.md").read_text()

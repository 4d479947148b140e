"""What an agent's command policy lets run, and what its operator is warned of
(omega/command_policy.py). The policy over a real agent process: tests/e2e/test_commands.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omega.command_policy import CommandPolicy

TRUE = os.path.realpath(shutil.which("true") or "/bin/true")


def test_a_policy_that_runs_nothing_warns_of_nothing() -> None:
    for policy in (CommandPolicy(), CommandPolicy(frozenset({"alice"})),
                   CommandPolicy(frozenset(), (TRUE,))):
        assert not policy.runs_any
        assert policy.warnings(verified_owners=False, own_user=True) == []


def test_commands_allowed_without_tls_or_as_the_agent_are_warned_of() -> None:
    policy = CommandPolicy(frozenset({"alice"}), (TRUE,))
    assert policy.runs_any
    assert policy.warnings(verified_owners=True, own_user=False) == []
    (plain,) = policy.warnings(verified_owners=False, own_user=False)
    assert "--allow-command-from checks nothing" in plain
    (own,) = policy.warnings(verified_owners=True, own_user=True)
    assert "can read its files (its key: they can act as this agent)" in own
    assert len(policy.warnings(verified_owners=False, own_user=True)) == 2


def test_a_path_allowed_is_the_real_executable_not_a_link_to_it(tmp_path: Path) -> None:
    """An allowed folder does not let a link in it run what lies outside it."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    (folder / "sh").symlink_to(os.path.realpath(shutil.which("sh") or "/bin/sh"))
    policy = CommandPolicy(frozenset({"*"}), (f"{folder}/",))
    assert "is outside the paths" in policy.refusal("alice", [str(folder / "sh")], "")

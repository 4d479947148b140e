"""One space quota and one auto-compaction setting: the launcher's flags, the
maintenance loop's policy, docker-compose.yml and docs/operations.md all state the
same values (the compose file once said 8 GiB where the docs said 2 GiB)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from cellstate.maintenance import DEFAULT_QUOTA_BACKEND_BYTES, GiB, MaintenancePolicy
from omega.etcd_launcher import server_flags

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "operations.md").read_text()
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
KEPT = ("quota-backend-bytes", "auto-compaction-mode", "auto-compaction-retention")


def _flag_values(args: list[str]) -> dict[str, str]:
    return {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in args)
            if k in KEPT}


CODE = _flag_values(server_flags())


def test_the_code_has_one_quota() -> None:
    assert CODE["quota-backend-bytes"] == str(DEFAULT_QUOTA_BACKEND_BYTES)
    assert MaintenancePolicy().quota_bytes == DEFAULT_QUOTA_BACKEND_BYTES


def test_compose_runs_the_codes_quota_and_compaction() -> None:
    members = [s for s in COMPOSE["services"].values()
               if s["image"].startswith("quay.io/coreos/etcd")]
    assert len(members) == 3
    for service in members:
        assert _flag_values([str(a) for a in service["command"]]) == CODE


def test_operations_guide_states_the_codes_values() -> None:
    # The flag table ...
    row = re.search(r"^\| `--quota-backend-bytes` \| ([\d.]+) GiB", DOCS, re.MULTILINE)
    assert row is not None, "docs/operations.md: no --quota-backend-bytes row in GiB"
    assert float(row.group(1)) * GiB == DEFAULT_QUOTA_BACKEND_BYTES
    # ... and every command line in it.
    stated = re.findall(r"--(quota-backend-bytes|auto-compaction-[a-z]+)[= ]([^\s`,]+)", DOCS)
    assert {k for k, _ in stated} == set(KEPT)
    for flag, value in stated:
        assert value == CODE[flag], f"docs/operations.md: --{flag}={value}, code {CODE[flag]}"

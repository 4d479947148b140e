"""`omega certs`: a CA made once, a certificate per identity naming it, keys private."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cellstate.api.auth import Identity, Kind
from cellstate.errors import ConfigError
from omega.cli import main
from omega.security import certificate_identity, process_identity


def test_certs_makes_a_ca_once_and_a_certificate_per_identity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", str(tmp_path), "user:alice", "scheduler:batch"]) == 0
    ca = (tmp_path / "ca.pem").read_bytes()
    assert certificate_identity(tmp_path / "user-alice.pem") == Identity(Kind.USER, "alice")
    assert stat.S_IMODE((tmp_path / "user-alice.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    old = (tmp_path / "user-alice.pem").read_bytes()
    assert main(["certs", str(tmp_path), "user:alice"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() == ca  # the CA is reused ...
    assert (tmp_path / "user-alice.pem").read_bytes() != old  # ... the leaf rotated
    capsys.readouterr()
    assert main(["certs", str(tmp_path), "wizard:merlin"]) == 2
    assert "'wizard' is not one of operator, user, submitter, scheduler, agent, server" in (
        capsys.readouterr().err)


def test_the_ca_key_may_live_apart_and_a_ca_without_its_key_is_not_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    certs, key = tmp_path / "certs", tmp_path / "private" / "ca.key"
    assert main(["certs", str(certs), "user:alice", "--ca-key", str(key)]) == 0
    assert key.exists() and not (certs / "ca.key").exists()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ca = (certs / "ca.pem").read_bytes()
    assert main(["certs", str(certs), "user:bob", "--ca-key", str(key)]) == 0
    assert (certs / "ca.pem").read_bytes() == ca  # signed by the same CA
    capsys.readouterr()
    # Without its key, the CA is not silently replaced (which would void every
    # certificate it signed): the command stops and says why.
    assert main(["certs", str(certs), "user:carol"]) == 2
    assert "exists but its key" in capsys.readouterr().err
    assert (certs / "ca.pem").read_bytes() == ca and not (certs / "user-carol.pem").exists()


def test_a_command_without_credentials_says_what_to_give(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMEGA_CA", "OMEGA_CERT", "OMEGA_KEY", "OMEGA_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["jobs", "--cellstate", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "no TLS credentials: give --ca, --cert and --key" in err and "--insecure" in err


def test_a_scheduler_certificate_must_name_the_scheduler(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", str(tmp_path), "scheduler:service"]) == 0
    argv = ["scheduler", "batch", "--cellstate", "127.0.0.1:1", "--ca",
            str(tmp_path / "ca.pem"), "--cert", str(tmp_path / "scheduler-service.pem")]
    capsys.readouterr()
    assert main(argv) == 2
    assert "names scheduler 'service', not 'batch'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "identity"), [
    (["server", "--name", "cellstate-1"], "server:cellstate-1"),
    (["agent", "--spec", "demo", "--id", "agent-3"], "agent:agent-3"),
    (["scheduler", "flow", "--policy", "quincy"], "scheduler:flow"),
    (["scheduler", "--name", "service"], "scheduler:service"),
    (["workload"], "submitter:workload"),
    (["status"], "operator:admin"),
])
def test_each_process_runs_as_the_identity_its_command_line_gives(
        argv: list[str], identity: str) -> None:
    assert str(process_identity(argv)) == identity


def test_an_agent_needs_an_id_for_its_certificate() -> None:
    with pytest.raises(ConfigError, match="needs --id"):
        process_identity(["agent", "--spec", "demo"])

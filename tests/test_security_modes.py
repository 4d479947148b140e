"""Plaintext is explicit and loud (docs/security.md, "Plaintext is explicit"): a
command given --insecure warns on stderr, a server without TLS logs that every
caller may do anything. Refusals without credentials: tests/test_certs.py; the
matrix over mutual TLS: tests/api/test_authz.py."""

from __future__ import annotations

import logging

import pytest

from cellstate.api.config import ServerConfig
from cellstate.api.server import CellStateServer
from cellstate.kv.etcd import EtcdKV
from omega.cli import main
from omega.etcd_launcher import free_ports


def test_an_insecure_command_says_so_on_stderr(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMEGA_CA", "OMEGA_CERT", "OMEGA_KEY"):
        monkeypatch.delenv(name, raising=False)
    # Nothing listens there: the command fails after the warning, which it gave first.
    assert main(["jobs", "--cellstate", f"127.0.0.1:{free_ports(1)[0]}", "--insecure"]) == 3
    err = capsys.readouterr().err
    assert "WARNING: omega jobs: --insecure: PLAINTEXT gRPC, no identities" in err
    assert "including running commands on agents that allow it" in err


@pytest.mark.etcd
def test_a_plaintext_server_logs_that_anyone_may_do_anything(
        etcd_kv: EtcdKV, caplog: pytest.LogCaptureFixture) -> None:
    server = CellStateServer(etcd_kv, ServerConfig(listen="127.0.0.1:0"))
    with caplog.at_level(logging.WARNING):
        server.start()
    try:
        assert any("serves PLAINTEXT gRPC" in r.getMessage()
                   and "every caller may do anything" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        server.stop(grace=0)

"""A cellstate server in this process (real gRPC on loopback) over a given KV."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cellstate.api.client import CellClient
from cellstate.api.config import ServerConfig
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV


@contextmanager
def running_server(kv: KV, **config: object) -> Iterator[CellStateServer]:
    config.setdefault("listen", "127.0.0.1:0")
    server = CellStateServer(kv, ServerConfig(**config))  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=0)


@contextmanager
def client_for(*servers: CellStateServer, retry_for: float = 5.0) -> Iterator[CellClient]:
    client = CellClient([f"127.0.0.1:{s.port}" for s in servers], retry_for=retry_for)
    try:
        yield client
    finally:
        client.close()


def run_omega(server: CellStateServer, capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``omega ARGV`` in process against a plaintext ``server``: (exit code, stdout,
    stderr). ``capsys`` is pytest's capture fixture."""
    from omega.cli import main

    code = main([*argv, "--cellstate", f"127.0.0.1:{server.port}", "--insecure"])
    out = capsys.readouterr()
    return code, out.out, out.err

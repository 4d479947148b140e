"""``omega simulate``: the discrete-event simulator (simulator/cli.py)."""

from __future__ import annotations

from typing import Any

ORDER = 61

TLS = False


def register(sub: Any) -> None:
    from simulator.cli import register as simulator

    simulator(sub)

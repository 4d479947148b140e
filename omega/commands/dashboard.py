"""``omega dashboard``: a live web page of the cell (omega/dashboard.py)."""

from __future__ import annotations

from typing import Any

ORDER = 17


def register(sub: Any) -> None:
    from omega import dashboard
    from omega.commands.common import cellstate_flag

    dashboard.register(sub, cellstate_flag)

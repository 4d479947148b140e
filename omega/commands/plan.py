"""``omega plan JOB_FILE``: what a job would get now; writes nothing (omega/plan.py)."""

from __future__ import annotations

from typing import Any

ORDER = 26


def register(sub: Any) -> None:
    from omega import plan
    from omega.commands.common import cellstate_flag, option, options_from_flags

    plan.register(sub, cellstate_flag, option, options_from_flags)

"""What an Aladdin round decided: its claims and counts, read by the flow scheduler's
policy like the flow core's ``Extraction`` (the fields it reads are the same)."""

from __future__ import annotations

import attrs

from cellstate.model import Claim


@attrs.define
class Outcome:
    claims: list[Claim] = attrs.field(factory=list)
    unscheduled: dict[str, int] = attrs.field(factory=dict)  # job -> tasks left waiting
    placed: int = 0
    migrated: int = 0  # tasks moved by repacking
    preempted: int = 0  # never: Aladdin does not preempt
    repaired: int = 0  # arrivals the fit rules turned back
    spilled: int = 0  # turned back, then placed on another machine
    stale: int = 0
    moved: list[tuple[str, str]] = attrs.field(factory=list)  # (task, machine left)
    why: dict[str, str] = attrs.field(factory=dict)  # job -> why an arrival was refused

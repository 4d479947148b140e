"""Checking a policy's options: each read names the option, the policy and what was
expected, so a bad ``--option`` stops a scheduler at start-up with a message that says
what to fix."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


class OptionError(ValueError):
    """A policy option is unknown or has a value the policy cannot use."""


class Options:
    """Typed reads of a policy's options; unknown names are refused at once."""

    def __init__(self, options: Mapping[str, Any], who: str, known: Sequence[str],
                 error: type[ValueError] = OptionError) -> None:
        self.options = options
        self.who = who
        self.error = error
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise error(f"{who}: unknown option(s) {', '.join(unknown)} "
                        f"(known: {', '.join(known)})")

    def number(self, name: str, default: float, lo: float, hi: float) -> float:
        v = self.options.get(name, default)
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or not lo <= v <= hi):
            raise self.error(f"{self.who}: option {name} must be a number from {lo:g} to "
                             f"{hi:g}, got {v!r}")
        return float(v)

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        v = self.options.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.error(f"{self.who}: option {name} must be a whole number from {lo} "
                             f"to {hi}, got {v!r}")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        v = self.options.get(name, default)
        if not isinstance(v, bool):
            raise self.error(f"{self.who}: option {name} must be true or false, got {v!r}")
        return v

    def choice(self, name: str, default: str, allowed: Sequence[str]) -> str:
        v = self.options.get(name, default)
        if v not in allowed:
            raise self.error(f"{self.who}: option {name} must be one of "
                             f"{', '.join(allowed)}, got {v!r}")
        return str(v)

    def table(self, name: str) -> Mapping[str, Any]:
        v = self.options.get(name, {})
        if not isinstance(v, Mapping):
            raise self.error(f"{self.who}: option {name} must be a table (e.g. --option "
                             f"{name}.KEY=VALUE), got {v!r}")
        return v

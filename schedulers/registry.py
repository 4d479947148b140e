"""Finding scheduling policies by name.

Built-in and third-party policies are declared in the ``omega.schedulers`` entry-point
group (``name = "package.module:PolicyClass"``), so a separate package can add one
without touching this repository. A registry refuses a second policy under a name it
already has: two plugins claiming one name is a configuration error, not a tie to
break silently.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from schedulers.api import Policy

ENTRY_POINT_GROUP = "omega.schedulers"

PolicyFactory = Callable[..., Policy]


class DuplicateSchedulerError(ValueError):
    pass


class UnknownSchedulerError(LookupError):
    pass


class Registry:
    def __init__(self) -> None:
        self._factories: dict[str, tuple[PolicyFactory, str]] = {}

    def register(self, name: str, factory: PolicyFactory, origin: str = "") -> None:
        if name in self._factories:
            raise DuplicateSchedulerError(
                f"scheduler policy {name!r} is already registered (by "
                f"{self._factories[name][1] or 'code'}); refusing {origin or 'the second'}"
            )
        self._factories[name] = (factory, origin)

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, **options: Any) -> Policy:
        try:
            factory, _ = self._factories[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise UnknownSchedulerError(
                f"no scheduler policy named {name!r} (known: {known})") from None
        return factory(**options)

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> Registry:
        """Every policy the installed distributions declare in ``group``."""
        reg = cls()
        for ep in metadata.entry_points(group=group):
            origin = f"{ep.value}" + (f" from {ep.dist.name}" if ep.dist else "")
            reg.register(ep.name, _lazy(ep), origin)
        return reg


def _lazy(ep: metadata.EntryPoint) -> PolicyFactory:
    def make(**options: Any) -> Policy:
        factory = ep.load()
        policy = factory(**options)
        if not isinstance(policy, Policy):
            raise TypeError(f"entry point {ep.name} = {ep.value} did not make a Policy")
        return policy

    return make

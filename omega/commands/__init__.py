"""The ``omega`` commands, a module each (as kubectl's and nomad's commands are a file
each): a module declares its command's flags and its handler, so a new command is one
new file here and nothing else.

A command module has:

* ``register(sub)``: adds its parser(s) to ``sub`` (argparse's subparsers) and sets
  ``func`` (the handler: ``func(args) -> exit code``) with ``set_defaults``;
* ``ORDER``: where it goes in ``omega --help`` (processes 10-19, using a cell 20-49,
  administration 50-59, tools 60 and up);
* ``TLS = False`` if it talks to no cellstate server (or makes its own certificates):
  every other command gets the TLS flags (``--ca``, ``--cert``, ``--key``,
  ``--insecure``).

Shared flag types and helpers are in :mod:`omega.commands.common`; the global flags
(``--json``, ``-o``, ``-v``) and exit codes in :mod:`omega.cliglobal`.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any

_NOT_COMMANDS = frozenset({"common"})


def modules() -> list[ModuleType]:
    """Every command module of this package, in ``ORDER``."""
    found = [importlib.import_module(f"{__name__}.{info.name}")
             for info in pkgutil.iter_modules(__path__) if info.name not in _NOT_COMMANDS]
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 99), m.__name__))


def register_all(sub: Any) -> None:
    """Every command's parser, with the TLS flags on those that talk to a server."""
    from omega.security import add_tls_flags

    for module in modules():
        before = set(sub.choices)
        module.register(sub)
        if getattr(module, "TLS", True):
            for name in sorted(set(sub.choices) - before):
                add_tls_flags(sub.choices[name])

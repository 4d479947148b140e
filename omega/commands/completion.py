"""``omega completion bash|zsh``: a completion script made from the parser."""

from __future__ import annotations

from typing import Any

ORDER = 60

TLS = False


def register(sub: Any) -> None:
    from omega import completion
    from omega.cli import build_parser

    completion.register(sub, build_parser)

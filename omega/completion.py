"""``omega completion bash|zsh``: a shell completion script made from the parser
itself, so it knows every command and flag there is (and no stale ones).

    source <(omega completion bash)        # or put it in ~/.bashrc
    source <(omega completion zsh)         # zsh, through its bash completion layer
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

_BASH = r"""# omega completion for bash (omega completion bash)
_omega() {
    local cur cmd w i skip=0
    cur="${COMP_WORDS[COMP_CWORD]}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if ((skip)); then skip=0; continue; fi
        case "$w" in
            -o|--output) skip=1 ;;
            -*) ;;
            *) cmd="$w"; break ;;
        esac
    done
    case "${COMP_WORDS[COMP_CWORD-1]}" in
        -o|--output) COMPREPLY=($(compgen -W "table wide json" -- "$cur")); return ;;
    esac
    case "$cmd" in
%(cases)s
    esac
}
complete -o default -F _omega omega
"""

_ZSH = """# omega completion for zsh (omega completion zsh), through zsh's bash layer
autoload -U +X compinit && compinit
autoload -U +X bashcompinit && bashcompinit
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (bash or zsh)."""
    commands = _commands(parser)
    top = sorted(commands) + _flags(parser)
    cases = [f'        "") COMPREPLY=($(compgen -W "{" ".join(top)}" -- "$cur")) ;;']
    for name, sub in sorted(commands.items()):
        words = " ".join(_flags(sub) + _subcommand_names(sub))
        cases.append(f'        {name}) COMPREPLY=($(compgen -W "{words}" -- "$cur")) ;;')
    bash = _BASH % {"cases": "\n".join(cases)}
    return bash if shell == "bash" else _ZSH + bash


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(_commands(parser))


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def register(sub: Any, build_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """Add ``completion``; ``build_parser`` makes the whole parser it describes."""
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script: "
                                   "`source <(omega completion bash)` in ~/.bashrc, or "
                                   "`source <(omega completion zsh)` in ~/.zshrc.")
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell: bash or zsh")
    def run(args: argparse.Namespace) -> int:
        sys.stdout.write(script(build_parser(), args.shell))
        return 0

    p.set_defaults(func=run)

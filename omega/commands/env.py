"""``omega env``: the client's address and credentials for a shell, in one line to eval.

    eval "$(omega env /tmp/omega-demo-x1y2)"     # a demo's data folder
    eval "$(omega env ~/cells/a.toml)"          # any client config file
    eval "$(omega env --unset)"                 # forget them again

The demo writes ``client.toml`` (a client config file, omega/clientconfig.py) into its
data folder: its first server's addresses, its CA and the certificate of
``operator:admin``, and, with ``--allow-commands``, its agents' log folder. This prints
each setting as the environment variable the commands read (``export OMEGA_CA=...``),
so every ``omega`` command of that shell talks to the cell without flags.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

CLIENT_FILE = "client.toml"
ORDER = 19
TLS = False  # reads a file, talks to no server


def register(sub: Any) -> None:
    p = sub.add_parser(
        "env", help="print shell lines that point omega at a cell (eval \"$(omega env "
                    "DIR)\")",
        description="Print `export` lines for the client settings of a demo's data folder "
                    "(its client.toml) or of a client config file, for eval in a shell.")
    p.add_argument("source", nargs="?", metavar="DIR|FILE",
                   help="a demo's data folder (the demo prints it) or a client config file")
    p.add_argument("--unset", action="store_true",
                   help="print `unset` lines for every setting instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omega.clientconfig import SETTINGS

    if args.unset:
        print("unset " + " ".join(var for var, _ in SETTINGS.values()))
        return 0
    if not args.source:
        raise ValueError("give a demo's data folder or a client config file (or --unset)")
    for line in env_lines(Path(args.source)):
        print(line)
    return 0


def env_lines(source: Path) -> list[str]:
    """``export NAME=value`` for every setting of the file (quoted for a POSIX shell)."""
    from omega.clientconfig import SETTINGS, load

    path = source / CLIENT_FILE if source.is_dir() else source
    if not path.is_file():
        where = (f"{source} has no {CLIENT_FILE} (is it a demo's data folder? demos write "
                 "one once their servers serve)" if source.is_dir() else f"{source}: no such "
                 "file")
        raise ValueError(where)
    settings = load({"OMEGA_CONFIG": str(path)})
    out = []
    for name, value in settings.items():
        var, kind = SETTINGS[name]
        text = ("1" if value else "0") if kind is bool else str(value)
        out.append(f"export {var}={shlex.quote(text)}")
    return out


def client_toml(settings: dict[str, Any]) -> str:
    """A client config file of ``settings`` (strings and booleans)."""
    lines = []
    for name, value in settings.items():
        if isinstance(value, bool):
            lines.append(f"{name} = {'true' if value else 'false'}")
        else:
            escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{name} = "{escaped}"')
    return "\n".join(lines) + "\n"

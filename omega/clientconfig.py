"""The command line's defaults: a flag, else an environment variable, else the client
config file, else the built-in default.

The file is ``$OMEGA_CONFIG``, else ``$XDG_CONFIG_HOME/omega/config.toml``, else
``~/.config/omega/config.toml``; a missing file is no error (unless $OMEGA_CONFIG names
it). Every setting is optional::

    cellstate = "cell-a:7070,cell-b:7070"   # $OMEGA_CELLSTATE, --cellstate
    ca = "/etc/omega/ca.pem"                # $OMEGA_CA, --ca
    cert = "~/.omega/me.pem"                # $OMEGA_CERT, --cert
    key = "~/.omega/me.key"                 # $OMEGA_KEY, --key
    insecure = false                        # $OMEGA_INSECURE, --insecure
    output = "table"                        # $OMEGA_OUTPUT, -o (table, wide, json)
    log_format = "text"                     # $OMEGA_LOG_FORMAT, --log-format
    log_dir = "/var/log/omega/tasks"        # $OMEGA_LOG_DIR, omega logs --log-dir

Paths may start with ``~``. A setting the file gets wrong (an unknown name, a value of
the wrong type) is an error naming the file and the setting, before the command runs.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cellstate.errors import ConfigError

# Setting -> (its environment variable, its type).
SETTINGS: dict[str, tuple[str, type]] = {
    "cellstate": ("OMEGA_CELLSTATE", str),
    "ca": ("OMEGA_CA", str),
    "cert": ("OMEGA_CERT", str),
    "key": ("OMEGA_KEY", str),
    "insecure": ("OMEGA_INSECURE", bool),
    "output": ("OMEGA_OUTPUT", str),
    "log_format": ("OMEGA_LOG_FORMAT", str),
    "log_dir": ("OMEGA_LOG_DIR", str),
}
_PATHS = frozenset({"ca", "cert", "key", "log_dir"})
_CHOICES = {"output": ("table", "wide", "json"), "log_format": ("text", "json")}


def config_path(env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The file, and whether it was named explicitly ($OMEGA_CONFIG)."""
    env = os.environ if env is None else env
    if env.get("OMEGA_CONFIG"):
        return Path(env["OMEGA_CONFIG"]).expanduser(), True
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else (
        Path.home() / ".config")
    return base / "omega" / "config.toml", False


def load(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file's settings, checked; {} when there is no file."""
    path, named = config_path(env)
    try:
        text = path.read_text()
    except FileNotFoundError:
        if named:
            raise ConfigError(f"$OMEGA_CONFIG: {path}: no such file") from None
        return {}
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    out: dict[str, Any] = {}
    for name, value in doc.items():
        if name not in SETTINGS:
            raise ConfigError(f"{path}: {name}: unknown setting (known: "
                              f"{', '.join(SETTINGS)})")
        kind = SETTINGS[name][1]
        if not isinstance(value, kind):
            raise ConfigError(f"{path}: {name}: expected a {kind.__name__}, got {value!r}")
        if name in _CHOICES and value not in _CHOICES[name]:
            raise ConfigError(f"{path}: {name}: {value!r} is not one of "
                              f"{', '.join(_CHOICES[name])}")
        out[name] = str(Path(str(value)).expanduser()) if name in _PATHS else value
    return out


def default(name: str, fallback: Any = None, env: Mapping[str, str] | None = None) -> Any:
    """The default of setting ``name``: its environment variable, else the config file,
    else ``fallback``. (A bad file gives ``fallback`` here; :func:`load`, called first
    by ``omega``'s main, reports it.)"""
    env = os.environ if env is None else env
    var, kind = SETTINGS[name]
    if env.get(var):
        raw = env[var]
        return raw not in ("", "0") if kind is bool else raw
    try:
        return load(env).get(name, fallback)
    except ConfigError:
        return fallback

"""Which job commands a node agent runs: no remote code execution by default.

A job may carry a ``command`` that the agents of its machines run. Whoever can submit
a job could otherwise run anything on every agent's host, so an agent process runs a
command only if its operator allowed both who submitted it (the job's owner, which
over mutual TLS the server has checked against the submitter's certificate) and what
it runs (the executable, resolved to a real path, under an allowed path). Anything
else fails at once with the reason in the agent's log. Jobs with only a ``duration``
run no code and need no permission.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

import attrs

ANY = "*"


@attrs.frozen
class CommandPolicy:
    """``owners``: job owners whose commands may run (``*``: any). ``paths``:
    executables (absolute paths) or folders (ending in ``/``) they may run from."""

    owners: frozenset[str] = frozenset()
    paths: tuple[str, ...] = ()

    @classmethod
    def allow_all(cls) -> CommandPolicy:
        return cls(frozenset({ANY}), ("/",))

    def refusal(self, owner: str, command: Sequence[str], search_path: str,
                cwd: str | None = None) -> str:
        """Why ``owner``'s ``command`` may not run here, or "" if it may."""
        if ANY not in self.owners and owner not in self.owners:
            allowed = ", ".join(sorted(self.owners)) or "none"
            return (f"owner {owner!r} may not run commands on this agent (allowed: "
                    f"{allowed}; the agent's --allow-command-from)")
        resolved = _resolve(command[0], search_path, cwd)
        if resolved is None:
            return f"{command[0]!r} is not an executable on this agent"
        for p in self.paths:
            if ((p.endswith("/") and resolved.startswith(os.path.realpath(p).rstrip("/") + "/"))
                    or resolved == os.path.realpath(p)):
                return ""
        allowed = ", ".join(self.paths) or "none"
        return (f"{resolved} is outside the paths this agent runs commands from (allowed: "
                f"{allowed}; the agent's --allow-command)")


    @property
    def runs_any(self) -> bool:
        """Whether any command can run at all (an owner and a path are allowed)."""
        return bool(self.owners) and bool(self.paths)

    def warnings(self, verified_owners: bool, own_user: bool) -> list[str]:
        """What the agent's operator must know about commands this policy lets run:
        ``verified_owners`` false when the agent talks plaintext (a job's owner is
        then whatever its submitter wrote), ``own_user`` true when commands run as
        the agent's own user (they can then read its key and act as the agent)."""
        if not self.runs_any:
            return []
        out = []
        if not verified_owners:
            out.append("without TLS a job's owner is whatever its submitter wrote: "
                       "--allow-command-from checks nothing, anyone who reaches the cell "
                       "runs the allowed commands here")
        if own_user:
            out.append("commands run as this agent's own user: they can read its files "
                       "(its key: they can act as this agent) and signal it; run the "
                       "agent as root (commands then run as nobody, or --run-as USER)")
        return out


def _resolve(name: str, search_path: str, cwd: str | None) -> str | None:
    if os.sep in name:
        full = name if os.path.isabs(name) or cwd is None else os.path.join(cwd, name)
    else:
        found = shutil.which(name, path=search_path)
        if found is None:
            return None
        full = found
    return os.path.realpath(full)

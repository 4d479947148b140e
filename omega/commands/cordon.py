"""Operators' commands on machines: ``omega cordon|uncordon|drain MACHINE...``.

Each is one call to a cellstate server, which authorizes it (operators only) and has
the store's judge (``cellstate.decisions``) decide it, so a refused change leaves the
cell as it was.
"""

from __future__ import annotations

import argparse
from typing import Any

MACHINE_HELP = {
    "cordon": "stop placing tasks on machines, which keep what they run",
    "uncordon": "let schedulers place tasks on cordoned or drained machines again",
    "drain": "cordon machines and take their tasks off (lost: their schedulers place "
             "them elsewhere); the machines show as draining",
}


ORDER = 31


def register(sub: Any) -> None:
    from omega.commands.common import cellstate_flag

    for action, text in MACHINE_HELP.items():
        p = sub.add_parser(action, help=text + "; operators only",
                           description=f"{text[0].upper()}{text[1:]}. Operators only.")
        cellstate_flag(p)
        p.add_argument("machines", nargs="+", metavar="MACHINE", help="machine id(s)")
        p.set_defaults(func=lambda args, a=action: machines(args, a))


def machines(args: argparse.Namespace, action: str) -> int:
    from omega.cliglobal import cell_client, emit

    done = []
    with cell_client(args) as client:
        # A typo among several machines changes none of them (each is its own write).
        known = {m["id"] for m in client.list_machines()}
        unknown = [m for m in args.machines if m not in known]
        if unknown:
            raise ValueError(f"unknown machine {unknown[0]!r}"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                             + f"; nothing was {action}ed")
        for mid in args.machines:  # one at a time: a refusal names its machine
            done.append(client.set_machine_state(mid, action))
    emit(args, done, "\n".join(_text(action, d) for d in done))
    return 0


def _text(action: str, d: dict[str, Any]) -> str:
    if not d["revision"]:
        return f"machine {d['machine']}: {d['state']} already, nothing to {action}"
    lost = f", {d['tasks_lost']} task(s) taken off" if action == "drain" else ""
    return f"machine {d['machine']}: {d['state']}{lost} (revision {d['revision']})"

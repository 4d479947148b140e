"""``omega shares``: the share view of a fair scheduler (``schedulers.fair.report``),
with the weights and delta its running instance reports unless flags say otherwise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cellstate.api.client import CellClient, remote_replica
from schedulers.fair.policy import FairConfig
from schedulers.fair.report import UserShare, share_table


def reported_config(status: Mapping[str, Any], scheduler: str) -> tuple[dict[str, float],
                                                                         float | None]:
    """The weights and delta a live instance of ``scheduler`` reports (its policy
    report's ``weight.USER`` and ``delta``); empty and None if none does."""
    # An instance reports every few seconds: one that just started may not have yet.
    for inst in status.get("schedulers", []):
        if inst.get("scheduler") != scheduler:
            continue
        policy = inst.get("policy") or {}
        if "delta" not in policy:
            continue
        weights = {k.removeprefix("weight."): float(v) for k, v in policy.items()
                   if k.startswith("weight.")}
        return weights, float(policy["delta"])
    return {}, None


def shares(client: CellClient, scheduler: str, cell: str, delta: float | None,
           weights: Sequence[tuple[str, float]]) -> dict[str, Any]:
    status = client.status()
    live_weights, live_delta = reported_config(status, scheduler)
    chosen = {**live_weights, **dict(weights)}
    d = delta if delta is not None else (live_delta if live_delta is not None
                                         else FairConfig().delta)
    replica = remote_replica(client, cell)
    try:
        replica.load()
        snap = replica.snapshot()
    finally:
        replica.stop()
    rows = share_table(snap, scheduler, chosen, d)
    live = any(r.scheduler == scheduler for r in snap.instances.values())
    return {"scheduler": scheduler, "delta": d, "live_instances": live,
            "revision": snap.revision, "users": [r.doc() for r in rows]}


def shares_text(doc: Mapping[str, Any]) -> str:
    head = (f"scheduler {doc['scheduler']} (delta {doc['delta']:g}"
            f"{'' if doc['live_instances'] else '; no live instance'}), "
            f"revision {doc['revision']}")
    lines = [head, f"{'USER':<14} {'WEIGHT':>6} {'TASKS':>6} {'SHARE':>7} {'WAITING':>7} "
                   f"{'NEXT':<20} {'CRS':>7}  WOULD"]
    for u in doc["users"]:
        row = UserShare(**u)
        crs = f"{row.next_crs:.3f}" if row.next_crs is not None else "-"
        would = f"{row.verdict}: {row.detail}" if row.verdict else "-"
        lines.append(f"{row.user[:14]:<14} {row.weight:>6g} {row.tasks:>6} {row.share:>7.3f} "
                     f"{row.waiting:>7} {(row.next_task or '-')[:20]:<20} {crs:>7}  {would}")
    if not doc["users"]:
        lines.append("(no user has running or waiting work)")
    return "\n".join(lines)

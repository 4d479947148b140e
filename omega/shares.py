"""``omega shares``: the share view of a fair scheduler (``schedulers.fair.report``),
with the weights and delta its running instance reports unless flags say otherwise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from cellstate.api.client import CellClient, remote_replica
from schedulers.fair.policy import FairConfig, config_from_report
from schedulers.fair.report import UserShare, share_table


def reported_config(status: Mapping[str, Any], scheduler: str) -> FairConfig | None:
    """The settings a live instance of ``scheduler`` reports (its policy report's
    delta, safe threshold, minimum run time, DRU mode and ``weight.USER``); None if
    none does."""
    # An instance reports every few seconds: one that just started may not have yet.
    for inst in status.get("schedulers", []):
        if inst.get("scheduler") != scheduler:
            continue
        policy = inst.get("policy") or {}
        if "delta" in policy:
            return config_from_report(policy)
    return None


def shares(client: CellClient, scheduler: str, cell: str, delta: float | None,
           weights: Sequence[tuple[str, float]], now: float | None = None) -> dict[str, Any]:
    """``now``: when to judge the minimum run time at (the caller's clock, against the
    start times the committing stores wrote)."""
    status = client.status()
    config = reported_config(status, scheduler) or FairConfig()
    config = attrs.evolve(config, weights={**config.weights, **dict(weights)},
                          delta=delta if delta is not None else config.delta)
    replica = remote_replica(client, cell)
    try:
        replica.load()
        snap = replica.snapshot()
    finally:
        replica.stop()
    rows = share_table(snap, scheduler, config, now)
    live = any(r.scheduler == scheduler for r in snap.instances.values())
    return {"scheduler": scheduler, "delta": config.delta,
            "safe_threshold": config.safe_threshold, "dru_mode": config.dru_mode,
            "live_instances": live, "revision": snap.revision,
            "users": [r.doc() for r in rows]}


def shares_text(doc: Mapping[str, Any]) -> str:
    head = (f"scheduler {doc['scheduler']} (delta {doc['delta']:g}, safe threshold "
            f"{doc['safe_threshold']:g}, DRU mode {doc['dru_mode']}"
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

"""The human-readable form of a cell's status (``omega status`` and the demo)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def status_text(s: dict[str, Any]) -> str:
    cap, used = s["capacity"], s["used"]
    util = "  ".join(f"{r} {100 * used.get(r, 0) / c:.1f}%" for r, c in sorted(cap.items()) if c)
    lines = [
        f"cell at revision {s['revision']} (answered by {s['server']})",
        f"machines: {s['machines_up']} up, {s['machines_down']} down; agents: {s['agents']}",
        f"utilization: {util or 'no capacity'}",
        "jobs: " + (", ".join(f"{k} {v}" for k, v in sorted(s["jobs"].items())) or "none"),
        "tasks: " + (", ".join(f"{k} {v}" for k, v in sorted(s["tasks"].items())) or "none"),
    ]
    if s.get("etcd"):
        lines.append(etcd_line(s["etcd"]))
    for name, lim in sorted((s.get("limits") or {}).items()):
        lines.append(f"limits of {name}: {limits_text(lim)}")
    for x in s["schedulers"]:
        lines.append(
            f"  {x['scheduler']}/{x['instance']}: {x.get('tasks_placed', 0)} tasks placed, "
            f"{x.get('transactions', 0)} txns ({x.get('conflicted', 0)} conflicted, "
            f"{refused(x)} refused), "
            f"busyness {100 * x.get('busyness', 0):.1f}%, "
            f"wait mean {x.get('wait_mean_s', 0):.2f} s")
        report = x.get("policy")
        if isinstance(report, dict) and report:
            lines.append("    " + policy_text(report))
    return "\n".join(lines)


def limits_text(lim: Mapping[str, Any]) -> str:
    """``precedence up to 4; holds cpu 6 of 6, mem 12 of 100``: a scheduler's limits
    and how much of its resource limit it holds."""
    parts = []
    if lim.get("max_precedence") is not None:
        parts.append(f"precedence up to {lim['max_precedence']}")
    cap, used = lim.get("max_resources"), lim.get("used") or {}
    if cap:
        parts.append("holds " + ", ".join(f"{d} {float(used.get(d, 0)):g} of {float(v):g}"
                                          for d, v in sorted(cap.items())))
    for field, word in (("shares", "share"), ("quotas", "quota")):
        for user, entry in sorted((lim.get(field) or {}).items()):
            parts.append(f"{word} of {user} " + ", ".join(
                f"{d} {float(v):g}" for d, v in sorted(entry.items())))
    return "; ".join(parts) or "none"


def refused(r: Mapping[str, Any]) -> int:
    """An instance's transactions neither committed whole nor conflicted: claims
    refused by a limit (say, the scheduler's quota) or as invalid. Shown beside the
    conflicts, so that a scheduler whose every transaction its quota turns down does
    not read as one with nothing wrong."""
    if "successful" not in r:
        return 0
    return max(int(r.get("transactions", 0)) - int(r["successful"])
               - int(r.get("conflicted", 0)), 0)


def policy_text(r: dict[str, Any]) -> str:
    """A policy's own report (``Policy.report``): a flow scheduler's rounds and a
    mapreduce scheduler's growth in words, anything else as name=value pairs."""
    if "rounds" in r and "median_solve_ms" in r:
        return (f"rounds {r['rounds']}: last solved {r.get('last_nodes', 0)} nodes, "
                f"{r.get('last_arcs', 0)} arcs in {r['last_solve_ms']:.1f} ms (update "
                f"{r.get('last_update_ms', 0):.1f}, extract {r.get('last_extract_ms', 0):.1f}), "
                f"{r.get('last_placed', 0)} placements proposed, {r.get('last_moved', 0)} moved, "
                f"{r.get('last_preempted', 0)} preempted; median solve "
                f"{r['median_solve_ms']:.1f} ms (update {r.get('median_update_ms', 0):.1f}, "
                f"extract {r.get('median_extract_ms', 0):.1f}); in all {r.get('placed', 0)} "
                f"placements proposed, {r.get('moved', 0)} moved, {r.get('preempted', 0)} "
                "preempted")
    if "preemptions" in r and "delta" in r:
        return fair_text(r)
    if "workers_added" in r and "extra_workers" in r:
        return (f"grows {r.get('jobs_running', 0)} running MapReduce job(s): "
                f"{r['extra_workers']} extra workers in {r.get('jobs_grown', 0)} of them "
                f"({r.get('last_added', 0)} added in the last round, "
                f"{r.get('last_round_ms', 0):.1f} ms), predicted speedup mean "
                f"{r.get('predicted_speedup_mean', 1.0):.2f}x, max "
                f"{r.get('predicted_speedup_max', 1.0):.2f}x; in all {r['workers_added']} "
                f"workers added, {r.get('jobs_sped_up', 0)} jobs sped up; cell "
                f"{100 * r.get('utilization', 0):.0f}% used")
    return "policy: " + ", ".join(f"{k}={_number(v)}" for k, v in sorted(r.items()))


def fair_text(r: dict[str, Any]) -> str:
    """A fair scheduler's report: its preemptions and each user's share."""
    shares = sorted(((k.removeprefix("share."), v) for k, v in r.items()
                     if k.startswith("share.")), key=lambda kv: -kv[1])
    users = ", ".join(f"{u} {v:.2f}" for u, v in shares) or "none running"
    return (f"fair: {r.get('placed', 0)} placements proposed, {r.get('preemptions', 0)} "
            "preemptions "
            f"({r.get('preempted', 0)} tasks' work lost; {r.get('last_preempted', 0)} in the "
            f"last round), delta {r.get('delta', 0):g}; shares: {users}")


def _number(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def etcd_line(e: dict[str, Any]) -> str:
    """The etcd maintenance loop's last view (cellstate.maintenance), alarms first."""
    mib = 1024 * 1024
    sizes = ", ".join(f"{m['endpoint']} {m['db_size'] / mib:.0f} MiB "
                      f"({m['db_size_in_use'] / mib:.0f} in use)" for m in e["members"])
    alarms = f"ALARMS {', '.join(e['alarms'])}; " if e["alarms"] else ""
    read_only = "THE CELL IS READ-ONLY (etcd refuses writes); " if e["read_only"] else ""
    return f"etcd: {read_only}{alarms}{sizes or 'no member answered'}"

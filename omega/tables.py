"""Tables for people: columns as wide as their widest cell, so long job ids and
machine names never push the others out of line; ``wide`` adds columns."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset(),
          ) -> str:
    """Aligned columns (``right``: indexes of right-aligned ones), two spaces apart;
    the last column is not padded."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w)
               for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def jobs_table(jobs: list[dict[str, Any]], wide: bool = False, now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = ["JOB", "SCHEDULER", "STATE", "TASKS"]
    if wide:
        header += ["OWNER", "KIND", "PREC", "AGE", "REASON"]
    rows = []
    for j in jobs:
        spec = j["spec"]
        counts = " ".join(f"{k}={v}" for k, v in sorted(j["task_states"].items()))
        row = [spec["id"], spec["scheduler"], j["state"], counts]
        if wide:
            row += [spec.get("owner", ""), spec.get("kind", "batch"),
                    str(spec.get("precedence", 0)), age(now - float(spec.get("submitted_at", now))),
                    j.get("reason", "")]
        rows.append(row)
    return table(header, rows)


def machines_table(machines: list[dict[str, Any]], wide: bool = False) -> str:
    header = ["MACHINE", "STATE", "RACK", "FD", "CPU", "MEM", "TASKS"]
    if wide:
        header += ["GPU", "AGENT", "LABELS"]
    rows = []
    for m in machines:
        cap, used = m["capacity"], m["used"]
        row = [m["id"], m["state"], m.get("rack", ""), m.get("failure_domain", ""),
               f"{used.get('cpu', 0):g}/{cap.get('cpu', 0):g}",
               f"{used.get('mem', 0):g}/{cap.get('mem', 0):g}", str(m["tasks"])]
        if wide:
            labels = m.get("labels", {})
            row += [f"{used.get('gpu', 0):g}/{cap.get('gpu', 0):g}", m.get("agent", ""),
                    ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                    if isinstance(labels, dict) else str(labels)]
        rows.append(row)
    return table(header, rows, right=frozenset({4, 5, 6}))


def age(seconds: float) -> str:
    """Like kubectl's AGE: 42s, 7m, 3h, 2d."""
    s = max(int(seconds), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"

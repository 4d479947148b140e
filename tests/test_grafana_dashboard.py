"""docs/grafana-dashboard.json graphs only metrics the processes export (the names
tests/e2e/test_metrics.py scrapes from a live server, scheduler and agent), and every
exported metric has a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.e2e.test_metrics import AGENT, SCHEDULER, SERVER

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json"
EXPORTED = {*SERVER, *SCHEDULER, *AGENT}
# What Prometheus adds to a counter's, histogram's or summary's samples.
SUFFIX = re.compile(r"_(total|count|sum|bucket|created)$")


def _targets() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] if p["type"] != "row"
            for t in p["targets"]]


def test_every_expression_names_an_exported_metric() -> None:
    targets = _targets()
    assert targets
    for title, expr in targets:
        names = re.findall(r"\bomega_[a-z_]+", expr)
        assert names, f"{title}: {expr} names no metric"
        unknown = {n for n in names if SUFFIX.sub("", n) not in EXPORTED}
        assert not unknown, f"{title}: {expr} names {unknown}, which no process exports"


def test_every_exported_metric_has_a_panel() -> None:
    shown = {SUFFIX.sub("", n) for _, expr in _targets()
             for n in re.findall(r"\bomega_[a-z_]+", expr)}
    assert EXPORTED - shown == set()


def test_panels_use_the_datasource_variable_and_do_not_overlap() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["templating"]["list"][0]["name"] == "datasource"
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        assert g["x"] + g["w"] <= 24
        cells |= area
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"

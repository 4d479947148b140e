"""The dashboard process's HTTP side against a live cellstate server (no browser): the
page, the document as JSON, the event stream, and an unknown path."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from cellstate.api.client import CellClient
from cellstate.kv.base import KV
from cellstate.model import Claim, InstanceRecord
from cellstate.store import CellStore
from omega.dashboard import Dashboard
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import running_server


@pytest.fixture
def dash(kv: KV) -> Iterator[tuple[str, CellStore]]:
    store = CellStore(kv)
    store.add_machines([machine("m1", cpu=4), machine("m2", cpu=4)])
    store.register_instance(InstanceRecord("batch", "0"), 30)
    store.submit_job(job("j", tasks=3, cpu=2))
    store.commit(txn([Claim("j", 0, "m1"), Claim("j", 1, "m1")]))
    # No instance of its scheduler runs: pending, and the cell says so.
    store.submit_job(job("orphan", tasks=1, cpu=1, scheduler="flow"))
    with running_server(kv) as server, CellClient([f"127.0.0.1:{server.port}"]) as client:
        d = Dashboard(client, interval=0.2)
        port = d.start("127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{port}", store
        finally:
            d.stop()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def _document(url: str) -> dict[str, Any]:
    """The first document built (the dashboard serves at once and loads the cell
    behind: until then the document is empty, and the page says it is connecting)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        doc = json.loads(_get(url + "/api/state"))
        if doc:
            return dict(doc)
        time.sleep(0.1)
    pytest.fail("the dashboard built no document")


def test_the_page_and_its_document(dash: tuple[str, CellStore]) -> None:
    url, _ = dash
    assert b'id="heatmap"' in _get(url + "/")
    doc = _document(url)
    assert [(m["id"], m["fill"], m["tasks"]) for m in doc["machines"]] == [
        ("m1", 1.0, 2), ("m2", 0.0, 0)]
    assert doc["jobs"] == {"pending": 1, "running": 1}
    assert [p["job"] for p in doc["pending"]] == ["orphan"]
    (reason,) = doc["pending"][0]["reasons"]
    assert "flow" in reason and "scheduler" in reason, reason  # what `omega why` says


def test_the_event_stream_follows_the_cell(dash: tuple[str, CellStore]) -> None:
    url, store = dash
    _document(url)
    with urllib.request.urlopen(url + "/api/events", timeout=10) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        store.set_machine_state("m2", "cordon")
        for raw in stream:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            doc = json.loads(line[len("data: "):])
            states = {m["id"]: m["state"] for m in doc["machines"]}
            if states["m2"] == "cordoned":
                break  # the cordon reached the page's stream
        else:
            pytest.fail("the stream ended before showing m2 cordoned")


def test_an_unknown_path_is_404(dash: tuple[str, CellStore]) -> None:
    url, _ = dash
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(url + "/nope")
    assert info.value.code == 404


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "10.0.0.1"])
def test_a_request_for_another_host_name_is_refused(dash: tuple[str, CellStore],
                                                    host: str) -> None:
    """Served on loopback, the page answers only requests naming a loopback address:
    a site whose name resolves to 127.0.0.1 (DNS rebinding) reads nothing."""
    url, _ = dash
    request = urllib.request.Request(url + "/api/state", headers={"Host": host})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 403
    assert b"only requests for a loopback address" in info.value.read()
    for ok in ("localhost", url.removeprefix("http://"), "[::1]:80"):
        with urllib.request.urlopen(urllib.request.Request(
                url + "/api/state", headers={"Host": ok}), timeout=10) as r:
            assert r.status == 200

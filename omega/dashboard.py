"""``omega dashboard``: a web page of the cell, live.

    omega dashboard --cellstate HOST:PORT [--listen 127.0.0.1:8080]

The process keeps a synced copy of the cell from a cellstate server's sync stream (as
a scheduler does), asks the server for its status once a second (the scheduler
instances' reports) and for the reasons of the oldest pending jobs, and serves:

* ``/``: the page (``omega/dashboard.html``): the machines as a heat map, each
  scheduler instance's busyness and conflicts over time, pending jobs with their
  reasons, recent preemptions;
* ``/api/state``: the page's document (:func:`omega.dashview.dashboard_doc`) as JSON;
* ``/api/events``: the same document as server-sent events, one each time it is
  rebuilt (the page listens to these, so it changes as the cell does).

It reads only: any identity may (with TLS, give it a certificate as for any command).
It asks no identity of its own visitors: served on loopback (the default), it answers
only requests naming a loopback host, which keeps other web sites out (DNS rebinding).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

import orjson

from cellstate.api.client import CellClient, ServiceUnavailable, remote_replica
from cellstate.errors import KVError, StoreError
from omega.dashview import EventLog, History, PreemptionLog, dashboard_doc

log = logging.getLogger(__name__)
PAGE = "dashboard.html"
PENDING_EVERY = 3  # refreshes between reads of the pending jobs' reasons


class Dashboard:
    """The live document and the HTTP server that serves it."""

    def __init__(self, client: CellClient, cell: str = "default", interval: float = 1.0,
                 pending_limit: int = 8, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.interval = interval
        self.pending_limit = pending_limit
        self.clock = clock
        self.replica = remote_replica(client, cell)
        self.history = History()
        self.preemptions = PreemptionLog(clock)
        self.replica.on_changes(self.preemptions.changed)
        self.events = EventLog()
        self.replica.on_changes(self.events.changed)
        self._cond = threading.Condition()
        self._doc = b"{}"
        self._version = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: http.server.ThreadingHTTPServer | None = None
        self._rounds = 0
        self._pending: list[dict[str, Any]] = []  # the last pending jobs read, with why

    # -- the document ------------------------------------------------------------------

    def refresh(self) -> None:
        """Rebuild the document from the replica and the service's status."""
        now = self.clock()
        try:
            status = self.client.status()
            if self._rounds % PENDING_EVERY == 0:
                # GetJob lists a job's tasks: asked for a few jobs every few seconds only.
                listed = self.client.list_jobs(state="pending", limit=self.pending_limit)
                self._pending = [self.client.get_job(j["spec"]["id"]) for j in listed]
        except (ServiceUnavailable, StoreError) as e:
            log.warning("dashboard: cannot read the cell (%s); showing the last view", e)
            return
        finally:
            self._rounds += 1
        pending = self._pending
        self.history.add(now, status["schedulers"])
        doc = dashboard_doc(self.replica.snapshot(), status, self.history, self.preemptions,
                            pending, now, self.events)
        with self._cond:
            self._doc = orjson.dumps(doc)
            self._version += 1
            self._cond.notify_all()

    def document(self) -> bytes:
        with self._cond:
            return self._doc

    def updates(self) -> Iterator[bytes]:
        """Each new document as it is built, until the dashboard stops."""
        seen = -1
        while not self._stop.is_set():
            with self._cond:
                if self._version == seen:
                    self._cond.wait(timeout=1.0)
                if self._version == seen:
                    continue
                seen, doc = self._version, self._doc
            yield doc

    def _sync(self) -> None:
        while not self._stop.is_set():
            try:
                self.replica.start()
                break
            except (ServiceUnavailable, KVError) as e:
                log.warning("dashboard: cannot load the cell (%s); trying again", e)
                self._stop.wait(1.0)
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval)

    # -- serving -----------------------------------------------------------------------

    def start(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0: any free port) at once, and sync and build the
        documents from a thread (a large cell's copy takes seconds to load; the page
        says it is connecting meanwhile); returns the port."""
        self._http = http.server.ThreadingHTTPServer(
            (host, port), _handler(self, loopback_only=_is_loopback(host)))
        self._http.daemon_threads = True
        for target, name in ((self._http.serve_forever, "http"), (self._sync, "refresh")):
            t = threading.Thread(target=target, name=f"dashboard-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return int(self._http.server_address[1])

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self.replica.stop()


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _handler(dash: Dashboard, loopback_only: bool = True,
             ) -> type[http.server.BaseHTTPRequestHandler]:
    """``loopback_only``: the page is served on a loopback address, so a request must
    name one as its Host. A web page elsewhere that points its own name at 127.0.0.1
    (DNS rebinding) could otherwise read the cell through the operator's browser."""
    page = resources.files("omega").joinpath(PAGE).read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            host = self.headers.get("Host", "")
            if host.startswith("["):  # [v6 address]:port
                name = host[1:host.find("]")] if "]" in host else host
            else:
                name = host.partition(":")[0]
            if loopback_only and host and not _is_loopback(name):
                self._send(403, "text/plain", f"this dashboard answers only requests for "
                           f"a loopback address, not {host!r}\n".encode())
                return
            path = self.path.split("?")[0]
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", page)
            elif path == "/api/state":
                self._send(200, "application/json", dash.document())
            elif path == "/api/events":
                self._events()
            else:
                self._send(404, "text/plain", b"not found: try / or /api/state\n")

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _events(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for doc in dash.updates():
                    self.wfile.write(b"data: " + doc + b"\n\n")
                    self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("dashboard: " + format, *args)

    return Handler


def register(sub: Any, cellstate_flag: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("dashboard", help="serve a live web page of the cell",
                       description="Serve a web page of the cell, live from a cellstate "
                                   "server's sync stream: machines as a heat map, each "
                                   "scheduler's busyness and conflicts over time, pending "
                                   "jobs with their reasons, recent preemptions.")
    cellstate_flag(p)
    p.add_argument("--listen", default="127.0.0.1:8080",
                   help="host:port to serve the page on (default 127.0.0.1:8080)")
    p.add_argument("--cell", default="default", help="cell name (default 'default')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cellstate.api.config import address, addresses
    from omega.cliglobal import check_listen
    from omega.logfmt import announce
    from omega.security import tls_from_args
    from omega.signals import stop_event_on_signals

    listen = address(args.listen, "--listen", listen=True)
    check_listen(listen)
    host, _, port = listen.rpartition(":")
    stop = stop_event_on_signals()
    with CellClient(addresses(args.cellstate, "--cellstate"), retry_for=10.0,
                    tls=tls_from_args(args)) as client:
        dash = Dashboard(client, args.cell)
        try:
            bound = dash.start(host.strip("[]"), int(port))
            announce("dashboard of cell %s at http://%s:%d/", args.cell, host, bound)
            stop.wait()
        finally:
            dash.stop()
    return 0

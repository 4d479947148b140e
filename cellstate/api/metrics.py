"""The cellstate server's Prometheus metrics (``omega server --metrics HOST:PORT``).

Commit latency and claim outcomes are counted as commits happen (a histogram
observation and a few counter increments per call); everything else is read from
the replica and the status index when Prometheus scrapes, so an unscraped server
pays nothing for it. Names and labels are listed in docs/operations.md, "Metrics".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cellstate.model import CommitResult, MachineState, Transaction

log = logging.getLogger(__name__)

# From a single-claim commit on loopback (~1 ms) to a large gang staged in parts.
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    """What a server counts as it commits, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.commit_seconds = Histogram(
            "omega_commit_seconds", "Time to decide and write one Commit call",
            buckets=COMMIT_BUCKETS, registry=registry)
        self.claims = Counter(
            "omega_commit_claims", "Claims judged by the store, by scheduler and outcome "
            "(committed, or the rejection reason such as limit_exceeded)",
            ["scheduler", "outcome"], registry=registry)
        self.transactions = Counter(
            "omega_commit_transactions", "Transactions committed, by scheduler and outcome "
            "(all, partial, none)", ["scheduler", "outcome"], registry=registry)

    def observe(self, seconds: float, txns: Sequence[Transaction],
                results: Sequence[CommitResult]) -> None:
        self.commit_seconds.observe(seconds)
        for txn, res in zip(txns, results, strict=True):
            if res.committed:
                self.claims.labels(txn.scheduler, "committed").inc(len(res.committed))
            for r in res.rejected:
                self.claims.labels(txn.scheduler, r.reason.value).inc()
            outcome = ("all" if not res.rejected else "partial" if res.committed else "none")
            self.transactions.labels(txn.scheduler, outcome).inc()


class CellCollector(Collector):
    """Gauges read at scrape time: jobs and tasks by state, machines by state,
    capacity and use, the replica's lag, sync subscribers. ``service`` is the
    server's CellStateService (typed loosely: this module is imported by it)."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self.service.status.view()  # one revision for every gauge below
        totals = view.totals()
        jobs = GaugeMetricFamily("omega_jobs", "Jobs by state", labels=["state"])
        for state, n in totals["jobs"].items():
            jobs.add_metric([state], n)
        yield jobs
        tasks = GaugeMetricFamily("omega_tasks", "Tasks by state", labels=["state"])
        for state, n in totals["tasks"].items():
            tasks.add_metric([state], n)
        yield tasks
        # Cordoned and drained machines count as up in the status (they still hold
        # tasks); operators who cordon want them apart. O(machines) per scrape.
        draining = sum(1 for m in view.snap.machines.values()
                       if m.state is MachineState.DRAINING)
        cordoned = sum(1 for m in view.snap.machines.values()
                       if m.state is MachineState.CORDONED)
        machines = GaugeMetricFamily("omega_machines", "Machines by state: up, cordoned, "
                                     "draining (drained), down", labels=["state"])
        machines.add_metric(["up"], totals["machines_up"] - draining - cordoned)
        machines.add_metric(["cordoned"], cordoned)
        machines.add_metric(["draining"], draining)
        machines.add_metric(["down"], totals["machines_down"])
        yield machines
        for name, what in (("capacity", "Capacity of the machines up"),
                           ("used", "Resources held on the machines up")):
            family = GaugeMetricFamily(f"omega_cell_{name}", what, labels=["resource"])
            for dim in sorted({*totals["capacity"], *totals["used"]}):  # 0 shown too
                family.add_metric([dim], totals[name].get(dim, 0.0))
            yield family
        lag = self.service.replica.lag()
        yield GaugeMetricFamily("omega_replica_lag_revisions",
                                "Revisions the server's copy of the cell is behind etcd",
                                value=lag.revisions_behind)
        yield GaugeMetricFamily("omega_replica_lag_seconds",
                                "Seconds since the server's copy was last known current",
                                value=lag.seconds_since_confirmed)
        yield GaugeMetricFamily("omega_cell_revision", "The revision of the server's copy",
                                value=lag.applied_revision)
        yield GaugeMetricFamily("omega_sync_subscribers", "Open sync streams",
                                value=self.service.cache.subscribers)


class MetricsListenError(OSError):
    """The metrics address cannot be listened on (the CLI exits 4)."""


@contextlib.contextmanager
def serving(address: str, *collectors: Collector,
            registry: CollectorRegistry | None = None) -> Iterator[CollectorRegistry]:
    """Serve ``registry`` (a new one if None: one per process, no global state) with
    ``collectors`` at http://``address``/metrics until the block ends; with an empty
    address, only build the registry."""
    registry = registry or CollectorRegistry()
    for c in collectors:
        registry.register(c)
    if not address:
        yield registry
        return
    host, _, port = address.rpartition(":")
    try:
        server, thread = start_http_server(int(port), host.strip("[]") or "0.0.0.0",
                                           registry=registry)
    except OSError as e:
        raise MetricsListenError(e.errno, f"cannot serve metrics on {address}: "
                                          f"{e.strerror}") from None
    log.info("metrics at http://%s/metrics", address)
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

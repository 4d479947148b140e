"""One scheduler instance as its own process, against the cellstate service.

All it needs is the service's address(es): it keeps a synced copy of the cell over
the sync stream, commits through the service, and reports its metrics there (the
``omega status`` command shows them). Configured from a TOML file and flags::

    [scheduler]
    name = "batch"            # the scheduler's name; jobs name it
    policy = "batch"          # a registered policy (default: the name)
    instance = "b0"           # unique among the scheduler's live instances
    cellstate = ["127.0.0.1:7070"]
    cell = "default"
    mode = "incremental"      # or "gang"
    detection = "fine"        # or "coarse"
    max_attempts = 1000
    max_fruitless_attempts = 100
    retry_delay = 1.0
    lease_ttl = 10
    [options]                 # handed to the policy: its constructor and Context.options
    score = "spread"

The policy is made with its options before anything connects, so a bad option stops
the process at once with the policy's own message. A previous run of the same
instance killed before it could withdraw leaves its registration behind until its
lease lapses; a restart waits for that (up to twice ``lease_ttl``) rather than fail.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import attrs

from cellstate.api.client import CellClient, RemoteStore, remote_replica
from cellstate.api.config import ConfigError, _Section, addresses
from cellstate.api.metrics import serving
from cellstate.api.tls import TlsFiles
from cellstate.errors import AlreadyExistsError, KVError, StoreError
from cellstate.gc_tuning import RoundCollector
from cellstate.model import Detection, ModelError, TxnMode, check_name
from cellstate.replica import Replica
from schedulers.api import Policy
from schedulers.prometheus import SchedulerCollector
from schedulers.registry import Registry, UnknownSchedulerError
from schedulers.runtime import RuntimeConfig, SchedulerInstance
from schedulers.why import PendingBook

log = logging.getLogger(__name__)


@attrs.frozen
class SchedulerProcessConfig:
    name: str
    policy: str
    instance: str
    cellstate: tuple[str, ...]
    cell: str = "default"
    runtime: RuntimeConfig = attrs.field(factory=RuntimeConfig)
    metrics_interval: float = 2.0
    pending_interval: float = 0.5
    metrics: str = ""  # host:port to serve Prometheus metrics on; "" for none
    seed: int | None = None
    tls: TlsFiles | None = None  # mutual TLS (cellstate/api/tls.py); None: plaintext


def default_instance() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def scheduler_config(doc: Mapping[str, Any], overrides: Mapping[str, Any],
                     source: str = "", options: Mapping[str, Any] | None = None,
                     ) -> SchedulerProcessConfig:
    """Config from a parsed file (``[scheduler]`` and ``[options]`` tables) with flags
    (non-None values in ``overrides``) taking precedence; ``options`` (from flags) are
    laid over the file's ``[options]``, table into table (``costs.migrate_cost``
    replaces that one entry of the file's ``costs`` table)."""
    prefix = f"{source}: " if source else ""
    try:
        top = _Section(doc, "")
        sec = _Section(top.get("scheduler", dict, {}), "scheduler")
        options_ = merge_options(dict(top.get("options", dict, {})), options or {})
        top.no_unknown()

        def pick(name: str, kind: type | tuple[type, ...], default: Any) -> Any:
            in_file = sec.get(name, kind, default)  # checked even when a flag wins
            return overrides[name] if overrides.get(name) is not None else in_file

        name = pick("name", str, "")
        if not name:
            raise ConfigError("scheduler.name: missing (give --name or set it in the file)")
        policy = pick("policy", str, name)
        instance = pick("instance", str, "") or default_instance()
        for field, value in (("name", name), ("instance", instance)):
            try:
                check_name(value, f"scheduler.{field}")
            except ModelError as e:
                raise ConfigError(str(e)) from None
        endpoints = addresses(pick("cellstate", (list, str), ["127.0.0.1:7070"]),
                              "scheduler.cellstate")
        cell = pick("cell", str, "default")
        mode_name = pick("mode", str, "incremental")
        detection_name = pick("detection", str, "fine")
        try:
            mode = TxnMode(mode_name)
        except ValueError:
            raise ConfigError(f"scheduler.mode: {mode_name!r} is not one of incremental, gang"
                              ) from None
        try:
            detection = Detection(detection_name)
        except ValueError:
            raise ConfigError(
                f"scheduler.detection: {detection_name!r} is not one of fine, coarse") from None
        runtime = RuntimeConfig(
            mode=mode, detection=detection,
            max_attempts=_at_least(pick("max_attempts", int, 1000), 1, "max_attempts"),
            max_fruitless_attempts=_at_least(pick("max_fruitless_attempts", int, 100), 1,
                                             "max_fruitless_attempts"),
            retry_delay=_at_least(float(pick("retry_delay", (int, float), 1.0)), 0.01,
                                  "retry_delay"),
            max_retry_delay=_at_least(float(pick("max_retry_delay", (int, float), 30.0)), 0.01,
                                      "max_retry_delay"),
            lease_ttl=_at_least(pick("lease_ttl", int, 10), 2, "lease_ttl"),
            options=options_,
            absorb_when_idle=True,
        )
        seed = pick("seed", int, None)
        sec.no_unknown()
    except ConfigError as e:
        raise ConfigError(prefix + str(e)) from None
    return SchedulerProcessConfig(name, policy, instance, endpoints, cell, runtime, seed=seed)


def merge_options(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` laid over ``base``: a table in both is merged entry by entry, anything
    else in ``top`` wins."""
    out = dict(base)
    for key, value in top.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = merge_options(old, value)
        else:
            out[key] = value
    return out


def make_policy(registry: Registry, config: SchedulerProcessConfig) -> Policy:
    """The configured policy, made with its options: an unknown policy or an option it
    refuses is a ConfigError naming the policy."""
    try:
        return registry.create(config.policy, **config.runtime.options)
    except UnknownSchedulerError as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:
        raise ConfigError(f"options of scheduler policy {config.policy!r}: {e}") from None
    except TypeError as e:
        # A plugin whose constructor takes no such keyword (or none at all).
        given = ", ".join(sorted(config.runtime.options)) or "none"
        raise ConfigError(f"scheduler policy {config.policy!r} cannot be made with the "
                          f"options given ({given}): {e}") from None


def _at_least(value: Any, low: float, name: str) -> Any:
    if value < low:
        raise ConfigError(f"scheduler.{name}: {value} is below the minimum of {low}")
    return value


def run_scheduler(config: SchedulerProcessConfig, stop: threading.Event,
                  registry: Registry | None = None) -> SchedulerInstance:
    """Run one instance until ``stop`` is set; withdraws it (its jobs move to the
    scheduler's other instances at once) before returning."""
    registry = registry or Registry.from_entry_points()
    policy = make_policy(registry, config)  # bad names and options fail before connecting
    policy.warm_up()  # e.g. the flow solver's kernels: loaded here, not in the first round
    client = CellClient(config.cellstate, tls=config.tls)
    replica = remote_replica(client, config.cell)
    collector = RoundCollector()
    try:
        replica.start()
        collector.start()  # after the load: the cell is what to keep out of its sight
        store = RemoteStore(client)
        rng = random.Random(config.seed) if config.seed is not None else random.Random()
        inst = SchedulerInstance(policy, store, replica, scheduler=config.name,
                                 instance=config.instance, rng=rng, config=config.runtime,
                                 pending=PendingBook())
        if not _register(inst, config, stop):
            return inst
        log.info("scheduler %s/%s (policy %s) running against %s", config.name,
                 config.instance, config.policy, ", ".join(config.cellstate))
        reporter = threading.Thread(target=_report_metrics, args=(inst, store, config, stop),
                                    name="metrics", daemon=True)
        reporter.start()
        why = threading.Thread(target=_report_pending, args=(inst, store, replica, config, stop),
                               name="pending", daemon=True)
        why.start()
        try:
            with serving(config.metrics, SchedulerCollector(inst, replica)):
                inst.run(stop, collector)
        finally:
            stop.set()
            reporter.join(timeout=5)
            why.join(timeout=5)
            try:
                inst.stop()
            except (KVError, StoreError) as e:
                log.warning("could not withdraw %s/%s (%s); its lease will lapse",
                            config.name, config.instance, e)
        return inst
    finally:
        collector.stop()
        replica.stop()
        client.close()


def _register(inst: SchedulerInstance, config: SchedulerProcessConfig,
              stop: threading.Event) -> bool:
    """Register the instance; False if ``stop`` was set first. A live registration
    under the same id is most likely this instance's previous run, killed before it
    could withdraw: wait for its lease to lapse. Still there after twice our own lease
    ttl, it is another live process with this instance id: a clear error."""
    patience = 2 * config.runtime.lease_ttl
    deadline = time.monotonic() + patience
    warned = False
    while True:
        try:
            inst.start()
            return True
        except AlreadyExistsError as e:
            if time.monotonic() > deadline:
                raise AlreadyExistsError(
                    f"{e}: its registration did not lapse within {patience} s, so another "
                    "live process runs this instance id (give each its own --instance)"
                ) from None
            if not warned:
                log.warning("%s; waiting up to %d s for its lease to lapse (a previous run "
                            "that was killed?)", e, patience)
                warned = True
        if stop.wait(0.5):
            return False


def _report_metrics(inst: SchedulerInstance, store: RemoteStore,
                    config: SchedulerProcessConfig, stop: threading.Event) -> None:
    while not stop.wait(config.metrics_interval):
        lease = inst.lease
        if lease is None:
            continue
        try:
            store.report_metrics(config.name, config.instance, lease,
                                 inst.metrics_summary(time.time()))
        except (KVError, StoreError) as e:
            log.debug("metrics report failed: %s", e)


def _report_pending(inst: SchedulerInstance, store: RemoteStore, replica: Replica,
                    config: SchedulerProcessConfig, stop: threading.Event) -> None:
    """Send the instance's pending reports as they change (``omega why`` reads them),
    a few times a second: a job's reasons are visible within its first attempt."""
    book = inst.pending
    assert book is not None
    while not stop.wait(config.pending_interval):
        lease = inst.lease
        if lease is None:
            continue
        puts, deletes = book.take(replica.snapshot(), inst.still_waiting)
        if not puts and not deletes:
            continue
        try:
            store.report_pending(config.name, config.instance, lease, puts, deletes)
        except (KVError, StoreError) as e:
            log.debug("pending report failed: %s", e)
            book.restore(puts)
            continue
        book.sent(puts, deletes)

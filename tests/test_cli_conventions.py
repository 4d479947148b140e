"""The command line as people expect it (issue 15, item 5): global flags anywhere,
--version, output formats, newest jobs first, the subcommand's usage for a bad flag,
and a documented exit code with a message, never a traceback, for expected failures."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import InstanceRecord
from cellstate.store import CellStore
from omega.cli import build_parser, main
from omega.cliglobal import CANNOT_LISTEN, PIPE_CLOSED, UNREACHABLE
from omega.proc import omega
from schedulers.testing import MachineBuilder, machine
from tests.api.service_fixture import running_server


@pytest.fixture(autouse=True)
def plaintext(monkeypatch: pytest.MonkeyPatch) -> None:
    """The conventions are tried against plaintext servers (every command, and every
    process these tests start, reads $OMEGA_INSECURE); TLS is tests/api/test_authz.py's."""
    monkeypatch.setenv("OMEGA_INSECURE", "1")


@pytest.fixture
def live(kv: KV) -> Iterator[CellStateServer]:
    admin = CellStore(kv)
    # m-gpu: a job asking for GPUs must fit some machine, or submission refuses it.
    admin.add_machines([machine("m1", cpu=4), machine("a-machine-with-a-long-name", cpu=4),
                        MachineBuilder("m-gpu").resource("gpu", 2).build()])
    admin.register_instance(InstanceRecord("batch", "0"), 30)
    with running_server(kv) as server:
        yield server


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _at(server: CellStateServer) -> str:
    return f"127.0.0.1:{server.port}"


def test_json_and_verbose_go_before_or_after_the_command(
        live: CellStateServer, capsys: pytest.CaptureFixture[str]) -> None:
    where = _at(live)
    outs = [_run(capsys, *argv)[1] for argv in (
        ["--json", "machines", "--cellstate", where],
        ["machines", "--cellstate", where, "--json"],
        ["-o", "json", "machines", "--cellstate", where],
        ["machines", "-o", "json", "--cellstate", where],
        ["-v", "machines", "--json", "--cellstate", where],
        ["machines", "--cellstate", where, "-v", "-o", "json"],
    )]
    assert all(o == outs[0] for o in outs)
    assert {m["id"] for m in json.loads(outs[0])} == {"m1", "a-machine-with-a-long-name", "m-gpu"}


def test_tables_fit_long_names_and_wide_adds_columns(
        live: CellStateServer, capsys: pytest.CaptureFixture[str]) -> None:
    where = _at(live)
    _, out, _ = _run(capsys, "machines", "--cellstate", where)
    header, *rows = out.splitlines()
    # Every column starts where its header does, however long a name is.
    start = header.index("STATE")
    assert all(r[start - 2:start] == "  " and r[start] != " " for r in rows), out
    _, wide, _ = _run(capsys, "machines", "-o", "wide", "--cellstate", where)
    assert "AGENT" in wide.splitlines()[0] and "AGENT" not in header


def test_jobs_newest_first_with_filters_and_limit(
        live: CellStateServer, capsys: pytest.CaptureFixture[str]) -> None:
    where = _at(live)
    for i in range(3):
        assert _run(capsys, "submit", "--id", f"j{i}", "--cellstate", where)[0] == 0
    _, out, _ = _run(capsys, "jobs", "--json", "--cellstate", where)
    assert [j["spec"]["id"] for j in json.loads(out)] == ["j2", "j1", "j0"]
    _, out, _ = _run(capsys, "jobs", "--json", "--limit", "1", "--cellstate", where)
    assert [j["spec"]["id"] for j in json.loads(out)] == ["j2"]
    _, out, _ = _run(capsys, "jobs", "--json", "--oldest-first", "--cellstate", where)
    assert [j["spec"]["id"] for j in json.loads(out)] == ["j0", "j1", "j2"]
    _, out, _ = _run(capsys, "jobs", "--json", "--status", "running", "--cellstate", where)
    assert json.loads(out) == []
    _, out, _ = _run(capsys, "jobs", "--json", "--scheduler", "batch", "--status", "pending",
                     "--cellstate", where)
    assert len(json.loads(out)) == 3


def test_gpu_flag_asks_for_gpus(live: CellStateServer,
                                capsys: pytest.CaptureFixture[str]) -> None:
    where = _at(live)
    assert _run(capsys, "submit", "--id", "g", "--gpu", "2", "--cellstate", where)[0] == 0
    _, out, _ = _run(capsys, "job", "g", "-o", "json", "--cellstate", where)
    assert json.loads(out)["spec"]["task_resources"] == {"cpu": 1.0, "mem": 1.0, "gpu": 2.0}


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("omega ")


def test_an_unknown_flag_prints_the_subcommands_usage(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["jobs", "--bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: omega jobs") and "unrecognized arguments: --bogus" in err


def test_help_states_units() -> None:
    text = subprocess.run(omega("submit", "--help"), capture_output=True, text=True,
                          check=True, timeout=60).stdout
    assert "CPU cores per task" in text and "GiB" in text and "GPUs per task" in text


def _commands(parser: argparse.ArgumentParser, path: str = "omega",
              ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def test_every_flag_and_argument_of_every_command_has_help() -> None:
    silent = [f"{path}: {'/'.join(a.option_strings) or a.dest}"
              for path, parser in _commands(build_parser()) for a in parser._actions
              if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert silent == []


# The flags the issue found without help or units (issue 15), as `--help` shows them.
@pytest.mark.parametrize(("command", "flag", "says"), [
    ("submit", "--cpu", "CPU cores per task"),
    ("submit", "--mem", "GiB"),
    ("submit", "--tasks", "number of tasks"),
    ("submit", "--duration", "seconds"),
    ("workload", "--jobs-per-second", "per second"),
    ("workload", "--seed", "random seed"),
    ("demo", "--jobs-per-second", "per second"),
    ("demo", "--seed", "random seed"),
    ("scheduler", "--cell", "cell name"),
    ("server", "--cell", "cell name"),
    ("agent", "--cell", "cell name"),
])
def test_the_flags_people_asked_about_say_what_they_take(command: str, flag: str,
                                                         says: str) -> None:
    (sub,) = [p for path, p in _commands(build_parser()) if path == f"omega {command}"]
    (action,) = [a for a in sub._actions if flag in a.option_strings]
    assert action.help and says in action.help


def _taken_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_server_on_a_taken_port_exits_4_without_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    s, port = _taken_port()
    with s:
        code, _, err = _run(capsys, "server", "--etcd", "127.0.0.1:1", "--listen",
                            f"127.0.0.1:{port}")
    assert code == CANNOT_LISTEN
    assert f"cannot listen on 127.0.0.1:{port}: the address is in use" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["check", "--etcd", "127.0.0.1:1"],
    ["recover", "--etcd", "127.0.0.1:1"],
    ["server", "--etcd", "127.0.0.1:1", "--listen", "127.0.0.1:0"],
])
def test_unreachable_etcd_exits_3_not_1(argv: list[str]) -> None:
    # As a process: what a user sees, stderr and all. Told after --etcd-timeout (10 s
    # by default), give or take the process's start.
    started = time.monotonic()
    run = subprocess.run(omega(*argv, "--etcd-timeout", "1"), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == UNREACHABLE, run
    assert f"omega {argv[0]}: etcd did not answer at 127.0.0.1:1" in run.stderr
    assert "no etcd endpoint answered within 1 s" in run.stderr
    assert "Traceback" not in run.stderr
    assert time.monotonic() - started < 9  # not the default 10 s


@pytest.mark.parametrize(("value", "says"), [
    ("0", "etcd timeout (--etcd-timeout): 0.0 is not a number of seconds above 0"),
    ("-3", "etcd timeout (--etcd-timeout): -3.0 is not a number of seconds above 0"),
    ("inf", "etcd timeout (--etcd-timeout): inf is not a number of seconds above 0"),
    ("soon", "argument --etcd-timeout: invalid float value: 'soon'"),
    ("attempt:0", "etcd attempt timeout (--etcd-attempt-timeout): 0.0 is not a number of "
                  "seconds above 0"),
    ("attempt:nan", "etcd attempt timeout (--etcd-attempt-timeout): nan is not a number of "
                    "seconds above 0"),
    ("attempt:soon", "argument --etcd-attempt-timeout: invalid float value: 'soon'"),
])
def test_a_bad_etcd_timeout_is_named(capsys: pytest.CaptureFixture[str], value: str,
                                     says: str) -> None:
    flag = "--etcd-attempt-timeout" if value.startswith("attempt:") else "--etcd-timeout"
    try:
        code, _, err = _run(capsys, "check", "--etcd", "127.0.0.1:1", flag,
                            value.removeprefix("attempt:"))
    except SystemExit as e:  # argparse's own refusal
        code, err = int(str(e.code)), capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err


def _into_closed_pipe(*argv: str) -> tuple[int, str]:
    """Run ``omega ARGV`` with its output a pipe nobody reads any more (`| head -0`,
    deterministically: the reading end is closed before the process starts)."""
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run(omega(*argv), stdout=write, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write)
    # The one line --insecure ($OMEGA_INSECURE) prints on purpose is not noise.
    noise = [line for line in run.stderr.decode().splitlines(keepends=True)
             if not line.startswith("WARNING: ") or "--insecure" not in line]
    return run.returncode, "".join(noise)


@pytest.mark.parametrize(("argv", "code"), [
    (["completion", "bash"], PIPE_CLOSED),
    # argparse itself drops output it cannot write, and help exits 0.
    (["--help"], 0),
    (["jobs", "--help"], 0),
])
def test_a_closed_output_ends_quietly(argv: list[str], code: int) -> None:
    assert _into_closed_pipe(*argv) == (code, "")


@pytest.mark.parametrize("command", ["machines", "jobs", "status"])
def test_listing_into_a_closed_pipe(live: CellStateServer, command: str) -> None:
    if command == "jobs":
        assert main(["submit", "--id", "j", "--cellstate", _at(live)]) == 0
    assert _into_closed_pipe(command, "--cellstate", _at(live)) == (PIPE_CLOSED, "")


@pytest.fixture(scope="module")
def completion_scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What `omega completion bash` and `omega completion zsh` print, in files: made
    once for the module's cases (an `omega` process costs a second or two here)."""
    folder = tmp_path_factory.mktemp("completion")
    scripts = {}
    for shell in ("bash", "zsh"):
        scripts[shell] = folder / f"omega.{shell}"
        scripts[shell].write_text(subprocess.run(
            omega("completion", shell), capture_output=True, text=True, check=True,
            timeout=60).stdout)
    return scripts


@pytest.mark.parametrize(("words", "offered"), [
    (["omega", "su"], "submit"),
    (["omega", "--json", "jo"], "jobs"),
    (["omega", "jobs", "--st"], "--status"),
    (["omega", "-o", "w"], "wide"),
])
def test_bash_completion_offers_commands_and_flags(
        words: list[str], offered: str, completion_scripts: dict[str, Path]) -> None:
    script = completion_scripts["bash"]
    quoted = " ".join(f"'{w}'" for w in words)
    out = subprocess.run(
        ["bash", "-c", f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1};"
                       ' _omega; printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert offered in out


def _zsh() -> str:
    """zsh, installed by the test run itself where it is missing (as the dashboard's
    browser test installs chromium); a machine that cannot install it fails here."""
    found = shutil.which("zsh")
    if not found and shutil.which("apt-get"):
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "zsh"]):
            subprocess.run(argv, check=False, capture_output=True, timeout=900,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which("zsh")
    if not found:
        raise RuntimeError("the zsh completion test needs zsh, and apt-get could not "
                           "install it here")
    return found


@pytest.mark.parametrize(("words", "offered"), [
    (["omega", "su"], "submit"),
    (["omega", "--json", "jo"], "jobs"),
    (["omega", "jobs", "--st"], "--status"),
    (["omega", "-o", "w"], "wide"),
])
def test_zsh_completion_offers_commands_and_flags(
        words: list[str], offered: str, completion_scripts: dict[str, Path],
        tmp_path: Path) -> None:
    """Through zsh's own bash layer, as its completion widget calls it: the words in
    ``words`` (1-based, zsh's way), and ``compgen -F`` running the script's function
    with sh emulation, the options it sets."""
    script = completion_scripts["zsh"]
    quoted = " ".join(f"'{w}'" for w in words)
    out = subprocess.run(
        [_zsh(), "-f", "-c", f"source {script}; words=({quoted}); CURRENT={len(words)};"
                             " COMP_WORDS=(\"${words[@]}\"); COMP_CWORD=$((CURRENT - 1));"
                             ' compgen -F _omega -- "${words[CURRENT]}"'],
        capture_output=True, text=True, check=True, timeout=60, env={**os.environ,
                                                                    "HOME": str(tmp_path)})
    assert offered in out.stdout.split(), out


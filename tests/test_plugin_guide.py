"""docs/plugins.md's worked example is a real package, examples/omega-plugin-leastloaded.

The guide shows the package's files as they are; this suite installs the package with
pip (as a plugin author's user would), finds its policy by name through the registry,
runs the guide's other code against it, and runs the package's own tests, which use
only the testing kit omega-cell ships (``schedulers.testing``)."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cellstate.cell import task_view
from cellstate.kv.base import KV
from cellstate.model import TaskState
from cellstate.store import CellStore
from schedulers.api import Policy
from schedulers.registry import DuplicateSchedulerError, Registry
from schedulers.testing import job, machine
from tests.api.service_fixture import running_server
from tests.etcd_fixture import EtcdServer

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "plugins.md"
EXAMPLE = ROOT / "examples" / "omega-plugin-leastloaded"
EXAMPLE_FILES = {"pyproject.toml", "src/least_loaded.py", "tests/test_least_loaded.py"}


def file_blocks() -> dict[str, str]:
    """The code blocks the guide marks ``<!-- file: path -->``, by path."""
    found = re.findall(r"<!-- file: (\S+) -->\n```\w+\n(.*?)```", DOC.read_text(), re.S)
    return {path: code for path, code in found}


def other_python_blocks() -> list[str]:
    """The guide's Python blocks that are not files of the example."""
    text = re.sub(r"<!-- file: \S+ -->\n```\w+\n.*?```", "", DOC.read_text(), flags=re.S)
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_guide_shows_the_example_files_as_they_are() -> None:
    shown = file_blocks()
    assert set(shown) == {f"examples/omega-plugin-leastloaded/{f}" for f in EXAMPLE_FILES}
    for path, code in shown.items():
        assert code == (ROOT / path).read_text(), f"docs/plugins.md shows {path} otherwise"


def test_the_example_needs_only_what_omega_cell_ships() -> None:
    """Its code imports the policy itself and the installed packages, never this
    repository's tests (which a plugin written elsewhere does not have)."""
    allowed = {"__future__", "least_loaded", "cellstate", "schedulers", "pytest"}
    sources = sorted(EXAMPLE.rglob("*.py"))
    assert len(sources) == 2, sources  # the policy and its tests
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] in allowed, f"{path} imports {name}"


def test_the_kit_ships_with_the_distribution() -> None:
    """pyproject.toml's package list (what a wheel of omega-cell holds) has the kit."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    setuptools = importlib.import_module("setuptools")  # (no type stubs installed)
    assert "schedulers.testing" in setuptools.find_packages(str(ROOT), include=include)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The example installed by pip into a target directory that is put on sys.path;
    yields (the target, the copy it was built from). No index, no dependencies, no
    build isolation: nothing is downloaded. Built from a copy because building writes
    build/ and *.egg-info into the source tree."""
    tmp = tmp_path_factory.mktemp("plugin")
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
         str(src)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield site, src
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("least_loaded", None)


def test_the_installed_package_registers_the_policy_by_name(
        installed: tuple[Path, Path]) -> None:
    site, _ = installed
    registry = Registry.from_entry_points()
    assert "least-loaded" in registry.names()
    policy = registry.create("least-loaded", dimension="mem")
    assert isinstance(policy, Policy) and policy.name == "least-loaded"
    assert policy.options == {"dimension": "mem"}
    module = sys.modules[type(policy).__module__]
    assert Path(str(module.__file__)).parent == site  # the installed copy, not the source


def test_the_guides_other_code_runs_against_the_installed_package(
        installed: tuple[Path, Path]) -> None:
    blocks = other_python_blocks()
    assert blocks, "docs/plugins.md has no Python blocks besides the example's files"
    namespace: dict[str, object] = {}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)
    registry = namespace["registry"]
    assert isinstance(registry, Registry) and "least-loaded" in registry.names()
    by_memory = namespace["by_memory"]
    assert isinstance(by_memory, Policy) and by_memory.options == {"dimension": "mem"}
    assert callable(namespace["run_least_loaded"])


def _guide_namespace() -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile("\n".join(other_python_blocks()), str(DOC), "exec"), namespace)
    return namespace


def _placed(kv: KV, job_id: str) -> dict[str, str]:
    snap = CellStore(kv).read_snapshot()
    return {t: r.machine for t, r in snap.tasks.items()
            if r.job == job_id and task_view(snap, t).state is TaskState.RUNNING}


def _wait_placed(kv: KV, job_id: str, count: int, alive: Callable[[], bool]) -> dict[str, str]:
    """Wait for ``count`` tasks of the job to run (an event, with a bound for failure)."""
    deadline = time.monotonic() + 60
    while len(placed := _placed(kv, job_id)) < count:
        assert alive(), "the scheduler stopped before placing the job"
        assert time.monotonic() < deadline, f"only {placed} placed after 60 s"
        time.sleep(0.1)
    return placed


@pytest.mark.etcd
def test_the_guides_run_least_loaded_places_a_job(
        installed: tuple[Path, Path], etcd_kv: KV, etcd_server: EtcdServer) -> None:
    """The guide's own function, as it stands, on a real etcd: it places a job named
    for least-loaded, one task per machine while the machines are equal, and stops."""
    run = _guide_namespace()["run_least_loaded"]
    assert callable(run)
    store = CellStore(etcd_kv)
    store.add_machines([machine("m0", cpu=4), machine("m1", cpu=4), machine("m2", cpu=4)])
    store.submit_job(job("web", tasks=3, cpu=1, scheduler="least-loaded"))
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(etcd_server.endpoint, "ll-0", stop))
    thread.start()
    try:
        placed = _wait_placed(etcd_kv, "web", 3, thread.is_alive)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive(), "run_least_loaded did not return when told to stop"
    assert sorted(placed.values()) == ["m0", "m1", "m2"]


def _guide_shell_lines(marker: str) -> list[str]:
    """The lines (comments cut) of the guide's ``sh`` block that contains ``marker``."""
    block = next(b for b in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
                 if marker in b)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.etcd
def test_the_guides_omega_lines_run_the_installed_plugin(
        installed: tuple[Path, Path], etcd_kv: KV) -> None:
    """``omega scheduler least-loaded`` (a process of its own, finding the plugin by its
    entry point), ``omega submit`` and ``omega status`` as the guide writes them, the
    address swapped for a real server's."""
    site, _ = installed
    lines = _guide_shell_lines("omega scheduler least-loaded")
    assert [shlex.split(line)[:2] for line in lines] == [
        ["omega", "scheduler"], ["omega", "submit"], ["omega", "status"]]
    CellStore(etcd_kv).add_machines([machine(f"m{i}", cpu=4) for i in range(3)])
    # The server here is plaintext (running_server): the guide's lines talk to it as
    # the guide says, with $OMEGA_INSECURE.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "OMEGA_INSECURE": "1"}
    with running_server(etcd_kv) as server:
        argvs = [[sys.executable, "-m", "omega.cli", *shlex.split(
            line.replace("127.0.0.1:7070", f"127.0.0.1:{server.port}"))[1:]]
            for line in lines]
        sched = subprocess.Popen(argvs[0], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        try:
            submit = subprocess.run(argvs[1], env=env, capture_output=True, text=True,
                                    timeout=120)
            assert submit.returncode == 0, submit.stderr
            placed = _wait_placed(etcd_kv, "web", 3, lambda: sched.poll() is None)
            # The instance publishes its metrics every 2 s: ask until they are there.
            deadline = time.monotonic() + 60
            while True:
                status = subprocess.run(argvs[2], env=env, capture_output=True, text=True,
                                        timeout=120)
                assert status.returncode == 0, status.stderr
                if "least-loaded/ll-0: 3 tasks placed" in status.stdout:
                    break
                assert time.monotonic() < deadline, status.stdout
                time.sleep(0.5)
        finally:
            sched.terminate()
            try:
                _, err = sched.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                sched.kill()
                _, err = sched.communicate()
    assert sorted(placed.values()) == ["m0", "m1", "m2"], err


def test_the_example_packages_own_tests_pass_with_the_kit(
        installed: tuple[Path, Path]) -> None:
    site, src = installed
    tests = src / "tests" / "test_least_loaded.py"
    count = len(re.findall(r"^def test_", tests.read_text(), re.M))
    # The server here is plaintext (running_server): the guide's lines talk to it as
    # the guide says, with $OMEGA_INSECURE.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "OMEGA_INSECURE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(src / "tests")],
        cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{count} passed" in done.stdout, done.stdout


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("rival", None)


def install_fake_distribution(tmp: Path, name: str, module: str, code: str,
                              entry_points: str) -> None:
    """A distribution as pip would leave it: a module and a dist-info with entry points."""
    (tmp / f"{module}.py").write_text(code)
    info = tmp / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_a_second_plugin_under_a_taken_name_is_refused(site: Path) -> None:
    install_fake_distribution(site, "rival-plugin", "rival", textwrap.dedent("""
        from schedulers.batch import BatchPolicy
        class Rival(BatchPolicy):
            name = "batch"
        """), "[omega.schedulers]\nbatch = rival:Rival\n")
    with pytest.raises(DuplicateSchedulerError, match="'batch' is already registered"):
        Registry.from_entry_points()


def test_registry_refuses_duplicates_and_names_unknown_policies() -> None:
    from schedulers.batch import BatchPolicy

    reg = Registry()
    reg.register("batch", BatchPolicy)
    with pytest.raises(DuplicateSchedulerError):
        reg.register("batch", BatchPolicy)
    with pytest.raises(LookupError, match="no scheduler policy named 'flow' \\(known: batch\\)"):
        reg.create("flow")

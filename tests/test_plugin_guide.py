"""docs/plugins.md is executable: its Python blocks run here, in order, as one module,
and its entry-point declaration is installed as a real (temporary) distribution."""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from schedulers.registry import DuplicateSchedulerError, Registry

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def install_fake_distribution(tmp: Path, name: str, module: str, code: str,
                              entry_points: str) -> None:
    """A distribution as pip would leave it: a module and a dist-info with entry points."""
    (tmp / f"{module}.py").write_text(code)
    info = tmp / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def site(tmp_path: Path):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for mod in [m for m in sys.modules if m in ("least_loaded", "rival")]:
        del sys.modules[mod]


def test_the_guide_runs_end_to_end(site: Path) -> None:
    py = blocks("python")
    module = py[0]
    assert module.startswith("# least_loaded.py")
    declared = tomllib.loads(blocks("toml")[0])["project"]["entry-points"]["omega.schedulers"]
    assert declared == {"least-loaded": "least_loaded:LeastLoaded"}
    lines = "".join(f"{k} = {v}\n" for k, v in declared.items())
    install_fake_distribution(site, "least-loaded-plugin", "least_loaded", module,
                              "[omega.schedulers]\n" + lines)
    namespace: dict[str, object] = {}
    exec(compile("from least_loaded import LeastLoaded\n" + "\n".join(py[1:]),
                 str(DOC), "exec"), namespace)
    registry = namespace["registry"]
    assert isinstance(registry, Registry) and "least-loaded" in registry.names()


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

"""Cell specs: the shipped files, the layout rules, splitting over agents, and bad files
(each with the exact message an operator sees)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellstate.model import Resources
from omega.cellspec import CellSpecError, load_cell_spec, parse_cell_spec

CELLS = Path(__file__).resolve().parent.parent / "omega" / "cells"

SMALL = """
[layout]
machines_per_rack = 3
racks_per_failure_domain = 2

[[types]]
name = "a"
count = 4
capacity = { cpu = 8, mem = 32 }

[[types]]
name = "b"
count = 5
capacity = { cpu = 16, mem = 64, gpu = 2 }
labels = { zone = "east", type = "special" }
machines_per_rack = 2
"""


def test_demo_cell() -> None:
    spec = load_cell_spec(CELLS / "demo.toml")
    ms = spec.machines()
    assert spec.name == "demo" and spec.machine_count == 300 and len(ms) == 300
    assert [(t.name, t.count) for t in spec.types] == [
        ("general", 192), ("highmem", 76), ("gpu", 32)]
    assert [m.id for m in ms[:2]] == ["m00001", "m00002"] and ms[-1].id == "m00300"
    assert len({m.id for m in ms}) == 300
    # 32 machines a rack, each type from a fresh rack, 4 racks a failure domain.
    assert (ms[0].rack, ms[0].failure_domain) == ("r001", "fd01")
    assert (ms[31].rack, ms[32].rack) == ("r001", "r002")
    assert (ms[192].id, ms[192].rack, ms[192].failure_domain) == ("m00193", "r007", "fd02")
    assert (ms[267].rack, ms[268].rack) == ("r009", "r010")
    assert (ms[299].rack, ms[299].failure_domain) == ("r010", "fd03")
    assert sorted({m.rack for m in ms}) == [f"r{i:03d}" for i in range(1, 11)]
    assert ms[299].capacity == Resources.of(cpu=32, mem=128, disk=2000, gpu=4)
    assert ms[299].label("type") == "gpu" and ms[299].label("gpu_model") == "a100"
    assert ms[0].label("tier") == "general" and ms[0].agent == ""
    assert spec.total_capacity() == Resources.of(cpu=6528, mem=35840, disk=236000, gpu=128)


# Table 3 of seed 002 (Aladdin+H), in reading order: (cpu, RAM in MB, machines).
ALIBABA_TABLE = [
    (28, 80392, 1040), (28, 112646, 868), (32, 128952, 112), (64, 258356, 320),
    (40, 96517, 344), (24, 64265, 88), (32, 128740, 74), (56, 160038, 3670),
    (16, 64266, 1152), (84, 338160, 49), (32, 129089, 84), (32, 128739, 121),
    (64, 257665, 212), (64, 258360, 168), (32, 96518, 84), (32, 128713, 122),
    (88, 354544, 1956), (64, 193716, 192), (40, 96683, 160), (56, 225705, 52),
    (36, 515820, 240), (56, 467436, 52), (56, 225531, 2604),
]


def test_alibaba_cell_is_table_3() -> None:
    spec = load_cell_spec(CELLS / "alibaba.toml")
    ms = spec.machines("agent-0")
    got = [(int(t.capacity.get("cpu")), t.capacity.get("mem") * 1024, t.count)
           for t in spec.types]
    assert got == ALIBABA_TABLE  # mem in GiB is exactly the table's MB / 1024
    assert [t.name for t in spec.types][:2] == ["c28-m80392", "c28-m112646"]
    assert len(ms) == spec.machine_count == 13764
    assert (ms[-1].id, ms[-1].rack, ms[-1].agent) == ("m13764", "r355", "agent-0")


def test_layout_overrides_and_labels() -> None:
    spec = parse_cell_spec(SMALL, "small.toml", default_name="small")
    assert spec.name == "small"
    ms = spec.machines()
    # Type a: 3 a rack (r001, r002); type b: 2 a rack from a fresh rack (r003-r005).
    assert [m.rack for m in ms] == ["r001"] * 3 + ["r002", "r003", "r003", "r004", "r004",
                                                  "r005"]
    assert [m.failure_domain for m in ms] == ["fd01"] * 4 + ["fd02"] * 4 + ["fd03"]
    assert ms[0].labels == (("type", "a"),)
    assert ms[4].labels == (("type", "special"), ("zone", "east"))  # its own type label wins


def test_defaults() -> None:
    spec = parse_cell_spec('[[types]]\nname = "x"\ncount = 81\ncapacity = { cpu = 1 }\n',
                           default_name="tiny")
    ms = spec.machines()
    assert spec.name == "tiny" and spec.layout.machines_per_rack == 40
    assert (ms[80].rack, ms[80].failure_domain) == ("r003", "fd01")


def test_partition_over_agents() -> None:
    spec = parse_cell_spec(SMALL)
    blocks = spec.partition(4)
    assert [len(b) for b in blocks] == [2, 2, 2, 3]
    assert [m for b in blocks for m in b] == spec.machines()
    share = spec.machines_for(3, 4, agent="a3")
    assert [m.id for m in share] == ["m00007", "m00008", "m00009"]
    assert {m.agent for m in share} == {"a3"}
    assert spec.partition(20)[0] == [] and sum(map(len, spec.partition(20))) == 9
    with pytest.raises(ValueError, match="agent index 4 of 4"):
        spec.machines_for(4, 4)
    with pytest.raises(ValueError, match="at least 1"):
        spec.partition(0)


GOOD_TYPE = 'name = "t"\ncount = 1\ncapacity = { cpu = 1 }\n'


def _types(*bodies: str) -> str:
    return "".join(f"[[types]]\n{b}\n" for b in bodies)


BAD = [
    (_types(GOOD_TYPE, GOOD_TYPE.replace('"t"', '"u"'),
            'name = "v"\ncount = 1\ncapacity = { cpu = -1 }'),
     "types[2].capacity.cpu: must be a positive number, got -1"),
    (_types('name = "t"\ncount = 1\ncapacity = { cpu = 0 }'),
     "types[0].capacity.cpu: must be a positive number, got 0"),
    (_types('name = "t"\ncount = 1\ncapacity = { cpu = "many" }'),
     "types[0].capacity.cpu: must be a positive number, got a string"),
    (_types('name = "t"\ncount = 1\ncapacity = { cpu = nan }'),
     "types[0].capacity.cpu: must be a positive number, got nan"),
    (_types('name = "t"\ncount = 1\ncapacity = { CPU = 1 }'),
     "types[0].capacity.CPU: is not a valid dimension name (lowercase letters, digits and "
     "'_', starting with a letter)"),
    (_types('name = "t"\ncount = 1\ncapacity = {}'),
     "types[0].capacity: must be a non-empty table of dimension = amount "
     "(e.g. { cpu = 16, mem = 64 })"),
    (_types('name = "t"\ncount = 1'), "types[0].capacity: is required"),
    (_types('name = "t"\ncapacity = { cpu = 1 }'), "types[0].count: is required"),
    (_types('name = "t"\ncount = 0\ncapacity = { cpu = 1 }'),
     "types[0].count: must be between 1 and 1000000, got 0"),
    (_types('name = "t"\ncount = 1.5\ncapacity = { cpu = 1 }'),
     "types[0].count: must be an integer, got a number"),
    (_types('count = 1\ncapacity = { cpu = 1 }'), "types[0].name: is required"),
    (_types('name = "a b"\ncount = 1\ncapacity = { cpu = 1 }'),
     "types[0].name: 'a b' is not a valid name (1-128 letters, digits, '_', '.', '-', "
     "starting with a letter or digit)"),
    (_types(GOOD_TYPE, GOOD_TYPE), "types[1].name: 't' is already the name of types[0]"),
    (_types(GOOD_TYPE + "cpus = 4"), "types[0]: unknown field(s) 'cpus'"),
    (_types(GOOD_TYPE + 'labels = { rack = "r9" }'),
     "types[0].labels.rack: is reserved: the layout sets rack"),
    (_types(GOOD_TYPE + "labels = { zone = 3 }"),
     "types[0].labels.zone: must be a string of at most 256 characters"),
    (_types(GOOD_TYPE + "machines_per_rack = 0"),
     "types[0].machines_per_rack: must be between 1 and 1000000, got 0"),
    ("[layout]\nmachines_per_rack = 0\n" + _types(GOOD_TYPE),
     "layout.machines_per_rack: must be between 1 and 1000000, got 0"),
    ("layout = 3\n" + _types(GOOD_TYPE), "layout: must be a table, got an integer"),
    ("[layout]\nracks = 2\n" + _types(GOOD_TYPE), "layout: unknown field(s) 'racks'"),
    ("machines = 3\n" + _types(GOOD_TYPE), "(top level): unknown field(s) 'machines'"),
    ('name = "demo"\n', "types: is required"),
    ("types = []\n", "types: must be a non-empty array of tables ([[types]])"),
    ("types = [3]\n", "types[0]: must be a table, got an integer"),
    (_types('name = "a"\ncount = 600000\ncapacity = { cpu = 1 }',
            'name = "b"\ncount = 600000\ncapacity = { cpu = 1 }'),
     "types: 1200000 machines in all, above the limit of 1000000"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_spec_names_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(CellSpecError) as e:
        load_cell_spec(path)
    assert str(e.value) == f"{path}: {message}"
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no chained traceback


def test_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("[[types]\nname = 1\n")
    with pytest.raises(CellSpecError) as e:
        load_cell_spec(path)
    assert str(e.value).startswith(f"{path}: not valid TOML: ")
    assert "line 1" in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(CellSpecError) as e:
        load_cell_spec(path)
    assert str(e.value) == f"{path}: cannot read the cell spec: No such file or directory"

"""Names are checked whole: a trailing newline (which a regex ``$`` lets through), a
NUL, a slash or a non-ASCII digit is refused wherever a name or index is read, and the
CLI says what is wrong with a number it cannot use."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cellstate import codec
from cellstate.model import ModelError, Resources, check_name, split_task_id
from omega.cellspec import CellSpecError, parse_cell_spec
from omega.cli import main

GOOD_JOB: dict[str, Any] = {"id": "j1", "owner": "ann", "scheduler": "batch",
                            "task_resources": {"cpu": 1}, "labels": {"team": "x"}}


@pytest.mark.parametrize("bad", ["job\n", "job\r\n", "a\x00b", "zeta/y", "", "-x", "x" * 129])
def test_check_name_refuses_the_whole_value(bad: str) -> None:
    with pytest.raises(ModelError, match="is not a valid name"):
        check_name(bad, "scheduler")


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("id", "j1\n", "job.id"),
        ("owner", "ann\n", "job.owner"),
        ("scheduler", "batch\n", "job.scheduler"),
        ("labels", {"team\n": "x"}, "job.labels key"),
        ("task_resources", {"cpu\n": 1}, "job.task_resources"),
    ],
)
def test_a_job_with_a_trailing_newline_in_a_name_is_refused(field: str, value: object,
                                                            where: str) -> None:
    codec.parse_job(GOOD_JOB)
    with pytest.raises(ModelError, match=re.escape(where)):
        codec.parse_job({**GOOD_JOB, field: value})


def test_a_machine_or_dimension_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ModelError, match=r"machine\.id"):
        codec.parse_machine({"id": "m1\n", "capacity": {"cpu": 1}})
    with pytest.raises(ModelError, match="not a valid dimension name"):
        Resources.from_mapping({"gpu\n": 1})


def test_a_cell_spec_dimension_with_a_trailing_newline_is_refused() -> None:
    spec = '[[types]]\nname = "small"\ncount = 1\ncapacity = {{ {dim} = 4 }}\n'
    parse_cell_spec(spec.format(dim="cpu"))
    with pytest.raises(CellSpecError, match="not a valid dimension name"):
        parse_cell_spec(spec.format(dim='"cpu\\n"'))


@pytest.mark.parametrize("tid", ["j/01", "j/\u0661", "j/1\n", "j/+1", "/1", "j/"])
def test_a_task_id_has_one_spelling(tid: str) -> None:
    # "j/01" and "j/<Arabic-Indic one>" would both mean task 1 under another key.
    assert split_task_id("j/10") == ("j", 10) and split_task_id("j/0") == ("j", 0)
    with pytest.raises(ModelError, match="is not a task id"):
        split_task_id(tid)


@pytest.mark.parametrize("value", ["nan", "inf", "NaN"])
def test_cli_refuses_a_number_that_is_not_finite(value: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["submit", "--id", "j1", "--scheduler", "batch", "--cpu", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --cpu: must be a finite number, got {value}" in err

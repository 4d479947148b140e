"""How a task's run ended (exit code, start and end), from an agent's report through
the cellstate service to ``omega job``; a report with bad times changes nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from cellstate.api.client import CellClient, ClientError, RemoteAgentBackend
from cellstate.api.pb.v1 import cellstate_pb2 as pb
from cellstate.api.server import CellStateServer
from cellstate.kv.base import KV
from cellstate.model import Claim, TaskResult, TaskState
from cellstate.store import CellStore
from omega.cli import main
from schedulers.testing import job, machine, txn
from tests.api.service_fixture import running_server

T0 = 1_790_000_000.0


@pytest.fixture
def live(kv: KV) -> Iterator[tuple[CellStateServer, CellStore]]:
    store = CellStore(kv)
    store.add_machines([machine("m1", cpu=4)])
    store.submit_job(job("j", tasks=3, cpu=1))
    store.commit(txn([Claim("j", i, "m1") for i in range(3)]))
    with running_server(kv) as server:
        yield server, store


def test_exit_codes_and_times_reach_omega_job(live: tuple[CellStateServer, CellStore],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = live
    with CellClient([f"127.0.0.1:{server.port}"]) as client:
        backend = RemoteAgentBackend(client)
        backend.report_task("j/0", TaskState.FAILED, "", "m1", TaskResult(3, T0, T0 + 2.5))
        backend.report_task("j/1", TaskState.FINISHED, "", "m1", TaskResult(None, T0, T0 + 1))
        backend.report_task("j/2", TaskState.FAILED, "", "m1", TaskResult(
            None, T0, T0, "cannot start 'trian.py': No such file or directory"))
    assert main(["job", "j", "--json", "--cellstate", f"127.0.0.1:{server.port}",
                 "--insecure"]) == 0
    tasks = {t["index"]: t for t in json.loads(capsys.readouterr().out)["tasks"]}
    placed = tasks[0].pop("placed_at")
    assert placed > 0 and tasks[0].pop("scheduler") == "batch"  # its run's placement
    assert tasks[0] == {"index": 0, "state": "failed", "machine": "m1", "exit_code": 3,
                        "started_at": T0, "ended_at": T0 + 2.5}
    assert "exit_code" not in tasks[1] and tasks[1]["ended_at"] == T0 + 1  # no command
    assert tasks[2]["detail"] == "cannot start 'trian.py': No such file or directory"
    assert main(["job", "j", "--cellstate", f"127.0.0.1:{server.port}", "--insecure"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"j/0 +failed +m1 +placed \S+ \S+ by batch  exit 3  "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d -> "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(2\.5 s\)", out), out
    assert re.search(r"j/2 +failed +m1 .*\(0\.0 s\)  cannot start 'trian\.py'", out), out


@pytest.mark.parametrize(("started", "ended", "detail", "message"), [
    (-1.0, 0.0, "", "started_at: -1.0 is not a time"),
    (float("nan"), 0.0, "", "started_at: nan is not a time"),
    (T0 + 5, T0, "", "is after ended_at"),
    (T0, T0, "x" * 501, "detail: 501 characters, above the limit of 500"),
    (T0, T0, "cannot start '\x1b]0;pwned\x07'", "detail: control character '\\x1b' at "
     "position 14"),
])
def test_bad_reports_are_refused_and_change_nothing(
        live: tuple[CellStateServer, CellStore], started: float, ended: float, detail: str,
        message: str) -> None:
    server, store = live
    before = store.read_snapshot().revision
    with CellClient([f"127.0.0.1:{server.port}"]) as client, pytest.raises(
            ClientError) as info:  # INVALID_ARGUMENT
        client.call("ReportTask", pb.ReportTaskRequest(
            task="j/0", outcome="failed", machine="m1", has_exit_code=True, exit_code=1,
            started_at=started, ended_at=ended, detail=detail), what="report")
    assert message in str(info.value)
    assert store.read_snapshot().revision == before
    assert store.read_snapshot().tasks["j/0"].state is TaskState.RUNNING

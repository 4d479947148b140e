"""A job submission the client sends again after a missed deadline (cellstate/api/client.py):
the first attempt may have been applied by a server that answered too late. The retry
then finds the job there: if it is the very job sent, the submission succeeded; a
different job under the same id is still refused, and so is a second submission that
was not a retry."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from cellstate.api.client import CellClient, ResentAlreadyExists
from cellstate.errors import AlreadyExistsError
from cellstate.keys import Keyspace
from cellstate.kv.base import KV, Compare, Op, Put, TxnResult
from cellstate.store import CellStore
from schedulers.testing import job, machine
from tests.api.service_fixture import running_server


class SlowReplyToAJobWrite:
    """A real KV whose first transaction that writes job ``job_id`` is applied at once
    and returns ``delay`` seconds late: a server slow to answer a write it made."""

    def __init__(self, kv: KV, job_id: str, delay: float) -> None:
        self._kv = kv
        self._key = Keyspace("default").job(job_id)
        self._delay = delay
        self.delayed = threading.Event()

    def txn(self, compares: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        result = self._kv.txn(compares, success, failure)
        if result.succeeded and not self.delayed.is_set() and any(
                isinstance(op, Put) and op.key == self._key for op in success):
            self.delayed.set()
            time.sleep(self._delay)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An endpoint that takes connections and never answers (a hung server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_a_submission_applied_but_answered_too_late_succeeds_when_resent(kv: KV) -> None:
    CellStore(kv).add_machine(machine("m1", cpu=8))
    slow = SlowReplyToAJobWrite(kv, "j1", delay=1.0)
    spec = job("j1", tasks=2, cpu=1)
    with running_server(slow) as server:
        address = f"127.0.0.1:{server.port}"
        # Every attempt's deadline is far below the late answer: the client never sees
        # the reply of the attempt that wrote the job, only the retries' ALREADY_EXISTS.
        with CellClient([address], timeout=0.2, retry_for=20.0) as client:
            revision = client.submit_job(spec)
        assert slow.delayed.is_set()
        with CellClient([address]) as client:
            stored = client.get_job("j1")
            assert stored["revision"] == revision
            assert stored["spec"]["task_count"] == 2
            # Submitting it again on purpose (no retry) is refused.
            with pytest.raises(AlreadyExistsError, match="job 'j1' already exists") as info:
                client.submit_job(spec)
            assert not isinstance(info.value, ResentAlreadyExists)


def test_a_resent_submission_that_finds_another_job_under_its_id_is_refused(
        kv: KV, black_hole: str) -> None:
    store = CellStore(kv)
    store.add_machine(machine("m1", cpu=8))
    store.submit_job(job("j2", tasks=1, cpu=1))
    with running_server(kv) as server:
        # The first attempt goes to the hung endpoint and misses its deadline; the
        # retry reaches the real server and finds job j2 there.
        endpoints = [black_hole, f"127.0.0.1:{server.port}"]
        with CellClient(endpoints, timeout=0.3, retry_for=20.0) as client, \
                pytest.raises(ResentAlreadyExists, match="job 'j2' already exists"):
            client.submit_job(job("j2", tasks=3, cpu=1))
        with CellClient(endpoints, timeout=0.3, retry_for=20.0) as client:
            # The same job resent is the one there: done, at the revision it was made.
            revision = client.submit_job(job("j2", tasks=1, cpu=1))
            stored = client.get_job("j2")
            assert stored["spec"]["task_count"] == 1  # not changed by the refused one
            assert revision == stored["revision"]

"""A record as it reads back after a write (``records.with_revision``) differs from
the record written only in its revision: every other field survives, including the
fields a task's last run sets (its exit code, times and detail), which the store's
own view used to drop."""

from __future__ import annotations

import attrs

from cellstate.model import TaskEvent, TaskRecord, TaskState
from cellstate.records import with_revision


def test_a_task_record_keeps_every_field_but_its_revision() -> None:
    t = TaskRecord("j", 3, TaskState.FAILED, "m1", "batch", "g1", 5, exit_code=3,
                   started_at=10.5, ended_at=12.25, detail="no such file", placed_at=9.5,
                   history=(TaskEvent(9.5, TaskState.RUNNING, "m1", "batch", "placed"),))
    # Every field is set to something other than its default, so that a field
    # added later and not copied shows here too.
    defaults = TaskRecord("j", 3, TaskState.FAILED)
    for f in attrs.fields(TaskRecord):
        if f.name not in ("job", "index", "state"):
            assert getattr(t, f.name) != getattr(defaults, f.name), f.name
    copy = with_revision(t, 9)
    assert copy == attrs.evolve(t, revision=9)
    # placed_at and history take no part in equality (model.TaskRecord): compare them.
    assert (copy.placed_at, copy.history) == (t.placed_at, t.history)

"""The record table: for each kind of record a cell holds, where it lives in a
snapshot, how it is encoded and decoded, and how it carries its revision.

The replica, the store's working view, the store and the simulator's cell all read this
one table instead of spelling the mapping out again. Machines are the one irregular
kind: their allocations are keys of their own (keys.py), so a machine is decoded with
them (``codec.decode_machine``) by the replica and the view, not through ``decode``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from cellstate import codec
from cellstate.keys import KeyKind
from cellstate.model import (
    AgentRecord,
    CellConfig,
    GangRecord,
    InstanceRecord,
    Job,
    JobStatus,
    Machine,
    SchedulerRecord,
    TaskRecord,
    UsageRecord,
    task_record_with_revision,
)


@attrs.frozen
class RecordKind:
    kind: KeyKind
    type: type
    table: str  # the CellSnapshot field holding these records ("" for the config)
    encode: Callable[[Any], bytes]
    decode: Callable[[str, bytes, int], Any]  # (id, value, mod_revision) -> record
    ident: Callable[[Any], str]  # the record's id (the last part of its key)


def _task_with_revision(t: TaskRecord, revision: int) -> TaskRecord:
    # Not attrs.evolve, nor TaskRecord(...): this runs for every task placed (and for
    # the commit leader, every task twice), and those are 5x and 2x slower.
    return task_record_with_revision(t, revision)


RECORDS: dict[KeyKind, RecordKind] = {
    r.kind: r
    for r in (
        RecordKind(KeyKind.MACHINE, Machine, "machines", codec.encode_machine,
                   lambda i, v, rev: codec.decode_machine(i, v, rev), lambda m: m.id),
        RecordKind(KeyKind.JOB, Job, "jobs", codec.encode_job, codec.decode_job,
                   lambda j: j.id),
        RecordKind(KeyKind.TASK, TaskRecord, "tasks", codec.encode_task, codec.decode_task,
                   lambda t: t.id),
        RecordKind(KeyKind.GANG, GangRecord, "gangs", codec.encode_gang, codec.decode_gang,
                   lambda g: g.id),
        RecordKind(KeyKind.USAGE, UsageRecord, "usage", codec.encode_usage,
                   codec.decode_usage, lambda u: u.scheduler),
        RecordKind(KeyKind.STATUS, JobStatus, "statuses", codec.encode_status,
                   codec.decode_status, lambda s: s.job),
        RecordKind(KeyKind.INSTANCE, InstanceRecord, "instances", codec.encode_instance,
                   codec.decode_instance, lambda i: i.id),
        RecordKind(KeyKind.SCHEDULER, SchedulerRecord, "schedulers", codec.encode_scheduler,
                   codec.decode_scheduler, lambda s: s.name),
        RecordKind(KeyKind.AGENT, AgentRecord, "agents", codec.encode_agent,
                   codec.decode_agent, lambda a: a.id),
        RecordKind(KeyKind.CONFIG, CellConfig, "", codec.encode_config,
                   lambda _i, v, rev: codec.decode_config(v, rev), lambda _c: ""),
    )
}
_BY_TYPE = {r.type: r for r in RECORDS.values()}


def kind_of(record: object) -> RecordKind:
    """The kind of a record object; TypeError for anything that is not one."""
    try:
        return _BY_TYPE[type(record)]
    except KeyError:
        raise TypeError(f"{type(record).__name__} is not a cell record") from None


def encode(record: object) -> bytes:
    return kind_of(record).encode(record)


def revision_of(record: object) -> int:
    """The etcd mod_revision a record was read or written at (a machine's sequence)."""
    if isinstance(record, Machine):
        return record.seq
    return int(record.revision)  # type: ignore[attr-defined]


def with_revision(record: Any, revision: int) -> Any:
    """The record as it reads back after a write at ``revision``."""
    if isinstance(record, Machine):
        return record.with_seq(revision)
    if isinstance(record, TaskRecord):
        return _task_with_revision(record, revision)
    return attrs.evolve(record, revision=revision)

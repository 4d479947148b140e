"""Where each record of a cell lives in etcd.

::

    /omega/<cell>/config                  CellConfig (per-scheduler limits)
    /omega/<cell>/machines/<machine>      Machine (capacity, labels, state: no tasks)
    /omega/<cell>/allocs/<machine>/<seq>/<task>
                                          Allocation: a task's hold on the machine
    /omega/<cell>/jobs/<job>              Job spec (immutable once submitted)
    /omega/<cell>/tasks/<job>/<index>     TaskRecord (absent = pending)
    /omega/<cell>/gangs/<gang>            GangRecord (large gang in flight)
    /omega/<cell>/usage/<scheduler>       UsageRecord (resource-limited schedulers)
    /omega/<cell>/jobstatus/<job>         JobStatus (abandoned or killed, with reason)
    /omega/<cell>/instances/<sched>/<id>  InstanceRecord (leased: live instances)
    /omega/<cell>/schedulers/<name>       SchedulerRecord (names that have run here)
    /omega/<cell>/agents/<agent>          AgentRecord (leased: live node agents)

One prefix per cell, so one watch follows a whole cell and several cells can share an
etcd cluster.

A machine's allocations are keys of their own, so a placement writes a bounded number
of bytes whatever the machine holds (one allocation, the task's record, and the
machine's small record again). Every write that changes a machine's allocations
rewrites its machine key in the same etcd transaction, so the machine key's
mod_revision is still the machine's sequence number: the one thing a claim checks.

An allocation's key names the machine's sequence number before the write that made it
(``<seq>``: 16 hex digits, so keys sort by it). A reader holding the machine at sequence
S learns what changed since with a range from ``<S>`` on: etcd goes through the new keys
only, not through every allocation of a busy machine (a range filtered by mod_revision
reads them all). An allocation that changes is deleted and put again under the new
sequence, the delete first in the transaction so that a watcher applying events in order
keeps the new one. Deletions show in the machine's record, which counts its allocations.
"""

from __future__ import annotations

import enum

import attrs

from cellstate.kv.base import prefix_end
from cellstate.model import ModelError, check_name


class KeyKind(enum.Enum):
    CONFIG = "config"
    MACHINE = "machines"
    ALLOC = "allocs"  # id: "<machine>/<seq>/<task id>" (see split_alloc)
    JOB = "jobs"
    TASK = "tasks"
    GANG = "gangs"
    USAGE = "usage"
    STATUS = "jobstatus"
    INSTANCE = "instances"
    SCHEDULER = "schedulers"
    AGENT = "agents"

    # Members are singletons, so the identity hash (in C) agrees with their equality;
    # Enum's own hashes the name in Python, on every set or dict of record refs.
    __hash__ = object.__hash__


# What classify() looks a key's kind up in (an Enum call per key read or watched costs
# more than the rest of classify).
_KINDS: dict[str, KeyKind] = {k.value: k for k in KeyKind}


@attrs.frozen
class Keyspace:
    cell: str = "default"
    root: bytes = attrs.field(init=False)
    _prefixes: dict[KeyKind, bytes] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check_name(self.cell, "cell name")
        object.__setattr__(self, "root", f"/omega/{self.cell}/".encode())
        # Every kind's prefix, made once: key() runs for each record a commit touches.
        object.__setattr__(self, "_prefixes", {
            k: self.root + str(k.value).encode() + b"/" for k in KeyKind})

    @property
    def end(self) -> bytes:
        return prefix_end(self.root)

    @property
    def config(self) -> bytes:
        return self.root + b"config"

    def machine(self, machine: str) -> bytes:
        return self.root + b"machines/" + machine.encode()

    def alloc(self, machine: str, seq: int, task: str) -> bytes:
        """The key of ``task``'s allocation on ``machine``, written by a write made
        while the machine was at sequence ``seq``."""
        return b"%sallocs/%s/%016x/%s" % (self.root, machine.encode(), seq, task.encode())

    def allocs(self, machine: str) -> bytes:
        """The prefix of ``machine``'s allocation keys."""
        return self.root + b"allocs/" + machine.encode() + b"/"

    def allocs_since(self, machine: str, seq: int) -> bytes:
        """Where ``machine``'s allocation keys written at sequence ``seq`` or later
        start (up to the end of :meth:`allocs`)."""
        return b"%sallocs/%s/%016x" % (self.root, machine.encode(), seq)

    def job(self, job: str) -> bytes:
        return self.root + b"jobs/" + job.encode()

    def task(self, job: str, index: int) -> bytes:
        return self.root + b"tasks/" + job.encode() + b"/" + str(index).encode()

    def task_key(self, tid: str) -> bytes:
        return self.root + b"tasks/" + tid.encode()

    def gang(self, gang: str) -> bytes:
        return self.root + b"gangs/" + gang.encode()

    def usage(self, scheduler: str) -> bytes:
        return self.root + b"usage/" + scheduler.encode()

    def status(self, job: str) -> bytes:
        return self.root + b"jobstatus/" + job.encode()

    def instance(self, scheduler: str, instance: str) -> bytes:
        return self.root + b"instances/" + scheduler.encode() + b"/" + instance.encode()

    def scheduler(self, name: str) -> bytes:
        return self.root + b"schedulers/" + name.encode()

    def agent(self, agent: str) -> bytes:
        return self.root + b"agents/" + agent.encode()

    def key(self, kind: KeyKind, ident: str) -> bytes:
        """The key of the record of ``kind`` with id ``ident`` (any kind)."""
        if kind is KeyKind.CONFIG:
            return self.config
        return self._prefixes[kind] + ident.encode()

    def prefix(self, kind: KeyKind) -> bytes:
        return self._prefixes[kind]

    def classify(self, key: bytes) -> tuple[KeyKind, str] | None:
        """The kind of record at ``key`` and its id (task ids are ``job/index``), or
        None for a key this cell does not own."""
        if not key.startswith(self.root):
            return None
        rest = key[len(self.root) :].decode()
        if rest == "config":
            return KeyKind.CONFIG, ""
        kind, sep, ident = rest.partition("/")
        if not sep or not ident:
            return None
        member = _KINDS.get(kind)
        return None if member is None else (member, ident)


def split_alloc(ident: str) -> tuple[str, int, str]:
    """(machine, sequence written at, task id) of an allocation key's id (``classify``'s
    ``<machine>/<seq>/<task id>``); ModelError (a ValueError) if it is not one."""
    mid, _, rest = ident.partition("/")
    if not mid:
        raise _not_an_alloc_key(ident)
    return (mid, *split_alloc_rest(mid, rest))


def split_alloc_rest(machine: str, rest: str) -> tuple[int, str]:
    """(sequence written at, task id) of what follows ``allocs/<machine>/`` in an
    allocation key; ModelError if it is not ``<seq>/<task>``."""
    seq, _, tid = rest.partition("/")
    if len(seq) == 16 and tid:
        try:
            return int(seq, 16), tid
        except ValueError:
            pass
    raise _not_an_alloc_key(f"{machine}/{rest}")


def _not_an_alloc_key(ident: str) -> ModelError:
    return ModelError(
        f"allocation key allocs/{ident} is not <machine>/<16 hex digits>/<task>: a cell "
        "written before allocation keys named their sequence (allocs/<machine>/<task>) "
        "cannot be read by this version; recreate the cell")


def metrics_prefix(cell: str) -> bytes:
    """Where scheduler instances' metric reports live: outside the cell's prefix, so
    that replicas (which watch the cell) never decode them."""
    return f"/omega-metrics/{cell}/".encode()


def pending_prefix(cell: str, job: str = "") -> bytes:
    """Where scheduler instances' pending reports live (``<prefix><job>/<scheduler>/
    <instance>``): outside the cell's prefix, like the metrics, so replicas never
    decode them."""
    return f"/omega-pending/{cell}/".encode() + (job.encode() + b"/" if job else b"")


def leader_key(cell: str) -> bytes:
    """The election key of ``cell``'s commit leader (cellstate/api/leader.py), outside
    the cell's keys: replicas and the invariant checkers never see it."""
    return f"/omega-leader/{cell}".encode()

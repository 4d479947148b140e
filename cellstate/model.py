"""The cell-state model: resources, machines, jobs, tasks, claims, transactions, results.

Everything here is an immutable attrs value. Records that live in the store carry the
etcd ``mod_revision`` they were read at; for a machine that revision *is* its sequence
number (every change to a machine rewrites its key, so the revision changes with it).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping

import attrs

from cellstate.errors import (
    ModelError as ModelError,
)

# Names of resource dimensions, labels, machines, jobs and schedulers. Kept to a safe
# alphabet because they become parts of etcd keys and of file names in the simulator.
# Checked with fullmatch: ``$`` also matches before a trailing newline, which would let
# "job\n" through.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_DIMENSION = re.compile(r"[a-z][a-z0-9_]{0,31}")

# A resource amount above this is a typo or an attack, not a machine: refusing it keeps
# sums exact enough in float arithmetic (2**53 / 1e12 leaves ~4 digits of headroom).
MAX_AMOUNT = 1e12
MAX_INPUT_LOCATIONS = 10_000
# Copies of input blocks one job's tasks may name in all (``Job.task_input``): a job
# record stays well below etcd's request limit (1.5 MiB) at about 60 bytes a copy.
MAX_TASK_INPUT_COPIES = 20_000
MAX_BLOCK_COPIES = 16
#: Float sums of many allocations drift by a few ulps; a claim that exceeds capacity by
#: less than this fraction of it (of 1 below 1) still fits. Everything that counts fits
#: (the flow network's room, its proofs) uses this one value.
FIT_SLACK = 1e-9


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid name (what :func:`check_name` accepts)."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def check_name(value: str, what: str) -> str:
    if not is_name(value):
        raise ModelError(
            f"{what} {value!r} is not a valid name: use 1-128 letters, digits, '_', '.', '-',"
            " starting with a letter or digit"
        )
    return value


def check_amount(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelError(f"{where} must be a number, got {value!r}")
    amount = float(value)
    if math.isnan(amount):
        raise ModelError(f"{where} is NaN")
    if math.isinf(amount):
        raise ModelError(f"{where} is infinite")
    if amount < 0:
        raise ModelError(f"{where} is negative ({amount:g})")
    if amount > MAX_AMOUNT:
        raise ModelError(f"{where} is {amount:g}, above the limit of {MAX_AMOUNT:g}")
    return amount


@attrs.frozen(slots=True, cache_hash=True)
class Resources:
    """A vector over named dimensions (``cpu``, ``mem`` in GiB, ``gpu``, ``disk``, ...).

    Stored as ``(name, amount)`` pairs sorted by name with zero amounts dropped, so equal
    vectors compare equal. Construct with :meth:`of` or :meth:`from_mapping`, which
    check every amount."""

    amounts: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, **amounts: float) -> Resources:
        return cls.from_mapping(amounts)

    @classmethod
    def from_mapping(cls, amounts: Mapping[str, object], where: str = "resources",
                     *, keep_zero: bool = False) -> Resources:
        """``keep_zero``: an amount of 0 stays named (a limit of 0 limits; elsewhere a
        dimension of 0 is the same as one not named, and is dropped)."""
        if not isinstance(amounts, Mapping):
            raise ModelError(f"{where} must be a mapping of dimension to amount")
        pairs = []
        for name, value in amounts.items():
            if not isinstance(name, str) or not _DIMENSION.fullmatch(name):
                raise ModelError(
                    f"{where}: {name!r} is not a valid dimension name (lowercase letters,"
                    " digits and '_', starting with a letter)"
                )
            amount = check_amount(value, f"{where}.{name}")
            if amount or keep_zero:
                pairs.append((name, amount))
        return cls(tuple(sorted(pairs)))

    def get(self, name: str) -> float:
        for dim, amount in self.amounts:
            if dim == name:
                return amount
        return 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.amounts)

    # The arithmetic below has a fast path for two vectors over the same two dimensions
    # (cpu and mem: nearly every vector the schedulers and the simulator add), which
    # computes exactly what the general path does (the same float operations) without
    # building a dict and sorting it.

    def __add__(self, other: Resources) -> Resources:
        b = other.amounts
        if not b:
            return self
        a = self.amounts
        if not a:
            return other
        if len(a) == 2 and len(b) == 2:
            (n0, x0), (n1, x1) = a
            (m0, y0), (m1, y1) = b
            if n0 == m0 and n1 == m1:
                s0 = x0 + y0
                s1 = x1 + y1
                if s0 and s1:
                    return _resources(((n0, s0), (n1, s1)))
        out = dict(a)
        for name, amount in b:
            out[name] = out.get(name, 0.0) + amount
        return _resources(tuple(sorted((n, x) for n, x in out.items() if x)))

    def __sub__(self, other: Resources) -> Resources:
        b = other.amounts
        if not b:
            return self
        a = self.amounts
        if len(a) == 2 and len(b) == 2:
            (n0, x0), (n1, x1) = a
            (m0, y0), (m1, y1) = b
            if n0 == m0 and n1 == m1:
                s0 = x0 - y0
                s1 = x1 - y1
                if (s0 > 1e-9 or s0 < -1e-9) and (s1 > 1e-9 or s1 < -1e-9):
                    return _resources(((n0, s0), (n1, s1)))
        out = dict(a)
        for name, amount in b:
            out[name] = out.get(name, 0.0) - amount
        # Clamp float residue so that releasing everything returns exactly to zero.
        return _resources(tuple(sorted((n, x) for n, x in out.items() if abs(x) > 1e-9)))

    def exceeding(self, capacity: Resources) -> str | None:
        """The first dimension in which ``self`` exceeds ``capacity``, or None if it fits."""
        for name, amount in self.amounts:
            cap = capacity.get(name)
            if amount > cap + FIT_SLACK * max(cap, 1.0):
                return name
        return None

    def exceeding_with(self, extra: Resources, capacity: Resources) -> str | None:
        """``(self + extra).exceeding(capacity)`` without building the sum: the fit
        rules ask it of every machine a policy looks at."""
        a, b, c = self.amounts, extra.amounts, capacity.amounts
        if len(b) == 2 and len(c) == 2:
            (n0, y0), (n1, y1) = b
            (k0, c0), (k1, c1) = c
            if n0 == k0 and n1 == k1:
                if not a:
                    x0 = x1 = 0.0
                elif len(a) == 2 and a[0][0] == n0 and a[1][0] == n1:
                    x0, x1 = a[0][1], a[1][1]
                else:
                    x0 = -1.0  # other dimensions: the general path below
                if x0 >= 0.0:
                    if x0 + y0 > c0 + FIT_SLACK * (c0 if c0 > 1.0 else 1.0):
                        return n0
                    if x1 + y1 > c1 + FIT_SLACK * (c1 if c1 > 1.0 else 1.0):
                        return n1
                    return None
        total = dict(a)
        known = len(total)
        for name, amount in b:
            total[name] = total.get(name, 0.0) + amount
        # In name order, as exceeding() reports; already so unless extra added a name.
        for name in total if len(total) == known else sorted(total):
            cap = capacity.get(name)
            if total[name] > cap + FIT_SLACK * (cap if cap > 1.0 else 1.0):
                return name
        return None

    def fit_times(self, extra: Resources, capacity: Resources, most: int) -> int:
        """How many copies of ``extra``, added one at a time, fit within ``capacity``
        (at most ``most``): the loop ``while u.exceeding_with(extra, capacity) is None:
        u = u + extra`` with the same float operations, so the answer is the one a
        caller checking copy by copy gets. A policy placing many tasks of one shape on
        one machine asks once."""
        n = 0
        a, b, c = self.amounts, extra.amounts, capacity.amounts
        if len(b) == 2 and len(c) == 2 and (
                not a or (len(a) == 2 and a[0][0] == b[0][0] and a[1][0] == b[1][0])):
            (n0, y0), (n1, y1) = b
            (k0, c0), (k1, c1) = c
            if n0 == k0 and n1 == k1:
                # exceeding_with's and __add__'s fast paths, with the bound worked out
                # once (the first sum from nothing is ``extra``, as __add__ returns it).
                x0, x1 = (a[0][1], a[1][1]) if a else (0.0, 0.0)
                if x0 >= 0.0:
                    lim0 = c0 + FIT_SLACK * (c0 if c0 > 1.0 else 1.0)
                    lim1 = c1 + FIT_SLACK * (c1 if c1 > 1.0 else 1.0)
                    while n < most:
                        s0, s1 = x0 + y0, x1 + y1
                        if s0 > lim0 or s1 > lim1:
                            return n
                        if not (s0 and s1):
                            break  # a zero sum: __add__'s general path, below
                        x0, x1, n = s0, s1, n + 1
                    if n == most:
                        return n
                    if n:
                        a = ((n0, x0), (n1, x1))
        u = _resources(a) if a is not self.amounts else self
        while n < most and u.exceeding_with(extra, capacity) is None:
            u, n = u + extra, n + 1
        return n

    def exceeding_limit(self, limit: Resources) -> str | None:
        """Like :meth:`exceeding`, but dimensions the limit does not name are unlimited."""
        for name, cap in limit.amounts:
            amount = self.get(name)
            if amount > cap + FIT_SLACK * max(cap, 1.0):
                return name
        return None

    def fits_in(self, capacity: Resources) -> bool:
        return self.exceeding(capacity) is None

    def __bool__(self) -> bool:
        return bool(self.amounts)

    def __str__(self) -> str:
        return ",".join(f"{n}={a:g}" for n, a in self.amounts) or "0"


_new_object = object.__new__


def _new_resources(amounts: tuple[tuple[str, float], ...]) -> Resources:
    """``Resources(amounts)`` without attrs' ``__init__`` (the hottest constructor of
    the model): the same two slots set, straight through their descriptors (a quarter
    quicker than ``object.__setattr__``), the hash not computed yet."""
    r = _new_object(Resources)
    _set_amounts(r, amounts)
    _set_cached_hash(r, None)
    return r


# attrs keeps a cached hash in that slot; should a version name it otherwise, the
# class itself builds the vectors (slower, the same values).
if "_attrs_cached_hash" in Resources.__slots__:
    _set_amounts = Resources.__dict__["amounts"].__set__
    _set_cached_hash = Resources.__dict__["_attrs_cached_hash"].__set__
    _resources = _new_resources
else:
    _resources = Resources


def trusted_resources(amounts: tuple[tuple[str, float], ...]) -> Resources:
    """A vector from pairs already sorted by name with no zero amount, not checked:
    for arithmetic outside this module on vectors that were (the two-level allocator's
    free counts)."""
    return _resources(amounts)


def add_each(total: Resources, items: Iterable[Resources]) -> Resources:
    """``total + items[0] + items[1] + ...``, added left to right as ``__add__`` adds
    (the same float operations, so the same vector), without building the vectors in
    between while the running total and the next item share their two dimensions: a
    commit adds each placed task's vector to what its scheduler holds."""
    it = iter(items)
    for r in it:
        a, b = total.amounts, r.amounts
        if len(a) == 2 and len(b) == 2 and a[0][0] == b[0][0] and a[1][0] == b[1][0]:
            (n0, x0), (n1, x1) = a
            s0, s1 = x0 + b[0][1], x1 + b[1][1]
            if s0 and s1:  # else __add__'s general path, below
                x0, x1 = s0, s1
                for r in it:
                    b = r.amounts
                    if len(b) == 2 and b[0][0] == n0 and b[1][0] == n1:
                        s0, s1 = x0 + b[0][1], x1 + b[1][1]
                        if s0 and s1:
                            x0, x1 = s0, s1
                            continue
                    total = _resources(((n0, x0), (n1, x1))) + r
                    break
                else:
                    return _resources(((n0, x0), (n1, x1)))
                continue
        total = total + r
    return total


def sum_resources(items: Iterable[Resources]) -> Resources:
    it = iter(items)
    total: dict[str, float] = {}
    for r in it:
        a = r.amounts
        if len(a) == 2 and not total:
            # Fast path while every vector has the first one's two dimensions: the
            # same sums, in the same order, as the loop below.
            (n0, s0), (n1, s1) = a
            for r2 in it:
                b = r2.amounts
                if len(b) == 2 and b[0][0] == n0 and b[1][0] == n1:
                    s0 += b[0][1]
                    s1 += b[1][1]
                    continue
                total[n0], total[n1] = s0, s1
                for name, amount in b:
                    total[name] = total.get(name, 0.0) + amount
                break
            else:
                if (s0 > 1e-9 or s0 < -1e-9) and (s1 > 1e-9 or s1 < -1e-9):
                    return _resources(((n0, s0), (n1, s1)))
                total[n0], total[n1] = s0, s1
            continue
        for name, amount in a:
            total[name] = total.get(name, 0.0) + amount
    if not total:
        return _NO_RESOURCES
    return _resources(tuple(sorted((n, a) for n, a in total.items() if abs(a) > 1e-9)))


_NO_RESOURCES = Resources()

Labels = tuple[tuple[str, str], ...]


def labels_from(mapping: Mapping[str, str] | None, where: str = "labels") -> Labels:
    if not mapping:
        return ()
    if not isinstance(mapping, Mapping):
        raise ModelError(f"{where} must be a mapping of string to string")
    for key, value in mapping.items():
        check_name(key, f"{where} key")
        if not isinstance(value, str) or len(value) > 256:
            raise ModelError(f"{where}[{key!r}] must be a string of at most 256 characters")
        at = control_at(value)
        if at >= 0:
            # Shown by `omega job` and `omega machines` in terminals: no escape sequences.
            raise ModelError(f"{where}[{key!r}] holds control character {value[at]!r} at "
                             f"position {at}")
    return tuple(sorted(mapping.items()))


# -- machines ------------------------------------------------------------------


class MachineState(enum.Enum):
    UP = "up"
    # Both run what they have and take nothing new: a cordoned machine was only
    # cordoned, a draining one also had its tasks taken off (omega drain).
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"


@attrs.frozen(slots=True)
class Allocation:
    """A task's hold on a machine's resources.

    ``gang`` is set while the task was staged by a large gang transaction: the hold
    counts against the machine while the gang's record exists, and the task counts as
    placed once that record says committed. ``evicted_by`` names a gang whose commit
    preempts this task. See docs/architecture.md, "Gangs larger than one etcd txn".

    ``key_seq`` says where the hold is stored, not what it is (so it is neither compared
    nor given when one is made): the machine's sequence number before the write that
    stored it, part of its etcd key (``cellstate.keys``). Whoever learns the key sets it
    (:func:`set_key_seq`): a reader decoding the key, the store once it has chosen the
    keys of the holds it writes. 0 where it is not stored (the simulator)."""

    task: str
    job: str
    scheduler: str
    precedence: int
    resources: Resources
    gang: str = ""
    evicted_by: str = ""
    key_seq: int = attrs.field(init=False, default=0, eq=False, repr=False)


def set_key_seq(a: Allocation, seq: int) -> Allocation:
    """Record where ``a`` is stored (``Allocation.key_seq``), on a hold just decoded or
    just decided, which nothing else holds yet; returns ``a``."""
    if a.key_seq != seq:
        object.__setattr__(a, "key_seq", seq)
    return a


@attrs.frozen(slots=True)
class Machine:
    id: str
    capacity: Resources
    rack: str = ""
    failure_domain: str = ""
    labels: Labels = ()
    state: MachineState = MachineState.UP
    agent: str = ""  # the node agent that runs it; it goes down when the agent's lease lapses
    # task id -> allocation; a plain dict is fine: records are never mutated after decode.
    allocations: Mapping[str, Allocation] = attrs.field(factory=dict, eq=False)
    seq: int = 0  # the etcd mod_revision of the machine's key; 0 before it exists
    # True once the fit rules found that no job with an allocation here has an
    # anti-affinity rule (``cellstate.fit.keeps_others_off_machine``); None: not known.
    # Job specs never change, so it holds for the record's life, and for any record
    # with a subset of these allocations or more allocations of such jobs.
    calm: bool | None = attrs.field(init=False, default=None, eq=False, repr=False)
    # Set by a decision that built this record from another by changing a few
    # allocations: (the other's allocations, the task ids whose allocation may differ
    # from them). A writer then compares just those instead of every allocation of a
    # busy machine (``CellStore._machine_ops``). None: compare them all.
    diff: tuple[Mapping[str, Allocation], tuple[str, ...]] | None = attrs.field(
        init=False, default=None, eq=False, repr=False)

    # What the properties below computed, kept with the record (None: not yet). Plain
    # slots, not functools.cached_property: attrs serves that through a __getattr__,
    # and a class with one reads every attribute through Python's slow path (no
    # specialised slot read): about three times as long for each field of a machine.
    _settled_used: Resources | None = attrs.field(init=False, default=None, eq=False,
                                                  repr=False)
    _has_tags: bool | None = attrs.field(init=False, default=None, eq=False, repr=False)
    _job_ids: frozenset[str] | None = attrs.field(init=False, default=None, eq=False,
                                                  repr=False)
    _gang_tags: frozenset[str] | None = attrs.field(init=False, default=None, eq=False,
                                                    repr=False)

    @property
    def settled_used(self) -> Resources:
        """What the allocations without gang tags hold (computed once per record)."""
        used = self._settled_used
        if used is None:
            used = sum_resources(a.resources for a in self.allocations.values()
                                 if not a.gang and not a.evicted_by)
            _set_settled_used(self, used)
        return used

    @property
    def has_tags(self) -> bool:
        tagged = self._has_tags
        if tagged is None:
            tagged = any(a.gang or a.evicted_by for a in self.allocations.values())
            _set_has_tags(self, tagged)
        return tagged

    @property
    def job_ids(self) -> frozenset[str]:
        """The jobs with an allocation here (computed once per record)."""
        jobs = self._job_ids
        if jobs is None:
            jobs = frozenset(a.job for a in self.allocations.values())
            _set_job_ids(self, jobs)
        return jobs

    @property
    def gang_tags(self) -> frozenset[str]:
        """The gangs this machine's staged records name."""
        tags = self._gang_tags
        if tags is None:
            tags = frozenset()
            if self.has_tags:
                tags = frozenset(g for a in self.allocations.values()
                                 for g in (a.gang, a.evicted_by) if g)
            _set_gang_tags(self, tags)
        return tags

    def with_allocations(
        self, allocations: Mapping[str, Allocation], settled_used: Resources | None = None,
        has_tags: bool | None = None, job_ids: frozenset[str] | None = None,
        calm: bool | None = None,
    ) -> Machine:
        """A copy with other allocations; pass their settled usage, whether any is
        tagged, their jobs and :attr:`calm` if known, to save going over them again."""
        return _copy_machine(self, allocations, self.seq, bool(calm), settled_used, has_tags,
                             job_ids)

    def known_job_ids(self) -> frozenset[str] | None:
        """:attr:`job_ids` if computed already, else None (without computing it)."""
        return self._job_ids

    def with_seq(self, seq: int) -> Machine:
        # The allocations are the same: so is everything computed from them.
        return _copy_machine(self, self.allocations, seq, bool(self.calm), self._settled_used,
                             self._has_tags, self._job_ids, self._gang_tags)

    def label(self, key: str) -> str | None:
        """A machine label, where ``rack``, ``failure_domain`` and ``machine`` are
        labels too, so selectors can name them."""
        if key == "rack":
            return self.rack
        if key == "failure_domain":
            return self.failure_domain
        if key == "machine":
            return self.id
        for k, v in self.labels:
            if k == key:
                return v
        return None



# A machine is copied for every claim and every task end (the simulator's hottest
# constructor): its slots are set straight through their descriptors, which takes
# about two thirds of the time of attrs' __init__ (no defaults, no factory). Should
# the fields change, the import fails here rather than a copy missing one.
assert tuple(f.name for f in attrs.fields(Machine)) == (
    "id", "capacity", "rack", "failure_domain", "labels", "state", "agent", "allocations",
    "seq", "calm", "diff", "_settled_used", "_has_tags", "_job_ids", "_gang_tags"
), "update _copy_machine for Machine's new fields"
_slot = Machine.__dict__
_set_id, _set_capacity, _set_rack, _set_failure_domain = (
    _slot["id"].__set__, _slot["capacity"].__set__, _slot["rack"].__set__,
    _slot["failure_domain"].__set__)
_set_labels, _set_state, _set_agent, _set_allocations, _set_seq, _set_calm = (
    _slot["labels"].__set__, _slot["state"].__set__, _slot["agent"].__set__,
    _slot["allocations"].__set__, _slot["seq"].__set__, _slot["calm"].__set__)
_set_diff = _slot["diff"].__set__
_set_settled_used, _set_has_tags, _set_job_ids, _set_gang_tags = (
    _slot["_settled_used"].__set__, _slot["_has_tags"].__set__, _slot["_job_ids"].__set__,
    _slot["_gang_tags"].__set__)
del _slot


def trusted_machine(machine_id: str, capacity: Resources, rack: str, failure_domain: str,
                    labels: Labels, state: MachineState, agent: str,
                    allocations: Mapping[str, Allocation], seq: int) -> Machine:
    """``Machine(...)`` of these fields, built as :func:`_copy_machine` builds a copy
    (attrs' frozen ``__init__`` sets each of the fifteen slots through
    ``object.__setattr__``): a replica decodes a machine record for every placement it
    follows. The fields are trusted (decoded from the store's own encoding)."""
    c = _new_object(Machine)
    _set_id(c, machine_id)
    _set_capacity(c, capacity)
    _set_rack(c, rack)
    _set_failure_domain(c, failure_domain)
    _set_labels(c, labels)
    _set_state(c, state)
    _set_agent(c, agent)
    _set_allocations(c, allocations)
    _set_seq(c, seq)
    _set_calm(c, None)
    _set_diff(c, None)
    _set_settled_used(c, None)
    _set_has_tags(c, None)
    _set_job_ids(c, None)
    _set_gang_tags(c, None)
    return c


def _copy_machine(m: Machine, allocations: Mapping[str, Allocation], seq: int,
                  calm: bool, settled_used: Resources | None = None,
                  has_tags: bool | None = None, job_ids: frozenset[str] | None = None,
                  gang_tags: frozenset[str] | None = None) -> Machine:
    """``Machine(m.id, ..., allocations, seq)`` with :attr:`Machine.calm` and what is
    known of its allocations as given."""
    c = _new_object(Machine)
    _set_id(c, m.id)
    _set_capacity(c, m.capacity)
    _set_rack(c, m.rack)
    _set_failure_domain(c, m.failure_domain)
    _set_labels(c, m.labels)
    _set_state(c, m.state)
    _set_agent(c, m.agent)
    _set_allocations(c, allocations)
    _set_seq(c, seq)
    _set_calm(c, True if calm else None)
    _set_diff(c, None)
    _set_settled_used(c, settled_used)
    _set_has_tags(c, has_tags)
    _set_job_ids(c, job_ids)
    _set_gang_tags(c, gang_tags)
    return c


def set_diff(m: Machine, base: Machine, changed: tuple[str, ...]) -> None:
    """Note on ``m``, a record a decision just built from ``base`` by changing the
    allocations of tasks ``changed`` (and nothing else that has allocations), what a
    writer needs to compare (:attr:`Machine.diff`): chained through records built from
    records of the same decision."""
    if base.diff is not None:
        _set_diff(m, (base.diff[0], base.diff[1] + changed))
    else:
        _set_diff(m, (base.allocations, changed))

# -- jobs and tasks ----------------------------------------------------------------


class TxnMode(enum.Enum):
    INCREMENTAL = "incremental"  # commit every claim that passes
    GANG = "gang"  # all or nothing


class Detection(enum.Enum):
    FINE = "fine"  # reject only what no longer fits
    COARSE = "coarse"  # reject any claim whose machine changed since it was seen


class JobKind(enum.Enum):
    BATCH = "batch"
    SERVICE = "service"
    MAPREDUCE = "mapreduce"


class SelectorOp(enum.Enum):
    IN = "in"
    NOT_IN = "not_in"
    EXISTS = "exists"
    NOT_EXISTS = "not_exists"


@attrs.frozen(slots=True)
class Requirement:
    """One term of a label selector; a selector matches when all its terms do."""

    key: str
    op: SelectorOp
    values: tuple[str, ...] = ()

    def matches(self, value: str | None) -> bool:
        if self.op is SelectorOp.EXISTS:
            return value is not None
        if self.op is SelectorOp.NOT_EXISTS:
            return value is None
        if self.op is SelectorOp.IN:
            return value is not None and value in self.values
        return value is None or value not in self.values


Selector = tuple[Requirement, ...]


def selector_matches_labels(selector: Selector, labels: Labels) -> bool:
    lookup = dict(labels)
    return all(r.matches(lookup.get(r.key)) for r in selector)


@attrs.frozen(slots=True)
class Constraints:
    """Placement rules the store enforces on every claim (fine-grained checks).

    * ``machine_selector``: the machine's labels (plus rack, failure_domain, machine)
      must match.
    * ``anti_affinity``: no task of a job whose labels match may share the machine
      (checked both ways: an existing task's anti-affinity also keeps newcomers off).
    * ``affinity``: the machine must already run a task of a job whose labels match.
    * ``max_per_machine``: at most this many of the job's own tasks per machine
      (1 spreads the job's tasks over distinct machines); 0 means no limit.
    """

    machine_selector: Selector = ()
    anti_affinity: Selector = ()
    affinity: Selector = ()
    max_per_machine: int = 0


# Extra workers of a MapReduce job (beyond those it asked for) hold idle resources on
# loan: they run at this precedence, below any a job may have (0 and up), so that any
# job may evict them, and before any task that runs at its job's own precedence.
OPPORTUNISTIC_PRECEDENCE = -1


@attrs.frozen(slots=True)
class MapReduceSpec:
    """What a MapReduce job is (Omega §6): ``maps`` map and ``reduces`` reduce
    activities of ``map_seconds`` and ``reduce_seconds`` on average, run by the job's
    tasks (its *workers*). It asked for ``workers`` of them; an elastic scheduler may
    give it up to ``max_workers``. Its tasks ``0 .. workers - 1`` are the requested
    workers; any beyond are extra workers, which run at
    :data:`OPPORTUNISTIC_PRECEDENCE`. How long the job runs follows from the workers it
    has over time (``cellstate/mapreduce.py``)."""

    maps: int
    reduces: int
    map_seconds: float
    reduce_seconds: float
    workers: int
    max_workers: int


@attrs.frozen(slots=True)
class Block:
    """One block of a task's input: its size (GB, or any unit the job's owner likes)
    and the machines holding a copy of it (distinct, at least one)."""

    size: float
    on: tuple[str, ...]


@attrs.frozen(slots=True)
class Job:
    id: str
    owner: str
    scheduler: str
    task_count: int
    task_resources: Resources
    kind: JobKind = JobKind.BATCH
    gang: bool = False
    precedence: int = 0
    constraints: Constraints = Constraints()
    labels: Labels = ()
    duration: float | None = None  # seconds each task runs (agents, simulator)
    command: tuple[str, ...] = ()  # or a real command an agent runs
    submitted_at: float = 0.0
    # Conflict detection for this job's transactions; None: the scheduler's default.
    detection: Detection | None = None
    revision: int = 0  # mod_revision of the job's key
    # Where the job's input data is stored: (machine, amount) pairs sorted by machine,
    # the amount in any unit the job's owner likes (GB). Its tasks read it evenly; a
    # locality-aware policy (Quincy) prefers the machines and racks that hold most.
    input: tuple[tuple[str, float], ...] = ()
    # Each task's own input blocks, task i's at position i (Quincy's per-task
    # locality: the flow scheduler gives such a task a node of its own, with its own
    # preference arcs). Tasks past the end, and every task when empty, read their even
    # share of ``input``.
    task_input: tuple[tuple[Block, ...], ...] = ()
    # A MapReduce job's activities and workers (kind MAPREDUCE); None for other jobs.
    mapreduce: MapReduceSpec | None = None
    # The owner's own order among their jobs (higher first). Only a fair-share
    # scheduler reads it; unlike precedence it says nothing across owners.
    priority: int = 0


def task_precedence(job: Job, index: int) -> int:
    """The precedence task ``index`` of ``job`` runs at (and evicts with): the job's,
    except for a MapReduce job's extra workers, which are opportunistic."""
    mr = job.mapreduce
    if mr is not None and index >= mr.workers:
        return OPPORTUNISTIC_PRECEDENCE
    return job.precedence


def required_tasks(job: Job) -> int:
    """How many of the job's tasks (the first ones) its scheduler must place: all of
    them, except that a MapReduce job's extra workers are optional (its elastic
    scheduler places them when there is room)."""
    return job.mapreduce.workers if job.mapreduce is not None else job.task_count


class TaskState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    LOST = "lost"  # its machine failed, or was drained: placed again
    PREEMPTED = "preempted"
    KILLED = "killed"  # stopped because its job was killed or shrunk: never placed again

    # Members are singletons, so the identity hash (in C) agrees with their equality;
    # Enum's own hashes the name in Python, on every ``state in PLACEABLE``.
    __hash__ = object.__hash__


# A task in one of these states may be (re)claimed.
PLACEABLE = frozenset({TaskState.PENDING, TaskState.LOST, TaskState.PREEMPTED})
# Outcomes an agent may report for a running task.
AGENT_OUTCOMES = frozenset({TaskState.FINISHED, TaskState.FAILED, TaskState.LOST})
# ... and those the store itself records (a kill or a shrink stops tasks as killed).
RELEASE_OUTCOMES = AGENT_OUTCOMES | {TaskState.KILLED}


def task_id(job: str, index: int) -> str:
    return f"{job}/{index}"


def split_task_id(tid: str) -> tuple[str, int]:
    job, _, index = tid.rpartition("/")
    # ASCII digits only, no leading zero: "j/01" or a Unicode digit would name a task
    # key other than the one its index says.
    if not job or not (index.isascii() and index.isdigit()) or (
        len(index) > 1 and index[0] == "0"
    ):
        raise ModelError(f"{tid!r} is not a task id (expected JOB/INDEX)")
    return job, int(index)


@attrs.frozen(slots=True)
class TaskEvent:
    """One step of a task's life, kept in its record (:attr:`TaskRecord.history`):
    when (``at``, seconds since the epoch as the committing store's clock read it; 0:
    not known), the state it entered (``running`` for a placement or a move), on which
    machine, who did it (``by``: the scheduler that placed or preempted it, the agent
    or operator that ended it) and why in a few words (``why``: "placed", "moved from
    m1", "preempted for j/3", "machine m1 down", "killed: ..."). The fair scheduler's
    history of placements and preemptions, `omega events` and the dashboard read it."""

    at: float
    state: TaskState
    machine: str = ""
    by: str = ""
    why: str = ""


# A task record keeps this many of its latest events (a record is rewritten whole at
# every step, so the history costs bytes on every write: about 60 per event).
HISTORY = 8


def with_event(old: TaskRecord | None, event: TaskEvent) -> tuple[TaskEvent, ...]:
    """``old``'s history with ``event`` after it, the oldest dropped past HISTORY."""
    if old is None or not old.history:
        return (event,)
    return (*old.history[-(HISTORY - 1):], event)


@attrs.frozen(slots=True)
class TaskRecord:
    """What the store holds for a task that has ever been placed. A task with no
    record is pending."""

    job: str
    index: int
    state: TaskState
    machine: str = ""
    scheduler: str = ""
    gang: str = ""  # staged by this gang; placed once the gang commits
    revision: int = 0
    # How its last run ended, as its agent reported it (finished or failed tasks):
    # the command's exit code (None: no command, or not known) and wall-clock times.
    exit_code: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    detail: str = ""  # why a run failed without an exit code (its command could not start)
    # When its current (or last) run was placed, as the committing store's clock read
    # it: the start time of a running task, for a scheduler (Cook orders a user's tasks
    # by it) and `omega job`. 0: not known (written before it was kept).
    # Both are dated by the clock of whichever store wrote them, so they take no part
    # in equality: two stores that decide the same writes (the etcd store and the
    # simulator's cell, tests/simulator/test_cell_equivalence.py) agree on the rest.
    placed_at: float = attrs.field(default=0.0, eq=False)
    # Its latest events, oldest first (at most HISTORY).
    history: tuple[TaskEvent, ...] = attrs.field(default=(), eq=False)

    @property
    def id(self) -> str:
        return task_id(self.job, self.index)


# Two task records, two events and two holds are built for every task placed and
# ended (the simulator's hottest constructors after the machine's): built as
# ``_copy_machine`` builds a machine, each slot set through its descriptor, which takes
# about half the time of attrs' frozen ``__init__``. Should the fields change, the
# import fails here rather than a record missing one.
assert tuple(f.name for f in attrs.fields(TaskRecord)) == (
    "job", "index", "state", "machine", "scheduler", "gang", "revision", "exit_code",
    "started_at", "ended_at", "detail", "placed_at", "history"
), "update trusted_task_record for TaskRecord's new fields"
assert tuple(f.name for f in attrs.fields(TaskEvent)) == (
    "at", "state", "machine", "by", "why"), "update trusted_task_event"
assert tuple(f.name for f in attrs.fields(Allocation)) == (
    "task", "job", "scheduler", "precedence", "resources", "gang", "evicted_by", "key_seq"
), "update trusted_allocation for Allocation's new fields"
_rec_slots = [TaskRecord.__dict__[f.name].__set__ for f in attrs.fields(TaskRecord)]
(_set_r_job, _set_r_index, _set_r_state, _set_r_machine, _set_r_scheduler, _set_r_gang,
 _set_r_revision, _set_r_exit_code, _set_r_started_at, _set_r_ended_at, _set_r_detail,
 _set_r_placed_at, _set_r_history) = _rec_slots
_set_e_at, _set_e_state, _set_e_machine, _set_e_by, _set_e_why = (
    TaskEvent.__dict__[f.name].__set__ for f in attrs.fields(TaskEvent))
(_set_a_task, _set_a_job, _set_a_scheduler, _set_a_precedence, _set_a_resources,
 _set_a_gang, _set_a_evicted_by, _set_a_key_seq) = (
    Allocation.__dict__[f.name].__set__ for f in attrs.fields(Allocation))
del _rec_slots


def trusted_task_record(job: str, index: int, state: TaskState, machine: str,
                        scheduler: str, gang: str, placed_at: float,
                        history: tuple[TaskEvent, ...]) -> TaskRecord:
    """``TaskRecord(job, index, state, machine, scheduler, gang, placed_at=...,
    history=...)``, the other fields at their defaults; the fields are trusted (a
    decision's own)."""
    r = _new_object(TaskRecord)
    _set_r_job(r, job)
    _set_r_index(r, index)
    _set_r_state(r, state)
    _set_r_machine(r, machine)
    _set_r_scheduler(r, scheduler)
    _set_r_gang(r, gang)
    _set_r_revision(r, 0)
    _set_r_exit_code(r, None)
    _set_r_started_at(r, 0.0)
    _set_r_ended_at(r, 0.0)
    _set_r_detail(r, "")
    _set_r_placed_at(r, placed_at)
    _set_r_history(r, history)
    return r


def task_record_with_revision(t: TaskRecord, revision: int) -> TaskRecord:
    """``t`` as stored at ``revision`` (a copy; every task a commit writes gets one,
    so built as ``trusted_task_record`` builds one)."""
    r = _new_object(TaskRecord)
    _set_r_job(r, t.job)
    _set_r_index(r, t.index)
    _set_r_state(r, t.state)
    _set_r_machine(r, t.machine)
    _set_r_scheduler(r, t.scheduler)
    _set_r_gang(r, t.gang)
    _set_r_revision(r, revision)
    _set_r_exit_code(r, t.exit_code)
    _set_r_started_at(r, t.started_at)
    _set_r_ended_at(r, t.ended_at)
    _set_r_detail(r, t.detail)
    _set_r_placed_at(r, t.placed_at)
    _set_r_history(r, t.history)
    return r


def trusted_task_event(at: float, state: TaskState, machine: str = "", by: str = "",
                       why: str = "") -> TaskEvent:
    """``TaskEvent(at, state, machine, by, why)`` of trusted fields."""
    e = _new_object(TaskEvent)
    _set_e_at(e, at)
    _set_e_state(e, state)
    _set_e_machine(e, machine)
    _set_e_by(e, by)
    _set_e_why(e, why)
    return e


def trusted_allocation(task: str, job: str, scheduler: str, precedence: int,
                       resources: Resources, gang: str = "") -> Allocation:
    """``Allocation(task, job, scheduler, precedence, resources, gang)`` of trusted
    fields (not evicted, not stored: ``key_seq`` 0)."""
    a = _new_object(Allocation)
    _set_a_task(a, task)
    _set_a_job(a, job)
    _set_a_scheduler(a, scheduler)
    _set_a_precedence(a, precedence)
    _set_a_resources(a, resources)
    _set_a_gang(a, gang)
    _set_a_evicted_by(a, "")
    _set_a_key_seq(a, 0)
    return a


@attrs.frozen(slots=True)
class TaskResult:
    """What an agent reports about a run that ended: the command's exit code (None for a
    task without a command) and when it started and ended (seconds since the epoch; 0:
    not known)."""

    exit_code: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    detail: str = ""  # e.g. why the command could not start (at most MAX_DETAIL characters)


MAX_DETAIL = 500


class GangState(enum.Enum):
    PREPARING = "preparing"
    COMMITTED = "committed"


@attrs.frozen(slots=True)
class GangRecord:
    """The commit point of a gang transaction too large for one etcd transaction."""

    id: str
    scheduler: str
    state: GangState
    claims: int
    # Resources the gang adds per scheduler (placements minus its evictions), applied to
    # usage counters at the commit point.
    usage_delta: Mapping[str, Resources] = attrs.field(factory=dict, eq=False)
    revision: int = 0


class JobState(enum.Enum):
    ABANDONED = "abandoned"  # a scheduler gave up; the reason says why
    KILLED = "killed"  # a user withdrew it


# A status's free text is shown by `omega job` and the dashboard, in terminals: it is
# bounded, and control characters (escape sequences could rewrite what an operator
# sees) are refused.
MAX_STATUS_REASON = 1_000
MAX_STATUS_BY = 300


def control_at(text: str) -> int:
    """The position of the first control character (C0, DEL or C1) in ``text``, or -1."""
    for i, ch in enumerate(text):
        if ch < " " or "\x7f" <= ch <= "\x9f":
            return i
    return -1


def check_status_text(status: JobStatus) -> None:
    """Refuse a job status whose reason or author is too long or holds a control
    character, or whose time is not a finite, non-negative number (ModelError)."""
    for value, what, limit in ((status.reason, "reason", MAX_STATUS_REASON),
                               (status.by, "by", MAX_STATUS_BY)):
        if not isinstance(value, str):
            raise ModelError(f"job {status.job}: status {what} must be text")
        if len(value) > limit:
            raise ModelError(f"job {status.job}: status {what} has {len(value)} characters, "
                             f"more than the limit of {limit}")
        at = control_at(value)
        if at >= 0:
            raise ModelError(f"job {status.job}: status {what} holds control character "
                             f"{value[at]!r} at position {at}")
    if isinstance(status.at, bool) or not isinstance(status.at, int | float) or not (
            0 <= status.at < float("inf")):
        raise ModelError(f"job {status.job}: status time {status.at!r} is not a finite, "
                         "non-negative number of seconds")


def printable(text: str, limit: int = MAX_STATUS_REASON) -> str:
    """``text`` as free text a store accepts: control characters become spaces and it is
    cut to ``limit`` characters (a scheduler's reason quotes rejection details, and a
    task's detail an error message naming the job's command, either of which can be
    long or carry what the job's submitter wrote)."""
    if control_at(text) >= 0:
        text = "".join(" " if ch < " " or "\x7f" <= ch <= "\x9f" else ch for ch in text)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return text


@attrs.frozen(slots=True)
class JobStatus:
    """A verdict on a job that its spec cannot carry (specs are immutable): set when a
    scheduler abandons it or a user kills it. A job with no status is live."""

    job: str
    state: JobState
    reason: str
    by: str = ""  # the scheduler instance (or user) that set it
    at: float = 0.0
    revision: int = 0


@attrs.frozen(slots=True)
class InstanceRecord:
    """A live scheduler instance; its key is leased, so it disappears with the process."""

    scheduler: str
    instance: str
    policy: str = ""
    started_at: float = 0.0
    revision: int = 0

    @property
    def id(self) -> str:
        return f"{self.scheduler}/{self.instance}"


@attrs.frozen(slots=True)
class AgentRecord:
    """A live node agent; its key is leased, so it disappears when the agent stops
    keeping it alive, and then its machines go down."""

    id: str
    machines: tuple[str, ...] = ()
    started_at: float = 0.0
    revision: int = 0


@attrs.frozen(slots=True)
class SchedulerRecord:
    """A scheduler name that has run in this cell (kept after its instances stop), so a
    job naming a scheduler that never existed can be told so."""

    name: str
    policy: str = ""
    revision: int = 0


# -- configuration -------------------------------------------------------------------


@attrs.frozen(slots=True)
class UserQuota:
    """Cook's per-user quota inside a fair scheduler's pool: at most ``count`` running
    tasks (None: no cap on the count) holding at most ``resources`` (a dimension not
    named is not capped; an amount of 0 is a cap of 0)."""

    count: int | None = None
    resources: Resources = attrs.field(factory=Resources)


#: The user entry of ``shares`` and ``quotas`` that stands for every user not named.
DEFAULT_USER = "default"


@attrs.frozen(slots=True)
class SchedulerLimits:
    """Omega §3.4: a scheduler may be limited in the precedence it can wield and in the
    resources it may hold. A fair scheduler also divides what it holds among its users
    as Cook does: ``shares`` (user -> the amount of each resource the user is entitled
    to; ``default`` for users not named) and ``quotas`` (user -> caps on what the user
    may run; ``default`` likewise). The store judges the first two on every claim;
    the fair scheduler applies the last two to its own users."""

    max_precedence: int | None = None
    max_resources: Resources | None = None
    shares: Mapping[str, Resources] = attrs.field(factory=dict)
    quotas: Mapping[str, UserQuota] = attrs.field(factory=dict)

    def share_of(self, user: str) -> Resources | None:
        """The user's configured share (their own entry, else ``default``'s)."""
        return self.shares.get(user, self.shares.get(DEFAULT_USER))

    def quota_of(self, user: str) -> UserQuota | None:
        return self.quotas.get(user, self.quotas.get(DEFAULT_USER))


@attrs.frozen(slots=True)
class CellConfig:
    """The cell's configuration: per-scheduler limits, as written at ``revision``.
    Two configs compare equal when their revisions do (the limits are not compared:
    a record is known by its revision, as the replica's ``verify`` compares them);
    compare ``.limits`` to compare what they say."""

    limits: Mapping[str, SchedulerLimits] = attrs.field(factory=dict, eq=False)
    revision: int = 0

    def limits_for(self, scheduler: str) -> SchedulerLimits | None:
        return self.limits.get(scheduler)


@attrs.frozen(slots=True)
class UsageRecord:
    """The resources one resource-limited scheduler holds (see store.usage)."""

    scheduler: str
    base_revision: int  # the config revision the count starts from
    used: Resources
    revision: int = 0
    # What it held at that revision: a limit set below it leaves the scheduler past its
    # limit until its tasks end, which no claim caused (cellstate/invariants.py).
    base_used: Resources | None = None


# -- transactions --------------------------------------------------------------------


# Alternatives one claim may name. Every machine the store tries is a read of the
# claim (guarded in the etcd transaction and counted against its 128-op lists), so a
# few keep a claim's cost bounded; beyond that a scheduler should decide again.
MAX_FALLBACKS = 4


@attrs.frozen(slots=True)
class Fallback:
    """An alternative machine for a claim, with the sequence number the scheduler saw
    for it. Under coarse detection a fallback is taken only if its machine is still at
    that sequence (exactly as for the claim's first machine); fine detection ignores it."""

    machine: str
    seen_seq: int = 0


@attrs.frozen(slots=True)
class Claim:
    """Place task ``index`` of ``job`` on ``machine``, seen at sequence ``seen_seq``,
    optionally preempting tasks (ids) that run on that machine.

    ``fallbacks``: other machines, in order of preference (at most MAX_FALLBACKS). When
    the claim does not pass on ``machine``, the store tries each in turn within the
    same commit and takes the first that passes; the committed claim names the machine
    taken. A claim that evicts cannot have fallbacks (its victims are on one machine).

    ``moves_from``: the task runs now on that machine and moves to the one taken: its
    old allocation is released in the same write (the task stays running). The old
    machine is a read of the claim, so the move is refused if the task no longer runs
    there."""

    job: str
    index: int
    machine: str
    seen_seq: int = 0
    evict: tuple[str, ...] = ()
    # If given, must equal the job's per-task resources (a check against confused or
    # hostile clients); None means "what the job asks for".
    resources: Resources | None = None
    fallbacks: tuple[Fallback, ...] = ()
    moves_from: str = ""
    # The task id, made with the claim (the commit path asks for it many times). A
    # field, not a functools.cached_property, for the reason given at Machine.
    task: str = attrs.field(init=False, eq=False, repr=False, default=attrs.Factory(
        lambda self: task_id(self.job, self.index), takes_self=True))

    def candidates(self) -> tuple[tuple[str, int], ...]:
        """(machine, seen sequence) in the order the store tries them."""
        if not self.fallbacks:
            return ((self.machine, self.seen_seq),)
        return ((self.machine, self.seen_seq), *((f.machine, f.seen_seq) for f in self.fallbacks))

    def machines(self) -> tuple[str, ...]:
        """Every machine the claim may read: its candidates and the one it moves from."""
        out = tuple(m for m, _ in self.candidates())
        return (*out, self.moves_from) if self.moves_from else out

    def taking(self, machine: str) -> Claim:
        """This claim as committed on ``machine`` (its first choice or a fallback): it
        names that machine and the sequence seen for it, and no fallbacks."""
        if not self.fallbacks:
            return self
        seq = dict(self.candidates())[machine]
        return attrs.evolve(self, machine=machine, seen_seq=seq, fallbacks=())


# A claim is built for every task a policy places: as the records above, slot by slot.
assert tuple(f.name for f in attrs.fields(Claim)) == (
    "job", "index", "machine", "seen_seq", "evict", "resources", "fallbacks", "moves_from",
    "task"), "update trusted_claim for Claim's new fields"
(_set_c_job, _set_c_index, _set_c_machine, _set_c_seen_seq, _set_c_evict, _set_c_resources,
 _set_c_fallbacks, _set_c_moves_from, _set_c_task) = (
    Claim.__dict__[f.name].__set__ for f in attrs.fields(Claim))


def trusted_claim(job: str, index: int, machine: str, seen_seq: int,
                  evict: tuple[str, ...], fallbacks: tuple[Fallback, ...],
                  moves_from: str) -> Claim:
    """``Claim(job, index, machine, seen_seq, evict, fallbacks=..., moves_from=...)``
    of trusted fields (a policy's view builds them from the cell's own records; the
    store checks every claim it is sent all the same), ``resources`` None."""
    c = _new_object(Claim)
    _set_c_job(c, job)
    _set_c_index(c, index)
    _set_c_machine(c, machine)
    _set_c_seen_seq(c, seen_seq)
    _set_c_evict(c, evict)
    _set_c_resources(c, None)
    _set_c_fallbacks(c, fallbacks)
    _set_c_moves_from(c, moves_from)
    _set_c_task(c, f"{job}/{index}")
    return c


@attrs.frozen(slots=True)
class Transaction:
    scheduler: str
    claims: tuple[Claim, ...]
    mode: TxnMode = TxnMode.INCREMENTAL
    detection: Detection = Detection.FINE
    job: str = ""  # when set, every claim must be for this job
    # Set by ``cellstate.validation.check_shape`` once it found the transaction well
    # formed: the record is immutable, so a second check (the runtime's, then the
    # store's, in one process) would find the same. A copy (attrs.evolve) starts over.
    shape_checked: bool = attrs.field(init=False, default=False, eq=False, repr=False)


class Reason(enum.Enum):
    SEQUENCE_CHANGED = "sequence_changed"
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    MACHINE_DOWN = "machine_down"
    UNKNOWN_MACHINE = "unknown_machine"
    CONSTRAINT_VIOLATED = "constraint_violated"
    TASK_ALREADY_PLACED = "task_already_placed"
    PRECEDENCE_TOO_LOW = "precedence_too_low"
    LIMIT_EXCEEDED = "limit_exceeded"
    GANG_ABORTED = "gang_aborted"
    JOB_ENDED = "job_ended"  # the job was killed or abandoned: nothing more is placed
    INVALID = "invalid"


@attrs.frozen(slots=True)
class Rejection:
    claim: Claim
    reason: Reason
    detail: str
    dimension: str = ""  # for insufficient_resources / limit_exceeded


@attrs.frozen(slots=True)
class CommitResult:
    """How one transaction went. ``committed`` holds each committed claim as applied:
    its ``machine`` is the one it took (its first choice or a fallback, see
    :meth:`Claim.taking`); ``fell_back`` lists the tasks whose claim took a fallback."""

    committed: tuple[Claim, ...]
    rejected: tuple[Rejection, ...]
    revision: int  # the store revision after the last write of this commit
    evicted: tuple[str, ...] = ()
    attempts: int = 1  # etcd transactions tried, including guard failures
    fell_back: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.rejected

    def placed_on(self) -> dict[str, str]:
        """Task id -> the machine its committed claim took."""
        return {c.task: c.machine for c in self.committed}

    def reasons(self) -> dict[str, Reason]:
        return {r.claim.task: r.reason for r in self.rejected}


def fallbacks_taken(claims: Iterable[Claim], committed: Iterable[Claim]) -> tuple[str, ...]:
    """The tasks of ``committed`` (claims as applied) that took a machine other than
    their claim's first choice (``claims``: as sent)."""
    first = {c.task: c.machine for c in claims if c.fallbacks}
    if not first:
        return ()
    return tuple(c.task for c in committed if c.task in first and c.machine != first[c.task])

"""Transaction validation: a pure function of a cell reader and a transaction.

``validate(cell, txn)`` decides every claim and says what the store must write; it does
no I/O. The store's backends only read what it needs and write what it returns, guarded
by the revisions of everything it read (``Decision.reads``), so a decision made on
state that changed before the write lands is thrown away and made again.

Claims are checked in order against the cell plus the effects of the claims accepted
before them in the same transaction. The checks, in order (the first that fails names
the reason):

1. the job exists, belongs to the transaction's scheduler, has that task  -> invalid
   the job has no status (killed or abandoned)                          -> job_ended
   a gang job's tasks come in a gang transaction that claims every one
   of them not already running or ended                                 -> invalid
2. the task is not placed or reserved already                           -> task_already_placed
   (a move: the task runs on ``moves_from``, not marked for eviction      -> invalid)
   then, for the claim's machine and each of its fallbacks in turn, until one passes:
3. the machine exists                                                   -> unknown_machine
4. coarse detection only: the machine's sequence number is the one seen -> sequence_changed
5. the machine is up                                                    -> machine_down
6. the scheduler may use the job's precedence                           -> limit_exceeded
7. every victim runs on the machine with lower precedence than the task, -> precedence_too_low
   or with the same precedence and placed by the transaction's scheduler
   (the task's precedence is the job's, or for a MapReduce job's extra
   worker OPPORTUNISTIC_PRECEDENCE)
8. selector, affinity, anti-affinity, tasks per machine                 -> constraint_violated
   (the first claim of a transaction claiming every task of a job whose
   labels match its own affinity founds the group: ``fit.self_affine``)
9. the task fits in what is free after the victims leave                -> insufficient_resources
10. the scheduler stays within its resource limit                       -> limit_exceeded

Checks 5, 8 and 9 are the fit rules of ``cellstate/fit.py``, the one copy the
policies use too, so a policy proposes what this accepts.

A claim with fallbacks is rejected only if every machine it names fails; the reason
is its first machine's, the detail lists each machine's. Every machine tried is a read
of the decision (a fallback taken relies on the machines before it having failed), so
the store's guards cover them all; machines after the one taken are not read.

A move (``Claim.moves_from``) releases the task's allocation on the old machine in the
same decision (the task stays running, now on the machine taken). The old machine is
a read, guarded like a victim's; coarse detection applies to the machine taken, the
old one is checked fine-grained (the task must still run there). A move does not
change what the scheduler holds, so it is not checked against its resource limit. A
move cannot be staged as part of a gang too large for one etcd transaction.

A gang transaction commits only if every claim passes; otherwise the failing claims
keep their reasons and all others are rejected as gang_aborted.

``validate_many`` decides several transactions in order, each against the cell plus
the decisions before it, as if each had been committed on its own before the next.

The job's spec and status are reads of every claim's decision, guarded like the
machine's sequence number: a kill or a resize and a racing claim cannot both succeed.
A gang job is all or nothing whatever the runtime asks for: the store refuses its
claims in an incremental transaction, or any that leave one of its placeable tasks
unclaimed (a task that ended or still runs need not be claimed again, so a gang that
lost one task re-places just that one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from cellstate import fit
from cellstate.cell import CellReader, alloc_placed, machine_used, task_view
from cellstate.errors import TransactionError as TransactionError
from cellstate.model import (
    MAX_FALLBACKS,
    PLACEABLE,
    Allocation,
    CellConfig,
    Claim,
    Detection,
    Fallback,
    GangRecord,
    Job,
    JobStatus,
    Machine,
    MachineState,
    ModelError,
    Reason,
    Rejection,
    Resources,
    TaskEvent,
    TaskRecord,
    TaskState,
    Transaction,
    TxnMode,
    UsageRecord,
    add_each,
    check_amount,
    check_name,
    is_name,
    set_diff,
    split_task_id,
    sum_resources,
    task_id,
    task_precedence,
    trusted_allocation,
    trusted_task_event,
    trusted_task_record,
    with_event,
)

# Enum members the hot paths compare with, as module globals: in Python 3.11 reading
# one off its class goes through EnumType.__getattr__ (~100 ns against ~15 for a global).
_GANG = TxnMode.GANG
_COARSE = Detection.COARSE
_UP = MachineState.UP
_RUNNING = TaskState.RUNNING

_NOTHING = Resources()
MAX_CLAIMS_PER_TRANSACTION = 100_000
# One commit call (CellStore.commit_many, the service's Commit) carries at most this
# many transactions, and all of them together at most MAX_CLAIMS_PER_TRANSACTION claims.
MAX_TRANSACTIONS_PER_COMMIT = 10_000


@attrs.frozen
class Reads:
    """Every record a decision relied on; the store guards each by its revision."""

    machines: frozenset[str]
    tasks: frozenset[str]
    jobs: frozenset[str]
    gangs: frozenset[str]
    usage: frozenset[str]
    statuses: frozenset[str] = frozenset()  # jobs whose (absent) status was relied on


@attrs.frozen
class Decision:
    accepted: tuple[Claim, ...]
    rejected: tuple[Rejection, ...]
    machines: Mapping[str, Machine]  # new records of machines that change
    tasks: Mapping[str, TaskRecord]  # new records of tasks that change
    evicted: tuple[str, ...]
    added: Mapping[str, Resources]  # per scheduler: resources newly held
    removed: Mapping[str, Resources]  # per scheduler: resources freed by evictions
    reads: Reads
    # task -> the machines its claim's decision read (candidates tried, the machine a
    # move leaves): the store's per-machine writes keep them in one nested transaction.
    claim_machines: Mapping[str, frozenset[str]] = attrs.field(factory=dict)
    # Computed on first use (not functools.cached_property: see model.Machine).
    _by_task: Mapping[str, Claim] | None = attrs.field(init=False, default=None, eq=False,
                                                       repr=False)

    @property
    def accepted_by_task(self) -> Mapping[str, Claim]:
        """Task id -> the accepted claim as applied (on the machine it took)."""
        by_task = self._by_task
        if by_task is None:
            by_task = {c.task: c for c in self.accepted}
            object.__setattr__(self, "_by_task", by_task)
        return by_task

    def rejection_of(self, task: str) -> Rejection:
        return next(r for r in self.rejected if r.claim.task == task)


# -- shape -------------------------------------------------------------------------


def check_shape(txn: Transaction, max_claims: int = MAX_CLAIMS_PER_TRANSACTION) -> None:
    """Refuse a transaction that is malformed whatever the cell holds."""
    if max_claims >= MAX_CLAIMS_PER_TRANSACTION and getattr(txn, "shape_checked", False):
        return
    problems: list[str] = []
    try:
        check_name(txn.scheduler, "scheduler")
    except ModelError as e:
        problems.append(str(e))
    # Transactions arrive from other processes: check types the annotations promise.
    mode: object = txn.mode
    detection: object = txn.detection
    if not isinstance(mode, TxnMode):
        problems.append(f"mode {mode!r} is not one of incremental, gang")
    if not isinstance(detection, Detection):
        problems.append(f"detection {detection!r} is not one of fine, coarse")
    claims: object = txn.claims
    if not isinstance(claims, tuple):
        raise TransactionError(f"claims must be a tuple of Claim, not {type(claims).__name__}")
    if not txn.claims:
        raise TransactionError("transaction has no claims")
    if len(txn.claims) > max_claims:
        raise TransactionError(
            f"transaction has {len(txn.claims)} claims, more than the limit of {max_claims}"
        )
    first_claim: dict[str, int] = {}
    cut = False
    plain = True  # every claim so far is a plain one (which evicts nothing)
    names: set[str] = set()  # names found valid in this transaction
    for i, item in enumerate(txn.claims):
        if _plain_claim(item, txn, names):
            # Well typed: its task id (kept, the commit reads it again) is its own.
            tid = item.task
        else:
            plain = False
            problems.extend(_claim_problems(i, item, txn))
            if len(problems) > 20:
                cut = True  # enough to say what is wrong; the rest are not counted
                break
            c: object = item
            if not isinstance(c, Claim):
                continue  # said so above
            tid = f"{c.job}/{c.index}"
        if tid in first_claim:
            problems.append(f"claim {i}: task {tid} is already claimed by claim {first_claim[tid]}")
        else:
            first_claim[tid] = i
    for i, item in enumerate(() if plain else txn.claims):
        victims: object = getattr(item, "evict", ())
        for victim in victims if isinstance(victims, tuple) else ():
            if victim in first_claim:
                problems.append(f"claim {i}: evicts task {victim}, which this transaction claims")
    if problems:
        shown = problems[:20]
        more = (" (and more)" if cut
                else f" (and {len(problems) - 20} more)" if len(problems) > 20 else "")
        raise TransactionError("invalid transaction: " + "; ".join(shown) + more)
    if max_claims <= MAX_CLAIMS_PER_TRANSACTION:
        object.__setattr__(txn, "shape_checked", True)


def _plain_claim(item: object, txn: Transaction, names: set[str]) -> bool:
    """Whether ``item`` is certainly a good claim of the common kind (no resources,
    victims, fallbacks or move; well-typed numbers; valid names), checked quickly;
    False sends it to :func:`_claim_problems`, which says what is wrong, if anything.
    ``names`` holds the names found valid so far (a transaction's claims share their
    job's name)."""
    if type(item) is not Claim:
        return False
    c = item
    # The empty tuple and string are singletons: "is" tells the plain values apart at
    # once (any other value, even an empty one of a subclass, takes the long way).
    if (c.evict is not _EMPTY or c.fallbacks is not _EMPTY or c.moves_from is not _NO_NAME
            or c.resources is not None
            or type(c.index) is not int or c.index < 0
            or type(c.seen_seq) is not int or c.seen_seq < 0
            or (txn.job and c.job != txn.job)):
        return False
    job, machine = c.job, c.machine
    if job not in names:
        if type(job) is not str or not is_name(job):
            return False
        names.add(job)
    if machine not in names:
        if type(machine) is not str or not is_name(machine):
            return False
        names.add(machine)
    return True


_EMPTY: tuple[()] = ()
_NO_NAME = ""


def _claim_problems(i: int, item: object, txn: Transaction) -> list[str]:
    where = f"claim {i}"
    out: list[str] = []
    if not isinstance(item, Claim):
        return [f"{where} is not a Claim"]
    c = item
    for value, what in ((c.job, "job"), (c.machine, "machine")):
        try:
            check_name(value, f"{where}: {what}")
        except ModelError as e:
            out.append(str(e))
    if isinstance(c.index, bool) or not isinstance(c.index, int) or c.index < 0:
        out.append(f"{where}: task index {c.index!r} is not a non-negative integer")
    if isinstance(c.seen_seq, bool) or not isinstance(c.seen_seq, int) or c.seen_seq < 0:
        out.append(f"{where}: seen_seq {c.seen_seq!r} is not a non-negative integer")
    if txn.job and c.job != txn.job:
        out.append(f"{where} is for a task of job {c.job!r}, but the transaction is for job "
                   f"{txn.job!r}")
    if c.resources is not None:
        try:
            if not isinstance(c.resources, Resources):
                raise ModelError("resources must be a Resources vector")
            for name, amount in c.resources.amounts:
                check_amount(amount, f"resources.{name}")
        except ModelError as e:
            out.append(f"{where}: {e}")
    out.extend(_alternative_problems(where, c))
    evict: object = c.evict
    if not isinstance(evict, tuple):
        out.append(f"{where}: evict must be a tuple of task ids")
        return out
    seen: set[str] = set()
    for victim in c.evict:
        try:
            if not isinstance(victim, str):
                raise ModelError(f"{victim!r} is not a task id")
            split_task_id(victim)
        except ModelError as e:
            out.append(f"{where}: evict: {e}")
            continue
        if victim in seen:
            out.append(f"{where}: evicts task {victim} twice")
        seen.add(victim)
    return out


def _alternative_problems(where: str, c: Claim) -> list[str]:
    """Problems with a claim's fallbacks and move, whatever the cell holds."""
    out: list[str] = []
    moves_from: object = c.moves_from
    if not isinstance(moves_from, str):
        out.append(f"{where}: moves_from must be a machine id or empty, got {moves_from!r}")
    elif moves_from:
        try:
            check_name(moves_from, f"{where}: moves_from")
        except ModelError as e:
            out.append(str(e))
        if moves_from == c.machine:
            out.append(f"{where}: moves task {c.job}/{c.index} from {moves_from!r} to the "
                       "same machine")
    fallbacks: object = c.fallbacks
    if not isinstance(fallbacks, tuple):
        return [*out, f"{where}: fallbacks must be a tuple of Fallback"]
    if len(c.fallbacks) > MAX_FALLBACKS:
        out.append(f"{where}: {len(c.fallbacks)} fallbacks, more than the limit of "
                   f"{MAX_FALLBACKS}")
    if c.fallbacks and c.evict:
        out.append(f"{where}: a claim that evicts cannot have fallbacks (its victims run on "
                   "its first machine)")
    named = {c.machine}
    for k, item in enumerate(c.fallbacks[:MAX_FALLBACKS + 1]):
        at = f"{where}: fallbacks[{k}]"
        f: object = item
        if not isinstance(f, Fallback):
            out.append(f"{at} is not a Fallback")
            continue
        try:
            check_name(f.machine, f"{at}: machine")
        except ModelError as e:
            out.append(str(e))
            continue
        if isinstance(f.seen_seq, bool) or not isinstance(f.seen_seq, int) or f.seen_seq < 0:
            out.append(f"{at}: seen_seq {f.seen_seq!r} is not a non-negative integer")
        if f.machine in named:
            out.append(f"{at}: machine {f.machine!r} is named twice by this claim")
        elif f.machine == c.moves_from:
            out.append(f"{at}: machine {f.machine!r} is the one the task moves from")
        named.add(f.machine)
    return out


def check_batch(txns: Sequence[Transaction]) -> None:
    """Refuse a batch of transactions for one commit call if any is malformed (naming
    it by its index) or the batch is over the limits."""
    seq: object = txns
    if not isinstance(seq, list | tuple):
        raise TransactionError("transactions must be a sequence of Transaction")
    if not txns:
        raise TransactionError("no transactions to commit")
    if len(txns) > MAX_TRANSACTIONS_PER_COMMIT:
        raise TransactionError(f"{len(txns)} transactions in one commit, more than the limit "
                               f"of {MAX_TRANSACTIONS_PER_COMMIT}")
    claims = 0
    for i, t in enumerate(txns):
        if not isinstance(t, Transaction):
            raise TransactionError(f"transactions[{i}] is not a Transaction")
        claims += len(t.claims) if isinstance(t.claims, tuple) else 0
        try:
            check_shape(t)
        except TransactionError as e:
            raise TransactionError(f"transactions[{i}]: {e}") from None
    if claims > MAX_CLAIMS_PER_TRANSACTION:
        raise TransactionError(f"{claims} claims in one commit, more than the limit of "
                               f"{MAX_CLAIMS_PER_TRANSACTION}")


# -- decision ------------------------------------------------------------------------


class _Work:
    """The cell plus the effects of the claims accepted so far in this transaction."""

    def __init__(
        self,
        cell: CellReader,
        txn: Transaction,
        gang: str,
        seq_rewrites: Mapping[str, tuple[int, int]],
    ) -> None:
        self.cell = cell
        self.txn = txn
        self.gang = gang  # set when staging a large gang: placements are staged holds
        self.seq_rewrites = seq_rewrites
        self.machines: dict[str, Machine] = {}
        self.tasks: dict[str, TaskRecord] = {}
        self.added: dict[str, Resources] = {}
        # What accepted claims add to the scheduler's holding since ``added`` was last
        # brought up to date (:meth:`added_by`): summed when read, in the same order.
        self.adding: list[Resources] = []
        self.removed: dict[str, Resources] = {}
        self.evicted: list[str] = []
        self.read_machines: set[str] = set()
        self.read_tasks: set[str] = set()
        self.read_jobs: set[str] = set()
        self.read_gangs: set[str] = set()
        self.read_usage: set[str] = set()
        self.read_statuses: set[str] = set()
        self.claim_reads: set[str] = set()  # machines read by the claim being decided
        self.founders: frozenset[str] = frozenset()  # claims that found affinity groups
        # Jobs whose claims passed the job checks (exists, this scheduler's, no status).
        self.jobs_passed: dict[str, Job] = {}
        self.limits = cell.config.limits_for(txn.scheduler)
        # The job and machine of the claim that just passed its checks, for _apply.
        self.taking: tuple[Job, Machine] | None = None
        self.at = 0.0  # the commit's time, for the records' placed_at and history

    def added_by(self, scheduler: str) -> Resources:
        """What ``scheduler`` holds more after the claims accepted so far (``added``
        brought up to date: every claim adds to the transaction's scheduler)."""
        if self.adding:
            s = self.txn.scheduler
            self.added[s] = add_each(self.added.get(s, _NOTHING), self.adding)
            self.adding.clear()
        return self.added.get(scheduler, _NOTHING)

    def machine(self, mid: str) -> Machine | None:
        self.read_machines.add(mid)
        self.claim_reads.add(mid)
        m = self.machines.get(mid)
        if m is None:
            m = self.cell.machines.get(mid)
            if m is not None and m.has_tags:
                # Staged records on the machine are read through their gangs.
                self.read_gangs |= m.gang_tags
        return m

    @property
    def gangs(self) -> Mapping[str, GangRecord]:
        return self.cell.gangs


def validate(
    cell: CellReader,
    txn: Transaction,
    *,
    staging_gang: str = "",
    seq_rewrites: Mapping[str, tuple[int, int]] | None = None,
    shape_checked: bool = False,
    gang_coverage: bool = True,
    founders: frozenset[str] | None = None,
    at: float = 0.0,
) -> Decision:
    """Decide ``txn`` against ``cell``. Raises TransactionError for a malformed one.

    ``at`` is the commit's time (the committing store's clock; 0: not known): a placed
    task's ``placed_at`` and the events written into its and its victims' histories.

    ``staging_gang`` is set by the store when it stages a gang too large for one etcd
    transaction: accepted placements are then written as holds tagged with the gang,
    and evictions as marks, both of which only take effect when the gang commits.

    ``seq_rewrites`` maps a machine to (sequence before, sequence after) the store's own
    writes of earlier parts of the same transaction, so that under coarse detection a
    transaction split over several etcd transactions does not conflict with itself.

    ``gang_coverage=False`` skips the check that a gang job's claims cover all its
    placeable tasks: the store sets it when it validates one part of a gang it split,
    having checked the whole transaction first, and passes ``founders`` (the claims that
    found affinity groups, :func:`founding_claims`) as the whole transaction has them."""
    if not shape_checked:
        check_shape(txn)
    w = _Work(cell, txn, staging_gang, seq_rewrites or {})
    w.at = at
    w.founders = founding_claims(cell, txn) if founders is None else founders
    accepted: list[Claim] = []
    rejected: list[Rejection] = []
    claim_machines: dict[str, frozenset[str]] = {}
    refused = _gang_job_rules(cell, txn, gang_coverage, w.read_tasks)
    for claim in txn.claims:
        w.claim_reads = set()
        refusal = refused.get(claim.task)
        if refusal is not None:
            # Refused on the job's record and on its having no verdict: guard both.
            w.read_jobs.add(claim.job)
            w.read_statuses.add(claim.job)
        outcome = refusal if refusal is not None else _check_claim(w, claim)
        if isinstance(outcome, str):
            _apply(w, claim)
            accepted.append(claim.taking(outcome))
        else:
            rejected.append(outcome)
        claim_machines[claim.task] = frozenset(w.claim_reads)
    reads = Reads(
        frozenset(w.read_machines),
        frozenset(w.read_tasks),
        frozenset(w.read_jobs),
        frozenset(w.read_gangs),
        frozenset(w.read_usage),
        frozenset(w.read_statuses),
    )
    if txn.mode is _GANG and rejected:
        failed = {r.claim.task for r in rejected}
        aborted = tuple(
            Rejection(c, Reason.GANG_ABORTED, f"gang aborted: {len(rejected)} claim(s) failed, "
                      f"first {rejected[0].claim.task}: {rejected[0].detail}")
            for c in txn.claims
            if c.task not in failed
        )
        ordered = {r.claim.task: r for r in (*rejected, *aborted)}
        return Decision(
            (), tuple(ordered[c.task] for c in txn.claims), {}, {}, (), {}, {}, reads,
            claim_machines,
        )
    w.added_by(txn.scheduler)
    return Decision(
        tuple(accepted),
        tuple(rejected),
        w.machines,
        w.tasks,
        tuple(w.evicted),
        w.added,
        w.removed,
        reads,
        claim_machines,
    )


def validate_many(
    cell: CellReader,
    txns: Sequence[Transaction],
    *,
    seq_rewrites: Sequence[Mapping[str, tuple[int, int]]] | None = None,
    shape_checked: bool = False,
    at: float = 0.0,
) -> list[Decision]:
    """Decide ``txns`` in order, each against ``cell`` plus the decisions before it,
    with the same outcome as committing each on its own before deciding the next (so a
    batch of one transaction per job is answered exactly as separate commits would be).
    ``seq_rewrites[i]`` is ``validate``'s ``seq_rewrites`` for ``txns[i]``."""
    out: list[Decision] = []
    reader: CellReader = cell
    overlay: _Overlay | None = None
    for i, t in enumerate(txns):
        d = validate(reader, t, seq_rewrites=seq_rewrites[i] if seq_rewrites else None,
                     shape_checked=shape_checked, at=at)
        out.append(d)
        if i + 1 < len(txns) and (d.machines or d.tasks):
            if overlay is None:
                reader = overlay = _Overlay(cell)
            overlay.add(d)
    return out


class _Overlay:
    """A cell reader: ``cell`` with decisions applied that are not written yet.

    Machines those decisions change read at sequence -1, a sequence no scheduler saw:
    under coarse detection a later transaction's claim on them conflicts, as it would
    after a separate commit had moved the machine's sequence."""

    def __init__(self, cell: CellReader) -> None:
        self.cell = cell
        self._machines: dict[str, Machine] = {}
        self._tasks: dict[str, TaskRecord] = {}
        self._usage: dict[str, object] = {}
        self.machines: Mapping[str, Machine] = _Layered(self._machines, cell.machines)
        self.tasks: Mapping[str, TaskRecord] = _Layered(self._tasks, cell.tasks)
        self.usage: Mapping[str, object] = _Layered(self._usage, cell.usage)

    @property
    def revision(self) -> int:
        return self.cell.revision

    @property
    def config(self) -> CellConfig:
        return self.cell.config

    @property
    def jobs(self) -> Mapping[str, Job]:
        return self.cell.jobs

    @property
    def gangs(self) -> Mapping[str, GangRecord]:
        return self.cell.gangs

    @property
    def statuses(self) -> Mapping[str, JobStatus]:
        return self.cell.statuses

    def add(self, d: Decision) -> None:
        for mid, m in d.machines.items():
            self._machines[mid] = m.with_seq(-1)
        self._tasks.update(d.tasks)
        for s in set(d.added) | set(d.removed):
            rec = self.usage.get(s)
            if isinstance(rec, UsageRecord):
                used = rec.used + d.added.get(s, Resources()) - d.removed.get(s, Resources())
                self._usage[s] = attrs.evolve(rec, used=used)


_ABSENT = object()


class _Layered(Mapping[str, Any]):
    """``top`` over ``base``: a key in ``top`` reads from it, any other from ``base``
    (``collections.ChainMap`` of two, without its generator per lookup: a machine read
    for every claim of a batch's second and later transactions)."""

    __slots__ = ("_base", "_top")

    def __init__(self, top: Mapping[str, Any], base: Mapping[str, Any]) -> None:
        self._top = top
        self._base = base

    def get(self, key: str, default: Any = None) -> Any:
        value = self._top.get(key, _ABSENT)
        return self._base.get(key, default) if value is _ABSENT else value

    def __getitem__(self, key: str) -> Any:
        value = self._top.get(key, _ABSENT)
        return self._base[key] if value is _ABSENT else value

    def __contains__(self, key: object) -> bool:
        return key in self._top or key in self._base

    def __iter__(self) -> Iterator[str]:
        yield from self._top
        for key in self._base:
            if key not in self._top:
                yield key

    def __len__(self) -> int:
        return len(self._top) + sum(1 for key in self._base if key not in self._top)


def _reject(claim: Claim, reason: Reason, detail: str, dimension: str = "") -> Rejection:
    return Rejection(claim, reason, detail, dimension)


def _gang_job_rules(cell: CellReader, txn: Transaction, coverage: bool,
                    reads: set[str]) -> dict[str, Rejection]:
    """Rejections of claims for gang jobs that break all-or-nothing, by task id.

    Coverage relies on the states of the job's unclaimed tasks that have records: they
    join ``reads`` (the decision's task reads), so a decision made on a stale view of
    them is made again on fresh ones. (A task lost just after a commit that covered it
    leaves the cell as if lost just after; but a refusal must give the reason the
    fresh cell gives.) Tasks never placed have no record and cost no guard."""
    jobs = {txn.job} if txn.job else {c.job for c in txn.claims}
    # A job with a verdict (killed, abandoned) takes no placement at all: its claims are
    # refused as job_ended by the claim check, whatever they cover or the mode.
    gang_jobs = {j for j in jobs if (job := cell.jobs.get(j)) is not None and job.gang
                 and j not in cell.statuses}
    if not gang_jobs:
        return {}  # the common case, checked cheaply
    by_job: dict[str, list[Claim]] = {}
    for c in txn.claims:
        if c.job in gang_jobs:
            by_job.setdefault(c.job, []).append(c)
    out: dict[str, Rejection] = {}
    for jid, claims in by_job.items():
        job = cell.jobs[jid]
        if txn.mode is not TxnMode.GANG:
            detail = (f"job {jid!r} is a gang: its tasks are claimed all together in a gang "
                      "transaction, not an incremental one")
        elif coverage and (missing := _unclaimed(cell, job, {c.index for c in claims}, reads)):
            detail = (f"job {jid!r} is a gang: the transaction leaves {len(missing)} of its "
                      f"placeable tasks unclaimed (first: task {missing[0]})")
        else:
            continue
        for c in claims:
            out[c.task] = _reject(c, Reason.INVALID, detail)
    return out


def founding_claims(cell: CellReader, txn: Transaction) -> frozenset[str]:
    """The claims (task ids) that found an affinity group (``fit.self_affine``): for each
    job whose labels match its own affinity selector and whose every task this
    transaction claims, its first claim. Each claimed task must be pending (check 2),
    so no task of such a job runs anywhere: the group starts where that claim lands."""
    if txn.job:
        # Every claim is for that job (check_shape): the common case, decided at once.
        job = cell.jobs.get(txn.job)
        if job is None or not fit.self_affine(job):
            return frozenset()
    by_job: dict[str, list[Claim]] = {}
    for c in txn.claims:
        by_job.setdefault(c.job, []).append(c)
    out = []
    for jid, claims in by_job.items():
        job = cell.jobs.get(jid)
        if (job is not None and fit.self_affine(job) and len(claims) == job.task_count
                and {c.index for c in claims} == set(range(job.task_count))):
            out.append(claims[0].task)
    return frozenset(out)


def _unclaimed(cell: CellReader, job: Job, claimed: set[int], reads: set[str]) -> list[int]:
    """Indices of ``job``'s tasks that could be claimed but are not in ``claimed``;
    adds the tasks whose records it read to ``reads``."""
    out = []
    for i in range(job.task_count):
        if i in claimed:
            continue
        tid = task_id(job.id, i)
        if cell.tasks.get(tid) is None:
            out.append(i)
            continue
        reads.add(tid)
        if task_view(cell, tid).state in PLACEABLE:
            out.append(i)
    return out


def _check_claim(w: _Work, claim: Claim) -> Rejection | str:
    """The claim's rejection, or the machine it takes."""
    job = w.jobs_passed.get(claim.job)
    if job is None:
        rejection_or_job = _check_job(w, claim)
        if isinstance(rejection_or_job, Rejection):
            return rejection_or_job
        job = rejection_or_job
    if claim.index >= job.task_count:
        return _reject(
            claim,
            Reason.INVALID,
            f"job {job.id!r} has {job.task_count} tasks; there is no task {claim.index}",
        )
    if claim.resources is not None and claim.resources != job.task_resources:
        return _reject(
            claim,
            Reason.INVALID,
            f"claim asks for {claim.resources}, but job {job.id!r} tasks need "
            f"{job.task_resources}",
        )
    rejection = _check_task(w, claim)
    if rejection is not None:
        return rejection
    if not claim.fallbacks:
        first = _check_machine(w, claim, job, claim.machine, claim.seen_seq)
        return claim.machine if first is None else first
    failed: list[Rejection] = []
    for mid, seen in claim.candidates():
        rejection = _check_machine(w, claim, job, mid, seen)
        if rejection is None:
            return mid
        failed.append(rejection)
    first = failed[0]
    tried = "; ".join(r.detail for r in failed[1:])
    return attrs.evolve(first, detail=f"{first.detail}; fallbacks: {tried}")


def _check_job(w: _Work, claim: Claim) -> Job | Rejection:
    """Check 1's job part: the claim's job exists, is the transaction's scheduler's
    and has no status. Reads the job and its status; a job that passes is kept in
    ``w.jobs_passed``, so its other claims (read the same records, which do not change
    during the decision) skip this."""
    txn = w.txn
    w.read_jobs.add(claim.job)
    job = w.cell.jobs.get(claim.job)
    if job is None:
        return _reject(claim, Reason.INVALID, f"unknown job {claim.job!r}")
    if job.scheduler != txn.scheduler:
        return _reject(
            claim,
            Reason.INVALID,
            f"job {job.id!r} belongs to scheduler {job.scheduler!r}, not {txn.scheduler!r}",
        )
    w.read_statuses.add(claim.job)
    status = w.cell.statuses.get(claim.job)
    if status is not None:
        return _reject(
            claim, Reason.JOB_ENDED, f"job {job.id!r} was {status.state.value}: {status.reason}"
        )
    w.jobs_passed[claim.job] = job
    return job


def _check_machine(w: _Work, claim: Claim, job: Job, mid: str, seen_seq: int
                   ) -> Rejection | None:
    """Checks 3-10 of the claim on one of its candidate machines."""
    txn = w.txn
    m = w.machine(mid)
    if m is None:
        return _reject(claim, Reason.UNKNOWN_MACHINE, f"unknown machine {mid!r}")
    if (
        txn.detection is _COARSE
        and (committed := w.cell.machines.get(mid)) is not None
        and committed.seq != seen_seq
        and w.seq_rewrites.get(m.id) != (seen_seq, committed.seq)
    ):
        return _reject(
            claim,
            Reason.SEQUENCE_CHANGED,
            f"machine {m.id!r} is at sequence {committed.seq}, the claim saw {seen_seq}",
        )
    if m.state is not _UP:
        miss = fit.machine_up(m)
        assert miss is not None
        return _reject(claim, miss.reason, miss.detail)
    limits = w.limits
    if (
        limits is not None
        and limits.max_precedence is not None
        and job.precedence > limits.max_precedence
    ):
        return _reject(
            claim,
            Reason.LIMIT_EXCEEDED,
            f"job {job.id!r} has precedence {job.precedence}, above scheduler "
            f"{txn.scheduler!r}'s limit of {limits.max_precedence}",
        )
    victims, rejection = _check_victims(w, claim, job, m) if claim.evict else ([], None)
    if rejection is not None:
        return rejection
    miss = fit.constraints(job, m, w.gangs, w.cell.jobs, victims, w.gang,
                           claim.task in w.founders)
    if miss is not None:
        return _reject(claim, miss.reason, miss.detail)
    rejection = _check_resources(w, claim, job, m, victims)
    if rejection is None:
        w.taking = (job, m)
    return rejection


def _check_task(w: _Work, claim: Claim) -> Rejection | None:
    tid = claim.task
    w.read_tasks.add(tid)
    if tid in w.tasks:
        # Preempted earlier in this same transaction: not claimable within it.
        return _reject(claim, Reason.TASK_ALREADY_PLACED, f"task {tid} changed earlier in this "
                       "transaction")
    rec = w.cell.tasks.get(tid)
    if rec is None and not claim.moves_from:
        return None  # pending, never placed: the common case (task_view would say so)
    view = task_view(w.cell, tid)
    if view.reserved_by:
        w.read_gangs.add(view.reserved_by)
        return _reject(
            claim,
            Reason.TASK_ALREADY_PLACED,
            f"task {tid} is reserved by gang {view.reserved_by} in flight",
        )
    if rec is not None and rec.gang:
        w.read_gangs.add(rec.gang)
    if claim.moves_from:
        return _check_move(w, claim, view.state, view.machine)
    if view.state not in (TaskState.PENDING, TaskState.LOST, TaskState.PREEMPTED):
        where = f" on machine {view.machine!r}" if view.machine else ""
        return _reject(
            claim, Reason.TASK_ALREADY_PLACED, f"task {tid} is {view.state.value}{where}"
        )
    return None


def _check_move(w: _Work, claim: Claim, state: TaskState, machine: str) -> Rejection | None:
    """A move needs the task running on the machine it names (read, so guarded)."""
    tid, old = claim.task, claim.moves_from
    if w.gang:
        return _reject(claim, Reason.INVALID, f"cannot move task {tid}: a move cannot be part "
                       "of a gang too large for one etcd transaction")
    if state is not TaskState.RUNNING or machine != old:
        where = f" on machine {machine!r}" if machine else ""
        return _reject(claim, Reason.INVALID, f"cannot move task {tid} from {old!r}: it is "
                       f"{state.value}{where}")
    m = w.machine(old)
    a = m.allocations.get(tid) if m is not None else None
    if a is None or not alloc_placed(a, w.gangs):
        return _reject(claim, Reason.INVALID,
                       f"cannot move task {tid}: it does not run on {old!r}")
    if a.evicted_by:
        return _reject(claim, Reason.INVALID, f"cannot move task {tid}: gang {a.evicted_by} "
                       "in flight evicts it")
    return None


def _check_victims(
    w: _Work, claim: Claim, job: Job, m: Machine
) -> tuple[list[Allocation], Rejection | None]:
    victims: list[Allocation] = []
    for victim in claim.evict:
        w.read_tasks.add(victim)
        a = m.allocations.get(victim)
        if a is None or not alloc_placed(a, w.gangs) or a.evicted_by:
            return victims, _reject(
                claim, Reason.INVALID, f"cannot evict {victim}: it does not run on {m.id!r}"
            )
        precedence = task_precedence(job, claim.index)
        # A scheduler may reorder its own work at one precedence (fair share among its
        # users); what others placed it may only evict from below.
        own = a.scheduler == w.txn.scheduler
        if a.precedence > precedence or (a.precedence == precedence and not own):
            return victims, _reject(
                claim,
                Reason.PRECEDENCE_TOO_LOW,
                f"cannot evict {victim} (precedence {a.precedence}, scheduler "
                f"{a.scheduler!r}) for task {claim.task} (precedence {precedence}): victims "
                "must have lower precedence, or the same and be the scheduler's own",
            )
        victims.append(a)
    return victims, None


def _check_resources(
    w: _Work, claim: Claim, job: Job, m: Machine, victims: list[Allocation]
) -> Rejection | None:
    freed = sum_resources(v.resources for v in victims) if victims else _NOTHING
    miss = fit.resources(job.task_resources, m, machine_used(m, w.gangs, w.gang), freed)
    if miss is not None:
        return _reject(claim, miss.reason, miss.detail, miss.dimension)
    if claim.moves_from or w.limits is None or w.limits.max_resources is None:
        # A move does not change what the scheduler holds; without a resource limit
        # there is nothing to check.
        return None
    # What the scheduler's own victims hold comes back to it as the task takes it.
    own = sum_resources(v.resources for v in victims if v.scheduler == w.txn.scheduler)
    return _check_usage_limit(w, claim, job.task_resources, own)


def _check_usage_limit(w: _Work, claim: Claim, need: Resources,
                       returned: Resources | None = None) -> Rejection | None:
    scheduler = w.txn.scheduler
    limits = w.limits
    if limits is None or limits.max_resources is None:
        return None
    w.read_usage.add(scheduler)
    record = w.cell.usage.get(scheduler)
    if not isinstance(record, UsageRecord):
        return _reject(
            claim,
            Reason.LIMIT_EXCEEDED,
            f"usage of scheduler {scheduler!r} is not known yet; retry",
        )
    held = record.used + w.added_by(scheduler) - w.removed.get(
        scheduler, Resources()
    ) - (returned or Resources())
    miss = fit.quota(held, need, limits.max_resources, scheduler)
    if miss is not None:
        return _reject(claim, miss.reason, miss.detail, miss.dimension)
    return None


def _apply(w: _Work, claim: Claim) -> None:
    """Apply an accepted claim on the machine it took (``w.taking``)."""
    assert w.taking is not None
    job, m = w.taking
    if claim.moves_from:
        _leave(w, claim)
    # Read once: a property, asked three times below.
    tagged = m.has_tags
    allocs = _without_void_holds(w, m) if tagged else dict(m.allocations)
    settled = m.settled_used
    for victim in claim.evict:
        a = allocs[victim]
        if not a.gang and not a.evicted_by:
            settled = settled - a.resources
        if w.gang:
            allocs[victim] = attrs.evolve(a, evicted_by=w.gang)
        else:
            del allocs[victim]
            # Its record as this cell knows it (a store's view may not hold it: the
            # history then starts here).
            old = w.cell.tasks.get(victim)
            w.tasks[victim] = TaskRecord(
                *split_task_id(victim), TaskState.PREEMPTED, m.id, a.scheduler,
                placed_at=old.placed_at if old is not None else 0.0,
                history=with_event(old, TaskEvent(w.at, TaskState.PREEMPTED, m.id,
                                                  w.txn.scheduler,
                                                  f"preempted for {claim.task}")))
        w.removed[a.scheduler] = w.removed.get(a.scheduler, _NOTHING) + a.resources
        w.evicted.append(victim)
    allocs[claim.task] = trusted_allocation(
        claim.task, job.id, w.txn.scheduler, task_precedence(job, claim.index),
        job.task_resources, w.gang
    )
    if not w.gang:
        settled = settled + job.task_resources
    # Tagged once staging (the hold is), untagged if the machine was and stays so.
    tags = True if w.gang else (None if tagged else False)
    # The jobs here, when the fit rules have listed them (a policy's next look at the
    # machine asks again); victims, and holds of aborted gangs dropped above, may take
    # a job away: then they are listed anew.
    jobs = None if claim.evict or tagged else m.known_job_ids()
    if jobs is not None and job.id not in jobs:
        jobs = jobs | {job.id}
    # Calm stays calm with one more task of a job that keeps no one off (the fit rules
    # read the job's spec, so it is known).
    calm = m.calm and not job.constraints.anti_affinity
    new = w.machines[m.id] = m.with_allocations(allocs, settled, tags, jobs, calm)
    if not tagged:  # else void holds may have gone too: no list of what changed
        set_diff(new, m, (claim.task, *claim.evict))
    # A move starts the task again on its new machine (its agent there starts it), so
    # its run starts now too.
    old = w.cell.tasks.get(claim.task)
    why = f"moved from {claim.moves_from}" if claim.moves_from else "placed"
    w.tasks[claim.task] = trusted_task_record(
        job.id, claim.index, _RUNNING, m.id, w.txn.scheduler, w.gang, w.at,
        with_event(old, trusted_task_event(w.at, _RUNNING, m.id, w.txn.scheduler, why)),
    )
    w.adding.append(job.task_resources)


def _without_void_holds(w: _Work, m: Machine) -> dict[str, Allocation]:
    allocs = dict(m.allocations)
    if m.has_tags:
        # Holds of aborted gangs are dropped whenever a machine is rewritten anyway.
        for tid, a in list(allocs.items()):
            if a.gang and a.gang not in w.gangs and a.gang != w.gang:
                del allocs[tid]
    return allocs


def _leave(w: _Work, claim: Claim) -> None:
    """Release a moving task's allocation on the machine it leaves."""
    m = w.machine(claim.moves_from)
    assert m is not None
    allocs = _without_void_holds(w, m)
    a = allocs.pop(claim.task)
    settled = m.settled_used if a.gang else m.settled_used - a.resources
    new = w.machines[m.id] = m.with_allocations(allocs, settled,
                                                None if m.has_tags else False, calm=m.calm)
    if not m.has_tags:
        set_diff(new, m, (claim.task,))
    w.removed[a.scheduler] = w.removed.get(a.scheduler, _NOTHING) + a.resources

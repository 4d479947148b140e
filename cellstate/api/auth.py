"""Who is calling, and what they may do: the cellstate server's authorization matrix.

Every caller has an :class:`Identity`, ``kind:name``, taken from the common name of the
client certificate it presented over mutual TLS (the server accepts only certificates
its CA signed, so a name cannot be claimed without the CA's key):

* ``operator:NAME``: a person who runs the cell; may do anything a user may, to any job,
  and cordon, uncordon and drain machines.
* ``user:NAME``: submits, kills and resizes jobs it owns (``owner`` = NAME).
* ``submitter:NAME``: submits jobs, dated as it says (a workload generator or a trace
  replay), at precedences a user may ask for, for the owners the server's
  ``[auth.submitters]`` table allows it (by default only itself); nothing else.
* ``scheduler:NAME``: the scheduler NAME (all its instances share the identity);
  registers its instances, commits claims for jobs that name it, reports why they
  wait, abandons and resizes them (killing is their owner's).
* ``agent:NAME``: the node agent NAME; registers the machines it runs and reports the
  tasks that ran on them.
* ``server:NAME``: a cellstate server's own certificate; forwards commits to the
  commit leader (already checked by the forwarding server), nothing else.

Everybody may read (sync, status, jobs, machines). :class:`Authorizer` holds the rules;
docs/security.md draws the whole matrix. A refusal raises :class:`Unauthenticated` (no
identity) or :class:`PermissionDenied` (an identity not allowed this), each with a
message naming the identity, the operation and the rule; the server turns them into
UNAUTHENTICATED and PERMISSION_DENIED. Checks read the server's synced copy of the
cell: what they guard (a job's owner and scheduler, a machine's agent) never changes
once written, so a copy a moment old decides the same.

A server without TLS (``--insecure``) cannot know who calls: every caller is
:data:`INSECURE`, an operator, and the matrix is off. Two rules hold in every mode,
as they are about the cell, not the caller: a job in a final state cannot change, and
(with TLS) a scheduler name the cell's configuration does not list has no rights at
all.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import attrs
import grpc

from cellstate.cell import CellSnapshot
from cellstate.errors import StoreError
from cellstate.keys import Keyspace, metrics_prefix, pending_prefix
from cellstate.model import Job, Machine, ModelError, Transaction, check_name, split_task_id


class Kind(enum.Enum):
    OPERATOR = "operator"
    USER = "user"
    SUBMITTER = "submitter"
    SCHEDULER = "scheduler"
    AGENT = "agent"
    SERVER = "server"


@attrs.frozen
class Identity:
    kind: Kind
    name: str

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"


INSECURE = Identity(Kind.OPERATOR, "insecure")
KINDS = ", ".join(k.value for k in Kind)


def parse_identity(text: str, where: str = "identity") -> Identity:
    """``kind:name`` as written in a certificate's common name or on a command line."""
    kind, sep, name = text.partition(":")
    if not sep:
        raise ModelError(f"{where}: {text!r} is not kind:name (kind one of {KINDS})")
    try:
        k = Kind(kind)
    except ValueError:
        raise ModelError(f"{where}: {kind!r} is not one of {KINDS}") from None
    return Identity(k, check_name(name, f"{where} name"))


class Unauthenticated(Exception):
    """The caller has no identity the server accepts."""


class PermissionDenied(Exception):
    """The caller's identity may not do this."""


class FinalState(StoreError):
    """The job has ended; nothing about it changes any more."""


# Job states from which nothing changes. A kill of a killed job is not refused: it
# changes nothing, and a resent kill (its first attempt timed out) must succeed; any
# other change to a killed job (a resize, an abandonment) is.
FINAL_STATES = frozenset({"finished", "failed", "abandoned", "killed"})
DEFAULT_USER_MAX_PRECEDENCE = 99


@attrs.frozen
class AuthPolicy:
    """``enabled``: identities come from client certificates and the matrix holds
    (false only for a plaintext server). ``user_max_precedence``: the highest
    precedence a user's job may ask for (operators' jobs have no such cap; a
    scheduler's own ``max_precedence`` caps both)."""

    enabled: bool = False
    user_max_precedence: int = DEFAULT_USER_MAX_PRECEDENCE
    # submitter name -> the owners its jobs may name besides itself ("*": any). An
    # agent runs a job's command for the owners it allows (--allow-command-from), so
    # naming an owner is acting as that owner: by default a submitter names only itself.
    submitter_owners: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def owners_of(self, submitter: str) -> tuple[str, ...]:
        """The owners ``submitter``'s jobs may name: itself and those listed for it."""
        return (submitter, *dict(self.submitter_owners).get(submitter, ()))


def identify(context: grpc.ServicerContext, policy: AuthPolicy,
             revoked: Callable[[bytes], int | None] | None = None) -> Identity:
    """The caller's identity, from the common name of its verified client certificate;
    ``revoked`` tells a revoked certificate's serial (cellstate/api/revocation.py)."""
    if not policy.enabled:
        return INSECURE
    auth = context.auth_context()
    names = auth.get("x509_common_name") or []
    if not names:
        raise Unauthenticated("no client certificate: this server takes calls over mutual "
                              "TLS only (`omega certs` makes certificates)")
    text = names[0].decode(errors="replace")
    try:
        who = parse_identity(text, "client certificate common name")
    except ModelError as e:
        raise Unauthenticated(f"{e}; no omega identity, so no rights") from None
    if revoked is not None:
        pem = (auth.get("x509_pem_cert") or [b""])[0]
        if not pem:
            raise Unauthenticated(f"{who}: the server cannot read the client certificate "
                                  "to check it against the revocation list")
        serial = revoked(pem)
        if serial is not None:
            raise Unauthenticated(f"the certificate of {who} (serial {serial:x}) is revoked: "
                                  "the cell's certificate revocation list names it")
    return who


class Authorizer:
    """The matrix, over the server's synced copy of the cell (``snapshot``)."""

    def __init__(self, policy: AuthPolicy, snapshot: Callable[[], CellSnapshot],
                 revoked: Callable[[bytes], int | None] | None = None) -> None:
        self.policy = policy
        self._snapshot = snapshot
        self._revoked = revoked

    def caller(self, context: grpc.ServicerContext) -> Identity:
        return identify(context, self.policy, self._revoked)

    def _only(self, who: Identity, kinds: Sequence[Kind], what: str) -> None:
        if who.kind not in kinds:
            allowed = " and ".join(k.value + "s" for k in kinds)
            raise PermissionDenied(f"{who} may not {what}: only {allowed} may")

    # -- reads -----------------------------------------------------------------------

    def read(self, context: grpc.ServicerContext) -> Identity:
        """Every identity may read the cell (syncs, status, jobs, machines)."""
        return self.caller(context)

    # -- jobs ------------------------------------------------------------------------

    def with_owner(self, context: grpc.ServicerContext, doc: object) -> object:
        """A job spec without an owner, submitted by a user or a submitter, is the
        caller's."""
        who = self.caller(context)
        if (who.kind in (Kind.USER, Kind.SUBMITTER) and isinstance(doc, dict)
                and "owner" not in doc):
            return {**doc, "owner": who.name}
        return doc

    def submit(self, context: grpc.ServicerContext, job: Job) -> None:
        who = self.caller(context)
        if who is INSECURE:
            return
        self._only(who, (Kind.USER, Kind.OPERATOR, Kind.SUBMITTER), f"submit job {job.id}")
        limits = self._known_scheduler(who, job.scheduler, f"submit job {job.id}")
        if who.kind is Kind.SUBMITTER:
            self._submitter_rules(who, job)
        if who.kind is Kind.USER:
            if job.owner != who.name:
                raise PermissionDenied(
                    f"{who} may submit only jobs it owns: job {job.id} names owner "
                    f"{job.owner!r}, not {who.name!r}")
            if job.submitted_at:
                # Schedulers queue jobs by it: a time in the past would jump the queue.
                raise PermissionDenied(
                    f"{who} may not set submitted_at of job {job.id}: the server stamps "
                    "the time a user's job arrives (schedulers queue jobs by it)")
            if job.precedence > self.policy.user_max_precedence:
                raise PermissionDenied(
                    f"{who} may not submit job {job.id} at precedence {job.precedence}: "
                    f"users' jobs go up to {self.policy.user_max_precedence}")
        if limits is not None and job.precedence > limits:
            raise PermissionDenied(
                f"{who} may not submit job {job.id} at precedence {job.precedence}: "
                f"scheduler {job.scheduler!r}'s jobs go up to {limits}")

    def _submitter_rules(self, who: Identity, job: Job) -> None:
        if job.precedence > self.policy.user_max_precedence:
            raise PermissionDenied(
                f"{who} may not submit job {job.id} at precedence {job.precedence}: "
                f"submitters' jobs go up to {self.policy.user_max_precedence}, as users' do")
        owners = self.policy.owners_of(who.name)
        if job.owner not in owners and "*" not in owners:
            raise PermissionDenied(
                f"{who} may not submit job {job.id} for owner {job.owner!r}: it may name "
                f"only {', '.join(repr(o) for o in owners)} ([auth.submitters] in the "
                "server's config lists the owners a submitter may name)")

    def _known_scheduler(self, who: Identity, scheduler: str, what: str) -> int | None:
        """The scheduler's max_precedence (None: no cap); refused if the cell's config
        does not list it: only operators create scheduler names."""
        config = self._snapshot().config
        if scheduler not in config.limits:
            known = ", ".join(sorted(config.limits)) or "none"
            raise PermissionDenied(
                f"{who} may not {what}: scheduler {scheduler!r} is not one of this cell's "
                f"schedulers ({known}); an operator adds it ([limits.{scheduler}] in the "
                "server's config)")
        return config.limits[scheduler].max_precedence

    def change_job(self, context: grpc.ServicerContext, job_id: str, what: str,
                   scheduler_may: bool) -> None:
        """Kill, abandon or resize ``job_id``: its owner (a user), any operator, and,
        if ``scheduler_may``, the scheduler the job names."""
        who = self.caller(context)
        if who is INSECURE:
            return
        kinds = (Kind.USER, Kind.OPERATOR, *((Kind.SCHEDULER,) if scheduler_may else ()))
        self._only(who, kinds, f"{what} job {job_id}")
        job = self._snapshot().jobs.get(job_id)
        if job is None or who.kind is Kind.OPERATOR:
            return  # an unknown job is the store's NOT_FOUND
        if who.kind is Kind.USER and job.owner != who.name:
            raise PermissionDenied(f"{who} may not {what} job {job_id}: it belongs to "
                                   f"{job.owner!r}")
        if who.kind is Kind.SCHEDULER and job.scheduler != who.name:
            raise PermissionDenied(f"{who} may not {what} job {job_id}: it names scheduler "
                                   f"{job.scheduler!r}")

    def may_set_times(self, context: grpc.ServicerContext) -> bool:
        """Whether the caller may say when something happened (a status's time), which
        the server otherwise stamps: operators (workload replay), and anyone in a cell
        without identities."""
        who = self.caller(context)
        return who is INSECURE or who.kind is Kind.OPERATOR

    def recorded_by(self, context: grpc.ServicerContext, said: str, default: str) -> str:
        """Who a job's status records as having set it. With identities it is the
        caller's, whatever the request says (a user cannot sign a kill as an
        operator); what it said follows in parentheses (a scheduler names its
        instance)."""
        who = self.caller(context)
        if who is INSECURE:
            return said or default
        return str(who) if not said or said == str(who) else f"{who} ({said})"

    # -- machines --------------------------------------------------------------------

    def operate_machine(self, context: grpc.ServicerContext, machine: str, action: str,
                        ) -> None:
        """Cordon, uncordon and drain: operators only (a machine's state decides what
        every scheduler may place on it)."""
        who = self.caller(context)
        if who is not INSECURE:
            self._only(who, (Kind.OPERATOR,), f"{action} machine {machine}")

    def set_limits(self, context: grpc.ServicerContext, scheduler: str) -> None:
        """A scheduler's limits: operators only (they bound what it may take of the
        cell, and with identities which schedulers may act at all)."""
        who = self.caller(context)
        if who is not INSECURE:
            self._only(who, (Kind.OPERATOR,), f"set scheduler {scheduler!r}'s limits")

    # -- schedulers ------------------------------------------------------------------

    def as_scheduler(self, context: grpc.ServicerContext, scheduler: str, what: str) -> None:
        """Register, keep, deregister and report for instances of ``scheduler``, and
        commit its claims: only ``scheduler:<scheduler>``, and only a scheduler the
        cell's config lists."""
        who = self.caller(context)
        if who is INSECURE:
            return
        if who != Identity(Kind.SCHEDULER, scheduler):
            raise PermissionDenied(f"{who} may not {what} for scheduler {scheduler!r}: only "
                                   f"scheduler:{scheduler} may")
        self._known_scheduler(who, scheduler, what)

    def commit(self, context: grpc.ServicerContext, txns: Sequence[Transaction]) -> None:
        """Commit claims: as :meth:`as_scheduler` for each transaction's scheduler, and
        only for jobs that name it (validation refuses such a claim too, but as a
        rejected claim in an answered call; here it is the caller's rights that fail).
        A job not in the server's copy yet is left to validation, which reads it."""
        who = self.caller(context)
        for scheduler in dict.fromkeys(t.scheduler for t in txns):
            if who.kind is Kind.SERVER:
                # A follower forwarding a commit to the commit leader
                # (cellstate/api/leader.py): it checked the scheduler's identity; the
                # rules about the cell hold here as well.
                self._known_scheduler(who, scheduler, "commit")
            else:
                self.as_scheduler(context, scheduler, "commit")
        if who is INSECURE:
            return
        jobs = self._snapshot().jobs
        for t in txns:
            for claim in t.claims:
                job = jobs.get(claim.job)
                if job is not None and job.scheduler != t.scheduler:
                    raise PermissionDenied(
                        f"{who} may not commit claims for job {claim.job}: it names "
                        f"scheduler {job.scheduler!r}; a scheduler places only its own jobs")

    def report_pending(self, context: grpc.ServicerContext, scheduler: str,
                       jobs: Sequence[str]) -> None:
        """Report why ``jobs`` wait: as :meth:`as_scheduler`, and only for jobs that
        name the scheduler (``omega why`` shows the reports with the job: another
        scheduler's would be a false reason). A job not in the server's copy passes:
        a report on a job just submitted, or a deletion for one gone."""
        self.as_scheduler(context, scheduler, "report pending jobs")
        who = self.caller(context)
        if who is INSECURE:
            return
        known = self._snapshot().jobs
        for job_id in jobs:
            job = known.get(job_id)
            if job is not None and job.scheduler != scheduler:
                raise PermissionDenied(
                    f"{who} may not report why job {job_id} waits: it names scheduler "
                    f"{job.scheduler!r}")

    def keep_alive(self, context: grpc.ServicerContext, lease: int, cell: str,
                   lease_keys: Callable[[], Sequence[bytes]]) -> None:
        """Renew ``lease``: an operator any; a scheduler or an agent only a lease it
        holds, told by the keys on it (``lease_keys``, which raises
        LeaseNotFoundError for a lapsed one): every key must be one of its instances'
        registrations or metric reports, or its agent record."""
        who = self.caller(context)
        if who is INSECURE:
            return
        self._only(who, (Kind.SCHEDULER, Kind.AGENT, Kind.OPERATOR), "renew leases")
        if who.kind is Kind.OPERATOR:
            return
        keys = lease_keys()
        others = [k for k in keys if not holds(who, k, cell)]
        if not keys or others:
            held = (f"it holds {others[0].decode(errors='replace')!r}" if others
                    else "nothing is registered under it")
            raise PermissionDenied(f"{who} may not renew lease {lease:x}: {held}; only "
                                   "the identity that registered under a lease renews it")

    # -- agents ----------------------------------------------------------------------

    def register_agent(self, context: grpc.ServicerContext, agent: str,
                       machines: Sequence[Machine]) -> bool:
        """Only ``agent:<agent>`` registers as ``agent``, and not with a machine another
        agent registered (an operator moves machines between agents). Returns whether
        the caller is the agent itself, not an operator: the store then lets it
        register only new machines and its own unchanged (machines an operator added,
        capacities and topology are an operator's), on what etcd holds."""
        who = self.caller(context)
        if who is INSECURE or who.kind is Kind.OPERATOR:
            return False
        if who != Identity(Kind.AGENT, agent):
            raise PermissionDenied(f"{who} may not register as agent {agent!r}: only "
                                   f"agent:{agent} may")
        known = self._snapshot().machines
        for m in machines:
            old = known.get(m.id)
            if old is not None and old.agent and old.agent != agent:
                raise PermissionDenied(f"{who} may not register machine {m.id}: it belongs "
                                       f"to agent {old.agent!r}")
        return True

    def report_task(self, context: grpc.ServicerContext, agent: str, task: str,
                    machine: str) -> str:
        """Only the agent of the machine the task ran on reports it: both the machine
        the report names and the one the task is recorded on must be the agent's.
        Returns the machine the store must find the task on ("" for any), so that a
        task placed elsewhere since the server's copy was taken is not ended by this
        report."""
        who = self.caller(context)
        if who is INSECURE or who.kind is Kind.OPERATOR:
            return machine
        if who != Identity(Kind.AGENT, agent):
            raise PermissionDenied(f"{who} may not report tasks as agent {agent!r}: only "
                                   f"agent:{agent} may")
        snap = self._snapshot()
        recorded = _machine_of(snap, task)
        for mid in dict.fromkeys(m for m in (machine, recorded) if m):
            m = snap.machines.get(mid)
            if m is not None and m.agent != agent:
                where = "names" if mid == machine and mid != recorded else "is on"
                raise PermissionDenied(f"{who} may not report task {task}: it {where} "
                                       f"machine {mid}, which belongs to agent {m.agent!r}")
        return machine or recorded


def _machine_of(snap: CellSnapshot, task: str) -> str:
    split_task_id(task)
    record = snap.tasks.get(task)
    return record.machine if record is not None else ""


def check_changeable(state: str, job_id: str, what: str, kill: bool = False,
                     running: int = 0) -> None:
    """A job in a final state cannot change (a finished job killed stays finished, a
    killed one cannot be resized). ``kill``: the change is a kill, which a killed job
    takes again without changing, and which an abandoned job still ``running`` tasks
    takes (its scheduler gave up placing the rest; the owner must still be able to
    stop what runs)."""
    if kill and (state == "killed" or (state == "abandoned" and running)):
        return
    if state in FINAL_STATES:
        raise FinalState(f"cannot {what} job {job_id}: it is {state}, and a job in a final "
                         "state does not change")


def holds(who: Identity, key: bytes, cell: str) -> bool:
    """Whether ``key`` may sit on a lease of ``who``: a scheduler's instance
    registrations, metric and pending reports (``<pending>/<job>/<scheduler>/...``),
    an agent's own record."""
    keys = Keyspace(cell)
    if who.kind is Kind.SCHEDULER:
        pending = pending_prefix(cell)
        if key.startswith(pending):
            return key[len(pending):].split(b"/")[1:2] == [who.name.encode()]
        return key.startswith((keys.instance(who.name, ""),
                               metrics_prefix(cell) + who.name.encode() + b"/"))
    if who.kind is Kind.AGENT:
        return key == keys.agent(who.name)
    return False

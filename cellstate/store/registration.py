"""Registration: scheduler instances and node agents under leases, and machines taken
down when their agent's lease lapses."""


from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence

import attrs

from cellstate import codec
from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    NotFoundError as NotFoundError,
    NotPermittedError,
    StoreError as StoreError,
)
from cellstate.kv.base import (
    Compare,
    CompareResult,
    CompareTarget,
    Delete,
    Get,
    KVError,
    LeaseNotFoundError,
    Put,
)
from cellstate.model import (
    AgentRecord,
    InstanceRecord,
    Machine,
    MachineState,
    SchedulerRecord,
    check_name,
)
from cellstate.store.admin import AdminWrites
from cellstate.store.base import (
    _Write,
)

log = logging.getLogger(__name__)


class Registration(AdminWrites):
    """Leased registrations of scheduler instances and agents."""

    def register_instance(self, record: InstanceRecord, ttl: int) -> int:
        """Announce a live scheduler instance under a new lease of ``ttl`` seconds (the
        caller keeps it alive); also records the scheduler's name for good. Returns the
        lease id. Refused if the same instance id is live already."""
        # Names become key parts: "zeta/y" would read as scheduler "zeta".
        check_name(record.scheduler, "scheduler")
        check_name(record.instance, "instance")
        lease = self.kv.lease_grant(ttl)
        ikey = self.keys.instance(record.scheduler, record.instance)
        skey = self.keys.scheduler(record.scheduler)
        sched = SchedulerRecord(record.scheduler, record.policy)
        with self._lock:
            res = self.kv.txn([Compare.absent(ikey)], [
                Put(ikey, codec.encode_instance(record), lease),
                Put(skey, codec.encode_scheduler(sched)),
            ])
        if not res.succeeded:
            self.kv.lease_revoke(lease)
            raise AlreadyExistsError(f"instance {record.id} is already running")
        return lease

    def keep_alive(self, lease: int) -> None:
        """Renew a lease (an instance's or an agent's); raises KVError when it is gone."""
        self.kv.lease_keepalive(lease)

    def deregister_instance(self, scheduler: str, instance: str, lease: int) -> None:
        """Withdraw an instance at once (its jobs move to the others). Only the holder
        of its registration can: the instance key must be attached to ``lease``, or
        this is refused and nothing changes (a deleted key whose lease lives on would
        keep a live scheduler from ever registering again). An instance already gone
        (lease lapsed, or a repeated call) is not an error."""
        check_name(scheduler, "scheduler")
        check_name(instance, "instance")
        who = f"instance {scheduler}/{instance}"
        if lease == 0:
            raise StoreError(f"{who}: deregistering needs the lease it registered with, not 0")
        ikey = self.keys.instance(scheduler, instance)
        mine = Compare(ikey, CompareTarget.LEASE, CompareResult.EQUAL, lease)
        res = self.kv.txn([mine], [Delete(ikey)], [Get(ikey)])
        if res.succeeded:
            # The lease is proven to be this instance's: end it (and its metrics key).
            with contextlib.suppress(LeaseNotFoundError):
                self.kv.lease_revoke(lease)
            return
        if res.responses[0]:
            raise StoreError(f"{who} is registered under another lease than {lease}; "
                             "only its holder can deregister it")

    def register_agent(
        self, agent: str, machines: Sequence[Machine], ttl: int, now: float = 0.0,
        *, as_agent: bool = False,
    ) -> tuple[int, int]:
        """Announce a live node agent under a new lease of ``ttl`` seconds (the caller
        keeps it alive) and register its machines: new ones are added, known ones are
        brought back up and adopted by this agent, with the capacity, rack, failure
        domain and labels given. When the lease lapses the agent's key goes, and
        :meth:`machine_lost` takes its machines down. Returns (lease, revision).

        Refused, before anything is written, for a machine another live agent owns
        (taking it over would take it down, tasks and all, when this registration
        lapses while the owner is alive) or whose capacity would fall below what its
        tasks hold. A registration refused midway (a race with another agent) revokes
        its lease, so it leaves no agent key behind.

        ``as_agent``: the caller is the agent itself (not an operator), which may
        register new machines and its own as they are, and nothing else
        (:meth:`_refuse_agent_changes`), checked on what etcd holds in the same guarded
        writes."""
        mine = self._agent_machines(agent, machines, ttl)
        ids = [m.id for m in mine]
        with self._lock:
            self._fetch(self.keys.machine(i) for i in ids)
            known = [(self.view.machines[m.id], m) for m in mine if m.id in self.view.machines]
            if as_agent:
                _refuse_agent_changes(agent, known)
            for old, m in known:
                self._replace_machine(old, self._adopted(old, m))  # raises if it cannot fit
            new = [m for m in mine if m.id not in self.view.machines]
        self._refuse_takeover(agent, [old for old, _ in known])
        lease = self.kv.lease_grant(ttl)
        try:
            record = AgentRecord(agent, tuple(ids), now)
            # The agent's key first: a machine naming a live agent must never be seen
            # without that agent's key, or it would be taken for lost.
            res = self.kv.txn([], [Put(self.keys.agent(agent), codec.encode_agent(record), lease)])
            revision = res.revision
            if new:
                revision = self.add_machines(new)
            for _, m in known:
                revision = max(revision, self._adopt_machine(m, as_agent))
        except BaseException:
            with contextlib.suppress(KVError):
                self.kv.lease_revoke(lease)
            raise
        return lease, revision

    def extend_agent(self, agent: str, machines: Sequence[Machine], lease: int,
                     *, as_agent: bool = False) -> int:
        """Add ``machines`` to ``agent``'s live registration under ``lease`` (a piece
        of a registration too large for one call), as :meth:`register_agent` adds or
        adopts them. Refused (NotFoundError) unless the agent's key is on that lease:
        the pieces of a lapsed registration must not land without their agent.
        Returns the revision."""
        mine = self._agent_machines(agent, machines, 1)
        akey = self.keys.agent(agent)
        with self._lock:
            self._fetch(self.keys.machine(m.id) for m in mine)
            known = [(self.view.machines[m.id], m) for m in mine if m.id in self.view.machines]
            if as_agent:
                _refuse_agent_changes(agent, known)
            new = [m for m in mine if m.id not in self.view.machines]
        self._refuse_takeover(agent, [old for old, _ in known])
        found = self.kv.range(akey).kvs
        if not found or found[0].lease != lease:
            raise NotFoundError(f"agent {agent} is not registered under lease {lease:x} (it "
                                "lapsed, or was never this agent's): register again")
        # The record lists every machine of the registration, this piece's too: guarded
        # on the lease, so a piece never revives a lapsed registration's record.
        old = codec.decode_agent(agent, found[0].value, 0)
        ids = tuple(dict.fromkeys([*old.machines, *(m.id for m in mine)]))
        record = AgentRecord(agent, ids, old.started_at)
        held = Compare(akey, CompareTarget.LEASE, CompareResult.EQUAL, lease)
        res = self.kv.txn([held], [Put(akey, codec.encode_agent(record), lease)])
        if not res.succeeded:
            raise NotFoundError(f"agent {agent}'s lease {lease:x} lapsed while registering "
                                "its machines: register again")
        revision = res.revision
        if new:
            revision = self.add_machines(new)
        for _, m in known:
            revision = max(revision, self._adopt_machine(m, as_agent))
        return revision

    def _agent_machines(self, agent: str, machines: Sequence[Machine], ttl: int) -> list[Machine]:
        """The machines of a registration as the agent will own them; raises on any
        malformed one."""
        check_name(agent, "agent id")
        if ttl < 1:
            raise StoreError(f"agent {agent}: the lease ttl must be at least 1 second")
        mine = []
        for i, m in enumerate(machines):
            codec.parse_machine(codec.machine_to_doc(m), f"machines[{i}]")
            if m.agent and m.agent != agent:
                raise StoreError(f"machines[{i}] ({m.id}) names agent {m.agent!r}, not {agent!r}")
            if m.allocations:
                raise StoreError(f"machines[{i}] ({m.id}): a registration carries no allocations")
            mine.append(attrs.evolve(m, agent=agent, state=MachineState.UP, seq=0))
        ids = [m.id for m in mine]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise StoreError(f"machines listed twice: {', '.join(dupes)}")
        return mine

    def _live_agents(self, agents: Iterable[str]) -> set[str]:
        """Which of ``agents`` hold a live lease (their key exists), read from etcd."""
        names = sorted(set(agents))
        live: set[str] = set()
        step = self.kv.max_txn_ops
        for i in range(0, len(names), step):
            chunk = names[i : i + step]
            res = self.kv.txn([], [Get(self.keys.agent(a)) for a in chunk])
            live.update(a for a, found in zip(chunk, res.responses, strict=True) if found)
        return live

    def _refuse_takeover(self, agent: str, known: Sequence[Machine]) -> None:
        owners: dict[str, list[str]] = {}
        for m in known:
            if m.agent and m.agent != agent:
                owners.setdefault(m.agent, []).append(m.id)
        live = self._live_agents(owners)
        if live:
            taken = "; ".join(
                f"{', '.join(sorted(owners[a]))} to agent {a!r}" for a in sorted(live))
            raise StoreError(
                f"agent {agent}: machines belong to another live agent ({taken}); an agent "
                "cannot take over a live agent's machines (stop that agent, or give these "
                "machines other ids)"
            )

    @staticmethod
    def _adopted(old: Machine, m: Machine) -> Machine:
        """Machine ``old`` as registration ``m`` describes it, keeping its tasks."""
        state = old.state if old.state in (MachineState.DRAINING,
                                           MachineState.CORDONED) else MachineState.UP
        return attrs.evolve(
            old.with_allocations(old.allocations), capacity=m.capacity, rack=m.rack,
            failure_domain=m.failure_domain, labels=m.labels, agent=m.agent, state=state,
        )

    def _adopt_machine(self, m: Machine, as_agent: bool = False) -> int:
        key = self.keys.machine(m.id)
        with self._lock:

            def attempt() -> _Write:
                self._fetch([key])
                old = self.view.machines.get(m.id)
                if old is None:
                    return _Write({key: 0}, {key: m})
                if as_agent:  # again: the machine may have changed since the first read
                    _refuse_agent_changes(m.agent, [(old, m)])
                w = self._replace_machine(old, self._adopted(old, m))
                if not old.agent or old.agent == m.agent:
                    return w
                # Another agent owned it a moment ago: only if that agent is gone, and
                # guarded so that it stays gone until this write lands.
                self._refuse_takeover(m.agent, [old])
                return _Write({**w.guards, self.keys.agent(old.agent): 0}, w.records)

            return self._retry(f"registering machine {m.id}", attempt).revision

    def machine_lost(self, machine_id: str) -> bool:
        """Take a machine down whose agent is gone (its leased key has lapsed): its
        tasks are lost and go back to their schedulers. Does nothing (returns False)
        if the machine is down already, has no agent, or its agent is live; the write
        is guarded on the agent's key being absent, so a racing re-registration wins.
        Several servers may call this at once; one write happens."""
        key = self.keys.machine(machine_id)
        wrote = False
        with self._lock:
            for _ in range(self.options.max_attempts):
                self._fetch([key])
                m = self.view.machines.get(machine_id)
                if m is None or not m.agent or (
                    m.state is MachineState.DOWN and not m.allocations
                ):
                    return wrote
                akey = self.keys.agent(m.agent)
                if self.kv.range(akey).kvs:
                    return wrote
                # A machine with more tasks than one write can lose stays down with the
                # rest; the next round loses those.
                w = self._lose_tasks(attrs.evolve(m.with_allocations(m.allocations),
                                                  state=MachineState.DOWN))
                res = self._try_write(_Write({**w.guards, akey: 0}, w.records))
                wrote = wrote or res.succeeded
        raise ContentionError(f"taking machine {machine_id} down: its records keep changing")


def _topology(m: Machine) -> dict[str, object]:
    """What only an operator changes about a known machine: what the schedulers count
    on (capacity) and spread over (rack, failure domain, labels)."""
    return {"capacity": m.capacity.as_dict(), "rack": m.rack,
            "failure domain": m.failure_domain, "labels": dict(m.labels)}


def _refuse_agent_changes(agent: str, known: Sequence[tuple[Machine, Machine]]) -> None:
    """An agent registers new machines and its own as they are recorded. A machine
    with no agent was added by an operator (it is nobody's to take), one of another
    agent is moved by an operator, and a capacity or topology change is an operator's
    (an agent key could otherwise grow an 8-cpu machine to a million cpus)."""
    for old, m in known:
        who = f"agent:{agent} may not register machine {m.id}"
        if old.agent != agent:
            whose = (f"it belongs to agent {old.agent!r}" if old.agent
                     else "an operator added it (it has no agent)")
            raise NotPermittedError(f"{who}: {whose}; only an operator moves a machine to "
                                    "another agent")
        was, now = _topology(old), _topology(m)
        changed = [k for k in was if was[k] != now[k]]
        if changed:
            what = changed[0]
            raise NotPermittedError(
                f"{who} with another {', '.join(changed)}: {what} {was[what]!r} as recorded, "
                f"{now[what]!r} asked; only an operator changes a machine's capacity and "
                "topology (register it with an operator's certificate)")

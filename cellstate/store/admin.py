"""Jobs, machines, releases and the cell's config: each write decided by the judge
(``cellstate.decisions``) and applied as one guarded write."""


from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from cellstate import codec, decisions
from cellstate.cell import (
    CellSnapshot,
    task_view,
)
from cellstate.decisions import Change
from cellstate.errors import (
    AlreadyExistsError as AlreadyExistsError,
    ContentionError as ContentionError,
    NotFoundError as NotFoundError,
    StoreError as StoreError,
)
from cellstate.keys import KeyKind
from cellstate.kv.base import (
    Compare,
    CompareResult,
    CompareTarget,
    prefix_end,
)
from cellstate.model import (
    CellConfig,
    Job,
    JobState,
    JobStatus,
    Machine,
    MachineState,
    ModelError,
    Resources,
    SchedulerLimits,
    TaskResult,
    TaskState,
    check_name,
    labels_from as model_labels,
    split_task_id,
    task_id,
)
from cellstate.store.base import (
    _RESERVED_OPS,
    _Write,
)
from cellstate.store.gangs import LargeGangs

log = logging.getLogger(__name__)

# Task records a scale-down deletes in one guarded write (with the job's key), well
# inside etcd's --max-txn-ops of 256 (docs/operations.md).
_SHRINK_STEP = 200


class AdminWrites(LargeGangs):
    """Jobs, machines, task ends, kills, resizes and the config."""

    def submit_job(self, job: Job) -> int:
        """Store a new job (its tasks start pending). Returns the revision."""
        codec.parse_job(codec.job_to_doc(job))  # the same checks as for user input
        with self._lock:
            return self._decide_and_write(f"submitting job {job.id}",
                                          lambda: decisions.submit_job(self.view, job))

    def add_machine(self, machine: Machine) -> int:
        return self.add_machines([machine])

    def add_machines(self, machines: Sequence[Machine]) -> int:
        """Add many new machines, as few etcd transactions as the limits allow. All are
        checked before anything is written; each transaction adds its machines or, if
        any of them exists already, none of them (and this raises)."""
        for m in machines:
            codec.parse_machine(codec.machine_to_doc(m))
        decisions.add_machines(CellSnapshot.empty(), machines)  # the checks of the whole list
        step = max(self.kv.max_txn_ops // 2, 1)  # a machine's guard reads two ranges
        revision = 0
        with self._lock:
            for i in range(0, len(machines), step):
                batch = machines[i : i + step]
                revision = self._decide_and_write(
                    "adding machines", lambda b=batch: decisions.add_machines(self.view, b))  # type: ignore[misc]
        return revision

    def update_machine(
        self,
        machine_id: str,
        *,
        capacity: Resources | None = None,
        state: MachineState | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> int:
        """Change a machine's capacity, state or labels. Taking it down loses every task
        on it (state lost), which frees their resources and sends them back to their
        schedulers; a capacity below what its tasks hold is refused."""
        if capacity is not None:
            codec.parse_resources(capacity.as_dict(), f"machine {machine_id}: capacity")
        if state is not None and not isinstance(state, MachineState):
            raise StoreError(f"machine {machine_id}: {state!r} is not a machine state")
        new_labels = model_labels(labels, f"machine {machine_id}: labels") if labels else None
        with self._lock:
            self._ensure_config()

            def decide() -> Change:
                self._fetch([self.keys.machine(machine_id)])
                m = self.view.machines.get(machine_id)
                if m is not None:
                    self._fetch_gangs(m)
                return decisions.update_machine(
                    self.view, machine_id, capacity=capacity, state=state, labels=new_labels,
                    budget=self._lose_budget(), at=self._now())

            return self._decide_and_write(f"updating machine {machine_id}", decide)

    def set_machine_state(self, machine_id: str, action: str) -> tuple[int, MachineState, int]:
        """An operator's cordon, uncordon or drain (:func:`decisions.machine_action`).
        Returns the revision (0 if nothing had to change), the machine's state and how
        many tasks a drain lost (a machine holding more than one write can lose is
        drained in several writes)."""
        revision, lost = 0, 0
        written: list[Change] = []  # the change of the last attempt: the one written
        with self._lock:
            self._ensure_config()
            while True:

                def decide() -> Change:
                    self._fetch([self.keys.machine(machine_id)])
                    m = self.view.machines.get(machine_id)
                    if m is not None:
                        self._fetch_gangs(m)
                    written[:] = [decisions.machine_action(self.view, machine_id, action,
                                                           self._lose_budget(), self._now())]
                    return written[0]

                wrote = self._decide_and_write(f"{action} machine {machine_id}", decide)
                change = written[0]
                after = change.writes.get((KeyKind.MACHINE, machine_id))
                if not isinstance(after, Machine):  # nothing had to change
                    self._fetch([self.keys.machine(machine_id)])
                    return revision, self.view.machines[machine_id].state, lost
                revision = wrote
                lost += sum(1 for kind, _ in change.writes if kind is KeyKind.TASK)
                if action != "drain" or not after.allocations:
                    return revision, after.state, lost

    def _lose_budget(self) -> int:
        # Each task lost deletes its allocation and rewrites its record: two ops.
        return (self.kv.max_txn_ops - _RESERVED_OPS) // 2

    def _replace_machine(self, m: Machine, changed: Machine) -> _Write:
        """The write that replaces machine ``m`` by ``changed`` (decisions.replace_machine)."""
        self._fetch_gangs(m)
        return self._write_for(decisions.replace_machine(self.view, m, changed))

    def _lose_tasks(self, down: Machine) -> _Write:
        """The write that takes the view's machine down as ``down`` (decisions.take_down)."""
        old = self.view.machines[down.id]
        self._fetch_gangs(old)
        return self._write_for(decisions.take_down(self.view, old, down, self._lose_budget(),
                                                   self._now()))

    def remove_machine(self, machine_id: str) -> int:
        """Take the machine down (losing its tasks) and delete it."""
        with self._lock:
            while True:
                self._fetch([self.keys.machine(machine_id)])
                m = self.view.machines.get(machine_id)
                if m is None:
                    raise NotFoundError(f"unknown machine {machine_id!r}")
                if m.state is not MachineState.DOWN or m.allocations:
                    self.update_machine(machine_id, state=MachineState.DOWN)
                    continue
                w = self._write_for(decisions.remove_machine(self.view, machine_id))
                res = self._try_write(w)
                if res.succeeded:
                    return res.revision

    def release_task(self, tid: str, outcome: TaskState, machine: str | None = None,
                     result: TaskResult | None = None, *, by: str = "", why: str = "") -> int:
        """Record that a running task ended (finished, failed, lost, killed; ``result``:
        its exit code and times; ``by`` and ``why`` for its history, by default its
        machine's agent) and free its hold (decisions.release_task says when it is
        refused)."""
        try:
            split_task_id(tid)
        except ModelError as e:
            raise StoreError(str(e)) from e
        with self._lock:
            self._ensure_config()
            k = self.keys

            def decide() -> Change:
                self._fetch([k.task_key(tid)])
                rec = self.view.tasks.get(tid)
                if rec is not None and rec.machine:
                    # Task and machine read together, so they agree with each other.
                    self._fetch([k.task_key(tid), k.machine(rec.machine)])
                    rec = self.view.tasks.get(tid)
                    m = self.view.machines.get(rec.machine) if rec is not None else None
                    if m is not None:
                        self._fetch_gangs(m)
                if rec is not None and rec.gang:
                    self._fetch([k.gang(rec.gang)])
                return decisions.release_task(self.view, tid, outcome, machine, result,
                                              at=self._now(), by=by, why=why)

            return self._decide_and_write(f"releasing task {tid}", decide)

    def set_job_status(self, status: JobStatus) -> int:
        """Record a verdict on a job (abandoned with a reason, or killed). Refused for a
        job that does not exist; a kill is final (an abandonment does not replace it)."""
        with self._lock:
            keys = [self.keys.job(status.job), self.keys.status(status.job)]

            def decide() -> Change:
                self._fetch(keys)
                return decisions.set_job_status(self.view, status)

            return self._decide_and_write(f"setting the status of job {status.job}", decide)

    def kill_job(self, status: JobStatus) -> int:
        """Kill a job: record the status, then end every task of it that runs.

        Every claim reads the job's status (guarded), so once the status is written no
        claim for the job can commit; a read of the job's tasks after that write sees
        every placement that beat it, and each is released (lost). Idempotent: killing
        a killed job ends whatever still runs. Returns the revision of the last write."""
        if status.state is not JobState.KILLED:
            raise StoreError(f"job {status.job}: kill_job records a kill, not {status.state}")
        revision = self.set_job_status(status)
        prefix = self.keys.task_key(status.job + "/")
        with self._lock:
            res = self.kv.range(prefix, prefix_end(prefix))
            self.view.observe_range(res.kvs, res.revision)
            tids = [kv.key[len(self.keys.task_key("")):].decode() for kv in res.kvs]
            running = [tid for tid in tids
                       if (t := self.view.tasks.get(tid)) is not None
                       and t.state is TaskState.RUNNING]
        for tid in running:
            try:
                # Killed, not lost: lost is a machine's failure, and a lost task is
                # placed again.
                revision = max(revision, self.release_task(
                    tid, TaskState.KILLED, by=status.by,
                    why=f"job killed: {status.reason}"[:200]))
            except StoreError as e:  # it ended meanwhile (finished, lost): nothing to do
                log.debug("kill %s: %s", status.job, e)
        return revision

    def resize_job(self, job_id: str, task_count: int, *, stop: bool = False) -> int:
        """Grow (or shrink to no fewer than its placed-or-ended tasks) a job's task count,
        as an elastic scheduler does to grow a running job into idle resources.

        ``stop`` (a user's scale-down): a job that is not a gang shrinks below tasks
        that have run. Its running tasks beyond the new count are stopped first, the
        highest index first, recorded as killed (their agents stop them), then the
        count and the records beyond it are written in one guarded write; a task placed
        meanwhile beyond the count makes it start over. At most ``_SHRINK_STEP``
        records go per write, so a large shrink is a few steps from the top down."""
        if not stop:
            return self._resize(job_id, task_count, False)
        revision = 0
        for _ in range(self.options.max_attempts):
            target = self._stop_beyond(job_id, task_count)
            try:
                revision = self._resize(job_id, target, True)
            except StoreError as e:
                if "runs; stop it before shrinking" not in str(e):
                    raise
                continue  # placed between the stop and the write: again
            if target == task_count:
                return revision
        raise ContentionError(f"resizing job {job_id}: its tasks kept being placed")

    def _stop_beyond(self, job_id: str, task_count: int) -> int:
        """Stop (as killed) the running tasks of ``job_id`` at ``task_count`` and above,
        highest index first; returns the count the next write may shrink to (at most
        ``_SHRINK_STEP`` records above it)."""
        prefix = self.keys.task_key(job_id + "/")
        with self._lock:
            self._fetch([self.keys.job(job_id)])
            res = self.kv.range(prefix, prefix_end(prefix))
            self.view.observe_range(res.kvs, res.revision)
            job = self.view.jobs.get(job_id)
            # A gang runs whole or not at all: it is refused below, nothing stopped.
            if job is None or task_count >= job.task_count or job.gang:
                return task_count
            beyond = sorted((int(kv.key.rsplit(b"/", 1)[1]) for kv in res.kvs), reverse=True)
            beyond = [i for i in beyond if i >= task_count]
            running = [task_id(job_id, i) for i in beyond
                       if task_view(self.view, task_id(job_id, i)).state is TaskState.RUNNING]
        for tid in running:
            try:
                self.release_task(tid, TaskState.KILLED,
                                  why=f"job shrunk to {task_count} tasks")
            except StoreError as e:  # it ended meanwhile: nothing to stop
                log.debug("shrink %s: %s", job_id, e)
        if len(beyond) > _SHRINK_STEP:
            return beyond[_SHRINK_STEP - 1]
        return task_count

    def _resize(self, job_id: str, task_count: int, drop_ended: bool) -> int:
        prefix = self.keys.task_key(job_id + "/")
        read_at = 0

        def decide() -> Change:
            nonlocal read_at
            read_at = 0
            self._fetch([self.keys.job(job_id)])
            job = self.view.jobs.get(job_id)
            placed: list[int] = []
            if job is not None and task_count < job.task_count:
                res = self.kv.range(prefix, prefix_end(prefix), keys_only=not drop_ended)
                if drop_ended:  # the decision reads their states
                    self.view.observe_range(res.kvs, res.revision)
                placed = [int(kv.key.rsplit(b"/", 1)[1]) for kv in res.kvs]
                read_at = res.revision
            return decisions.resize_job(self.view, job_id, task_count, placed, drop_ended)

        def unchanged() -> tuple[Compare, ...]:
            # Claims do not rewrite the job's key, so its revision alone would not see a
            # task placed since the range read: guard that no task key of the job
            # changed (or appeared) since then.
            if not read_at:
                return ()
            return (Compare(prefix, CompareTarget.MOD, CompareResult.LESS, read_at + 1,
                            prefix_end(prefix)),)

        with self._lock:
            return self._decide_and_write(f"resizing job {job_id}", decide, unchanged)

    def update_limits(
        self, scheduler: str,
        change: Callable[[SchedulerLimits | None], SchedulerLimits],
    ) -> tuple[int, SchedulerLimits]:
        """Set one scheduler's limits to ``change(its limits now)``, leaving the other
        schedulers' as they are, while nobody else rewrites the config in between (the
        change is applied again to what a failed guard read). Returns the revision (0
        when the limits were already those) and the limits now. ``change`` may raise
        (ModelError) to refuse: nothing is written then."""
        check_name(scheduler, "scheduler")
        with self._lock:
            key = self.keys.config
            self._fetch([key])

            def attempt() -> _Write:
                now = self.view.config
                config = CellConfig({**now.limits, scheduler: change(now.limits_for(scheduler))})
                codec.parse_config(codec.config_to_doc(config))  # as set_config checks
                return _Write({key: self.view.guard_revision(key)}, {key: config})

            current = self.view.config.limits_for(scheduler)
            wanted = change(current)
            if current is not None and wanted == current:
                return 0, current
            res = self._retry(f"setting scheduler {scheduler!r}'s limits", attempt)
            self._ensure_usage(self.view.config.limits)
            # The view took the written config in (the write succeeded).
            written = self.view.config.limits_for(scheduler)
            assert written is not None
            return res.revision, written

    def seed_config(self, config: CellConfig) -> CellConfig | None:
        """Write ``config`` as the cell's first configuration if it has none yet;
        returns None if written, else the cell's configuration, untouched (a server's
        start-up file seeds a new cell and never overwrites one: operators change it
        with ``omega limits``)."""
        codec.parse_config(codec.config_to_doc(config))
        key = self.keys.config
        with self._lock:
            self._fetch([key])
            if self.view.guard_revision(key):
                return self.view.config
            res = self._try_write(_Write({key: 0}, {key: config}))
            if not res.succeeded:  # another server seeded it first
                self._fetch([key])
                return self.view.config
            self._ensure_usage(config.limits)
            return None

    def set_config(self, config: CellConfig) -> int:
        """Replace the cell's configuration (per-scheduler limits)."""
        codec.parse_config(codec.config_to_doc(config))
        with self._lock:
            self._fetch([self.keys.config])
            key = self.keys.config
            res = self._retry(
                "setting the cell config",
                lambda: _Write({key: self.view.guard_revision(key)}, {key: config}),
            )
            # Start the counters of resource-limited schedulers now, while the history
            # at this revision is surely still there.
            self._ensure_usage(config.limits)
            return res.revision

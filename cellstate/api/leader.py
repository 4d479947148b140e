"""The commit leader: one cellstate server validates every commit, in memory, and writes
the accepted claims of many transactions to etcd together.

Omega's store is "a persistent data store with validation code" (seed 001, §3.4); Nomad
runs one plan applier on its leader. Here the servers of a cell elect one through an
etcd lease and one key (:class:`Election`); the revision that created the key is the
leader's *fencing token*. The leader's :class:`GroupCommitter` queues the commits that
reach it (its own clients' and those its followers forward), takes every one waiting
as one batch, and commits the batch with ``CellStore.commit_many``: the transactions
are validated in arrival order against the leader's working view (its replica plus
its own writes not yet seen on the watch), each seeing those before it, so a claim that
loses to another scheduler's is rejected in memory and never reaches etcd; the
accepted claims go out in as few etcd Txns as etcd's limits allow. Every Txn also
compares the leader key's revision with the token (``CellStore.fence``), so a deposed
leader (its lease lapsed while it was paused, say) can write nothing, and keeps its
guards on every record it changes, so a writer outside the leader (an agent, a user's
submit, a library committer) is still caught. A guard that fails makes the store learn
the fresh records and validate again; each transaction is answered only once its Txn
succeeded (etcd made it durable), or with the error that stopped the batch.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import attrs

from cellstate.errors import FencedOut, KVError, LeaseNotFoundError
from cellstate.keys import leader_key as leader_key
from cellstate.kv.base import KV, Compare, Get, Put, TxnResult, Watcher
from cellstate.model import CommitResult, Transaction
from cellstate.store import CellStore
from cellstate.store.claims import SentBatch, Staged

log = logging.getLogger(__name__)

DEFAULT_TTL = 5  # seconds: a new leader serves within this (plus one poll) of a crash
# A batch stops growing at these (a batch's claims are validated and encoded by one
# thread; the cap keeps one batch's latency bounded under a flood).
MAX_BATCH_TXNS = 64
MAX_BATCH_CLAIMS = 4000


@attrs.frozen
class Leadership:
    """Who leads: the leader's address (as its peers reach it) and its token."""

    address: str
    token: int


class Election:
    """Campaigns for ``cell``'s commit leadership and keeps it while it can.

    Every ``ttl / 3`` seconds a leader refreshes its lease (a lapsed lease deposes
    it). A follower watches the key and campaigns (create-if-absent, under a fresh
    lease) as soon as it is gone, and reads it every ``ttl / 3`` seconds besides. So a
    crashed leader is replaced within ``ttl`` of its last refresh. ``on_elected(token)``
    and ``on_deposed()`` run on the election's thread, in that order, once per term."""

    def __init__(self, kv: KV, cell: str, address: str, *, ttl: int = DEFAULT_TTL,
                 on_elected: Callable[[int], None] = lambda token: None,
                 on_deposed: Callable[[], None] = lambda: None) -> None:
        if not 1 <= ttl <= 60:
            raise ValueError(f"leader lease ttl: {ttl} is not between 1 and 60 seconds")
        self.kv = kv
        self.key = leader_key(cell)
        self.address = address
        self.ttl = ttl
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._lock = threading.Lock()
        self._known: Leadership | None = None
        self._lease = 0  # ours while we lead
        self._kept_at = 0.0  # when it was last granted or refreshed (monotonic)
        self._seen = 0  # the revision the key was last read at
        self._watcher: Watcher | None = None  # a follower's watch of the key
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="election", daemon=True)

    @property
    def leading(self) -> bool:
        return self._lease != 0

    def leader(self) -> Leadership | None:
        """The leader as last seen (None: none known)."""
        with self._lock:
            return self._known

    def refresh(self) -> Leadership | None:
        """Read the key now (a forward to a stale address failed, say)."""
        res = self.kv.range(self.key)
        kvs = res.kvs
        known = Leadership(kvs[0].value.decode(), kvs[0].mod_revision) if kvs else None
        with self._lock:
            self._seen = max(self._seen, res.revision)
            if not self.leading:
                self._known = known
        return known

    def start(self) -> Election:
        """Campaign once now (so a server knows the leader, or leads, before it
        serves), then keep at it on the election's thread."""
        self._round()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop campaigning; a leader resigns (revokes its lease: the key goes at once,
        so a follower takes over without waiting out the TTL)."""
        self._stop.set()
        self._wake.set()
        self._drop_watch()  # wakes a follower waiting on the key
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.resign()

    def resign(self) -> None:
        """Give the leadership up now (revoke the lease: the key goes at once); a
        server still running campaigns again at its next round, like the others."""
        with self._lock:
            lease, self._lease = self._lease, 0
            self._known = None
        if not lease:
            return
        self._on_deposed()
        try:
            self.kv.lease_revoke(lease)
        except KVError as e:
            log.warning("resigning the commit leadership: %s (the lease lapses by itself)", e)

    def lost(self) -> None:
        """The leader's write found its token gone (cellstate's FencedOut): step down
        now rather than at the next keep-alive."""
        with self._lock:
            lease, self._lease = self._lease, 0
            self._known = None
        if lease:
            log.warning("commit leadership lost (a write found the token gone)")
            self._on_deposed()
            self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._lease:
                    self._drop_watch()
                    self._wake.wait(self.ttl / 3)
                else:
                    self._wait_for_change(self.ttl / 3)
                self._wake.clear()
                if not self._stop.is_set():
                    self._round()
        finally:
            self._drop_watch()

    def _wait_for_change(self, timeout: float) -> None:
        """A follower waits on a watch of the key, so it campaigns the moment the key
        goes (the leader's lease lapsed or it resigned), not a poll later; the timeout
        keeps the periodic read as a backstop."""
        try:
            if self._watcher is None:
                self._watcher = self.kv.watch(self.key, self.key + b"\0",
                                              start_revision=self._seen + 1)
            response = self._watcher.next(timeout=timeout)
            if response is not None and response.canceled:
                self._drop_watch()  # compacted past it: watch again from a fresh read
        except KVError as e:
            log.warning("commit leader election: watching the key: %s", e)
            self._drop_watch()
            self._wake.wait(timeout)

    def _drop_watch(self) -> None:
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            with contextlib.suppress(KVError):
                watcher.cancel()

    def _round(self) -> None:
        try:
            if self._lease:
                self._keep()
            else:
                self._campaign()
        except KVError as e:
            log.warning("commit leader election: etcd: %s", e)

    def _campaign(self) -> None:
        held = self.refresh()
        if held is not None:
            return
        lease = self.kv.lease_grant(self.ttl)
        res = self.kv.txn([Compare.absent(self.key)],
                          [Put(self.key, self.address.encode(), lease)], [Get(self.key)])
        if not res.succeeded:
            self.kv.lease_revoke(lease)
            self.refresh()
            return
        with self._lock:
            self._lease = lease
            self._kept_at = time.monotonic()
            self._known = Leadership(self.address, res.revision)
        log.info("commit leader of %s from revision %d (%s)", self.key.decode(),
                 res.revision, self.address)
        self._on_elected(res.revision)

    def _keep(self) -> None:
        try:
            self.kv.lease_keepalive(self._lease)
            self._kept_at = time.monotonic()
            return
        except LeaseNotFoundError:
            why = "its lease lapsed"
        except KVError as e:
            # etcd out of reach (an etcd election, a stall): the lease lives on in etcd
            # until its TTL from the last refresh, and the key with it, so stepping
            # down now would leave nobody leading until then. Keep trying while it may
            # live; the fence keeps every write safe meanwhile.
            if time.monotonic() - self._kept_at < self.ttl:
                log.warning("commit leader: refreshing the lease failed (%s); trying again",
                            e)
                return
            why = f"etcd: {e}, for longer than the lease"
        with self._lock:
            self._lease = 0
            self._known = None
        log.warning("commit leadership lost (%s)", why)
        self._on_deposed()


@attrs.define
class _Request:
    txns: Sequence[Transaction]
    done: threading.Event = attrs.field(factory=threading.Event)
    results: list[CommitResult] | None = None
    error: BaseException | None = None


@attrs.define
class _Flight:
    """A batch whose etcd request is on its way."""

    batch: list[_Request]
    staged: Staged
    sent: SentBatch
    future: Future[TxnResult]
    sent_at: float = 0.0  # monotonic


# A batch taken while another's request is in flight waits until that request has
# been out this share of the latest round trip (or has returned), so the commits that
# arrive meanwhile join it: with one request in flight at a time, commits per
# request are what the leader's rate scales with.
HOLD_SHARE = 0.5

# One batch at a time (not pipelined), N schedulers each waiting on its own commit
# split into two alternating halves: those answered come back while the others' batch
# is written, and each batch holds about N/2 commits. A batch taken with fewer waiting
# than came in the last cycle (its batch and those queued behind it: the "siblings",
# as PostgreSQL's commit_siblings) waits for them up to this share of the latest
# batch's time, so that one etcd request (one fsync, one watch event to apply) serves
# them all. Waiting when none would come costs at most that share in latency.
SIBLING_HOLD_SHARE = 0.5

# Placeholder revisions of the records of a write in flight (``CellStore.stage``):
# above any revision etcd will reach.
MARK_BASE = 1 << 62


class GroupCommitter:
    """The leader's commit queue: ``commit`` blocks until its transactions are durable
    (or failed); one thread commits whatever waits, as one batch (module docstring).

    Pipelined (``pipeline``; not the default, see ServerConfig.commit_pipeline): while
    one batch's etcd request is in
    flight, the thread takes the commits that arrived meanwhile and decides them over
    the state that request will make (``CellStore.stage``); it sends them once the
    request before is durable, and answers each batch only from its own request's
    answer. If the request in flight fails (a guard: a writer outside the leader; the
    fence; etcd), the batch decided over it is thrown away and decided again from
    what etcd holds (``CellStore.abandon``, then ``commit_checked``). A batch that is
    not all incremental transactions fitting one request goes the plain way, with
    nothing in flight.

    Stats (read by tests and ``status``): ``batches``, ``commits`` (requests),
    ``transactions``, ``overlapped`` (batches decided while another's request was in
    flight) and ``redone`` (batches decided again because the request they were decided
    over failed)."""

    def __init__(self, store: CellStore, *, max_txns: int = MAX_BATCH_TXNS,
                 max_claims: int = MAX_BATCH_CLAIMS, pipeline: bool = False) -> None:
        self.store = store
        self.max_txns = max_txns
        self.max_claims = max_claims
        self.pipeline = pipeline
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._closed: BaseException | None = None
        self.batches = self.commits = self.transactions = 0
        self.overlapped = self.redone = 0
        self.in_flight = 0  # requests taken and not answered yet
        self.busy_s = 0.0  # seconds spent deciding, encoding and settling batches
        self._started = time.monotonic()
        self._marks = 0
        self._durable: dict[int, int] = {}  # the mark of the latest request settled -> revision
        self._round_trip = 0.0  # seconds, a moving average of the requests'
        # The plain way's sibling hold (SIBLING_HOLD_SHARE): requests seen in the last
        # cycle and the latest batch's seconds (a moving average).
        self._siblings = 0
        self._batch_s = 0.0
        self.held_s = 0.0  # seconds batches waited for siblings, added up
        self.requests = 0  # pipelined etcd requests returned
        self.etcd_s = 0.0  # seconds they were out, added up (one at a time)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="group-commit-send")
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)

    def start(self) -> GroupCommitter:
        self._thread.start()
        return self

    def commit(self, txns: Sequence[Transaction]) -> list[CommitResult]:
        """Commit ``txns`` (each already checked well-formed) in the next batch; raises
        what stopped the batch (FencedOut when the leadership ended first)."""
        req = _Request(txns)
        with self._cond:
            if self._closed is not None:
                raise self._closed
            self._queue.append(req)
            self._cond.notify()
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.results is not None
        return req.results

    def describe(self) -> str:
        """What it did, for the log: batches, commits, busy share of its time."""
        up = max(1e-9, time.monotonic() - self._started)
        per = self.commits / self.batches if self.batches else 0.0
        return (f"{self.commits} commits ({self.transactions} transactions) in "
                f"{self.batches} batches ({per:.1f} commits a batch, {self.overlapped} "
                f"decided while another was in flight, {self.redone} decided again), busy "
                f"{self.busy_s:.1f} s of {up:.1f} s, waited for siblings {self.held_s:.1f} s; "
                f"pipelined etcd requests out "
                f"{self.etcd_s:.1f} s ({self.requests} requests, "
                f"{1000 * self.etcd_s / max(1, self.requests):.1f} ms each)")

    def close(self, why: BaseException | None = None) -> None:
        """Stop taking commits; those queued fail with ``why`` (the batch in flight
        finishes: its Txn is fenced)."""
        err = why or FencedOut("this server stopped leading commits")
        with self._cond:
            if self._closed is None:
                self._closed = err
            waiting, self._queue = self._queue, []
            self._cond.notify_all()
        for req in waiting:
            req.error = err
            req.done.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _take(self, flight: _Flight | None) -> list[_Request] | None:
        """Every request waiting, up to the batch caps; waits for one, or for the
        request in flight to return ([] then). None once closed."""
        with self._cond:
            while (not self._queue and self._closed is None
                   and (flight is None or not flight.future.done())):
                self._cond.wait()
            if flight is not None:
                until = flight.sent_at + HOLD_SHARE * self._round_trip
                while (self._closed is None and not flight.future.done()
                       and (left := until - time.monotonic()) > 0):
                    self._cond.wait(left)
            elif self._queue and len(self._queue) < self._siblings:
                began = time.monotonic()
                until = began + SIBLING_HOLD_SHARE * self._batch_s
                while (self._closed is None and len(self._queue) < self._siblings
                       and not self._full() and (left := until - time.monotonic()) > 0):
                    self._cond.wait(left)
                self.held_s += time.monotonic() - began
            if self._closed is not None:
                return None
            batch: list[_Request] = []
            txns = claims = 0
            while self._queue:
                req = self._queue[0]
                n = sum(len(t.claims) for t in req.txns)
                if batch and (txns + len(req.txns) > self.max_txns
                              or claims + n > self.max_claims):
                    break
                batch.append(self._queue.pop(0))
                txns += len(req.txns)
                claims += n
            self.in_flight = len(batch) + (len(flight.batch) if flight is not None else 0)
            return batch

    def _full(self) -> bool:
        """Whether the queue holds a whole batch (the caps). Under ``_cond``."""
        txns = claims = 0
        for req in self._queue:
            txns += len(req.txns)
            claims += sum(len(t.claims) for t in req.txns)
        return txns >= self.max_txns or claims >= self.max_claims

    def _run(self) -> None:
        flight: _Flight | None = None
        try:
            while True:
                batch = self._take(flight)
                if batch is None:
                    if flight is not None:
                        self._land(flight, None)
                    return
                staged: Staged | None = None
                if batch and self.pipeline:
                    staged = self._stage(batch, flight is not None)
                if flight is not None:
                    if not self._land(flight, staged) and staged is not None:
                        staged = None  # decided over a write that failed: decide again
                        self.redone += 1
                    flight = None
                    if self._closed is not None:
                        if staged is not None:
                            self.store.abandon(staged)
                        self._answer(batch, error=self._closed)
                        return
                if not batch:
                    continue
                if staged is not None:
                    flight = self._launch(batch, staged)
                    if flight is not None:
                        continue
                self._commit_now(batch)
                if self._closed is not None:
                    return
        finally:
            self._sender.shutdown(wait=False)

    def _stage(self, batch: list[_Request], overlapping: bool) -> Staged | None:
        """Decide ``batch`` over the write in flight; if only its first requests fit
        one etcd request, the rest go back to the head of the queue (``batch`` keeps
        those staged)."""
        began = time.monotonic()
        self._marks += 1
        cuts = list(itertools.accumulate(len(req.txns) for req in batch))
        try:
            staged = self.store.stage([t for req in batch for t in req.txns],
                                      MARK_BASE + self._marks, cuts)
        except Exception as e:  # an etcd read failed, say: the plain way tells the waiters
            log.debug("staging a batch: %s; committing it the plain way", e)
            staged = None
        self.busy_s += time.monotonic() - began
        if staged is None:
            return None
        kept = cuts.index(len(staged.txns)) + 1
        if kept < len(batch):
            rest = batch[kept:]
            del batch[kept:]
            with self._cond:
                closed = self._closed
                if closed is None:
                    self._queue[:0] = rest
                    self.in_flight -= len(rest)
            if closed is not None:
                self._answer(rest, error=closed)
        if overlapping:
            self.overlapped += 1
        return staged

    def _launch(self, batch: list[_Request], staged: Staged) -> _Flight | None:
        """Encode ``staged`` (the write before it is durable) and send it; None when it
        does not fit one request (then it goes the plain way)."""
        began = time.monotonic()
        try:
            sent = self.store.send(staged, self._durable)
        except Exception:
            self.store.abandon(staged)
            raise
        finally:
            self.busy_s += time.monotonic() - began
        if sent is None:
            self.store.abandon(staged)
            return None
        kv = self.store.kv
        flight = _Flight(batch, staged, sent,
                         self._sender.submit(kv.txn, sent.compares, sent.ops, sent.shared_gets),
                         time.monotonic())
        flight.future.add_done_callback(lambda _f: self._returned(flight))
        return flight

    def _returned(self, flight: _Flight) -> None:
        took = time.monotonic() - flight.sent_at
        with self._cond:
            self.requests += 1
            self.etcd_s += took
            self._round_trip = took if not self._round_trip else (
                0.8 * self._round_trip + 0.2 * took)
            self._cond.notify_all()

    def _land(self, flight: _Flight, next_staged: Staged | None) -> bool:
        """Wait for ``flight``'s answer and answer its requests. Returns whether it was
        durable as decided; if not, ``next_staged`` (decided over it) is abandoned."""
        try:
            res = flight.future.result()
            began = time.monotonic()
            settled = self.store.settle(flight.staged, flight.sent, res)
            ok = not settled.left
            if not ok and next_staged is not None:
                self.store.abandon(next_staged)  # before deciding anything again
            results = self.store.finish(flight.staged, settled)
            self.busy_s += time.monotonic() - began
        except BaseException as e:  # every waiter hears it
            self.store.abandon(flight.staged)
            if next_staged is not None:
                self.store.abandon(next_staged)
            self._answer(flight.batch, error=e)
            return False
        if ok:
            self._durable = {flight.staged.mark: res.revision}
        self._answer(flight.batch, results)
        return ok

    def _commit_now(self, batch: list[_Request]) -> None:
        """The plain way: decide and write the batch with nothing in flight."""
        began = time.monotonic()
        try:
            results = self.store.commit_checked([t for req in batch for t in req.txns])
        except BaseException as e:  # every waiter hears it
            self.busy_s += time.monotonic() - began
            self._answer(batch, error=e)
            return
        took = time.monotonic() - began
        self.busy_s += took
        self._batch_s = took if not self._batch_s else 0.8 * self._batch_s + 0.2 * took
        with self._cond:
            # This cycle's requests: the batch (its callers commit again once answered)
            # and those that queued while it was written.
            self._siblings = len(batch) + len(self._queue)
        self._answer(batch, results)

    def _answer(self, batch: list[_Request], results: list[CommitResult] | None = None,
                error: BaseException | None = None) -> None:
        if error is None:
            assert results is not None
            self.batches += 1
            self.commits += len(batch)
            self.transactions += len(results)
        at = 0
        for req in batch:
            if error is not None:
                req.error = error
            else:
                assert results is not None
                req.results = results[at:at + len(req.txns)]
                at += len(req.txns)
            req.done.set()
        with self._cond:
            self.in_flight = max(0, self.in_flight - len(batch))
        if isinstance(error, FencedOut):
            self.close(error)

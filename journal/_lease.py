"""The run's lease: ``SET NX PX`` with an owner token, plus the fence redis-py's lock lacks.

Acquisition increments a per-run fence counter and stores ``<fence>:<token>`` as the lease
value in one script, so every later write can prove, inside the same script as the write,
that it still comes from the current holder. A worker that was paused past its lease (GC,
SIGSTOP, a slow network) and wakes up after another took over is refused at its next write.

A holder that is provably dead (see ``journal._holder``: same host, boot, pid and time
namespace, and its pid gone or reused) is not waited for: its lease is taken over at once, with
a new fence.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from journal._cancel import Cancelled
from journal._clock import Clock
from journal._holder import ProcessIdentity
from journal._redis.backend import (
    Confirming,
    Opened,
    Opening,
    OpenReply,
    RedisBackend,
    Renewed,
    StepStore,
)
from journal._schema.keys import RunKeys
from journal.errors import CorruptJournal, LeaseBusy, LeaseLost
from journal.events import emit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """What a successful acquisition hands the holder."""

    holder: str
    fence: int
    starts_without_progress: int
    confirmed_at: float
    """``time.monotonic()`` taken before the acquire request: the lease is held until at
    least this plus the TTL, whenever the reply arrived."""
    status: Opened = Opened.ACQUIRED
    """Acquired; or acquired but stalled too often, to be parked; or acquired with a cancel
    pending, to be cancelled."""
    meta: list[Any] = field(default_factory=list)
    """For an opening: the meta hash as it was before this start, flat (field, value, ...)."""
    steps: list[Any] = field(default_factory=list)
    """For an opening: the steps hash, flat (step key, record, ...)."""
    effects: frozenset[str] | None = None
    """For an opening: the effects that had a claim; one absent never did."""


@dataclass(frozen=True)
class Found:
    """An opening that took no lease: the run has ended, is parked, or has an unreadable wait.

    Attributes:
        status: ended, parked, or a bad wait.
        detail: the meta hash, flat, when ended or parked; the stored wait for a bad wait.
    """

    status: Opened
    detail: Any


@dataclass
class Lease:
    """One holder's claim on one run.

    ``due_after_ms`` is set when the lease belongs to an opened run: each renewal then pushes
    the run's due time past the new expiry (``due_after_ms()`` from the renewal on).
    """

    keys: RunKeys
    backend: RedisBackend
    ttl_ms: int
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    due_after_ms: Callable[[], int] | None = None

    def open(self, now_ms: int, opening: Opening) -> Grant | Found:
        """Take the lease and open the run in one round trip (see ``open.lua``).

        Returns:
            The grant, or what was found instead when the run must not start.

        Raises:
            LeaseBusy: another holder's lease is live; carries its remaining milliseconds.
            CorruptJournal: a counter the start increments is not an integer.
        """
        return self._take(now_ms, opening)

    def _take(self, now_ms: int, opening: Opening | None) -> Grant | Found:
        me = ProcessIdentity.current()
        asked = time.monotonic()
        reply = self._acquire(now_ms, me, "", opening)
        if reply.status is Opened.BUSY:
            process = ProcessIdentity.decode(reply.process)
            if process is not None and process.provably_gone(me):
                asked = time.monotonic()
                holder, reply = reply.holder, self._acquire(now_ms, me, reply.holder, opening)
                if reply.status.acquired:
                    emit("takeover", workflow=self.keys.workflow)
                    log.info(
                        "run %s: lease holder %s (pid %d on %s) is gone; taken over at once",
                        self.keys.run,
                        holder.split(":", 1)[0],
                        process.pid,
                        process.host,
                    )
        if reply.status is Opened.BUSY:
            holder = reply.holder
            raise LeaseBusy(self.keys.run, max(reply.remaining_ms, 0), holder.split(":", 1)[0])
        if reply.status is Opened.BAD_WAIT:
            return Found(reply.status, reply.detail)
        if not reply.status.acquired:
            return Found(reply.status, reply.meta)
        holder = f"{reply.fence}:{self.token}"
        fence, stalled = reply.fence, reply.stalled
        # A field that is not text is no step key: replaced, it matches none.
        effects = (
            None
            if reply.effects is None
            else frozenset(name.decode(errors="replace") for name in reply.effects)
        )
        return Grant(holder, fence, stalled, asked, reply.status, reply.meta, reply.steps, effects)

    def _acquire(
        self, now_ms: int, me: ProcessIdentity, dead_holder: str, opening: Opening | None
    ) -> OpenReply:
        reply = self.backend.open(
            self.keys, self.token, self.ttl_ms, now_ms, me.encode(), dead_holder, opening
        )
        if reply.status is Opened.BAD_COUNTER:
            raise CorruptJournal(self.keys.run, reply.detail, "not an integer counter")
        return reply

    def renew(
        self,
        holder: str,
        flight: Mapping[str, int] | None = None,
        confirming: Confirming | None = None,
    ) -> Renewed:
        """Extend the lease if we still hold it (compare-and-PEXPIRE), pushing its due time.

        Args:
            holder: ``<fence>:<token>``, ours.
            flight: the steps we run now (step key -> started at, ms), published for
                operators in the same round trip; none clears what the last renewal said.
            confirming: an effect's confirmation: its claim is marked confirmed (taken, if
                asked and nobody has one) in the same round trip, unless a cancel is pending.
        """
        due_at = None if self.due_after_ms is None else self.due_after_ms()
        return self.backend.renew(self.keys, holder, self.ttl_ms, due_at, flight or {}, confirming)

    def release(self, holder: str) -> bool:
        """Give the lease back if we still hold it (compare-and-DEL)."""
        return self.backend.release(self.keys, holder)


class _Beats:
    """The one daemon thread per process that renews every started heartbeat when it is due.

    A thread per run cost more than the rest of a short run's bookkeeping (start, then a join
    at its end); one shared thread costs a dictionary entry. A renewal runs outside the lock,
    so a slow one delays the others' but never blocks a run registering or leaving. Forked
    children (Celery's pool) start with none, and their own thread is made on first use.

    A run's first renewal is an interval away, so it is rarely sooner than the thread's next
    wake-up: the thread is woken only when it is, and otherwise keeps sleeping. Waking it for
    every run (it would find nothing due) cost a thread switch per run, under the GIL.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start empty; again in the child of a fork, where the parent's thread does not run."""
        self._changed = threading.Condition()
        self._due: dict[Heartbeat, float] = {}
        self._thread: threading.Thread | None = None
        self._wakes_at = -math.inf  # when the waiting thread looks again; -inf: not waiting
        self._shortest = math.inf  # the shortest interval of any beat added

    def add(self, beat: Heartbeat, at: float) -> None:
        """Renew ``beat`` at ``at`` (``time.monotonic()``), then every interval after."""
        with self._changed:
            self._due[beat] = at
            self._shortest = min(self._shortest, beat.interval)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-beats", daemon=True)
                self._thread.start()
            elif at < self._wakes_at:
                self._changed.notify()

    def remove(self, beat: Heartbeat) -> None:
        """Renew ``beat`` no more (a renewal already started still finishes)."""
        with self._changed:
            self._due.pop(beat, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = time.monotonic()
                    ready = [beat for beat, at in self._due.items() if at <= now]
                    if ready:
                        break
                    # With none left, look again an interval from now: a run added meanwhile
                    # is first due no sooner, so adding it wakes nobody.
                    soonest = min(self._due.values(), default=now + self._shortest)
                    self._wakes_at = soonest
                    self._changed.wait(soonest - now)
                    self._wakes_at = -math.inf
                for beat in ready:
                    self._due[beat] = now + beat.interval
            for beat in ready:
                beat.beat()


_BEATS = _Beats()
os.register_at_fork(after_in_child=_BEATS.reset)


class InFlight:
    """The steps a holder runs now, by key, with the time each started (ms).

    Steps of a map run on several threads at once, hence the lock. The heartbeat publishes
    them with each renewal (``renew.lua``): at no extra round trip, operators see what a live
    run is doing between its records, at most a renewal interval late.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[str, int] = {}

    @contextlib.contextmanager
    def running(self, key: str, started_ms: int) -> Iterator[None]:
        """``key`` is in flight while the block runs."""
        with self._lock:
            self._steps[key] = started_ms
        try:
            yield
        finally:
            with self._lock:
                self._steps.pop(key, None)

    def now(self) -> dict[str, int]:
        """The steps in flight now, a copy."""
        with self._lock:
            return dict(self._steps)


class Guard(Protocol):
    """What a run checks at each step boundary and before an irreversible act.

    ``Heartbeat`` guards every real run; a run replayed in memory (``journal.testing._rehearsal``)
    holds no lease and is never cancelled. ``flight`` is where the run says which steps it
    runs now.
    """

    cancelled: threading.Event
    flight: InFlight

    def ensure(self) -> None:
        """Raise unless the run may start another step."""
        ...

    def confirm(self, effect: Confirming | None = None) -> bool:
        """Raise unless the run may act now; with ``effect``, confirm its claim in that check.

        False when that claim is no longer this fence's claimed one, or could not be taken
        (nothing confirmed).
        """
        ...


@dataclass(frozen=True)
class Holding:
    """A lease holder's right to write one run: what its ``Run`` and each ``Effect`` share.

    Every write of either goes through ``backend`` as ``holder`` under ``fence``, checked by
    ``guard`` at each boundary and timed by ``clock``: values that always travel together.
    """

    backend: StepStore
    keys: RunKeys
    holder: str
    fence: int
    guard: Guard
    clock: Clock


class Heartbeat:
    """Renews a lease every ttl/3 from the process's beat thread, and guards each step boundary.

    A failed renewal only sets ``lost``; the run notices at its next step boundary, and the
    fenced record refuses anything it tries to write in between. A renewal (or a record) that
    reports a pending cancel sets ``cancelled``, and the next boundary stops the run.
    ``ensure`` closes the gap a
    paused process (SIGSTOP, a long GC, a frozen VM) would otherwise leave: when the last
    confirmation is older than half the TTL, it renews synchronously before a step may start,
    so a worker that slept through its lease learns it before running a side effect.

    A confirmation is the time taken *before* the request that proved the lease (the acquire,
    then each renewal): a pause between the request and its reply, or after it, only makes
    the confirmation look older than it is, never younger.
    """

    def __init__(self, lease: Lease, holder: str, confirmed_at: float) -> None:
        self._lease = lease
        self._holder = holder
        self._stop = threading.Event()
        self._confirmed_at = confirmed_at
        self._confirm_lock = threading.Lock()
        self._beating = threading.Lock()  # held by each beat's renewal, and by ``paused``
        self.lost = threading.Event()
        self.cancelled = threading.Event()
        self.flight = InFlight()
        self.renewals = 0
        self.interval = lease.ttl_ms / 3000

    def start(self) -> Heartbeat:
        """Start renewing in the background, every ttl/3."""
        _BEATS.add(self, time.monotonic() + self.interval)
        return self

    def stop(self, *, join: bool = True) -> None:
        """Stop renewing; the caller releases or lets the lease expire.

        Args:
            join: wait for a renewal in flight to end (not from inside ``paused``, which
                holds what it would wait for).
        """
        self._stop.set()
        _BEATS.remove(self)
        if join:
            with self._beating:
                pass

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No renewal starts meanwhile: for a write that may give the lease back.

        A renewal after the lease is given back would report it lost; one that started
        before finishes first, so its due-time push never lands after the write's.
        """
        with self._beating:
            yield

    def ensure(self) -> None:
        """Raise unless the lease is known to be held now and the run is not cancelled.

        Raises:
            LeaseLost: renewal failed, or a synchronous check found the lease gone.
            Cancelled: the run was cancelled; it must not start another step.
        """
        if not self.lost.is_set():
            stale = time.monotonic() - self._confirmed_at > self._lease.ttl_ms / 2000
            if stale:
                self._renew()
        if self.lost.is_set():
            raise LeaseLost(self._lease.keys.run, "the lease expired or was taken over")
        if self.cancelled.is_set():
            raise Cancelled(self._lease.keys.run)

    def confirm(self, effect: Confirming | None = None) -> bool:
        """Renew synchronously, now, whatever the last confirmation: for an irreversible act.

        The lease is then held until at least the time before the request plus the TTL.

        Args:
            effect: an effect's confirmation: its claim is marked confirmed (or taken) by the
                same script that renews (one round trip), unless the run is cancelled.

        Returns:
            False when ``effect``'s claim is no longer this fence's claimed one, or another's
            stands (the lease renewed all the same, nothing confirmed); True otherwise.

        Raises:
            LeaseLost: the lease is gone or held by another.
            Cancelled: the run was cancelled: the act must not happen.
        """
        renewed = Renewed.LOST if self.lost.is_set() else self._renew(effect)
        if renewed is Renewed.LOST:
            raise LeaseLost(self._lease.keys.run, "the lease expired or was taken over")
        if self.cancelled.is_set():
            raise Cancelled(self._lease.keys.run)
        return renewed is not Renewed.NOT_THIS_CLAIM

    def _renew(self, effect: Confirming | None = None) -> Renewed:
        asked = time.monotonic()
        status = self._lease.renew(self._holder, self.flight.now(), effect)
        if status is Renewed.LOST:
            emit("renewal_failed", workflow=self._lease.keys.workflow)
            with self._confirm_lock:  # the beat and a step boundary may find it at once
                first = not self.lost.is_set()
                self.lost.set()
            if first:  # one line, whichever of them found it
                log.error("lease on %s lost; the run stops at its next step", self._lease.keys.run)
            return status
        if status is Renewed.CANCEL_PENDING:
            self.cancelled.set()
        with self._confirm_lock:  # the beat and a step boundary may both renew
            self._confirmed_at = max(self._confirmed_at, asked)
            self.renewals += 1
        return status

    def beat(self) -> None:
        """One background renewal; a lost lease stops the beats."""
        try:
            with self._beating:
                if self._stop.is_set() or self.lost.is_set():
                    return
                renewed = self._renew() is not Renewed.LOST
            if not renewed:
                _BEATS.remove(self)
        except Exception:  # a blip must not kill the thread; the next beat retries
            log.warning("lease renewal for %s failed; retrying", self._lease.keys.run)

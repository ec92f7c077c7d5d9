"""The run's lease: ``SET NX PX`` with an owner token, plus the fence redis-py's lock lacks.

Acquisition increments a per-run fence counter and stores ``<fence>:<token>`` as the lease
value in one script, so every later write can prove, inside the same script as the write,
that it still comes from the current holder. A worker that was paused past its lease (GC,
SIGSTOP, a slow network) and wakes up after another took over is refused at its next write.

A holder that is provably dead (see ``journal.holder``: same host, boot and pid namespace, and
its pid gone or reused) is not waited for: its lease is taken over at once, with a new fence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from journal.cancel import Cancelled
from journal.errors import CorruptJournal, LeaseBusy, LeaseLost
from journal.events import emit
from journal.holder import ProcessIdentity
from journal.keys import RunKeys
from journal.scripts import Scripts, status_of

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
    status: int = 1
    """1 acquired (and, for an opening, announced); 3 acquired but stalled too often, to be
    parked; 4 acquired with a cancel pending, to be cancelled (see ``open.lua``)."""
    meta: list[Any] = field(default_factory=list)
    """For an opening: the meta hash as it was before this start, flat (field, value, ...)."""
    steps: list[Any] = field(default_factory=list)
    """For an opening: the steps hash, flat (step key, record, ...)."""


@dataclass(frozen=True)
class Found:
    """An opening that took no lease: the run has ended, is parked, or has an unreadable wait.

    Attributes:
        status: 2 ended, 5 parked, -3 unreadable wait (see ``open.lua``).
        detail: the meta hash, flat, for 2 and 5; the stored wait for -3.
    """

    status: int
    detail: Any


@dataclass(frozen=True)
class Opening:
    """What opening a run adds to taking its lease, in the same script (see ``open.lua``).

    Attributes:
        runs: the runs index key; due: the due index key.
        max_stalled_starts: starts that died without recording anything before parking.
        due_at_ms: when the run is due again should this holder die (lease expiry + grace).
        args: the run's arguments as JSON, frozen unless an earlier start froze some.
        count_delivery: count this start in ``meta.deliveries`` (a queue delivered it).
    """

    runs: str
    due: str
    max_stalled_starts: int
    due_at_ms: int
    args: bytes
    count_delivery: bool = False


@dataclass
class Lease:
    """One holder's claim on one run.

    ``due`` names the due index when the lease belongs to an opened run: each renewal then
    pushes the run's due time past the new expiry (``due_after_ms`` from the renewal on).
    """

    keys: RunKeys
    scripts: Scripts
    ttl_ms: int
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    due: str = ""
    due_after_ms: Callable[[], int] | None = None

    def acquire(self, now_ms: int) -> Grant:
        """Take the lease alone, or learn how long the current holder still has.

        A live lease whose holder this process can prove dead is taken over at once.

        Raises:
            LeaseBusy: another holder's lease is live; carries its remaining milliseconds.
        """
        grant = self._take(now_ms, None)
        assert isinstance(grant, Grant)  # without an opening the script never finds a run
        return grant

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
        if reply[0] == 0:
            holder = _text(reply[2])
            process = ProcessIdentity.decode(reply[3])
            if process is not None and process.provably_gone(me):
                asked = time.monotonic()
                reply = self._acquire(now_ms, me, holder, opening)
                if reply[0] in (1, 3, 4):
                    emit("takeover")
                    log.info(
                        "run %s: lease holder %s (pid %d on %s) is gone; taken over at once",
                        self.keys.run,
                        holder.split(":", 1)[0],
                        process.pid,
                        process.host,
                    )
        status = reply[0]
        if status == 0:
            holder = _text(reply[2])
            raise LeaseBusy(self.keys.run, max(int(reply[1]), 0), holder.split(":", 1)[0])
        if status in (2, 5, -3):
            return Found(status, reply[1])
        fence = int(reply[1])
        grant = Grant(f"{fence}:{self.token}", fence, int(reply[2]), asked, status)
        if len(reply) > 3:
            return dataclasses.replace(grant, meta=reply[3], steps=reply[4])
        return grant

    def _acquire(
        self, now_ms: int, me: ProcessIdentity, dead_holder: str, opening: Opening | None
    ) -> Any:
        keys = [self.keys.lease, self.keys.fence, self.keys.meta, self.keys.steps]
        args: list[Any] = [self.token, self.ttl_ms, now_ms, me.encode(), dead_holder]
        known: tuple[int, ...] = (0, 1, -1)
        if opening is not None:
            keys += [opening.runs, opening.due]
            args += [opening.max_stalled_starts, opening.due_at_ms, self.keys.run]
            args += [self.keys.workflow, self.keys.run_id, opening.args]
            args.append("1" if opening.count_delivery else "")
            known = (0, 1, 2, 3, 4, 5, -1, -3)
        reply = self.scripts.open(keys=keys, args=args)
        if status_of("open", reply, known) == -1:
            raise CorruptJournal(self.keys.run, _text(reply[1]), "not an integer counter")
        return reply

    def renew(self, holder: str) -> int:
        """Extend the lease if we still hold it (compare-and-PEXPIRE), pushing the run's due time.

        Returns:
            1 extended, 2 extended and a cancel of the run is pending, 0 lost.
        """
        keys = [self.keys.lease, self.keys.meta]
        args: list[Any] = [holder, self.ttl_ms]
        if self.due and self.due_after_ms is not None:
            keys.append(self.due)
            args += [self.due_after_ms(), self.keys.run]
        return status_of("renew", self.scripts.renew(keys=keys, args=args), (0, 1, 2))

    def release(self, holder: str) -> bool:
        """Give the lease back if we still hold it (compare-and-DEL)."""
        reply = self.scripts.release(keys=[self.keys.lease], args=[holder])
        return status_of("release", reply, (0, 1)) == 1


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Beats:
    """The one daemon thread per process that renews every started heartbeat when it is due.

    A thread per run cost more than the rest of a short run's bookkeeping (start, then a join
    at its end); one shared thread costs a dictionary entry. A renewal runs outside the lock,
    so a slow one delays the others' but never blocks a run registering or leaving. Forked
    children (Celery's pool) start with none, and their own thread is made on first use.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start empty; again in the child of a fork, where the parent's thread does not run."""
        self._changed = threading.Condition()
        self._due: dict[Heartbeat, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, beat: Heartbeat, at: float) -> None:
        """Renew ``beat`` at ``at`` (``time.monotonic()``), then every interval after."""
        with self._changed:
            self._due[beat] = at
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-beats", daemon=True)
                self._thread.start()
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
                    soonest = min(self._due.values(), default=now + 60)
                    self._changed.wait(soonest - now)
                for beat in ready:
                    self._due[beat] = now + beat.interval
            for beat in ready:
                beat.beat()


_BEATS = _Beats()
os.register_at_fork(after_in_child=_BEATS.reset)


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

    def confirm(self) -> float:
        """Renew synchronously, now, whatever the last confirmation: for an irreversible act.

        Returns:
            The confirmation time (``time.monotonic()`` before the request); the lease is
            held until at least this plus the TTL.

        Raises:
            LeaseLost: the lease is gone or held by another.
            Cancelled: the run was cancelled: the act must not happen.
        """
        asked = time.monotonic()
        if self.lost.is_set() or not self._renew(asked):
            raise LeaseLost(self._lease.keys.run, "the lease expired or was taken over")
        if self.cancelled.is_set():
            raise Cancelled(self._lease.keys.run)
        return asked

    def _renew(self, asked: float | None = None) -> bool:
        asked = time.monotonic() if asked is None else asked
        status = self._lease.renew(self._holder)
        if status == 0:
            self.lost.set()
            emit("renewal_failed")
            return False
        if status == 2:
            self.cancelled.set()
        with self._confirm_lock:  # the beat and a step boundary may both renew
            self._confirmed_at = max(self._confirmed_at, asked)
            self.renewals += 1
        return True

    def beat(self) -> None:
        """One background renewal; a lost lease stops the beats."""
        try:
            with self._beating:
                if self._stop.is_set() or self.lost.is_set():
                    return
                renewed = self._renew()
            if not renewed:
                _BEATS.remove(self)
                log.error("lease on %s lost; the run stops at its next step", self._lease.keys.run)
        except Exception:  # a blip must not kill the thread; the next beat retries
            log.warning("lease renewal for %s failed; retrying", self._lease.keys.run)

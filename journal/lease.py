"""The run's lease: ``SET NX PX`` with an owner token, plus the fence redis-py's lock lacks.

Acquisition increments a per-run fence counter and stores ``<fence>:<token>`` as the lease
value in one script, so every later write can prove, inside the same script as the write,
that it still comes from the current holder. A worker that was paused past its lease (GC,
SIGSTOP, a slow network) and wakes up after another took over is refused at its next write.

A holder that is provably dead (see ``journal.holder``: same host, boot and pid namespace, and
its pid gone or reused) is not waited for: its lease is taken over at once, with a new fence.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
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


@dataclass
class Lease:
    """One holder's claim on one run."""

    keys: RunKeys
    scripts: Scripts
    ttl_ms: int
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    def acquire(self, now_ms: int) -> Grant:
        """Take the lease, or learn how long the current holder still has.

        A live lease whose holder this process can prove dead is taken over at once.

        Raises:
            LeaseBusy: another holder's lease is live; carries its remaining milliseconds.
        """
        me = ProcessIdentity.current()
        asked = time.monotonic()
        reply = self._acquire(now_ms, me, "")
        if status_of("acquire", reply, (0, 1)) == 0:
            holder = _text(reply[2])
            process = ProcessIdentity.decode(reply[3])
            if process is not None and process.provably_gone(me):
                asked = time.monotonic()
                reply = self._acquire(now_ms, me, holder)
                if status_of("acquire", reply, (0, 1)) == 1:
                    emit("takeover")
                    log.info(
                        "run %s: lease holder %s (pid %d on %s) is gone; taken over at once",
                        self.keys.run,
                        holder.split(":", 1)[0],
                        process.pid,
                        process.host,
                    )
        if status_of("acquire", reply, (0, 1)) == 0:
            holder = _text(reply[2])
            raise LeaseBusy(self.keys.run, max(int(reply[1]), 0), holder.split(":", 1)[0])
        fence = int(reply[1])
        return Grant(f"{fence}:{self.token}", fence, int(reply[2]), asked)

    def _acquire(self, now_ms: int, me: ProcessIdentity, dead_holder: str) -> Any:
        reply = self.scripts.acquire(
            keys=[self.keys.lease, self.keys.fence, self.keys.meta, self.keys.steps],
            args=[self.token, self.ttl_ms, now_ms, me.encode(), dead_holder],
        )
        if status_of("acquire", reply, (0, 1, -1)) == -1:
            raise CorruptJournal(self.keys.run, _text(reply[1]), "not an integer counter")
        return reply

    def renew(self, holder: str) -> int:
        """Extend the lease if we still hold it (compare-and-PEXPIRE).

        Returns:
            1 extended, 2 extended and a cancel of the run is pending, 0 lost.
        """
        reply = self.scripts.renew(
            keys=[self.keys.lease, self.keys.meta], args=[holder, self.ttl_ms]
        )
        return status_of("renew", reply, (0, 1, 2))

    def release(self, holder: str) -> bool:
        """Give the lease back if we still hold it (compare-and-DEL)."""
        reply = self.scripts.release(keys=[self.keys.lease], args=[holder])
        return status_of("release", reply, (0, 1)) == 1


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Heartbeat:
    """Renews a lease every ttl/3 from a daemon thread, and guards each step boundary.

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

    def __init__(
        self,
        lease: Lease,
        holder: str,
        confirmed_at: float,
        on_renew: Callable[[], None] | None = None,
    ) -> None:
        self._lease = lease
        self._holder = holder
        self._stop = threading.Event()
        self._confirmed_at = confirmed_at
        self._confirm_lock = threading.Lock()
        self._on_renew = on_renew
        self.lost = threading.Event()
        self.cancelled = threading.Event()
        self.renewals = 0
        self._thread = threading.Thread(
            target=self._beat, name=f"lease-heartbeat-{lease.keys.run}", daemon=True
        )

    def start(self) -> Heartbeat:
        """Start renewing in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing; the caller releases or lets the lease expire."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

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
        if self._on_renew is not None:
            self._on_renew()
        return True

    def _beat(self) -> None:
        interval = self._lease.ttl_ms / 3000
        while not self._stop.wait(interval) and not self.lost.is_set():
            try:
                if not self._renew():
                    log.error(
                        "lease on %s lost; the run stops at its next step", self._lease.keys.run
                    )
            except Exception:  # a blip must not kill the thread; the next beat retries
                log.warning("lease renewal for %s failed; retrying", self._lease.keys.run)

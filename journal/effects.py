"""Fenced effects: a side effect outside Redis that at most one lease holder may perform.

A fenced record stops a stale holder from *writing* a step, but an email, a payment or a
webhook is not a write to Redis: a holder frozen (SIGSTOP, a GC pause, a paused VM) inside
the step could wake after another took over and act again. ``Run.effect`` closes that:

1. **Claim.** One script checks the lease and records "effect in progress by fence F, until
   deadline D" (D = the server's time + the effect's timeout) before the effect starts.
2. **Confirm.** Right before the irreversible moment (for SMTP: before DATA) the function
   calls ``effect.confirm()``: the lease is renewed synchronously (its confirmation time taken
   before the request) and the claim's timeout checked against a clock read before the claim
   was sent. Lost or late, it raises ``LeaseLost`` and the effect is abandoned.
3. **Receipt.** Right after it, ``effect.accepted(receipt)`` saves the receipt through a
   fenced script; the step's record, also fenced, follows.

A new holder that finds an earlier fence's claim with no receipt waits until that claim's
deadline has passed (the earlier holder's lease is already gone, or the new one could not
hold it), or less when it can prove the claimant's process gone (``journal.holder``); then it
claims again with ``resumed=True`` and performs the effect under the same idempotency key, so
the receiver can recognise a repeat. A receipt saved by an earlier holder is handed over as
``effect.earlier``: the effect happened, and the function should not act again.

The guarantee: the effect's irreversible moment is passed by at most one holder per claim,
and only while that holder's lease is confirmed and its claim is within its timeout. The one
window left: a holder that passed ``confirm`` and then died or froze before ``accepted``
(the SMTP server accepted DATA, the receipt never reached Redis) is repeated once by the next
holder under the same idempotency key (the same ``Message-ID``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from journal import codec
from journal.backend import EffectClaimed, RedisBackend, Settled
from journal.errors import Fenced, LeaseLost
from journal.events import emit
from journal.holder import ProcessIdentity
from journal.keys import RunKeys
from journal.lease import Heartbeat

log = logging.getLogger(__name__)


class Effect:
    """The handle an effect's function receives.

    Attributes:
        key: the effect's step key.
        resumed: an earlier holder claimed this effect: it may have happened, so it must be
            repeated only under the same idempotency key.
        earlier: the receipt an earlier holder saved with ``accepted`` (the effect happened),
            or None.
        timeout: seconds after its claim within which the effect may pass ``confirm``.
    """

    def __init__(
        self,
        *,
        backend: RedisBackend,
        keys: RunKeys,
        holder: str,
        fence: int,
        guard: Heartbeat,
        key: str,
        timeout: float,
    ) -> None:
        self.key = key
        self.timeout = timeout
        self.resumed = False
        self.earlier: Any = None
        self._backend = backend
        self._keys = keys
        self._holder = holder
        self._fence = fence
        self._guard = guard
        self._claimed_at = 0.0
        self._settled = False

    def claim(self) -> None:
        """Record "in progress by this fence"; wait out an earlier holder's live claim.

        Raises:
            LeaseLost: the lease was lost (``Fenced`` when another holder owns it).
        """
        me = ProcessIdentity.current()
        proved_dead = False
        while True:
            self._claimed_at = time.monotonic()  # before the request: a deadline never grows
            claim = self._backend.effect_claim(
                self._keys,
                self._holder,
                self.key,
                self._fence,
                int(self.timeout * 1000),
                me.encode(),
                proved_dead,
            )
            if claim.status is EffectClaimed.CLAIMED:
                self.resumed = claim.resumed
                self.earlier = codec.loads(claim.receipt) if claim.receipt else None
                return
            if claim.status is not EffectClaimed.CLAIMED_BY_EARLIER:
                raise self._lost(claim.status is EffectClaimed.FENCED, "could be claimed")
            claimant = ProcessIdentity.decode(claim.process)
            if claimant is not None and claimant.provably_gone(me):
                proved_dead = True
                continue
            remaining = claim.remaining_ms / 1000
            log.info(
                "run %s: effect %r was claimed by an earlier holder that may still act; "
                "waiting %.1fs for its timeout",
                self._keys.run,
                self.key,
                remaining,
            )
            # Real time, not the run's clock: the deadline is the server's, and only real
            # time moves it.
            time.sleep(remaining)
            self._guard.ensure()

    def confirm(self) -> None:
        """Call right before the irreversible moment; raises instead of letting it happen late.

        Raises:
            LeaseLost: the lease is gone, or the claim's timeout has passed: do not act.
        """
        asked = self._guard.confirm()
        if asked - self._claimed_at >= self.timeout:
            raise LeaseLost(
                self._keys.run,
                f"effect {self.key!r} passed its {self.timeout:g}s timeout before it could act",
            )

    def accepted(self, receipt: Any) -> None:
        """Call right after the irreversible moment: the receipt, through a fenced script.

        Raises:
            LeaseLost: the lease was lost meanwhile; the receipt was not saved.
        """
        self._settle("done", codec.dumps(receipt))

    def release(self) -> None:
        """The function ended without finishing: this holder will not act on its claim again.

        Raises:
            LeaseLost: the lease was lost meanwhile, so the claim stays: the next holder waits
                for its timeout, which is what a holder that may still act deserves.
        """
        if self._settled:
            return
        try:
            self._settle("released", b"")
        except redis.RedisError:
            log.info("run %s: effect %r left claimed", self._keys.run, self.key)

    def _settle(self, state: str, receipt: bytes) -> None:
        status = self._backend.effect_settle(
            self._keys, self._holder, self.key, self._fence, state, receipt
        )
        if status is not Settled.SETTLED:
            raise self._lost(status is not Settled.LEASE_EXPIRED, "could be settled")
        self._settled = True

    def _lost(self, fenced: bool, what: str) -> LeaseLost:
        if not fenced:
            return LeaseLost(self._keys.run, f"the lease expired before effect {self.key!r} {what}")
        emit("fenced", workflow=self._keys.workflow)
        return Fenced(self._keys.run, f"effect {self.key!r} refused: the run has a newer holder")


def run_effect(effect: Effect, fn: Callable[[Effect], Any]) -> Any:
    """Claim, call ``fn``, and release the claim if ``fn`` did not finish.

    A failure of ``fn`` in a holder that has lost its lease is reported as the lease loss it
    is (a frozen sender's socket times out when it wakes): the run stops without recording.
    An interpreter exit (``SystemExit`` from a shutdown) leaves the claim: the process may be
    mid-effect, so the next holder waits for the timeout or for proof the process is gone.
    """
    effect.claim()
    try:
        return fn(effect)
    except Exception as error:
        try:
            effect.release()
        except LeaseLost as lost:
            raise lost from error
        raise

"""Fenced effects: a side effect outside Redis that at most one lease holder may perform.

A fenced record stops a stale holder from *writing* a step, but an email, a payment or a
webhook is not a write to Redis: a holder frozen (SIGSTOP, a GC pause, a paused VM) inside
the step could wake after another took over and act again. ``Run.effect`` closes that:

1. **Claim.** One script checks the lease and records "effect claimed by fence F, until
   deadline D" (D = the server's time + the effect's timeout + a margin) before it starts.
   An effect the run's opening found no claim of is not claimed yet: until its confirmation
   it cannot have happened, so no later holder has anything to wait for, and the
   confirmation takes the claim.
2. **Confirm.** Right before the last step that can still be undone (for SMTP: before DATA)
   the function calls ``effect.confirm()``: one script renews the lease and marks the claim
   *confirmed* (or takes it, confirmed): from here on the effect may have happened. The
   claim's timeout is checked against a clock read before the claim was sent.
3. **Last moment.** At the very instant before the irreversible write (SMTP's end-of-data
   marker) ``effect.last_moment()`` checks the timeout again, with no I/O: past it, the
   function abandons the act, and a later holder that waited out D acts instead.
4. **Settle.** ``effect.accepted(receipt)`` saves the receipt; a failure the function knows
   happened before the act settles *released*; any failure after the confirmation settles
   *ambiguous*: unknown is never taken for "did not happen".

Only the claim's own fence settles it, with its lease or without: a holder frozen past its
lease that wakes and finds it never acted says so, and one whose late answer shows the act
went through saves the receipt. Either wakes the run.

A new holder that finds an earlier fence's claim unsettled waits until its deadline (or less
when it proves the claimant's process gone, ``journal._holder``). A *claimed* effect never
reached its irreversible moment: it is claimed again. A *confirmed* one may have happened:
it is *ambiguous*. An ambiguous effect is repeated under the same idempotency key only where
the receiver drops repeats (``repeatable``); otherwise the run waits for an operator's
decision (``journal.ops.actions.decide``: it happened, or repeat it).

The window left: a pause between ``last_moment`` and the irreversible write itself, longer
than the claim's margin, lets a later holder act too (see docs/guarantees.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from journal._cancel import Cancelled
from journal._clock import millis
from journal._holder import ProcessIdentity
from journal._lease import Holding
from journal._redis.backend import Claimant, Confirming, EffectClaimed, EffectTerms, Settled
from journal._schema import codec
from journal.errors import (
    EffectAmbiguous,
    EffectLate,
    Fenced,
    LeaseLost,
    ReceiptUnsaved,
    StoreUnavailable,
    one_line,
)
from journal.events import emit

log = logging.getLogger(__name__)

# A claim stands this much longer in the store than its claimant allows itself: the
# claimant's monotonic clock and the server's may run at slightly different rates.
CLAIM_MARGIN_S = 1.0
CLAIM_MARGIN_RATIO = 0.02


def claim_ms(timeout: float) -> int:
    """How long the store keeps a claim of ``timeout`` seconds: the timeout and its margin."""
    return millis(timeout + max(CLAIM_MARGIN_S, timeout * CLAIM_MARGIN_RATIO))


class Effect:
    """The handle an effect's function receives.

    Attributes:
        run: the full run id.
        key: the effect's step key.
        resumed: an earlier holder claimed this effect and may have acted, so it must be
            repeated only under the same idempotency key.
        earlier: the receipt an earlier holder saved (the effect happened: do not act), or None.
        timeout: seconds after its claim within which the effect may pass ``last_moment``.
        repeatable: the receiver drops a repeat of the idempotency key.
        revocable: an operator's cancel of the run does not wait for this effect: the
            application undoes what it started.
        confirmed: ``confirm`` passed: from here on the effect may have happened.
        claim_at_confirm: no claim of the effect stood when the run opened: ``confirm`` takes
            it, and until then there is none to settle.
        outcome: how this holder settled the claim (``done``, ``released``, ``ambiguous``),
            ``done`` when an earlier holder had, or None while it is open.
        receipt_stored: the store holds the effect's receipt (this holder's or an earlier
            one's): a replay of the run can answer from it.
    """

    def __init__(
        self,
        holding: Holding,
        *,
        key: str,
        timeout: float,
        repeatable: bool = False,
        revocable: bool = False,
        claim_at_confirm: bool = False,
    ) -> None:
        self.run = holding.keys.run
        self.key = key
        self.timeout = timeout
        self.repeatable = repeatable
        self.revocable = revocable
        self.resumed = False
        self.earlier: Any = None
        self._backend = holding.backend
        self._keys = holding.keys
        self._holder = holding.holder
        self._fence = holding.fence
        self._guard = holding.guard
        self._clock = holding.clock
        self._claimed_at = 0.0
        self.confirmed = False
        self.claim_at_confirm = claim_at_confirm
        self._claim_sent = not claim_at_confirm
        self.outcome: str | None = None
        self.receipt_stored = False

    def claim(self) -> None:
        """Claim the effect, or learn that it happened; wait out an earlier live claimant.

        The wait is on the run's clock: real time in a real run (the claimant's deadline is
        the server's, and only real time moves it), a test's clock in a test.

        Raises:
            EffectAmbiguous: an earlier claimant may have acted, and no repeat is allowed.
            LeaseLost: the lease was lost (``Fenced`` when another holder owns it).
        """
        if self.claim_at_confirm:
            self._claimed_at = time.monotonic()  # its timeout runs from here all the same
            return
        me = ProcessIdentity.current()
        terms = EffectTerms(
            claim_ms(self.timeout),
            self.repeatable,
            f"an earlier holder stopped after confirming {self.key!r}, before saving its outcome",
            self.revocable,
        )
        earlier = ""
        while True:
            self._claimed_at = time.monotonic()  # before the request: a deadline never grows
            us = Claimant(self._holder, self._fence, me.encode(), earlier)
            claim = self._backend.effect_claim(self._keys, self.key, us, terms)
            if claim.status is EffectClaimed.CLAIMED:
                self.resumed = claim.resumed
                return
            if claim.status is EffectClaimed.DONE_EARLIER:
                self.earlier = codec.loads(claim.receipt)
                self.outcome = "done"
                self.receipt_stored = True
                return
            if claim.status is EffectClaimed.AMBIGUOUS:
                raise EffectAmbiguous(self._keys.run, self.key, claim.detail)
            if claim.status is not EffectClaimed.CLAIMED_BY_EARLIER:
                raise self._lost(claim.status is EffectClaimed.FENCED, "could be claimed")
            claimant = ProcessIdentity.decode(claim.process)
            if claimant is not None and claimant.provably_gone(me):
                earlier = "dead"
                continue
            log.info(
                "run %s: effect %r was claimed by an earlier holder that may still act; "
                "waiting %.1fs for its timeout",
                self._keys.run,
                self.key,
                claim.remaining_ms / 1000,
            )
            self._clock.sleep(claim.remaining_ms / 1000)
            self._guard.ensure()
            earlier = claim.deadline  # waited out on this clock: the script may take it over

    def confirm(self) -> None:
        """Call right before the last step that can still be undone: from here it may happen.

        Raises:
            EffectLate: the claim's timeout has passed: do not act.
            LeaseLost: the lease is gone: do not act.
            Cancelled: the run was cancelled before its effect: do not act.
        """
        if time.monotonic() - self._claimed_at >= self.timeout:
            raise self._late()
        confirming = Confirming(self.key, self._fence)
        taking = not self._claim_sent
        if taking:  # the claim's own timeout starts now, before its request
            self._claimed_at = time.monotonic()
            me = ProcessIdentity.current().encode()
            confirming = Confirming(
                self.key, self._fence, claim_ms(self.timeout), me, self.revocable
            )
            self._claim_sent = True  # a reply may never come: the claim may stand from here
        try:
            confirmed = self._guard.confirm(confirming)  # the renewal, in one round trip
        except (LeaseLost, Cancelled):
            self._claim_sent = not taking  # the store answered, and took no claim
            raise
        if not confirmed:
            self._claim_sent = not taking
            raise self._lost(True, "could be confirmed")
        self.confirmed = True

    def last_moment(self) -> None:
        """Call at the instant before the irreversible write: the timeout, checked with no I/O.

        Raises:
            EffectLate: the claim's timeout has passed: abandon the act (the function's
                failure then settles the effect as not done).
        """
        if time.monotonic() - self._claimed_at >= self.timeout:
            raise self._late()

    def accepted(self, receipt: Any) -> None:
        """Call right after the irreversible moment: the receipt, through the claim's fence.

        Raises:
            ReceiptUnsaved: the store refused the write: the claim stays confirmed, so the
                effect is not repeated unasked.
            Fenced: a later holder had already claimed the effect again.
            LeaseLost: the receipt is saved, but the lease was lost: the run stops here.
        """
        try:
            self._settle("done", codec.dumps(receipt))
        except (redis.RedisError, StoreUnavailable) as error:
            refused = error.__cause__ if isinstance(error, StoreUnavailable) else error
            cause = f"{type(refused).__name__}: {one_line(refused or error)}"
            raise ReceiptUnsaved(self._keys.run, self.key, receipt, cause) from None

    def ambiguous(self, detail: str) -> None:
        """The effect may have happened and nobody knows: never taken for "did not happen".

        Raises:
            LeaseLost: settled, but the lease was lost meanwhile.
        """
        try:
            self._settle("ambiguous", detail.encode())
        except (
            redis.RedisError,
            StoreUnavailable,
        ):  # the claim stays confirmed, which reads the same
            log.info("run %s: effect %r left confirmed", self._keys.run, self.key)

    def release(self) -> None:
        """The effect did not happen: this holder will not act on its claim again.

        Raises:
            LeaseLost: released, but the lease was lost meanwhile.
        """
        try:
            self._settle("released", b"")
        except (
            redis.RedisError,
            StoreUnavailable,
        ):  # the claim stays: the next holder waits out its deadline
            log.info("run %s: effect %r left claimed", self._keys.run, self.key)

    def _settle(self, state: str, value: bytes) -> None:
        if self.outcome is not None:
            return
        if not self._claim_sent:  # never claimed: nothing stands to settle
            self.outcome = state
            return
        status = self._backend.effect_settle(
            self._keys, self._holder, self.key, self._fence, state, value
        )
        self.outcome = state
        if status is Settled.NOT_THIS_CLAIM:  # a later holder claimed it: this one is stale
            raise self._lost(True, "could be settled")
        self.receipt_stored = state == "done"
        if status is Settled.SETTLED_WITHOUT_LEASE:
            # A run waiting on this claim (for its deadline, or for a decision) goes on now.
            self._backend.make_due(self._keys, millis(self._clock.now()))
            raise LeaseLost(self._keys.run, f"the lease was lost while effect {self.key!r} ran")

    def _late(self) -> EffectLate:
        return EffectLate(
            self._keys.run,
            f"effect {self.key!r} passed its {self.timeout:g}s timeout before it could act",
        )

    def _lost(self, fenced: bool, what: str) -> LeaseLost:
        if not fenced:
            return LeaseLost(self._keys.run, f"the lease expired before effect {self.key!r} {what}")
        emit("fenced", workflow=self._keys.workflow)
        return Fenced(self._keys.run, f"effect {self.key!r} refused: the run has a newer holder")


def run_effect(effect: Effect, fn: Callable[[Effect], Any]) -> Any:
    """Claim, call ``fn``, and settle what ``fn`` left open by what is known.

    A failure before ``confirm`` settles the effect as not done; after it, as ambiguous
    (unless ``fn`` settled it itself, or ``last_moment`` stopped it in time). A failure
    after a settlement that says what happened is the failure it is. A failure of a
    holder that has lost its lease is reported as the lease loss it is (a frozen sender's
    socket times out when it wakes). An interpreter exit (``SystemExit`` from a shutdown)
    settles nothing: the process may be mid-effect, so the next holder waits for the
    deadline, or for proof the process is gone.

    Raises:
        EffectAmbiguous: the effect may have happened and is not ``repeatable``.
    """
    effect.claim()
    try:
        return fn(effect)
    except ReceiptUnsaved:
        raise  # it happened: the claim stays confirmed, which no holder repeats unasked
    except Exception as error:
        known = isinstance(error, EffectLate) or not effect.confirmed
        try:
            if known:
                effect.release()
            else:
                effect.ambiguous(one_line(error))
        except LeaseLost as lost:
            raise lost from error
        if effect.outcome != "ambiguous" or effect.repeatable or isinstance(error, LeaseLost):
            raise
        raise EffectAmbiguous(effect.run, effect.key, one_line(error)) from error

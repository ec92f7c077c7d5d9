"""Delivering a run: open it under a new lease, drive its body, close it.

One delivery is one opening (lease, fence, counters, status, arguments, indexes and the
journal read, in one script), the body's steps, and one closing transition (done, waiting,
retrying, failed, parked or cancelled, with the indexes and the release, in one more). The
closing transitions are the only status writes of a holder, each fenced.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from journal import logs, tracing
from journal._cancel import Cancelled
from journal._clock import Clock, millis
from journal._lease import Found, Grant, Heartbeat, Holding, Lease
from journal._redact import redact
from journal._redis.backend import (
    DELETE,
    Closed,
    Closing,
    Opened,
    Opening,
    RedisBackend,
)
from journal._retry import woken_by
from journal._run import Run, StepEvent
from journal._schema import codec
from journal._schema.keys import RunKeys
from journal._schema.meta import RunMeta, Wait
from journal._schema.status import RunStatus
from journal._settings import Settings
from journal._waits import Suspend
from journal.errors import (
    CorruptJournal,
    GaveUp,
    Hints,
    JournalError,
    LeaseLost,
    ReceiptUnsaved,
    RetryScheduled,
    RunParked,
    StoreUnavailable,
)
from journal.events import emit, outcome_of

log = logging.getLogger(__name__)

R = TypeVar("R")

# A run's streak of transient failures, in its meta: kept until it succeeds or fails otherwise.
STREAK = ("retry_at", "retry_until", "failing_since", "failures", "gave_up_at")


@dataclass(frozen=True)
class Outcome:
    """How one execution ended (failures raise instead).

    Attributes:
        status: ``done`` (the body returned now), ``already-done`` (it had returned before and
            did not run), ``waiting`` (the run suspended), or ``cancelled`` (an operator
            cancelled it, now or before).
        result: the body's return value (for ``already-done``, the one it returned then).
        wait: what a waiting run waits for.
        ran: steps executed in this attempt; replayed: steps replayed from the journal.
    """

    run: str
    status: str
    result: Any = None
    wait: Wait | None = None
    ran: int = 0
    replayed: int = 0


class Runner:
    """Delivers the runs of one journal; every delivery, from a worker or a command line.

    Given what a delivery needs, not the ``Journal`` that builds it: the handle is the caller's
    face, and the delivery never calls back into it.
    """

    def __init__(
        self, backend: RedisBackend, settings: Settings, clock: Clock, hints: Hints
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.hints = hints

    def execute(
        self,
        keys: RunKeys,
        body: Callable[[Run], R],
        args: dict[str, Any] | None,
        on_step: Callable[[StepEvent], None] | None,
        delivered: bool,
    ) -> Outcome:
        """One delivery of ``keys``'s run (see ``Journal.execute``), in its span when traced."""
        with tracing.delivery(keys.workflow, keys.run_id) as traced:
            opening = self._opening(args, delivered, traced.context)
            outcome = self._execute(keys, body, on_step, opening, traced)
            status = outcome_of(outcome.result) if outcome.status == "done" else ""
            traced.ended(outcome.status, status, outcome.ran, outcome.replayed)
            return outcome

    def _execute(
        self,
        keys: RunKeys,
        body: Callable[[Run], R],
        on_step: Callable[[StepEvent], None] | None,
        opening: Opening,
        traced: tracing.Delivery,
    ) -> Outcome:
        lease = self._lease(keys)
        taken = lease.open(millis(self.clock.now()), opening)
        if isinstance(taken, Found):
            return self._found(keys, taken)
        grant = taken
        logs.set_fence(grant.fence)
        try:
            current = RunMeta.from_flat(keys.run, grant.meta)
            traced.opened(
                fence=grant.fence,
                attempt=current.count("starts") + 1,  # as it was before this start counted
                delivery=current.count("deliveries") if opening.count_delivery else 0,
                first=current.get("trace"),
            )
            created = current.created(self.clock.now())
            if grant.status is Opened.STALLED:
                self._park(keys, grant.holder, grant.starts_without_progress - 1, created)
            if grant.status is Opened.CANCEL_PENDING:  # its holder died before it could stop
                self._cancel(keys, grant.holder)
                self._ended(keys, "cancelled", created)
                return Outcome(keys.run, "cancelled")
            frozen = current.args
            # As it was before the start cleared it: a retry wait carries its attempt count.
            waited = current.wait
            run, heartbeat = self._open(keys, grant, on_step, lease, waited)
            run.args = dict(frozen if frozen is not None else opening.args or {})
        except BaseException:
            lease.release(grant.holder)
            raise
        return self._drive(keys, grant.holder, run, heartbeat, body, created)

    def _lease(self, keys: RunKeys) -> Lease:
        """A new holder's lease on the run; its renewals keep the run due past its expiry."""
        ttl = millis(self.settings.lease_ttl)
        return Lease(keys, self.backend, ttl, due_after_ms=self._due_ms)

    def _opening(
        self, args: dict[str, Any] | None, delivered: bool = False, trace: str = ""
    ) -> Opening:
        """What ``open.lua`` does besides taking the lease, for these arguments."""
        return Opening(
            max_stalled_starts=self.settings.max_stalled_starts,
            due_at_ms=self._due_ms(),
            args=args,
            count_delivery=delivered,
            trace=trace,
        )

    def _found(self, keys: RunKeys, found: Found) -> Outcome:
        """The outcome of an opening that found the run not to be started.

        Raises:
            RunParked: the run kept dying at start and was set aside.
            CorruptJournal: its stored wait is not one this library wrote.
        """
        if found.status is Opened.BAD_WAIT:
            Wait.from_meta(keys.run, found.detail)
            raise CorruptJournal(keys.run, "meta.wait", "not a wait this library wrote")
        meta = RunMeta.from_flat(keys.run, found.detail)
        if found.status is Opened.PARKED:
            raise RunParked(keys.run, meta.count("starts_without_progress"), self.hints.parked)
        # Ended: the opening took it out of the due index, whatever had put it back there (an
        # older version, a hand-made ZADD), so the sweep stops delivering it.
        if meta.get("status") == RunStatus.CANCELLED:
            return Outcome(keys.run, "cancelled")
        return Outcome(keys.run, "already-done", meta.json("outcome"))

    def _open(
        self,
        keys: RunKeys,
        grant: Grant,
        on_step: Callable[[StepEvent], None] | None,
        lease: Lease,
        wait: Wait | None,
    ) -> tuple[Run, Heartbeat]:
        holder = grant.holder
        flat = iter(grant.steps)  # one pass, one dict: a journal may hold 10,000 steps
        recorded = {field.decode(): value for field, value in zip(flat, flat, strict=True)}
        heartbeat = Heartbeat(lease, holder, grant.confirmed_at)
        holding = Holding(self.backend, keys, holder, grant.fence, heartbeat, self.clock)
        run = Run(
            holding=holding,
            recorded=recorded,
            retry_state=wait if wait is not None and wait.kind == "retry" else None,
            on_step=on_step,
            record_wait=self.settings.record_wait,
            effects_begun=grant.effects,
            defer_records=True,
        )
        heartbeat.start()
        return run, heartbeat

    def _drive(
        self,
        keys: RunKeys,
        holder: str,
        run: Run,
        heartbeat: Heartbeat,
        body: Callable[[Run], R],
        created: float,
    ) -> Outcome:
        try:
            while True:
                try:
                    result = body(run)
                except Suspend as suspend:
                    if self._suspend(keys, holder, suspend.wait, heartbeat, run.unwritten):
                        return Outcome(
                            keys.run, "waiting", None, suspend.wait, run.ran, run.replayed
                        )
                    continue  # the signal it waits for arrived meanwhile: replay and go on
                break
        except Cancelled:
            heartbeat.stop()
            self._cancel(keys, holder, run.unwritten)
            self._ended(keys, "cancelled", created)
            return Outcome(keys.run, "cancelled", None, None, run.ran, run.replayed)
        except (LeaseLost, StoreUnavailable):
            heartbeat.stop()
            raise
        except ReceiptUnsaved:
            # Past its irreversible moment: not the run's failure, and the store that refused
            # the receipt would refuse the status too. The lease goes (a delete, which a full
            # store still takes), so the next start, finding the effect confirmed, asks.
            heartbeat.stop()
            with contextlib.suppress(redis.RedisError, StoreUnavailable):
                self.backend.release(keys, holder)
            raise
        except (redis.ConnectionError, redis.TimeoutError) as down:
            # The store went away under an application's own command in a step (the journal's
            # own come translated): not the run's failure, and nothing could be saved anyway.
            # StoreUnavailable lets the delivery retry once the store is back.
            heartbeat.stop()
            raise self.backend.unavailable(down) from down
        except Exception as error:
            heartbeat.stop()
            verdict = self._fail(keys, holder, error, created, run.wakes_by, run.unwritten)
            if verdict is not None:
                raise verdict from error
            raise
        except BaseException:
            heartbeat.stop()  # interpreter exit: behave like a crash, the lease expires
            raise
        heartbeat.stop()
        self._finish(keys, holder, result, run.unwritten)
        self._ended(keys, outcome_of(result), created)
        return Outcome(keys.run, "done", result, None, run.ran, run.replayed)

    # -- closing transitions, each one fenced script that also indexes and releases ---------

    def _close(self, keys: RunKeys, holder: str, closing: Closing) -> Closed:
        """Save the run's status, index it and give the lease back, in one round trip.

        Returns:
            Closed; or the signal ``closing.unless_signal`` had arrived, or a cancel is pending
            (for ``closing.unless_cancelled``): nothing written, the lease still held.

        Raises:
            LeaseLost: the lease had expired or passed on; nothing was written.
        """
        status = self.backend.close(keys, holder, closing)
        if status < 0:
            raise LeaseLost(keys.run, "the lease was lost before the run's status could be saved")
        return status

    def _ended(self, keys: RunKeys, outcome: str, created: float) -> None:
        """Tell observers the run ended, and how long it took since it was created.

        Waits and retry back-offs included: what the run's requester waited.
        """
        seconds = max(self.clock.now() - created, 0.0)
        emit("run_finished", outcome, seconds, workflow=keys.workflow)

    def _due_ms(self) -> int:
        """When a running run is due again should its holder die: lease expiry plus a grace."""
        return millis(self.clock.now() + self.settings.lease_ttl + self.settings.recovery_grace)

    def _suspend(
        self,
        keys: RunKeys,
        holder: str,
        wait: Wait,
        heartbeat: Heartbeat,
        records: Sequence[tuple[str, bytes]],
    ) -> bool:
        now = millis(self.clock.now())
        fields = {
            "status": RunStatus.WAITING,
            "wait": codec.dumps(wait.to_json()),
            "starts_without_progress": 0,
            "updated_at": now,
        }
        due = None if wait.until is None else millis(wait.until)
        # No renewal in between: once the lease is given back, one would report it lost.
        with heartbeat.paused():
            signal = wait.signal or ""
            written = self._close(
                keys,
                holder,
                Closing(fields, now, due, signal, unless_cancelled=True, records=records),
            )
            if written is Closed.CLOSED:
                heartbeat.stop(join=False)
        if written is Closed.CANCEL_PENDING:
            raise Cancelled(keys.run)  # cancelled while about to wait: not worth waiting for
        if written is Closed.SIGNAL_ARRIVED:
            return False
        heartbeat.stop()
        return True

    def _finish(
        self, keys: RunKeys, holder: str, result: Any, records: Sequence[tuple[str, bytes]]
    ) -> None:
        now = millis(self.clock.now())
        fields = {
            "status": RunStatus.DONE,
            "outcome": codec.dumps(result),
            "finished_at": now,
            "updated_at": now,
            "starts_without_progress": 0,
            "wait": DELETE,
            "last_error": DELETE,
            **dict.fromkeys(STREAK, DELETE),
        }
        self._close(keys, holder, Closing(fields, now, records=records))

    def _fail(
        self,
        keys: RunKeys,
        holder: str,
        error: BaseException,
        created: float,
        wake_by: float | None,
        records: Sequence[tuple[str, bytes]],
    ) -> JournalError | None:
        """Record a failure; a transient one stays in the due index for the sweep to retry.

        The retry is due no later than ``wake_by`` (``Run.wake_by``), if that is still ahead.
        ``records``, the run's unwritten ones, go with the failure: they are finished steps.

        Returns:
            ``RetryScheduled`` or ``GaveUp``, for the caller to raise in the error's place; or
            None when the error itself is the run's final word.
        """
        now = self.clock.now()
        described = redact(f"{type(error).__name__}: {error}")
        fields: dict[str, Any] = {
            "status": RunStatus.FAILED,
            "last_error": described,
            "updated_at": millis(now),
            "starts_without_progress": 0,
            "wait": DELETE,
            **dict.fromkeys(STREAK, DELETE),
        }
        verdict: JournalError | None = None
        retry_at: float | None = None
        policy = self.settings.run_retry
        try:
            if policy.retries(error):
                since, failures = self._streak(keys, now)
                deadline = since + policy.give_up_after
                fields |= {"failing_since": millis(since), "failures": failures}
                if now < deadline:
                    retry_at = woken_by(min(now + policy.delay(failures), deadline), wake_by, now)
                    fields |= {
                        "status": RunStatus.RETRYING,
                        "retry_at": millis(retry_at),
                        "retry_until": millis(deadline),
                    }
                    verdict = RetryScheduled(keys.run, described, retry_at, deadline)
                else:
                    fields["gave_up_at"] = millis(now)
                    verdict = GaveUp(keys.run, described, failures, since)
            due = None if retry_at is None else millis(retry_at)
            self._close(keys, holder, Closing(fields, millis(now), due, records=records))
            if retry_at is None:
                self._ended(keys, "failed", created)
        except (LeaseLost, StoreUnavailable):
            log.warning("run %s failed (%s) and its status could not be saved", keys.run, error)
            return None
        # Not logged here: the caller reports it (a worker logs it, a command line prints it).
        return verdict

    def _streak(self, keys: RunKeys, now: float) -> tuple[float, int]:
        """When the run's streak of transient failures began, and its length with this one.

        A run that gave up, or whose streak fields are unreadable, starts a new streak: a
        deliberate start after giving up earns a full retry window again.
        """
        meta = RunMeta.parse(keys.run, self.backend.meta(keys))
        if "gave_up_at" in meta:
            return now, 1
        try:
            since = int(meta["failing_since"]) / 1000
            failures = int(meta["failures"])
        except (KeyError, ValueError):
            return now, 1
        return since, failures + 1

    def _cancel(
        self, keys: RunKeys, holder: str, records: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        now = millis(self.clock.now())
        fields = {
            "status": RunStatus.CANCELLED,
            "finished_at": now,
            "updated_at": now,
            "starts_without_progress": 0,
            "wait": DELETE,
        }
        self._close(keys, holder, Closing(fields, now, records=records))

    def _park(self, keys: RunKeys, holder: str, starts: int, created: float) -> None:
        now = millis(self.clock.now())
        fields = {
            "status": RunStatus.FAILED,
            "parked": "1",
            "last_error": str(RunParked(keys.run, starts, self.hints.parked)),
            # The parking start itself ran nothing: count only the ones that died, so every
            # later refusal (read back from here) names the same number as last_error.
            "starts_without_progress": starts,
            "updated_at": now,
        }
        self._close(keys, holder, Closing(fields, now))
        self._ended(keys, "failed", created)
        raise RunParked(keys.run, starts, self.hints.parked)

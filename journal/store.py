"""The journal store: opens runs under a lease, runs workflows, and keeps the indexes.

``Journal.execute`` is the one way a workflow body runs, whether a Celery worker or a command
line calls it, so both take the same lease, replay the same journal and leave the same meta.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from journal import codec
from journal.cancel import CANCEL_FIELD, Cancelled
from journal.clock import Clock, SystemClock, millis
from journal.errors import (
    CorruptJournal,
    GaveUp,
    Hints,
    JournalError,
    LeaseLost,
    RetryScheduled,
    RunParked,
    StoreUnavailable,
    StoreUnsupported,
)
from journal.keys import Keyspace, RunKeys
from journal.lease import Grant, Heartbeat, Lease
from journal.redact import redact
from journal.retry import RunRetry
from journal.scripts import Scripts, status_of
from journal.steps import Run, StepEvent
from journal.waits import Suspend, Wait

log = logging.getLogger(__name__)

R = TypeVar("R")

DELETE = "\0"
TERMINAL = ("done", "cancelled")
# A run's streak of transient failures, in its meta: kept until it succeeds or fails otherwise.
STREAK = ("retry_at", "retry_until", "failing_since", "failures", "gave_up_at")


@dataclass(frozen=True)
class Settings:
    """How runs are held and recovered.

    Attributes:
        lease_ttl: seconds a lease lives without renewal; a crashed holder's run is taken
            over this long after it died.
        recovery_grace: seconds after a lease's expiry before the due sweep re-enqueues the run.
        rearm_after: seconds before the sweep looks again at a run it enqueued, in case that
            message was lost.
        max_stalled_starts: starts that died without recording anything before a run is parked.
        fsync_records: wait for the local AOF fsync of every record (WAITAOF; Redis 7.2+, Valkey).
        run_retry: which failures the due sweep retries, how often and for how long; by
            default none.
    """

    lease_ttl: float = 30.0
    recovery_grace: float = 5.0
    rearm_after: float = 300.0
    max_stalled_starts: int = 5
    fsync_records: bool = False
    run_retry: RunRetry = field(default_factory=RunRetry)

    def __post_init__(self) -> None:
        if self.lease_ttl < 0.3:
            raise ValueError(f"lease_ttl={self.lease_ttl}: must be at least 0.3 s")
        if self.max_stalled_starts < 1:
            raise ValueError("max_stalled_starts must be at least 1")


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


@dataclass
class Journal:
    """A handle on the journal in one Redis database; cheap to share across threads."""

    client: redis.Redis
    keyspace: Keyspace = field(default_factory=Keyspace)
    settings: Settings = field(default_factory=Settings)
    clock: Clock = field(default_factory=SystemClock)
    url: str = "redis"
    hints: Hints = field(default_factory=Hints)

    def __post_init__(self) -> None:
        self.scripts = Scripts.register(self.client)
        if self.settings.fsync_records:
            self._require_waitaof()

    def _require_waitaof(self) -> None:
        """Refuse ``fsync_records`` at start on a server that cannot honour it."""
        try:
            self.call(self.client.execute_command, "WAITAOF", 1, 0, 100)
        except redis.ResponseError as exc:
            raise StoreUnsupported(
                self.url,
                f"fsync_records needs WAITAOF (Redis 7.2+ or Valkey with appendonly yes): {exc}",
            ) from None

    def keys(self, workflow: str, run_id: str) -> RunKeys:
        """The validated keys of one run."""
        return self.keyspace.run(workflow, run_id)

    def meta(self, keys: RunKeys) -> dict[str, str]:
        """The run's meta hash, decoded."""
        return decode_meta(keys.run, self.call(self.client.hgetall, keys.meta))

    def execute(
        self,
        workflow: str,
        run_id: str,
        body: Callable[[Run], R],
        *,
        args: dict[str, Any] | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
    ) -> Outcome:
        """Run ``body`` for one run under its lease, replaying what the journal holds.

        ``args`` are the run's inputs. The first start freezes them in the run's meta; every
        later delivery, however it was enqueued (the due sweep, a duplicate ``delay`` without
        options, a command line), gets the frozen ones as ``run.args``, so a resumed run
        takes the same path as its first attempt.

        Raises:
            LeaseBusy: another live holder has the run.
            RunParked: the run kept dying at start and was set aside.
            LeaseLost: the lease was lost mid-run; nothing more was written.
            StoreUnavailable: Redis could not be reached.
            RetryScheduled: ``body`` raised an error ``settings.run_retry`` calls transient;
                the run stays due and the sweep starts it again (the error is the cause).
            GaveUp: the same, once the retry deadline has passed: the run is failed for good.
            Exception: whatever else ``body`` raised, after the run was marked failed.
        """
        keys = self.keys(workflow, run_id)
        meta = self.meta(keys)
        if meta.get("status") in TERMINAL:
            return self._ended(keys, meta)
        if meta.get("parked"):
            raise RunParked(
                keys.run, _count(keys, meta, "starts_without_progress"), self.hints.parked
            )
        lease = Lease(keys, self.scripts, millis(self.settings.lease_ttl))
        grant = self.call(lease.acquire, millis(self.clock.now()))
        try:
            if grant.starts_without_progress > self.settings.max_stalled_starts:
                self._park(keys, grant.holder, grant.starts_without_progress - 1)
            current = self.meta(keys)
            if current.get("status") in TERMINAL:  # ended between our read and our lease
                self.call(lease.release, grant.holder)
                return self._ended(keys, current)
            if CANCEL_FIELD in current:  # a holder that died before it could stop
                self._cancel(keys, grant.holder)
                return Outcome(keys.run, "cancelled")
            frozen = self._frozen_args(keys, current)
            # Read before the announcement clears it: a retry wait carries its attempt count.
            waited = Wait.from_meta(keys.run, current["wait"]) if current.get("wait") else None
            self._announce(keys, grant.holder, args if frozen is None else None)
            run, heartbeat = self._open(keys, grant, on_step, lease, waited)
            run.args = dict(frozen if frozen is not None else args or {})
        except BaseException:
            self.call(lease.release, grant.holder)
            raise
        return self._drive(keys, grant.holder, run, heartbeat, body)

    def _ended(self, keys: RunKeys, meta: dict[str, str]) -> Outcome:
        # Found ended: nothing is left to wake, so whatever put it back in the due index (an
        # older version, a hand-made ZADD) stops the sweep from delivering it again.
        self.call(self.client.zrem, self.keyspace.due, keys.run)
        if meta.get("status") == "cancelled":
            return Outcome(keys.run, "cancelled")
        return Outcome(keys.run, "already-done", self._decode_meta(keys, meta, "outcome"))

    def _open(
        self,
        keys: RunKeys,
        grant: Grant,
        on_step: Callable[[StepEvent], None] | None,
        lease: Lease,
        wait: Wait | None,
    ) -> tuple[Run, Heartbeat]:
        holder = grant.holder
        raw_steps = self.call(self.client.hgetall, keys.steps)
        recorded = {field.decode(): value for field, value in raw_steps.items()}
        heartbeat = Heartbeat(
            lease, holder, grant.confirmed_at, on_renew=lambda: self._push_due(keys, holder)
        )
        run = Run(
            client=self.client,
            scripts=self.scripts,
            keys=keys,
            holder=holder,
            fence=grant.fence,
            clock=self.clock,
            recorded=recorded,
            guard=heartbeat,
            retry_state=wait if wait is not None and wait.kind == "retry" else None,
            on_step=on_step,
            fsync_records=self.settings.fsync_records,
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
    ) -> Outcome:
        try:
            while True:
                try:
                    result = body(run)
                except Suspend as suspend:
                    if self._suspend(keys, holder, suspend.wait, heartbeat):
                        return Outcome(
                            keys.run, "waiting", None, suspend.wait, run.ran, run.replayed
                        )
                    continue  # the signal it waits for arrived meanwhile: replay and go on
                break
        except Cancelled:
            heartbeat.stop()
            self._cancel(keys, holder)
            return Outcome(keys.run, "cancelled", None, None, run.ran, run.replayed)
        except (LeaseLost, StoreUnavailable):
            heartbeat.stop()
            raise
        except (redis.ConnectionError, redis.TimeoutError) as down:
            # The store went away under a step: not the run's failure, and nothing could be
            # saved anyway. StoreUnavailable lets the delivery retry once the store is back.
            heartbeat.stop()
            raise StoreUnavailable(
                self.url, str(down) or type(down).__name__, self.hints.store_down
            ) from down
        except Exception as error:
            heartbeat.stop()
            verdict = self._fail(keys, holder, error)
            if verdict is not None:
                raise verdict from error
            raise
        except BaseException:
            heartbeat.stop()  # interpreter exit: behave like a crash, the lease expires
            raise
        heartbeat.stop()
        self._finish(keys, holder, result)
        return Outcome(keys.run, "done", result, None, run.ran, run.replayed)

    # -- meta transitions, each a fenced write ---------------------------------------------

    def _update_meta(
        self,
        keys: RunKeys,
        holder: str,
        fields: dict[str, Any],
        unless_signal: str = "",
        unless_cancelled: bool = False,
    ) -> int:
        flat: list[Any] = []
        for name, value in fields.items():
            flat += [name, value]
        reply = self.call(
            self.scripts.update_meta,
            keys=[keys.lease, keys.meta, keys.signals],
            args=[holder, unless_signal, "1" if unless_cancelled else "0", *flat],
        )
        status = status_of("update_meta", reply, (1, 3, 4, -1, -2))
        if status < 0:
            raise LeaseLost(keys.run, "the lease was lost before the run's status could be saved")
        return status

    def _announce(self, keys: RunKeys, holder: str, args: dict[str, Any] | None) -> None:
        now = self.clock.now()
        fields: dict[str, Any] = {
            "status": "running",
            "workflow": keys.workflow,
            "run_id": keys.run_id,
            "holder": holder,
            "wait": DELETE,
            "retry_at": DELETE,
        }
        if args is not None:
            fields["args"] = codec.dumps(args)
        self._update_meta(keys, holder, fields)
        deadline = self._lease_deadline_ms()
        self._index(
            keys,
            holder,
            lambda pipe: pipe.zadd(self.keyspace.runs, {keys.run: millis(now)}).zadd(
                self.keyspace.due, {keys.run: deadline}
            ),
        )

    def _push_due(self, keys: RunKeys, holder: str) -> None:
        deadline = self._lease_deadline_ms()
        self._index(keys, holder, lambda pipe: pipe.zadd(self.keyspace.due, {keys.run: deadline}))

    def _index(self, keys: RunKeys, holder: str, writes: Callable[[Any], Any]) -> list[Any] | None:
        """Write the run's index entries only while ``holder`` still holds its lease.

        The indexes live outside the run's hash tag, so no per-run script may touch them;
        instead the writes go in a MULTI that WATCHes the lease key. If the lease expired or
        passed to another holder since this holder's fenced meta write, EXEC does nothing, so
        a holder paused between the two can never re-arm or re-list a run another finished.

        Returns:
            The replies of ``writes``, or None when the lease was no longer ours.
        """
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(keys.lease)  # type: ignore[no-untyped-call]
                if self.call(pipe.get, keys.lease) != holder.encode():
                    return None
                pipe.multi()
                writes(pipe)
                replies: list[Any] = self.call(pipe.execute)
                return replies
            except redis.WatchError:
                return None

    def _lease_deadline_ms(self) -> int:
        return millis(self.clock.now() + self.settings.lease_ttl + self.settings.recovery_grace)

    def _suspend(self, keys: RunKeys, holder: str, wait: Wait, heartbeat: Heartbeat) -> bool:
        fields = {
            "status": "waiting",
            "wait": codec.dumps(wait.to_json()),
            "starts_without_progress": 0,
            "updated_at": millis(self.clock.now()),
        }
        written = self._update_meta(
            keys, holder, fields, unless_signal=wait.signal or "", unless_cancelled=True
        )
        if written == 4:
            raise Cancelled(keys.run)  # cancelled while about to wait: not worth waiting for
        if written == 3:
            return False
        # Waiting now: a renewal from here on would log a lost lease once it is released, and
        # its due push (the lease expiry) could overwrite the wake-up time written below.
        heartbeat.stop()
        now = millis(self.clock.now())

        def writes(pipe: Any) -> None:
            if wait.until is None:
                pipe.zrem(self.keyspace.due, keys.run)
            else:
                pipe.zadd(self.keyspace.due, {keys.run: millis(wait.until)})
            pipe.zadd(self.keyspace.runs, {keys.run: now})
            if wait.signal:
                pipe.hexists(keys.signals, wait.signal)

        replies = self._index(keys, holder, writes)
        if replies is None:
            raise LeaseLost(keys.run, "the lease was lost before the run's wait could be indexed")
        if wait.signal and replies[-1]:
            # The signal landed after the wait was recorded: its sender may have made the run
            # due before the line above overwrote that, so make it due again.
            self.call(self.client.zadd, self.keyspace.due, {keys.run: millis(self.clock.now())})
        self._release(keys, holder)
        return True

    def _finish(self, keys: RunKeys, holder: str, result: Any) -> None:
        now = millis(self.clock.now())
        fields = {
            "status": "done",
            "outcome": codec.dumps(result),
            "finished_at": now,
            "updated_at": now,
            "starts_without_progress": 0,
            "wait": DELETE,
            "last_error": DELETE,
            **dict.fromkeys(STREAK, DELETE),
        }
        self._update_meta(keys, holder, fields)
        self._settle(keys, holder, now)

    def _fail(self, keys: RunKeys, holder: str, error: BaseException) -> JournalError | None:
        """Record a failure; a transient one stays in the due index for the sweep to retry.

        Returns:
            ``RetryScheduled`` or ``GaveUp``, for the caller to raise in the error's place; or
            None when the error itself is the run's final word.
        """
        now = self.clock.now()
        described = redact(f"{type(error).__name__}: {error}")
        fields: dict[str, Any] = {
            "status": "failed",
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
                    retry_at = min(now + policy.delay(failures), deadline)
                    fields |= {
                        "status": "retrying",
                        "retry_at": millis(retry_at),
                        "retry_until": millis(deadline),
                    }
                    verdict = RetryScheduled(keys.run, described, retry_at, deadline)
                else:
                    fields["gave_up_at"] = millis(now)
                    verdict = GaveUp(keys.run, described, failures, since)
            self._update_meta(keys, holder, fields)
            self._settle(keys, holder, millis(now), retry_at)
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
        meta = self.meta(keys)
        if "gave_up_at" in meta:
            return now, 1
        try:
            since = int(meta["failing_since"]) / 1000
            failures = int(meta["failures"])
        except (KeyError, ValueError):
            return now, 1
        return since, failures + 1

    def _cancel(self, keys: RunKeys, holder: str) -> None:
        now = millis(self.clock.now())
        fields = {
            "status": "cancelled",
            "finished_at": now,
            "updated_at": now,
            "starts_without_progress": 0,
            "wait": DELETE,
        }
        self._update_meta(keys, holder, fields)
        self._settle(keys, holder, now)

    def _park(self, keys: RunKeys, holder: str, starts: int) -> None:
        now = millis(self.clock.now())
        fields = {
            "status": "failed",
            "parked": "1",
            "last_error": str(RunParked(keys.run, starts, self.hints.parked)),
            # The parking start itself ran nothing: count only the ones that died, so every
            # later refusal (read back from here) names the same number as last_error.
            "starts_without_progress": starts,
            "updated_at": now,
        }
        self._update_meta(keys, holder, fields)
        self._settle(keys, holder, now)
        raise RunParked(keys.run, starts, self.hints.parked)

    def _settle(
        self, keys: RunKeys, holder: str, now_ms: int, retry_at: float | None = None
    ) -> None:

        def writes(pipe: Any) -> None:
            if retry_at is None:
                pipe.zrem(self.keyspace.due, keys.run)
            else:
                pipe.zadd(self.keyspace.due, {keys.run: millis(retry_at)})
            pipe.zadd(self.keyspace.runs, {keys.run: now_ms})

        self._index(keys, holder, writes)  # a new holder owns the indexes if ours was lost
        self._release(keys, holder)

    def _release(self, keys: RunKeys, holder: str) -> None:
        lease = Lease(keys, self.scripts, millis(self.settings.lease_ttl))
        self.call(lease.release, holder)

    def _decode_meta(self, keys: RunKeys, meta: dict[str, str], name: str) -> Any:
        raw = meta.get(name)
        return None if raw is None else codec.loads_field(keys.run, f"meta.{name}", raw)

    def _frozen_args(self, keys: RunKeys, meta: dict[str, str]) -> dict[str, Any] | None:
        args = self._decode_meta(keys, meta, "args")
        if args is not None and not isinstance(args, dict):
            raise CorruptJournal(keys.run, "meta.args", "not a JSON object")
        return args

    # -- operations on runs from outside ---------------------------------------------------

    def reset(self, workflow: str, run_id: str) -> bool:
        """Un-park a run deliberately, so the next delivery starts it again.

        Its recorded steps stay: the reset run resumes where it stopped. A run that is not
        parked (finished, running, or never started) is left exactly as it is.

        Returns:
            Whether the run was parked.
        """
        keys = self.keys(workflow, run_id)

        def un_park(pipe: redis.client.Pipeline) -> bool:
            if not pipe.hexists(keys.meta, "parked"):
                return False
            pipe.multi()
            pipe.hdel(keys.meta, "parked", "last_error")
            pipe.hset(keys.meta, "starts_without_progress", 0)
            return True

        return bool(
            self.call(self.client.transaction, un_park, keys.meta, value_from_callable=True)
        )

    def delete(self, workflow: str, run_id: str) -> int:
        """Remove every key of one run and its index entries (a dry run's scratch journal)."""
        keys = self.keys(workflow, run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(*keys.all())
        pipe.zrem(self.keyspace.runs, keys.run)
        pipe.zrem(self.keyspace.due, keys.run)
        return int(self.call(pipe.execute)[0])

    def send_signal(
        self,
        workflow: str,
        run_id: str,
        name: str,
        payload: Any,
        *,
        on_wake: Callable[[RunKeys], Any] | None = None,
    ) -> bool:
        """Deliver a signal: stored first-wins, then the run is woken if it waits for it.

        Stored before the wait is checked, and the run checks for it in the same script that
        records its wait, so a signal racing a run about to suspend is never lost. Woken means
        due now in the index (the sweep's safety net) and ``on_wake(keys)`` called, for a
        queue that can start the run at once.

        Returns:
            True if this payload was stored; False if a signal of that name was already there.
        """
        keys = self.keys(workflow, run_id)
        stored = bool(self.call(self.client.hsetnx, keys.signals, name, codec.dumps(payload)))
        meta = self.meta(keys)
        wait = meta.get("wait")
        if meta.get("status") == "waiting" and wait:
            waiting_for = Wait.from_meta(keys.run, wait)
            if waiting_for.signal == name:
                self.call(self.client.zadd, self.keyspace.due, {keys.run: millis(self.clock.now())})
                if on_wake is not None:
                    on_wake(keys)
        return stored

    def claim_due(self, limit: int = 100) -> list[RunKeys]:
        """Claim runs whose wake-up or lease-expiry time has passed (atomic across sweepers)."""
        now = self.clock.now()
        reply = self.call(
            self.scripts.claim_due,
            keys=[self.keyspace.due],
            args=[millis(now), limit, millis(now + self.settings.rearm_after)],
        )
        claimed: list[RunKeys] = []
        for raw in reply:
            try:
                claimed.append(self.keyspace.parse_run(raw.decode()))
            except Exception:
                log.error("due index holds an unreadable run %r; removing it", raw)
                self.client.zrem(self.keyspace.due, raw)
        return claimed

    def run_args(self, keys: RunKeys) -> dict[str, Any]:
        """The arguments a run was delivered with, for re-enqueueing it."""
        return self._frozen_args(keys, self.meta(keys)) or {}

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a Redis operation, turning a lost connection into ``StoreUnavailable``."""
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(
                self.url, str(exc) or type(exc).__name__, self.hints.store_down
            ) from exc


def decode_meta(run: str, raw: dict[bytes, bytes]) -> dict[str, str]:
    """A meta hash as text; a field that is not UTF-8 was not written by this library.

    Raises:
        CorruptJournal: naming the field, so the operator can repair or delete just that one.
    """
    meta: dict[str, str] = {}
    for name, value in raw.items():
        field = name.decode("utf-8", errors="replace")
        try:
            meta[field] = value.decode()
        except UnicodeDecodeError as exc:
            raise CorruptJournal(run, f"meta.{field}", f"not UTF-8: {exc}") from None
    return meta


def _count(keys: RunKeys, meta: dict[str, str], name: str) -> int:
    """A counter kept in meta, refused by name when it is not one."""
    raw = meta.get(name, "0")
    if not raw.isdigit():
        raise CorruptJournal(keys.run, f"meta.{name}", f"{raw[:40]!r} is not a count")
    return int(raw)


def jitter(seconds: float, spread: float = 0.2) -> float:
    """``seconds`` plus up to ``spread`` of itself, so retries of many runs do not align."""
    return seconds + random.uniform(0, spread * max(seconds, 1.0))

"""A run in progress: keyed steps replayed from the journal or executed and recorded.

Every value the control flow depends on comes from a step, so a resumed run takes the same
path as the first attempt and finds each step's recorded result where it left it. Steps are
identified by stable keys chosen by the workflow, never by position: that is what makes
parallel steps safe, and what lets drift be detected by name.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import uuid as uuid_module
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from journal import tracing
from journal._batch import BatchStep
from journal._batch_state import BatchApi, BatchEntry, BatchPolicy
from journal._clock import millis
from journal._effects import Effect, run_effect
from journal._lease import Holding
from journal._redis.backend import NO_WAIT, Recorded, RecordWait, StepWrite
from journal._replay import ReplayCursor
from journal._retry import RetryPolicy
from journal._retry import attempt as retry_loop
from journal._riders import Rider, riding, send_alone
from journal._schema import codec, records
from journal._schema.meta import Wait
from journal._schema.steps import StepKey
from journal._waits import SignalResult, Suspend
from journal.errors import (
    EffectAmbiguous,
    Fenced,
    LeaseLost,
)
from journal.events import emit, step_name

T = TypeVar("T")
X = TypeVar("X")


@dataclass(frozen=True)
class StepEvent:
    """Reported for every step the run passes: ran now, or replayed from the journal."""

    key: str
    replayed: bool
    kind: str = "step"
    attempt: int = 1


class StepPolicy(Protocol):
    """How a run replayed against a recording (the rehearsal) treats the steps it lacks.

    A real run has none: every step the journal lacks runs, and drift is always checked.
    """

    def exempt(self, key: str) -> bool:
        """Whether ``key`` runs afresh although later records wait (no drift check)."""
        ...

    def admit(self, key: str, kind: str) -> None:
        """Called before a step the recording lacks runs; raises to stop it running."""
        ...


class _NotStarted(Exception):
    """A map item skipped because another item had already failed."""


class _ItemOrder:
    """A map's reports in item order, whatever order its items are recorded in.

    Each item is recorded the moment its call answers: the journal is keyed, so the order of
    the records means nothing to a replay, and a finished answer never waits in memory behind
    a slow one. Only its report (``on_step``, and the crash points a workflow hangs on it)
    waits until every item before it is reported, replayed or given up (it failed or never
    started), so the transcript reads in item order at any concurrency and a failure never
    holds back the reports after it. Whichever thread completes the prefix makes the reports
    now due, one at a time.
    """

    def __init__(self) -> None:
        self._ready: dict[int, Callable[[], object] | None] = {}
        self._next = 0  # every item before it is reported
        self._turn = threading.Lock()

    def done(self, index: int, report: Callable[[], object] | None) -> None:
        """``index`` is settled; make its report, and every later one it held back, if due."""
        with self._turn:
            self._ready[index] = report
            while self._next in self._ready:
                due = self._ready.pop(self._next)
                self._next += 1
                if due is not None:
                    due()


class Run:
    """The handle a workflow receives: ``step``, ``map``, deterministic helpers and waits.

    A ``Run`` belongs to one lease holder. Every write goes through the fenced record script,
    so once the lease is lost nothing more reaches the journal.
    """

    def __init__(
        self,
        *,
        holding: Holding,
        recorded: dict[str, bytes],
        retry_state: Wait | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        record_wait: RecordWait = NO_WAIT,
        policy: StepPolicy | None = None,
        effects_begun: frozenset[str] | None = None,
        defer_records: bool = False,
    ) -> None:
        self.keys = holding.keys
        self.holder = holding.holder
        self.fence = holding.fence
        self.clock = holding.clock
        self._holding = holding
        self._backend = holding.backend
        self._cursor = ReplayCursor(holding.keys.run, recorded, policy.exempt if policy else None)
        self._policy = policy
        self._guard = holding.guard
        self._retry_state = retry_state
        self._on_step = on_step
        self._record_wait = record_wait
        self._lock = self._cursor.lock
        self._wake_by: float | None = None
        # The effects that had a claim when the run opened (None: unknown, as in memory); one
        # absent is claimed by its confirmation, a round trip less.
        self._effects_begun = None if effects_begun is None else set(effects_begun)
        # Records that may wait (a repeatable step's, a settled effect's) go with the run's
        # next write; not where records wait for an fsync or replicas, nor in memory.
        self._defer_records = defer_records and not record_wait.waits
        self._unwritten: list[tuple[str, bytes]] = []
        self.ran = 0
        self.args: dict[str, Any] = {}

    @property
    def replayed(self) -> int:
        """Distinct steps this attempt took from the journal instead of running them."""
        return self._cursor.seen - self.ran

    @property
    def run_id(self) -> str:
        """The run id the workflow was started with (``2026-w42``)."""
        return self.keys.run_id

    @property
    def workflow(self) -> str:
        """The workflow name (``digest``)."""
        return self.keys.workflow

    def idempotency_key(self, step: str | None = None) -> str:
        """A key for a side effect, stable across every attempt and delivery of this run.

        Derived from the run (and the step), never random or time-based: a retry must present
        the same key for the receiver to recognise the repeat.
        """
        base = f"{self.keys.workflow}-{self.keys.run_id}"
        return base if step is None else f"{base}-{step}"

    def step(
        self,
        key: str,
        fn: Callable[[], T],
        *,
        retry: RetryPolicy | None = None,
        repeatable: bool = False,
    ) -> T:
        """Run ``fn`` once for this run: replay its recorded result, or call and record it.

        A ``repeatable`` step's ``fn`` is safe to run again (a set union, a delete of what the
        run itself holds), so the run goes on without waiting for its record: the record is
        written with the run's next write (the next step's record, or the run's closing), a
        round trip less. A crash before that write runs ``fn`` again.

        Raises:
            ReplayMismatch: ``key`` is new while earlier-recorded steps have not been replayed.
            LeaseLost: the lease was lost before the step could start or record.
            UnserializableResult: ``fn`` returned something JSON cannot hold.
        """
        recorded: dict[str, Any] | None
        recorded = self._cursor.take_next(key)  # the hot path of a resumed run: no lock
        if recorded is None:
            recorded = self._cursor.take(key)
            if recorded is None:
                return self._execute(key, fn, retry, "step", None, repeatable=repeatable)
        if self._on_step is not None:
            self._replay(key, recorded)
        elif tracing.enabled():
            self._trace(_replayed(key, recorded))
        return recorded["result"]  # type: ignore[no-any-return]

    def effect(
        self,
        key: str,
        fn: Callable[[Effect], T],
        *,
        timeout: float,
        repeatable: bool = False,
        revocable: bool = False,
    ) -> T:
        """A step that acts outside Redis, performed by at most one lease holder at a time.

        ``fn(effect)`` must check ``effect.earlier`` (the effect happened already), call
        ``effect.confirm()`` right before the last step that can still be undone and
        ``effect.last_moment()`` at the instant before the irreversible write, and should call
        ``effect.accepted(receipt)`` right after it; it must carry an idempotency key
        (``run.idempotency_key(key)``) into the effect. ``timeout`` bounds how long after its
        claim the effect may still pass ``last_moment``; a later holder waits that long for a
        claimant that may still be alive. Replay returns the recorded result without calling
        ``fn``.

        An effect that may have happened (a failure after ``confirm``, or a claimant that
        died after it) is repeated under the same key only when ``repeatable`` (the receiver
        drops repeats of the key); otherwise the run suspends until an operator decides
        (``journal.ops.actions.decide``) whether it happened.

        A claimed effect refuses an operator's cancel of the run (what follows it must run),
        unless it is ``revocable``: its application undoes what it started when the run is
        cancelled (a provider batch, cancelled; ``journal.batch``).

        Raises:
            LeaseLost: the lease was lost before the claim, at ``confirm`` or at the record.
            ReceiptUnsaved: it happened, and the store refused its receipt.
        """
        recorded = self._cursor.take(key)
        if recorded is not None:
            return self._replay(key, recorded)  # type: ignore[no-any-return]
        self.check_lease()
        started = millis(self.clock.now())
        begun = self._effects_begun
        handle = Effect(
            self._holding,
            key=key,
            timeout=timeout,
            repeatable=repeatable,
            revocable=revocable,
            claim_at_confirm=begun is not None and key not in begun,
        )
        try:
            result = run_effect(handle, fn)
        except EffectAmbiguous as unknown:
            emit("effect_ambiguous", step_name(key), workflow=self.keys.workflow)
            raise Suspend(Wait(kind="decision", step=key, reason=unknown.detail)) from None
        finally:
            if begun is not None:  # a claim may stand now: another attempt claims first
                begun.add(key)
        # Its receipt stands in the store: a replay answers from it, so the record may wait.
        return self._record(  # type: ignore[no-any-return]
            key, result, 1, started, "effect", None, deferred=handle.receipt_stored
        )

    def map(
        self,
        prefix: str,
        items: Sequence[X],
        fn: Callable[[X], T],
        *,
        key: Callable[[X], str],
        concurrency: int = 3,
        retry: RetryPolicy | None = None,
    ) -> list[T]:
        """One step per item, ``concurrency`` at a time, each recorded as soon as it answers.

        Whatever order the calls finish in, each result is recorded the moment its call
        returns, so a crash loses only the calls in flight, never an answer already paid for;
        the steps are reported (and numbered) in item order, so a transcript is the same at any
        concurrency. The group counts as one position for drift detection. When one item fails,
        items already running finish and are recorded, the others are not started, and the
        first error is raised.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        keys = _item_keys("map", prefix, items, key)
        results: list[Any] = [None] * len(items)
        recorded, seqs = self._open_group(prefix, keys)
        order = _ItemOrder()
        stop = threading.Event()

        def one(index: int) -> T:
            settled: list[StepEvent] = []
            try:
                try:
                    if stop.is_set():
                        raise _NotStarted()
                    call = functools.partial(fn, items[index])
                    return self._execute(
                        keys[index], call, retry, "step", prefix, seqs[index], settled.append
                    )
                finally:
                    order.done(
                        index, functools.partial(self._report, settled[0]) if settled else None
                    )
            except BaseException:
                stop.set()  # items not yet started stay unstarted
                raise

        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=prefix)
        # Each call in its own copy of this context: its log lines name the run's delivery.
        futures: dict[Future[T], int] = {
            pool.submit(contextvars.copy_context().run, one, i): i for i in seqs
        }
        try:
            self._replayed_in_order(keys, recorded, results, order)
            wait(futures)
        except BaseException:
            _abandon(pool, stop)
            raise
        finally:
            self._cursor.close_group(prefix)
        pool.shutdown()
        return _collected(futures, results)

    def batch(
        self,
        prefix: str,
        items: Sequence[X],
        request: Callable[[X], Mapping[str, Any]],
        *,
        key: Callable[[X], str],
        api: BatchApi,
        settle: Callable[[X, BatchEntry], T],
        fallback: Callable[[X], T],
        policy: BatchPolicy | None = None,
        retry: RetryPolicy | None = None,
        concurrency: int = 3,
        reserve: Callable[[str, Sequence[X]], None] | None = None,
    ) -> list[T]:
        """One step per item, asked of a provider as one batch and awaited durably.

        ``request(item)`` is the item's request (its parameters; ``key(item)`` becomes its
        ``custom_id``), ``settle(item, entry)`` the step result of an item the batch answered
        (``succeeded`` or ``errored``: it may raise to fail the run), ``fallback(item)`` the
        step result of one it did not (``expired``, ``canceled``, past the deadline), asked
        synchronously with ``retry`` and ``concurrency`` as ``map`` asks. ``reserve(effect,
        items)`` is called before a batch is created (a budget's hold, under a name derived
        from ``effect``, the creation's key, so a repeated creation holds the same). Between
        looks the run suspends (``Suspend``): the caller's worker is free. See
        ``journal.batch`` for the steps it records and what a crash at each leaves.

        Raises:
            Suspend: the run waits for the next look.
            ValueError: two item keys are the same.
        """
        step = BatchStep(
            self,
            prefix,
            items,
            request,
            key=key,
            api=api,
            settle=settle,
            fallback=fallback,
            policy=policy or BatchPolicy(),
            retry=retry,
            concurrency=concurrency,
            reserve=reserve,
        )
        return step()

    def now(self, key: str) -> float:
        """The wall time, recorded once: a replay sees the time of the first attempt."""
        return float(self._once(StepKey.NOW.of(key), self.clock.now, "now"))

    def uuid(self, key: str) -> str:
        """A random id, recorded once, for values that must not change on replay."""
        return str(self._once(StepKey.UUID.of(key), lambda: str(uuid_module.uuid4()), "uuid"))

    def version(self, key: str, current: int) -> int:
        """The code version this run started under, for branching safely after a deploy.

        A run that first passes this gate records ``current``. A run replaying history
        recorded before the gate existed gets 0 and records nothing, so it keeps the old path
        to its end; new steps go behind ``if run.version(key, N) >= N``.
        """
        step = StepKey.VERSION.of(key)
        if not self._cursor.has(step) and self._cursor.older_history():
            return 0
        return int(self._once(step, lambda: current, "version", drift_check=False))

    def sleep(self, key: str, seconds: float) -> None:
        """Wait durably: the wake time is recorded once, and the run suspends until then.

        A replay never extends the sleep; a run woken early suspends again until the
        recorded time.
        """
        step = StepKey.SLEEP.of(key)
        wake_at = float(self._once(step, lambda: self.clock.now() + seconds, "sleep"))
        if self.clock.now() < wake_at:
            raise Suspend(Wait(kind="sleep", step=step, until=wake_at))

    def wait_for_signal(self, name: str, timeout: float | None) -> SignalResult:
        """The first payload sent as ``name`` to this run, or a timed-out result.

        The deadline is recorded on first execution; the outcome is recorded when it is known,
        so a later signal of the same name never changes a wait that already returned.
        """
        deadline = self._once(
            StepKey.DEADLINE.of(name),
            lambda: None if timeout is None else self.clock.now() + timeout,
            "wait",
        )
        outcome_step = StepKey.SIGNAL.of(name)
        recorded = self._cursor.take(outcome_step)
        if recorded is not None:
            outcome = self._replay(outcome_step, recorded)
            return SignalResult(bool(outcome["received"]), outcome.get("payload"))
        raw = self._backend.signal(self.keys, name)
        if raw is not None:
            payload = codec.loads_field(self.keys.run, f"signals.{name}", raw)
            outcome = {"received": True, "payload": payload}
        elif deadline is not None and self.clock.now() >= float(deadline):
            outcome = {"received": False, "payload": None}
        else:
            until = None if deadline is None else float(deadline)
            raise Suspend(Wait(kind="signal", step=outcome_step, until=until, signal=name))
        stored = self._execute(outcome_step, lambda: outcome, None, kind="signal", group=None)
        return SignalResult(bool(stored["received"]), stored.get("payload"))

    def wake_by(self, at: float | None) -> None:
        """Bring every retry of this delivery forward to ``at`` at the latest.

        A step's back-off (slept or suspended) and the run's own retry after a transient
        failure end by ``at``, so a run with a deadline of its own (a digest that must go out
        by Monday 11:00) is awake to meet it instead of sleeping past it. Not recorded: the
        workflow states it on every delivery, from what it recorded or was started with.
        None, the default, brings nothing forward.
        """
        self._wake_by = at

    @property
    def unwritten(self) -> tuple[tuple[str, bytes], ...]:
        """Records that wait for the run's next write (a repeatable step's, a settled effect's)."""
        return tuple(self._unwritten)

    @property
    def wakes_by(self) -> float | None:
        """The time ``wake_by`` set, if any."""
        return self._wake_by

    def check_lease(self) -> None:
        """The step boundary check: raise unless the lease is held and the run not cancelled.

        Raises:
            LeaseLost: the lease is gone.
            Cancelled: the run was cancelled.
        """
        self._guard.ensure()

    # -- internals ---------------------------------------------------------------------

    def _open_group(self, prefix: str, keys: list[str]) -> tuple[list[Any], dict[int, int]]:
        """A map's recorded items taken, and a sequence number for each one left to run."""
        with self._lock:
            recorded = [self._cursor.consume(k) for k in keys]
            if keys and not any(recorded):
                self._cursor.check_drift(keys[0])
            todo = [index for index, record in enumerate(recorded) if record is None]
            self._cursor.open_group(prefix)
        first_seq = self._cursor.next_seq(len(todo)) if todo else 0
        return recorded, {index: first_seq + offset for offset, index in enumerate(todo)}

    def _replayed_in_order(
        self, keys: list[str], recorded: list[Any], results: list[Any], order: _ItemOrder
    ) -> None:
        """A map's recorded items as results, each reported in its turn among the new ones."""
        for index, record in enumerate(recorded):
            if record is not None:
                results[index] = record["result"]
                order.done(index, functools.partial(self._replay, keys[index], record))

    def _once(
        self, step: str, fn: Callable[[], Any], kind: str, *, drift_check: bool = True
    ) -> Any:
        """What every helper is: the recorded value replayed, else ``fn`` called and recorded."""
        recorded = self._cursor.take(step, drift_check=drift_check)
        if recorded is not None:
            return self._replay(step, recorded)
        return self._execute(step, fn, None, kind=kind, group=None)

    def _replay(self, key: str, record: dict[str, Any]) -> Any:
        emit("step_replayed", step_name(key), workflow=self.keys.workflow)
        event = _replayed(key, record)
        self._trace(event)
        if self._on_step is not None:
            self._on_step(event)
        return record["result"]

    @staticmethod
    def _trace(event: StepEvent, seconds: float = 0.0) -> None:
        """The step's span, under the delivery's (``journal.tracing``); a replay takes no time."""
        tracing.step(
            event.key,
            kind=event.kind,
            replayed=event.replayed,
            attempt=event.attempt,
            seconds=seconds,
        )

    def _execute(
        self,
        key: str,
        fn: Callable[[], T],
        retry: RetryPolicy | None,
        kind: str,
        group: str | None,
        seq: int | None = None,
        report: Callable[[StepEvent], object] | None = None,
        *,
        repeatable: bool = False,
    ) -> T:
        if self._policy is not None:
            self._policy.admit(key, kind)
        self.check_lease()
        started = millis(self.clock.now())
        riders: list[Rider] = []

        def attempt_of_fn() -> T:
            with riding() as sent:  # what this attempt sends with the record, if it answers
                answer = fn()
            riders[:] = sent
            return answer

        with self._guard.flight.running(key, started):
            attempt, result = retry_loop(
                key,
                attempt_of_fn,
                retry,
                self._retry_state,
                self.clock,
                self.check_lease,
                self._wake_by,
            )
        return self._record(  # type: ignore[no-any-return]
            key, result, attempt, started, kind, group, seq, report, riders, deferred=repeatable
        )

    def _record(
        self,
        key: str,
        result: Any,
        attempt: int,
        started: int,
        kind: str,
        group: str | None,
        seq: int | None = None,
        report: Callable[[StepEvent], object] | None = None,
        riders: Sequence[Rider] = (),
        *,
        deferred: bool = False,
    ) -> Any:
        """Record ``key`` (numbered ``seq``, or next), then report it, or hand ``report`` it.

        ``riders``: what the step's body sent with its record (``journal._riders``).
        ``deferred``: the record may wait for the run's next write (a repeatable step's, a
        settled effect's), the step counting as recorded meanwhile; its riders go at once.
        """
        finished = millis(self.clock.now())
        encoded = records.encode(
            self.keys.run,
            key,
            result,
            seq=self._cursor.next_seq() if seq is None else seq,
            attempt=attempt,
            fence=self.fence,
            started_at=started,
            finished_at=finished,
            kind=kind,
            group=group,
        )
        status, found = self._write(key, encoded, riders, deferred and self._defer_records)
        if status is Recorded.RECORDED_CANCEL_PENDING:  # an operator cancelled the run:
            self._guard.cancelled.set()  # no step starts after this one
        if status is Recorded.LEASE_EXPIRED:
            raise LeaseLost(self.keys.run, f"the lease expired before {key!r} could be recorded")
        if status is Recorded.FENCED:
            emit("fenced", workflow=self.keys.workflow)
            holder = found.decode() if isinstance(found, bytes) else str(found)
            raise Fenced(self.keys.run, f"{key!r} refused: the run is now held by {holder}")
        # The result as replay will see it (JSON types), so every attempt computes alike.
        raw = found if status is Recorded.ALREADY else encoded
        record = records.decode_fields(self.keys.run, key, raw)
        with self._lock:
            self._cursor.recorded(key, record)
            self.ran += 1
        seconds = (finished - started) / 1000
        if status is Recorded.ALREADY:  # another holder's record: replayed, as reported below
            emit("step_replayed", step_name(key), workflow=self.keys.workflow)
        else:
            emit("step_ran", step_name(key), seconds, workflow=self.keys.workflow)
        event = StepEvent(key, status is Recorded.ALREADY, kind, record.get("attempt", 1))
        self._trace(event, seconds)
        (report or self._report)(event)
        return record["result"]

    def _write(
        self, key: str, encoded: bytes, riders: Sequence[Rider], deferred: bool
    ) -> tuple[Recorded, Any]:
        """Send the record, with every deferred one before it; or defer it in turn."""
        if deferred:
            with self._lock:
                self._unwritten.append((key, encoded))
            send_alone(riders)
            return Recorded.RECORDED, None
        with self._lock:
            earlier, self._unwritten = self._unwritten, []
        write = StepWrite(self.holder, key, encoded, self._record_wait, riders, earlier)
        return self._backend.record(self.keys, write)

    def _report(self, event: StepEvent) -> None:
        if self._on_step is not None:
            self._on_step(event)


def _replayed(key: str, record: Mapping[str, Any]) -> StepEvent:
    """The report of a step taken from the journal, as its record describes it."""
    return StepEvent(key, True, record.get("kind", "step"), record.get("attempt", 1))


def _item_keys(kind: str, prefix: str, items: Sequence[X], key: Callable[[X], str]) -> list[str]:
    """Each item's step key; items must be told apart, or one would replay another's result."""
    keys = [f"{prefix}:{key(item)}" for item in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{kind} {prefix!r}: item keys are not unique")
    return keys


def _abandon(pool: ThreadPoolExecutor, stop: threading.Event) -> None:
    """The process is stopping (a pool child's SIGTERM raises SystemExit in the map).

    The calls in flight are left behind rather than waited out to their timeouts: whatever
    they still record is fenced, and the next holder replays it or makes the call again.
    """
    stop.set()
    pool.shutdown(wait=False, cancel_futures=True)


def _collected(futures: Mapping[Future[T], int], results: list[Any]) -> list[T]:
    """A map's results in item order; else its first error (a wait only if nothing failed)."""
    first_error: BaseException | None = None
    for future, index in futures.items():
        error = future.exception()
        if error is None:
            results[index] = future.result()
        elif isinstance(error, _NotStarted):
            continue
        elif first_error is None or isinstance(first_error, Suspend):
            first_error = error
    if first_error is not None:
        raise first_error
    return results

"""How a failing step is tried again, and how a failed run is.

``RetryPolicy``: a step's attempts within one delivery. Exponential back-off with jitter,
honouring the server's own ``retry-after`` when it gives one, and a bounded number of
attempts. A wait longer than ``suspend_over`` is not slept in the worker: the run suspends
durably and the worker slot is freed (see ``journal._waits``).

``RunRetry``: a run whose error outlasted those attempts. The application says which errors
are transient; such a run stays in the due index and the due sweep starts it again later,
until it succeeds or a deadline passes. Every other error fails the run for good at once.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from journal._clock import Clock, check_doubling
from journal._limits import stopped_by_time_limit
from journal._schema.meta import Wait
from journal._waits import Suspend
from journal.events import emit

T = TypeVar("T")


def _never(_: BaseException) -> bool:
    return False


def _no_hint(_: BaseException) -> float | None:
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a step again.

    Attributes:
        max_attempts: attempts in one delivery, the first included; then the error propagates
            and the run fails, to resume from this step on a later delivery.
        base_delay: the first back-off, in seconds; doubles on each attempt.
        max_delay: the cap of the computed back-off (a server's retry-after may exceed it).
        retryable: which exceptions are transient.
        retry_after: the server's own hint, in seconds, if the exception carries one.
        max_retry_after: the longest hint honoured; a longer one waits this long. A server
            (or a proxy) answering ``retry-after: 999999999`` or a date decades ahead would
            otherwise suspend the run for as long, and the week would be lost in silence.
        suspend_over: back-offs longer than this become a durable sleep instead of a blocked
            worker.
    """

    max_attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    retryable: Callable[[BaseException], bool] = _never
    retry_after: Callable[[BaseException], float | None] = _no_hint
    max_retry_after: float = 3600.0
    suspend_over: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def delay(self, attempt: int, error: BaseException, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        The server's hint wins when it is longer than our own back-off (waiting less than it
        asked only earns another 429), up to ``max_retry_after``.
        """
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        backoff = (rng or random).uniform(ceiling / 2, ceiling)
        hint = self.retry_after(error)
        return backoff if hint is None else max(backoff, min(hint, self.max_retry_after))


@dataclass(frozen=True)
class RunRetry:
    """When a run that failed for a transient cause is started again, and when to stop.

    A failure the application calls transient (``retryable``) keeps the run in the due index:
    the due sweep starts it again after ``first_delay``, doubling up to ``max_delay``, until
    the run succeeds or ``give_up_after`` seconds have passed since the first failure of the
    streak. The last retry falls on that deadline; if it fails too, the run is failed for good
    and logged at ERROR. Any other error (bad input, drift, a refused account) fails the run
    for good at once: retrying cannot fix it, and a person must look.

    Attributes:
        retryable: which errors are transient; none by default, so nothing is retried.
        first_delay: seconds before the first retry.
        max_delay: the cap of the doubling delay.
        give_up_after: seconds from the first failure of a streak to giving up; 0 disables
            retries.
    """

    retryable: Callable[[BaseException], bool] = _never
    first_delay: float = 60.0
    max_delay: float = 3600.0
    give_up_after: float = 86400.0

    def __post_init__(self) -> None:
        check_doubling(self, "first_delay", "max_delay")
        if self.give_up_after < 0:
            raise ValueError(f"give_up_after={self.give_up_after:g} must not be negative")

    def retries(self, error: BaseException) -> bool:
        """Whether a run that failed with ``error`` is to be started again.

        A delivery the queue's time limit stopped always is: the run is not at fault.
        """
        return self.give_up_after > 0 and (self.retryable(error) or stopped_by_time_limit(error))

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds from failure number ``failures`` (1-based) of a streak to the next retry.

        Up to 10% shorter at random, so runs that failed together do not all retry together;
        never longer, so ``max_delay`` stays a bound.
        """
        ceiling = min(self.max_delay, self.first_delay * 2.0 ** min(failures - 1, 64))
        return (rng or random).uniform(ceiling * 0.9, ceiling)


def woken_by(until: float, wake_by: float | None, now: float) -> float:
    """``until``, brought forward to ``wake_by`` if that is sooner and still ahead of ``now``.

    A wake-by time already past brings nothing forward: the run is awake, and a zero back-off
    would only spin.
    """
    if wake_by is None or wake_by <= now:
        return until
    return min(until, wake_by)


def attempt(
    key: str,
    fn: Callable[[], T],
    retry: RetryPolicy | None,
    resumed: Wait | None,
    clock: Clock,
    check_lease: Callable[[], None],
    wake_by: float | None = None,
) -> tuple[int, T]:
    """Call ``fn`` for step ``key`` until it succeeds or ``retry`` gives up; (attempt, result).

    ``resumed`` is the retry wait the run was suspended in, if it was this step's: its
    attempts count on. The lease is checked again after every back-off slept here. No
    back-off, slept or suspended, ends after ``wake_by`` (``Run.wake_by``).

    Raises:
        Suspend: a back-off longer than ``retry.suspend_over``, or a delivery that came
            before a suspended back-off ended: the run waits durably instead.
        Exception: what ``fn`` raised, once it is not retryable or out of attempts.
    """
    attempts = 0
    if resumed is not None and resumed.step == key:
        now = clock.now()
        until = None if resumed.until is None else woken_by(resumed.until, wake_by, now)
        if until is not None and now < until:
            # Delivered before the back-off ended (a duplicate, a manual run): calling now
            # would only earn another 429 and spend an attempt, so wait out the rest.
            raise Suspend(dataclasses.replace(resumed, until=until))
        attempts = resumed.attempt
    while True:
        attempts += 1
        try:
            return attempts, fn()
        except Exception as error:
            if retry is None or not retry.retryable(error) or attempts >= retry.max_attempts:
                raise
            emit("retry", type(error).__name__)
            now = clock.now()
            delay = woken_by(now + retry.delay(attempts, error), wake_by, now) - now
            if delay > retry.suspend_over:
                until = now + delay
                wait = Wait("retry", key, until=until, attempt=attempts, reason=str(error))
                raise Suspend(wait) from error
            clock.sleep(delay)
            check_lease()

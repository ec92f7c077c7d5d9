"""How a failing step is tried again.

Exponential back-off with jitter, honouring the server's own ``retry-after`` when it gives
one, and a bounded number of attempts.

A wait longer than ``suspend_over`` is not slept in the worker: the run suspends durably and
the worker slot is freed (see ``journal.waits``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


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
        suspend_over: back-offs longer than this become a durable sleep instead of a blocked
            worker.
    """

    max_attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    retryable: Callable[[BaseException], bool] = _never
    retry_after: Callable[[BaseException], float | None] = _no_hint
    suspend_over: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def delay(self, attempt: int, error: BaseException, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        The server's hint wins when it is longer than our own back-off: waiting less than it
        asked only earns another 429.
        """
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        backoff = (rng or random).uniform(ceiling / 2, ceiling)
        hint = self.retry_after(error)
        return max(backoff, hint) if hint is not None else backoff

"""Time, injected.

Lease expiry, durable sleep and back-off read time through a ``Clock`` so tests move time
instead of sleeping. Real-time behaviour is tested only with real processes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from journal.errors import ClockSkewed


class Clock(Protocol):
    """Wall time for records and wake-ups, and a way to wait."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch, from the system clock."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        time.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instead of blocking."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def now(self) -> float:
        """The clock's current reading."""
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Record the requested sleep and move time forward by it."""
        with self._lock:
            self.slept.append(seconds)
            self._now += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward, as if ``seconds`` had passed."""
        with self._lock:
            self._now += seconds


def millis(seconds: float) -> int:
    """Seconds as whole milliseconds, the unit every stored timestamp uses."""
    return int(seconds * 1000)


MAX_SKEW_S = 2.0


def check_skew(client: Any, clock: Clock, url: str, bound: float = MAX_SKEW_S) -> float:
    """Refuse to work with a clock too far from the Redis server's; returns the skew.

    Due times, wake-ups and lease deadlines are written by every worker from its own clock and
    compared by others: one clock off by minutes would wake runs early or sweep them again and
    again. The server's ``TIME`` is the reference every process shares; a skew within
    ``bound`` (2 s by default) is far below every lease, sweep and back-off this library uses.

    Raises:
        ClockSkewed: the skew, measured against the middle of the round trip, exceeds ``bound``.
    """
    before = clock.now()
    seconds, micros = client.time()
    after = clock.now()
    skew = (before + after) / 2 - (int(seconds) + int(micros) / 1e6)
    if abs(skew) > bound:
        raise ClockSkewed(url, skew, bound)
    return skew

"""Time, injected.

Lease expiry, durable sleep and back-off read time through a ``Clock`` so tests move time
instead of sleeping. Real-time behaviour is tested only with real processes.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


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


def check_doubling(policy: object, first: str, cap: str) -> None:
    """Refuse a doubling wait that starts at zero or below, or above its own cap.

    Raises:
        ValueError: naming both settings as the policy's caller wrote them.
    """
    start, most = getattr(policy, first), getattr(policy, cap)
    if not 0 < start <= most:
        raise ValueError(f"{first}={start:g} must be positive and at most {cap}={most:g}")

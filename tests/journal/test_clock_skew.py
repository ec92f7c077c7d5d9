"""One clock for time in the store: a process whose clock is off by more than 2 s is refused."""

from __future__ import annotations

import time

import pytest
import redis

from journal import ManualClock
from journal.contrib.checks import MAX_SKEW_S, check_skew
from journal.errors import ClockSkewed


def test_a_synchronised_clock_is_accepted(store: redis.Redis) -> None:
    assert abs(check_skew(store, ManualClock(time.time()), "redis")) < 0.5


@pytest.mark.parametrize("offset", [10.0, -10.0, MAX_SKEW_S + 0.5])
def test_a_skewed_clock_is_refused_in_one_line(store: redis.Redis, offset: float) -> None:
    with pytest.raises(ClockSkewed) as refused:
        check_skew(store, ManualClock(time.time() + offset), "redis://store")
    message = str(refused.value)
    side = "ahead of" if offset > 0 else "behind"
    assert message.startswith(f"this machine's clock is {abs(offset):.1f}s {side} the journal")
    assert "at most 2s is allowed" in message and "\n" not in message

"""Writes of other slots that a step's body sends with the step's record, in its round trip.

A model call settles its take from a shared rate limiter (or a budget) when it answers, and
the step records the answer right after: two writes, two round trips, to keys of two slots
that no one script may touch together on a Redis Cluster. ``send_with_record`` queues such a
write while a step's body runs; the record goes in one pipeline with it on a single server,
so the settle costs no round trip of its own. On a cluster each goes to its own slot's master
as before. An attempt that fails records nothing: its writes are sent at once, before the
retry's wait, so what they tell other processes (a 429 holding every caller) is not late.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from journal._redis.scripts import KeyOrArg, Script

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rider:
    """One script call that rides with a step's record."""

    script: Script
    keys: tuple[KeyOrArg, ...]
    args: tuple[KeyOrArg, ...]

    def send(self) -> Any:
        """Send it alone, on the script's own client: its reply."""
        return self.script(keys=self.keys, args=self.args)


_riding: ContextVar[list[Rider] | None] = ContextVar("journal_riders", default=None)


def send_with_record(
    script: Script, keys: Sequence[KeyOrArg], args: Sequence[KeyOrArg] = ()
) -> None:
    """Send ``script`` with the record of the step whose body runs now, in the same round trip.

    Outside a step's body (or in a thread of its own, which the step's context does not
    reach) it is sent at once. The reply is not handed back: for writes whose answer the
    body does not need, such as a rate limiter's settle.
    """
    riders = _riding.get()
    rider = Rider(script, tuple(keys), tuple(args))
    if riders is None:
        rider.send()
    else:
        riders.append(rider)


@contextlib.contextmanager
def riding() -> Iterator[list[Rider]]:
    """Collect what one attempt of a step's body sends with its record; a failure sends it now."""
    riders: list[Rider] = []
    token = _riding.set(riders)
    try:
        yield riders
    except BaseException:
        send_alone(riders)
        raise
    finally:
        _riding.reset(token)


def send_alone(riders: Sequence[Rider]) -> None:
    """Send each rider on its own: a failed attempt's, or a cluster's (another slot each)."""
    for rider in riders:
        try:
            rider.send()
        except Exception as refused:  # the body's own outcome matters more than its rider
            log.warning("a write sent with a step's record failed: %s", refused)

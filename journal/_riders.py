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
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from journal._redis.scripts import KeyOrArg, Script

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rider:
    """One script call that rides with a step's record.

    ``answered`` is handed the reply once the server has it, for a caller that others wait on.
    """

    script: Script
    keys: tuple[KeyOrArg, ...]
    args: tuple[KeyOrArg, ...]
    answered: Callable[[Any], None] | None = None

    def send(self) -> None:
        """Send it alone, on the script's own client."""
        self.heard(self.script(keys=self.keys, args=self.args))

    def heard(self, reply: Any) -> None:
        """The server's reply to it, sent alone or with a record."""
        if self.answered is not None:
            self.answered(reply)


_riding: ContextVar[list[Rider] | None] = ContextVar("journal_riders", default=None)


def send_with_record(
    script: Script,
    keys: Sequence[KeyOrArg],
    args: Sequence[KeyOrArg] = (),
    answered: Callable[[Any], None] | None = None,
) -> None:
    """Send ``script`` with the record of the step whose body runs now, in the same round trip.

    Outside a step's body (or in a thread of its own, which the step's context does not
    reach) it is sent at once. For writes whose answer the body does not need, such as a rate
    limiter's settle: the reply goes to ``answered``, once the server has it, for other
    threads that wait for the write (none is called for a write the server refused).
    """
    riders = _riding.get()
    rider = Rider(script, tuple(keys), tuple(args), answered)
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

"""A run's stored status, and which status may follow which.

The status lives in the run's meta hash. ``open.lua`` sets ``running``; every other write is
a closing transition of the holder (``close.lua``) or a cancel of a run nobody holds
(``cancel.lua``). ``TRANSITIONS`` is the whole lifecycle: the stateful tests check every
change they observe in Redis against it.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """What the meta hash's ``status`` field holds."""

    RUNNING = "running"
    WAITING = "waiting"  # a durable sleep, a signal wait or a long back-off
    RETRYING = "retrying"  # a transient failure: the due sweep starts it again
    FAILED = "failed"  # for good, or parked (``meta.parked``) until reset
    DONE = "done"
    CANCELLED = "cancelled"


ENDED = frozenset({RunStatus.DONE, RunStatus.CANCELLED})
"""Statuses a run never leaves: a delivery finds it ended and runs nothing."""

TRANSITIONS: dict[RunStatus | None, frozenset[RunStatus]] = {
    None: frozenset({RunStatus.RUNNING}),  # the first start
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING,
            RunStatus.RETRYING,
            RunStatus.FAILED,
            RunStatus.DONE,
            RunStatus.CANCELLED,
        }
    ),
    RunStatus.WAITING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.RETRYING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.FAILED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.DONE: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def may_follow(before: RunStatus | None, after: RunStatus) -> bool:
    """Whether a run with status ``before`` (None: never started) may next show ``after``."""
    return after in TRANSITIONS[before]

"""Cancellation: an operator's request that a run stop at its next step boundary.

Not a failure, so not under ``JournalError``: like a suspension, it unwinds the workflow and
the runner records the outcome. The request is a field of the run's meta (``cancel``), set by
``journal.ops.actions.cancel``. A run learns of it inside the fenced scripts it already calls:
the record script answers "recorded, and a cancel is pending" in the same call that stores a step,
and the lease renewal answers the same between steps, so noticing a cancel costs no round trip
of its own. The step in flight when the request lands finishes and is recorded (its cost is
not thrown away); no step starts after the run has learnt of it, and a run about to wait is
cancelled instead of waiting. A fenced effect in flight (``run.effect``) renews its lease
right before its irreversible moment; a cancel that renewal reports stops it before it acts.
"""

from __future__ import annotations

CANCEL_FIELD = "cancel"


class Cancelled(Exception):
    """Unwinds a workflow whose run was cancelled; the runner marks it ``cancelled``."""

    def __init__(self, run: str) -> None:
        super().__init__(run)
        self.run = run

    def __str__(self) -> str:
        return f"run {self.run} was cancelled"

"""Control flow for runs that must wait: not failures, so not under ``JournalError``.

A wait unwinds the workflow with ``Suspend``; the runner records what the run waits for,
registers its wake-up time in the ``due`` index, releases the lease and returns, freeing the
worker slot. Whoever wakes it (the due sweep, a signal, a later delivery) simply runs the
workflow again: replay fast-forwards to the wait, which now finds its answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from journal._schema.meta import Wait


class Suspend(Exception):
    """Unwinds a workflow that must wait; the runner turns it into a durable wait."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(wait)
        self.wait = wait

    def __str__(self) -> str:
        until = f" until {self.wait.until:.3f}" if self.wait.until is not None else ""
        return f"suspended at {self.wait.step} ({self.wait.kind}){until}"


@dataclass(frozen=True)
class SignalResult:
    """The answer of ``wait_for_signal``: the payload, or the fact that time ran out."""

    received: bool
    payload: Any = None

    @property
    def timed_out(self) -> bool:
        """True when the wait ended by its timeout, with no signal."""
        return not self.received

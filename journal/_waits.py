"""Control flow for runs that must wait: not failures, so not under ``JournalError``.

A wait unwinds the workflow with ``Suspend``; the runner records what the run waits for,
registers its wake-up time in the ``due`` index, releases the lease and returns, freeing the
worker slot. Whoever wakes it (the due sweep, a signal, a later delivery) simply runs the
workflow again: replay fast-forwards to the wait, which now finds its answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from journal._schema import codec
from journal.errors import CorruptJournal


@dataclass(frozen=True)
class Wait:
    """What a suspended run waits for, as stored in its meta and shown by inspection.

    Attributes:
        kind: ``sleep``, ``signal`` or ``retry``.
        step: the step key that waits.
        until: wake-up time in seconds since the epoch, or None for a signal with no timeout.
        signal: the signal name, for signal waits.
        attempt: attempts already made, for retry waits (the count survives the suspension).
        reason: a human line (the error behind a retry, for example).
    """

    kind: str
    step: str
    until: float | None = None
    signal: str | None = None
    attempt: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for the run's meta."""
        return {
            "kind": self.kind,
            "step": self.step,
            "until": self.until,
            "signal": self.signal,
            "attempt": self.attempt,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Wait:
        """Read back what ``to_json`` stored."""
        return cls(
            kind=str(data["kind"]),
            step=str(data["step"]),
            until=None if data.get("until") is None else float(data["until"]),
            signal=data.get("signal"),
            attempt=int(data.get("attempt", 0)),
            reason=str(data.get("reason", "")),
        )

    @classmethod
    def from_meta(cls, run: str, raw: str) -> Wait:
        """Read a run's ``meta.wait`` back.

        Raises:
            CorruptJournal: the field is not JSON, or not a wait this library wrote.
        """
        data = codec.loads_field(run, "meta.wait", raw)
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptJournal(run, "meta.wait", f"not a wait: {exc!r}") from None


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

"""The step keys the journal gives its own helpers' records, built in one place.

A workflow names its steps (``select``, ``summarize:i4``); ``Run``'s helpers record under a
key made from the name they are given and a prefix per kind (``sleep:cooling-off``,
``signal:approval``). Code that reads a run back (an operator's view, a fixture, an
application showing what a run waits for) asks here for those keys instead of spelling the
prefixes itself, so the journal's format is written down once.
"""

from __future__ import annotations


class StepKey:
    """The key each helper of ``Run`` records under, from the name the workflow gave it."""

    NOW = "now:"
    UUID = "uuid:"
    VERSION = "version:"
    SLEEP = "sleep:"
    DEADLINE = "wait:"
    SIGNAL = "signal:"

    @classmethod
    def now(cls, key: str) -> str:
        """``run.now(key)``: the wall time recorded once."""
        return cls.NOW + key

    @classmethod
    def uuid(cls, key: str) -> str:
        """``run.uuid(key)``: the random id recorded once."""
        return cls.UUID + key

    @classmethod
    def version(cls, key: str) -> str:
        """``run.version(key, n)``: the code version the run passed the gate under."""
        return cls.VERSION + key

    @classmethod
    def sleep(cls, key: str) -> str:
        """``run.sleep(key, s)``: the wake-up time."""
        return cls.SLEEP + key

    @classmethod
    def deadline(cls, name: str) -> str:
        """``run.wait_for_signal(name, timeout)``: when the wait times out (None: never)."""
        return cls.DEADLINE + name

    @classmethod
    def signal(cls, name: str) -> str:
        """``run.wait_for_signal(name, ...)``: what the wait ended with, payload or timeout."""
        return cls.SIGNAL + name

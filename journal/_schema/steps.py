"""The step keys the journal gives its own helpers' records, built in one place.

A workflow names its steps (``select``, ``summarize:i4``); ``Run``'s helpers record under a
key made from the name they are given and a prefix per kind (``sleep:cooling-off``,
``signal:approval``). Code that reads a run back (an operator's view, a fixture, an
application showing what a run waits for) asks here for those keys instead of spelling the
prefixes itself, so the journal's format is written down once.
"""

from __future__ import annotations

from enum import StrEnum


class StepKey(StrEnum):
    """The prefix of each helper of ``Run``; ``StepKey.SLEEP.of("nap")`` is its step key.

    ``NOW``: ``run.now``'s wall time; ``UUID``: ``run.uuid``'s id; ``VERSION``: the code
    version a run passed ``run.version``'s gate under; ``SLEEP``: ``run.sleep``'s wake-up
    time; ``DEADLINE`` and ``SIGNAL``: when ``run.wait_for_signal`` times out, and what it
    ended with.
    """

    NOW = "now:"
    UUID = "uuid:"
    VERSION = "version:"
    SLEEP = "sleep:"
    DEADLINE = "wait:"
    SIGNAL = "signal:"

    def of(self, name: str) -> str:
        """The step key this helper records under for ``name``."""
        return self.value + name

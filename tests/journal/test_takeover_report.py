"""A takeover from a provably dead holder is counted and logged, naming who was gone.

``test_holder.py`` proves the takeover itself; what an operator sees of it (the ``takeover``
event behind a metric, one INFO line naming the run, the dead holder's token, pid and host)
is pinned here. Found by mutation testing (docs/mutation.md): both could change unseen.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from journal import Outcome
from tests.conftest import MakeJournal
from tests.journal.test_holder import PID_MAX, hold_then_vanish, me
from tests.support import recorded_events


def test_a_takeover_is_counted_once_and_logged_naming_the_dead_holder(
    make_journal: MakeJournal,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = dataclasses.replace(me(), pid=PID_MAX + 1)
    with recorded_events() as events, caplog.at_level(logging.INFO, logger="journal._lease"):
        first, (outcome, _) = hold_then_vanish(make_journal, dead)
    assert isinstance(outcome, Outcome) and outcome.status == "done"
    assert [event for event in events if event[0] == "takeover"] == [("takeover", "", 1.0)]
    fence = first.fence  # the holder is named by its fence, as LeaseBusy names it
    assert [r.getMessage() for r in caplog.records if r.name == "journal._lease"] == [
        f"run w:r1: lease holder {fence} (pid {PID_MAX + 1} on {dead.host}) is gone; "
        "taken over at once"
    ]

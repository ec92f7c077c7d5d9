"""A lease whose holder process is provably gone is taken over at once; any doubt waits.

These run in one process on both backends: the dead holder is an identity of this host whose
pid cannot exist (above the kernel's ``pid_max``). Real crashed, stopped and zombie processes
are in ``tests/failure/test_dead_holder.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TypedDict

import pytest

from journal import Outcome, Run
from journal._holder import ProcessIdentity
from journal.errors import LeaseBusy, LeaseLost
from tests.conftest import MakeJournal
from tests.support import execute

PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())


def me() -> ProcessIdentity:
    return ProcessIdentity.current()


def test_this_process_knows_who_it_is_and_is_not_gone() -> None:
    identity = me()
    assert identity.boot and identity.pidns.startswith("pid:[") and identity.start > 0
    assert identity.timens.startswith("time:[")
    assert ProcessIdentity.decode(identity.encode()) == identity
    assert not identity.provably_gone()


def test_an_absent_or_reused_pid_is_gone() -> None:
    assert dataclasses.replace(me(), pid=PID_MAX + 1).provably_gone()
    assert dataclasses.replace(me(), start=me().start - 1).provably_gone()  # our pid, reused


class Elsewhere(TypedDict, total=False):
    """Where a process may be other than here: its identity's text fields."""

    host: str
    boot: str
    pidns: str
    timens: str


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"host": "elsewhere"},
        {"boot": "another-boot"},
        {"pidns": "pid:[1]"},
        {"timens": "time:[1]"},
        {"timens": ""},
        {"boot": ""},
    ],
    ids=["host", "boot", "pidns", "timens", "no-timens", "no-boot"],
)
def test_nothing_is_proved_from_another_host_boot_or_namespace(elsewhere: Elsewhere) -> None:
    assert not dataclasses.replace(me(), pid=PID_MAX + 1, **elsewhere).provably_gone()


def test_an_identity_stored_without_its_time_namespace_proves_nothing() -> None:
    stored = json.loads(dataclasses.replace(me(), pid=PID_MAX + 1).encode())
    del stored["timens"]
    older = ProcessIdentity.decode(json.dumps(stored))
    assert older is not None and older.timens == ""
    assert not older.provably_gone()


def test_an_observer_whose_proc_is_not_its_own_proves_nothing() -> None:
    blind = dataclasses.replace(me(), start=0)  # what an observer records in that case
    assert not dataclasses.replace(me(), pid=PID_MAX + 1).provably_gone(blind)


def test_an_unreadable_identity_proves_nothing() -> None:
    assert ProcessIdentity.decode(b"not json") is None
    assert ProcessIdentity.decode(b'{"host": "h"}') is None
    assert ProcessIdentity.decode(None) is None


def hold_then_vanish(
    make_journal: MakeJournal, holder: ProcessIdentity
) -> tuple[Run, tuple[Outcome | LeaseBusy, LeaseLost | None]]:
    """Open a run in a first journal, then make its stored holder ``holder``.

    Returns the first holder's run, then what a second holder got (an outcome, or refused as
    busy) and how the first holder's next write ended (lost, or None if it was not refused).
    """
    journal = make_journal(lease_ttl=30.0)
    keys = journal.keys("w", "r1")
    held: list[Run] = []
    seen: list[Outcome | LeaseBusy] = []

    def body(run: Run) -> None:
        held.append(run)
        journal.client.hset(keys.meta, "holder_process", holder.encode())
        second = make_journal(lease_ttl=30.0)
        try:
            seen.append(execute(second, "w", "r1", lambda other: other.step("b", lambda: 2)))
        except LeaseBusy as busy:
            seen.append(busy)
        run.step("a", lambda: 1)

    try:
        execute(journal, "w", "r1", body)
    except LeaseLost as lost:
        return held[0], (seen[0], lost)
    return held[0], (seen[0], None)


def test_a_dead_holders_lease_is_taken_over_at_once_and_fenced(make_journal: MakeJournal) -> None:
    dead = dataclasses.replace(me(), pid=PID_MAX + 1)
    first, (outcome, fenced) = hold_then_vanish(make_journal, dead)
    assert isinstance(outcome, Outcome) and outcome.status == "done"  # no wait for the 30 s lease
    assert fenced is not None  # the old holder's write is refused: the lease moved on
    journal = make_journal()
    keys = journal.keys("w", "r1")
    assert journal.meta(keys)["fence"] == "2"
    assert set(journal.client.hkeys(keys.steps)) == {b"b"}
    assert first.fence == 1


def test_a_live_holder_on_this_host_keeps_its_lease(make_journal: MakeJournal) -> None:
    _, (outcome, fenced) = hold_then_vanish(make_journal, me())
    assert isinstance(outcome, LeaseBusy) and outcome.remaining_ms > 25_000
    assert fenced is None

"""A lease whose holder process is provably gone is taken over at once; any doubt waits.

These run in one process on both backends: the dead holder is an identity of this host whose
pid cannot exist (above the kernel's ``pid_max``). Real crashed, stopped and zombie processes
are in ``tests/failure/test_dead_holder.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from journal import LeaseBusy, LeaseLost, Run
from journal.holder import ProcessIdentity

PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())


def me() -> ProcessIdentity:
    return ProcessIdentity.current()


def test_this_process_knows_who_it_is_and_is_not_gone() -> None:
    identity = me()
    assert identity.boot and identity.pidns.startswith("pid:[") and identity.start > 0
    assert ProcessIdentity.decode(identity.encode()) == identity
    assert not identity.provably_gone()


def test_an_absent_or_reused_pid_is_gone() -> None:
    assert dataclasses.replace(me(), pid=PID_MAX + 1).provably_gone()
    assert dataclasses.replace(me(), start=me().start - 1).provably_gone()  # our pid, reused


@pytest.mark.parametrize(
    "field, value",
    [("host", "elsewhere"), ("boot", "another-boot"), ("pidns", "pid:[1]"), ("boot", "")],
)
def test_nothing_is_proved_from_another_host_boot_or_namespace(field: str, value: str) -> None:
    assert not dataclasses.replace(me(), pid=PID_MAX + 1, **{field: value}).provably_gone()


def test_an_unreadable_identity_proves_nothing() -> None:
    assert ProcessIdentity.decode(b"not json") is None
    assert ProcessIdentity.decode(b'{"host": "h"}') is None
    assert ProcessIdentity.decode(None) is None


def hold_then_vanish(make_journal, holder: ProcessIdentity) -> tuple[Run, object]:  # type: ignore[no-untyped-def]
    """Open a run in a first journal, then make its stored holder ``holder``."""
    journal = make_journal(lease_ttl=30.0)
    keys = journal.keys("w", "r1")
    held: list[Run] = []

    def body(run: Run) -> None:
        held.append(run)
        journal.client.hset(keys.meta, "holder_process", holder.encode())
        second = make_journal(lease_ttl=30.0)
        try:
            outcome = second.execute("w", "r1", lambda other: other.step("b", lambda: 2))
        except LeaseBusy as busy:
            outcome = busy
        held.append(outcome)  # type: ignore[arg-type]
        run.step("a", lambda: 1)

    try:
        journal.execute("w", "r1", body)
    except LeaseLost as lost:
        return held[0], (held[1], lost)
    return held[0], (held[1], None)


def test_a_dead_holders_lease_is_taken_over_at_once_and_fenced(make_journal) -> None:  # type: ignore[no-untyped-def]
    dead = dataclasses.replace(me(), pid=PID_MAX + 1)
    first, (outcome, fenced) = hold_then_vanish(make_journal, dead)
    assert getattr(outcome, "status", None) == "done"  # no wait for the 30 s lease
    assert fenced is not None  # the old holder's write is refused: the lease moved on
    journal = make_journal()
    keys = journal.keys("w", "r1")
    assert journal.meta(keys)["fence"] == "2"
    assert set(journal.client.hkeys(keys.steps)) == {b"b"}
    assert first.fence == 1


def test_a_live_holder_on_this_host_keeps_its_lease(make_journal) -> None:  # type: ignore[no-untyped-def]
    _, (outcome, fenced) = hold_then_vanish(make_journal, me())
    assert isinstance(outcome, LeaseBusy) and outcome.remaining_ms > 25_000
    assert fenced is None

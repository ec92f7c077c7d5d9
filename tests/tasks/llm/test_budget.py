"""The budget as a call sees it: holds of a process that is provably gone are returned at once.

A hold's process is recorded with it (``journal.ProcessIdentity``); a call that finds no room
while a hold of a process that can never settle it is in flight takes the money back at once,
as the journal takes a dead holder's lease, instead of waiting out the hold's lapse. The dead
process is this one under another start time: a pid reused, which ``provably_gone`` proves
without starting any process.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis

from journal import Keyspace, ProcessIdentity, RunKeys
from tasks.config.prices import PriceTable
from tasks.llm.budget import NANO, Budget, StoreLedger
from tasks.llm.cost import BudgetExceeded
from tests.support import as_text

LIMIT = 1.0


class NoWaiting(AssertionError):
    """A call waited for a hold to settle."""


def never(seconds: float) -> None:
    raise NoWaiting(f"waited {seconds} s for holds to settle")


@pytest.fixture
def keys(prefix: str) -> RunKeys:
    return Keyspace(prefix).run("digest", "2026-w42")


def budget(store: redis.Redis) -> Budget:
    return Budget(StoreLedger(store), LIMIT, PriceTable.from_env({}), 60.0, sleep=never)


def hold_of(process: ProcessIdentity, amount: float, store: redis.Redis, keys: RunKeys) -> None:
    """A hold as ``process`` wrote it, with an hour to lapse."""
    seconds, _ = store.time()
    expiry = (int(seconds) + 3600) * 1000
    held = f"{int(amount * NANO)}:{expiry}:{process.encode()}"
    store.hset(keys.usage, mapping={"spent": 0, "r:held": held})


def test_a_hold_of_a_process_provably_gone_is_returned_at_once(
    store: redis.Redis, keys: RunKeys
) -> None:
    me = ProcessIdentity.current()
    if me.start <= 0:
        pytest.skip("this /proc proves nothing about processes")
    reused = dataclasses.replace(me, start=me.start - 1)  # our pid, another process's start
    hold_of(reused, 0.8, store, keys)

    with budget(store).hold(keys, "summarize:i1", 0.5) as reservation:
        assert reservation is not None
        held = sorted(as_text(name) for name in store.hkeys(keys.usage))
        assert held == [f"r:{reservation.id}", "spent"]  # the dead hold went, ours is in
        reservation.settle(0.25)

    assert store.hgetall(keys.usage) == {b"spent": str(int(0.25 * NANO)).encode()}


def test_a_hold_of_a_live_process_is_waited_for(store: redis.Redis, keys: RunKeys) -> None:
    hold_of(ProcessIdentity.current(), 0.8, store, keys)  # this process: alive

    with pytest.raises(NoWaiting), budget(store).hold(keys, "summarize:i1", 0.5):
        pass
    assert store.hexists(keys.usage, "r:held")


def test_a_hold_of_a_process_on_another_host_is_waited_for(
    store: redis.Redis, keys: RunKeys
) -> None:
    elsewhere = dataclasses.replace(ProcessIdentity.current(), host="elsewhere", start=1)
    hold_of(elsewhere, 0.8, store, keys)

    with pytest.raises(NoWaiting), budget(store).hold(keys, "summarize:i1", 0.5):
        pass
    assert store.hexists(keys.usage, "r:held")


def test_a_dead_holds_money_returned_still_refuses_a_call_over_the_spend(
    store: redis.Redis, keys: RunKeys
) -> None:
    me = ProcessIdentity.current()
    if me.start <= 0:
        pytest.skip("this /proc proves nothing about processes")
    hold_of(dataclasses.replace(me, start=me.start - 1), 0.8, store, keys)
    store.hset(keys.usage, "spent", int(0.7 * NANO))

    with pytest.raises(BudgetExceeded), budget(store).hold(keys, "summarize:i1", 0.5):
        pass

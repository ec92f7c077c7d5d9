"""Every branch of the lease and record protocol, on real Redis and on fakeredis.

Each reply code of each script, first as the script answers it, then as the code that acts on
it turns it into an outcome: recorded, already recorded, lease expired, fenced, not the holder,
lease lost before a status write, signal arrived, and a code nobody knows. Then what the
scripts count (stalled starts, through parking and ``reset``) and what the lease's Python side
does when Redis fails under it. ``tests/mutants.py`` breaks one guard at a time; this module
is where each break must be caught, so every test here is fast and exact.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import fakeredis
import orjson
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from journal import Effect, Journal, Keyspace, ManualClock, RetryPolicy, Run, Settings, StepEvent
from journal._cancel import Cancelled
from journal._clock import millis
from journal._holder import ProcessIdentity
from journal._lease import Found, Grant, Heartbeat, Lease
from journal._redis.backend import Opened, Recorded, code
from journal._redis.scripts import Script
from journal._schema.keys import RunKeys
from journal.errors import (
    Fenced,
    LeaseBusy,
    LeaseLost,
    RunParked,
    StoreUnavailable,
    UnknownScriptStatus,
)
from journal.ops.views import inspect_run
from tests.conftest import MakeJournal
from tests.support import Relay, acquire, as_bytes, execute, only_index, wait_until

T0 = 1_800_000_000.0
TTL_MS = 5_000


@pytest.fixture
def journal(make_journal: MakeJournal) -> Journal:
    return make_journal(clock=ManualClock(T0))


@pytest.fixture
def keys(journal: Journal) -> RunKeys:
    return journal.keys("wf", "r1")


def lease(journal: Journal, ttl_ms: int = TTL_MS) -> Lease:
    return Lease(journal.keys("wf", "r1"), journal.backend, ttl_ms)


def record_of(result: object, fence: int = 1) -> bytes:
    """A step record as the journal writes it."""
    at = millis(T0)
    fields = {"result": result, "seq": 1, "attempt": 1, "fence": fence}
    return orjson.dumps({**fields, "started_at": at, "finished_at": at, "kind": "step"})


def crash(run: Run) -> None:
    """A start that dies before recording anything: the process is gone, the lease stays."""
    raise SystemExit(137)


# -- acquire -------------------------------------------------------------------------------


def test_each_grant_increments_the_fence_and_sets_a_lease_that_expires(
    journal: Journal, keys: RunKeys
) -> None:
    first = acquire(lease(journal), millis(T0))
    assert (first.fence, first.holder.split(":")[0]) == (1, "1")
    assert journal.client.get(keys.lease) == first.holder.encode()
    assert 4_000 < journal.client.pttl(keys.lease) <= TTL_MS
    assert lease(journal).release(first.holder)
    second = acquire(lease(journal), millis(T0) + 7)
    assert second.fence == 2
    assert journal.client.get(keys.fence) == b"2"
    meta = journal.meta(keys)
    assert (meta["fence"], meta["starts"]) == ("2", "2")
    assert (meta["created_at"], meta["updated_at"]) == (str(millis(T0)), str(millis(T0) + 7))
    assert ProcessIdentity.decode(meta["holder_process"]) == ProcessIdentity.current()


def test_a_live_lease_is_busy_and_the_refused_start_writes_nothing(
    journal: Journal, keys: RunKeys
) -> None:
    grant = acquire(lease(journal), millis(T0))
    before = journal.meta(keys)
    with pytest.raises(LeaseBusy) as busy:
        acquire(lease(journal), millis(T0) + 1)
    assert busy.value.holder == "1"
    assert 4_000 < busy.value.remaining_ms <= TTL_MS
    assert journal.client.get(keys.lease) == grant.holder.encode()
    assert journal.client.get(keys.fence) == b"1"
    assert journal.meta(keys) == before


def test_only_the_holder_proved_dead_is_taken_over(journal: Journal, keys: RunKeys) -> None:
    grant = acquire(lease(journal), millis(T0))
    me = ProcessIdentity.current().encode()
    script_keys = [keys.lease, keys.fence, keys.meta, keys.steps]

    def take_over(dead: str) -> Any:
        return journal.backend.scripts.open(keys=script_keys, args=["t2", TTL_MS, 1, me, dead])

    busy = take_over("1:someone-else")
    assert busy[:1] == [0] and busy[2] == grant.holder.encode()
    assert journal.client.get(keys.lease) == grant.holder.encode()
    assert take_over(grant.holder)[:2] == [1, 2]
    assert journal.client.get(keys.lease) == b"2:t2"


def test_an_opening_that_finds_the_run_ended_takes_it_out_of_the_due_index(
    journal: Journal, keys: RunKeys
) -> None:
    execute(journal, "wf", "r1", lambda run: "done once")
    journal.client.zadd(only_index(journal).due, {keys.run: 1})  # put back by hand
    fence = journal.client.get(keys.fence)

    outcome = execute(journal, "wf", "r1", lambda run: "never again")

    assert (outcome.status, outcome.result) == ("already-done", "done once")
    assert journal.client.zscore(only_index(journal).due, keys.run) is None
    assert journal.client.get(keys.fence) == fence  # no lease was taken


def test_an_opening_refuses_an_unreadable_wait_and_writes_nothing(
    journal: Journal, keys: RunKeys
) -> None:
    execute(journal, "wf", "r1", lambda run: run.sleep("nap", 60))
    journal.client.hset(keys.meta, "wait", b'{"kind": "sleep"}')  # no step
    before = journal.client.hgetall(keys.meta)
    opening = journal.runner._opening(None)

    found = journal.runner._lease(keys).open(millis(T0), opening)

    assert found == Found(Opened.BAD_WAIT, '{"kind": "sleep"}')
    assert journal.client.hgetall(keys.meta) == before
    assert not journal.client.exists(keys.lease)


def test_a_renewal_pushes_the_run_due_past_its_new_expiry(journal: Journal, keys: RunKeys) -> None:
    held = journal.runner._lease(keys)
    grant = held.open(millis(T0), journal.runner._opening(None))
    assert isinstance(grant, Grant)
    first = journal.client.zscore(only_index(journal).due, keys.run)
    assert first is not None and isinstance(journal.clock, ManualClock)
    journal.clock.advance(7)

    assert held.renew(grant.holder) == 1

    assert journal.client.zscore(only_index(journal).due, keys.run) == first + 7_000
    assert held.renew("1:not-the-token") == 0
    assert journal.client.zscore(only_index(journal).due, keys.run) == first + 7_000


# -- stalled starts, parking and reset ---------------------------------------------------------


def test_starts_that_record_nothing_are_counted_and_progress_resets_the_count(
    journal: Journal, keys: RunKeys
) -> None:
    def start() -> int:
        grant = acquire(lease(journal), millis(T0))
        assert lease(journal).release(grant.holder)
        return grant.starts_without_progress

    assert [start(), start(), start()] == [1, 2, 3]
    journal.client.hset(keys.steps, "a", record_of("A"))  # the third start recorded a step
    assert [start(), start()] == [1, 2]
    assert journal.meta(keys)["recorded_at_start"] == "1"


def test_a_run_that_keeps_dying_at_start_is_parked_until_reset(
    make_journal: MakeJournal, keys: RunKeys
) -> None:
    journal = make_journal(clock=ManualClock(T0), max_stalled_starts=2)
    for _ in range(2):  # two starts die; each leaves its lease to expire
        with pytest.raises(SystemExit):
            execute(journal, "wf", "r1", crash)
        journal.client.delete(keys.lease)
    with pytest.raises(RunParked) as parked:
        execute(journal, "wf", "r1", crash)
    assert parked.value.starts == 2
    meta = journal.meta(keys)
    assert (meta["status"], meta["parked"], meta["starts_without_progress"]) == ("failed", "1", "2")
    assert meta["last_error"] == str(parked.value)
    assert journal.client.get(keys.lease) is None  # the parking start gave its lease back
    assert journal.client.zscore(only_index(journal).due, keys.run) is None

    with pytest.raises(RunParked, match="after 2 starts"):
        execute(journal, "wf", "r1", crash)
    assert journal.client.get(keys.fence) == b"3"  # refused before taking the lease

    assert journal.reset("wf", "r1")
    meta = journal.meta(keys)
    assert ("parked" in meta, "last_error" in meta) == (False, False)
    assert meta["starts_without_progress"] == "0"
    outcome = execute(journal, "wf", "r1", lambda run: run.step("a", lambda: "A"))
    assert (outcome.status, outcome.result) == ("done", "A")
    assert journal.meta(keys)["starts_without_progress"] == "0"
    assert not journal.reset("wf", "r1")  # not parked: left as it is
    assert journal.meta(keys)["status"] == "done"
    assert not journal.reset("wf", "never-started")
    assert journal.client.exists(journal.keys("wf", "never-started").meta) == 0


def test_a_start_that_suspends_or_fails_clears_the_stall_count(
    make_journal: MakeJournal, keys: RunKeys
) -> None:
    journal = make_journal(clock=ManualClock(T0), max_stalled_starts=2)
    for _ in range(4):  # woken early each time: the sleep replays and suspends, recording nothing
        assert execute(journal, "wf", "r1", lambda run: run.sleep("nap", 10)).status == "waiting"
        assert journal.meta(keys)["starts_without_progress"] == "0"
    failing = journal.keys("wf", "r2")
    for _ in range(4):  # a start that dies, then one that fails: the failure is progress
        with pytest.raises(SystemExit):
            execute(journal, "wf", "r2", crash)
        journal.client.delete(failing.lease)
        with pytest.raises(ZeroDivisionError):
            execute(journal, "wf", "r2", lambda run: run.step("a", lambda: 1 / 0))
        assert journal.meta(failing)["starts_without_progress"] == "0"
    with pytest.raises(SystemExit):
        execute(journal, "wf", "r1", crash)
    assert journal.meta(keys)["starts_without_progress"] == "1"


# -- record ----------------------------------------------------------------------------------


def test_the_record_script_answers_each_of_its_four_codes(journal: Journal, keys: RunKeys) -> None:
    grant = acquire(lease(journal), millis(T0))
    script_keys = [keys.lease, keys.steps, keys.meta]

    def record(holder: str, value: object) -> Any:
        return journal.backend.scripts.record(
            keys=script_keys, args=[holder, "a", record_of(value)]
        )

    assert record(grant.holder, "first") == 1
    assert record(grant.holder, "second") == [2, record_of("first")]
    assert record("1:not-the-token", "third") == [-2, grant.holder.encode()]
    assert record("2:" + grant.holder.split(":")[1], "fourth") == [-2, grant.holder.encode()]
    assert lease(journal).release(grant.holder)
    assert record(grant.holder, "fifth") == [-1, None]
    assert journal.client.hgetall(keys.steps) == {b"a": record_of("first")}


def test_a_step_recorded_meanwhile_is_adopted_and_not_overwritten(
    journal: Journal, keys: RunKeys
) -> None:
    events: list[StepEvent] = []

    def racing(run: Run) -> object:
        # Another thread of this holder records the step while this one computes it.
        return run.step("a", lambda: journal.client.hset(keys.steps, "a", record_of("won")) and 1)

    outcome = execute(journal, "wf", "r1", racing, on_step=events.append)
    assert outcome.result == "won"
    assert journal.client.hget(keys.steps, "a") == record_of("won")
    assert events == [StepEvent("a", True, "step", 1)]


def test_a_step_finished_after_the_lease_expired_is_not_recorded(
    journal: Journal, keys: RunKeys
) -> None:
    def body(run: Run) -> None:
        run.step("a", lambda: "A")
        run.step("b", lambda: journal.client.delete(keys.lease) and "B")

    with pytest.raises(LeaseLost) as lost:
        execute(journal, "wf", "r1", body)
    assert type(lost.value) is LeaseLost
    assert "the lease expired before 'b' could be recorded" in str(lost.value)
    assert journal.client.hkeys(keys.steps) == [b"a"]
    assert journal.meta(keys)["status"] == "running"  # no status write without the lease


def test_a_step_finished_after_another_holder_took_over_is_fenced(
    journal: Journal, keys: RunKeys
) -> None:
    def body(run: Run) -> None:
        run.step("b", lambda: journal.client.set(keys.lease, "2:winner") and "B")

    with pytest.raises(Fenced, match="'b' refused: the run is now held by 2:winner"):
        execute(journal, "wf", "r1", body)
    assert journal.client.hlen(keys.steps) == 0
    assert journal.client.get(keys.lease) == b"2:winner"


def test_a_retry_after_a_back_off_checks_the_lease_before_it_runs_again(
    make_journal: MakeJournal, keys: RunKeys
) -> None:
    journal = make_journal(lease_ttl=0.3)  # the real clock: the back-off really passes
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            journal.client.set(keys.lease, "2:winner")  # taken over during the back-off
            raise TimeoutError("transient")
        return "ran again without the lease"

    # A 0.2 s back-off: past half the TTL, so the boundary asks Redis before the next attempt.
    policy = RetryPolicy(base_delay=0.2, retryable=lambda e: True, retry_after=lambda e: 0.2)
    with pytest.raises(LeaseLost) as lost:
        execute(journal, "wf", "r1", lambda run: run.step("a", flaky, retry=policy))
    assert type(lost.value) is LeaseLost  # stopped at the boundary, not refused at the record
    assert attempts == [1]


# -- release and renew -----------------------------------------------------------------------


def test_release_deletes_only_the_callers_own_lease(journal: Journal, keys: RunKeys) -> None:
    grant = acquire(lease(journal), millis(T0))
    assert not lease(journal).release("1:not-the-token")
    assert not lease(journal).release("2:" + grant.holder.split(":")[1])
    assert journal.client.get(keys.lease) == grant.holder.encode()
    assert lease(journal).release(grant.holder)
    assert journal.client.get(keys.lease) is None
    assert not lease(journal).release(grant.holder)


def test_renewal_extends_only_the_callers_own_lease(journal: Journal, keys: RunKeys) -> None:
    grant = acquire(lease(journal), millis(T0))
    journal.client.pexpire(keys.lease, 1_000)
    assert not lease(journal).renew("1:not-the-token")
    assert journal.client.pttl(keys.lease) <= 1_000
    assert lease(journal).renew(grant.holder)
    assert journal.client.pttl(keys.lease) > 4_000
    journal.client.delete(keys.lease)
    assert not lease(journal).renew(grant.holder)
    assert journal.client.get(keys.lease) is None


def test_a_renewal_publishes_the_holders_steps_in_flight_for_as_long_as_its_lease(
    journal: Journal, keys: RunKeys
) -> None:
    grant = acquire(lease(journal), millis(T0))
    held = lease(journal)
    assert held.renew(grant.holder, {"summarize:i1": 1_000, "summarize:i2": 1_200}) == 1
    assert journal.client.hgetall(keys.flight) == {
        b"summarize:i1": b"1000",
        b"summarize:i2": b"1200",
    }
    assert 4_000 < journal.client.pttl(keys.flight) <= TTL_MS  # gone with a dead holder's lease
    assert held.renew(grant.holder, {"summarize:i2": 1_200}) == 1  # i1 recorded meanwhile
    assert journal.client.hgetall(keys.flight) == {b"summarize:i2": b"1200"}
    assert held.renew("1:not-the-token", {"elsewhere": 5}) == 0
    assert journal.client.hgetall(keys.flight) == {b"summarize:i2": b"1200"}
    assert held.renew(grant.holder, {}) == 1
    assert journal.client.exists(keys.flight) == 0


def test_a_step_is_in_flight_from_its_start_until_it_is_recorded(journal: Journal) -> None:
    seen: list[dict[str, int]] = []

    def body(run: Run) -> None:
        def slow() -> int:
            run._guard.confirm()  # a renewal, as the beat thread makes one
            seen.append(inspect_run(journal, "wf", "r1").in_flight)
            return 1

        run.step("quick", lambda: 0)
        run.step("slow", slow)
        run._guard.confirm()
        seen.append(inspect_run(journal, "wf", "r1").in_flight)

    execute(journal, "wf", "r1", body)
    assert seen == [{"slow": millis(T0)}, {}]


def test_a_cancel_is_learnt_at_a_renewal_and_stops_the_next_step(
    make_journal: MakeJournal, keys: RunKeys
) -> None:
    journal = make_journal(lease_ttl=0.3)
    held = lease(journal, 300)
    grant = acquire(held, 0)
    assert held.renew(grant.holder) == 1
    journal.client.hset(keys.meta, "cancel", "wrong week")
    assert held.renew(grant.holder) == 2  # extended, and told
    heartbeat = Heartbeat(held, grant.holder, time.monotonic() - 0.16)  # due a renewal
    with pytest.raises(Cancelled):
        heartbeat.ensure()
    assert heartbeat.cancelled.is_set() and not heartbeat.lost.is_set()


# -- close ----------------------------------------------------------------------------------


def close_keys(journal: Journal, keys: RunKeys) -> list[str]:
    index = only_index(journal)
    return [keys.lease, keys.meta, keys.signals, index.runs, index.due, keys.flight, keys.steps]


def test_the_close_script_answers_each_of_its_four_codes(journal: Journal, keys: RunKeys) -> None:
    grant = acquire(lease(journal), millis(T0))
    journal.client.zadd(only_index(journal).due, {keys.run: 5})

    def close(
        holder: str, signal: str, due: str, *fields: str, delete: tuple[str, ...] = ()
    ) -> Any:
        return journal.backend.scripts.close(
            keys=close_keys(journal, keys),
            args=[holder, signal, "", keys.run, 7, due, len(fields) // 2, 0, *fields, *delete],
        )

    journal.client.hset(keys.signals, "go", b'"payload"')
    assert close(grant.holder, "go", "", "status", "waiting") == 3
    assert close("1:not-the-token", "", "", "status", "other") == -2
    assert journal.client.get(keys.lease) == grant.holder.encode()  # refusals write nothing
    assert "status" not in journal.meta(keys)
    assert journal.client.zscore(only_index(journal).due, keys.run) == 5
    journal.client.hset(keys.meta, "note", "n")
    assert close(grant.holder, "", "9", "status", "waiting", delete=("note",)) == 1
    assert (journal.meta(keys)["status"], "note" in journal.meta(keys)) == ("waiting", False)
    assert journal.client.zscore(only_index(journal).due, keys.run) == 9
    assert journal.client.zscore(only_index(journal).runs, keys.run) == 7
    assert not journal.client.exists(keys.lease)  # released in the same script
    assert close(grant.holder, "", "", "status", "expired") == -1
    assert journal.meta(keys)["status"] == "waiting"
    assert journal.client.zscore(only_index(journal).due, keys.run) == 9

    again = acquire(lease(journal), millis(T0))
    assert close(again.holder, "", "", "status", "done") == 1
    assert journal.client.zscore(only_index(journal).due, keys.run) is None  # "" leaves due


def test_a_wait_is_not_saved_over_a_pending_cancel(journal: Journal, keys: RunKeys) -> None:
    grant = acquire(lease(journal), millis(T0))

    def close(unless_cancelled: str, *fields: str) -> Any:
        return journal.backend.scripts.close(
            keys=close_keys(journal, keys),
            args=[
                grant.holder,
                "",
                unless_cancelled,
                keys.run,
                7,
                "",
                len(fields) // 2,
                0,
                *fields,
            ],
        )

    journal.client.hset(keys.meta, "cancel", "wrong week")
    assert close("1", "status", "waiting") == 4  # the run is cancelled instead of waiting
    assert "status" not in journal.meta(keys)
    assert journal.client.get(keys.lease) == grant.holder.encode()
    assert close("0", "status", "done") == 1  # a write that does not ask is made
    assert journal.meta(keys)["status"] == "done"


def test_a_run_that_lost_its_lease_before_saving_its_status_saves_nothing(
    journal: Journal, keys: RunKeys
) -> None:
    with pytest.raises(LeaseLost, match="lost before the run's status could be saved"):
        execute(journal, "wf", "r1", lambda run: journal.client.delete(keys.lease) and "done")
    meta = journal.meta(keys)
    assert (meta["status"], "outcome" in meta) == ("running", False)


def test_a_run_taken_over_before_saving_its_status_leaves_the_new_holder_alone(
    journal: Journal, keys: RunKeys
) -> None:
    def body(run: Run) -> str:
        journal.client.set(keys.lease, "2:winner", px=TTL_MS)
        raise RuntimeError("the body failed after the takeover")

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", body)
    meta = journal.meta(keys)
    assert (meta["status"], "last_error" in meta) == ("running", False)
    assert journal.client.get(keys.lease) == b"2:winner"


# -- effect_claim and effect_settle ---------------------------------------------------------


def test_the_effect_scripts_answer_each_of_their_codes(journal: Journal, keys: RunKeys) -> None:
    first = acquire(lease(journal), millis(T0))
    me = ProcessIdentity.current().encode()
    script_keys = [keys.lease, keys.effects]
    scripts = journal.backend.scripts

    def claim(holder: str, fence: int, earlier: str = "", repeatable: str = "") -> Any:
        return scripts.effect_claim(
            keys=script_keys, args=[holder, "send", fence, 60_000, me, earlier, repeatable, "?"]
        )

    def confirm(holder: str, fence: int) -> Any:  # a renewal that confirms the claim
        renewing = [keys.lease, keys.meta, keys.flight, keys.effects]
        return scripts.renew(keys=renewing, args=[holder, 60_000, 0, keys.run, "send", fence])

    def settle(holder: str, fence: int, state: str = "done", receipt: bytes = b"{}") -> Any:
        return scripts.effect_settle(keys=script_keys, args=[holder, "send", fence, state, receipt])

    def decide(decision: str, receipt: bytes = b"") -> Any:
        return scripts.effect_decide(keys=script_keys, args=["send", decision, receipt])

    def state() -> bytes:
        return as_bytes(journal.client.hget(keys.effects, "send"))

    assert claim("1:not-the-token", 1) == [-2, first.holder.encode()]
    assert confirm("1:not-the-token", 1) == 0
    assert settle(first.holder, 1) == -3  # nothing claimed: nothing to settle
    assert decide("done") == [0]
    assert journal.client.hlen(keys.effects) == 0
    assert claim(first.holder, 1) == [1, 0]
    assert confirm(first.holder, 1) == 1 and state().endswith(b":confirmed")
    assert confirm(first.holder, 1) == -3  # confirmed once; never claimed twice by one act
    assert decide("done") == [2, b"confirmed"]  # its claimant may still settle it
    assert lease(journal).release(first.holder)
    assert claim(first.holder, 1) == [-1, None]
    assert confirm(first.holder, 1) == 0

    second = acquire(lease(journal), millis(T0))
    busy = claim(second.holder, 2)  # fence 1 may still act: wait, or prove it dead
    assert busy[0] == 3 and 55_000 < busy[1] <= 60_000 and busy[2] == me.encode()
    deadline = busy[3]
    assert settle(second.holder, 2) == -3  # fence 1's claim is not fence 2's to settle
    assert claim(second.holder, 2, earlier="1") == [3, ANY, me.encode(), deadline]
    # Waited out (or proved dead): fence 1 confirmed, so it may have acted: ambiguous.
    assert claim(second.holder, 2, earlier=deadline.decode()) == [4, 1, b"?"]
    assert state() == b"1:0:ambiguous"
    assert claim(second.holder, 2, earlier="dead") == [4, 1, b"?"]  # no repeat unasked
    assert claim(second.holder, 2, repeatable="1") == [1, 1]  # where the receiver dedups
    assert confirm(second.holder, 1) == -3  # fence 2's claim: no other fence confirms it
    assert settle(second.holder, 2, "ambiguous", b"no answer") == 1
    assert journal.client.hget(keys.effects, "send:detail") == b"no answer"
    assert decide("resend") == [1] and state() == b"2:0:resend"
    assert decide("done") == [2, b"resend"]
    assert claim(second.holder, 2) == [1, 1]  # decided: repeated, as one that may have acted
    assert settle(second.holder, 2, receipt=b'{"id": 7}') == 1
    assert journal.client.hget(keys.effects, "send:receipt") == b'{"id": 7}'
    assert claim(second.holder, 2) == [2, b'{"id": 7}']  # done: handed over, not waited for
    assert settle(second.holder, 2, "released", b"") == -3  # known stays known
    assert lease(journal).release(second.holder)

    third = acquire(lease(journal), millis(T0))
    journal.client.hset(keys.effects, "send", "3:0:claimed")  # claimed, never confirmed
    assert settle("9:someone-else", 3, "released", b"") == 2  # its own fence, lease or not
    assert state() == b"3:0:released"
    assert claim(third.holder, 3) == [1, 0]  # released: nothing happened, nothing resumed


def test_an_effect_whose_lease_is_gone_never_passes_its_confirmation(
    journal: Journal, keys: RunKeys
) -> None:
    """Unclaimed when the run opened, the effect is claimed by its confirmation: refused."""
    acted: list[str] = []

    def send(effect: Effect) -> None:
        effect.confirm()
        acted.append("send")

    def body(run: Run) -> None:
        journal.client.set(keys.lease, "2:winner")
        run.effect("send", send, timeout=5)

    with pytest.raises(LeaseLost, match="expired or was taken over"):
        execute(journal, "wf", "r1", body)

    def expired(run: Run) -> None:
        journal.client.delete(journal.keys("wf", "r2").lease)
        run.effect("send", send, timeout=5)

    with pytest.raises(LeaseLost, match="expired or was taken over"):
        execute(journal, "wf", "r2", expired)
    assert acted == []
    assert journal.client.hlen(keys.effects) == 0
    assert journal.client.hlen(journal.keys("wf", "r2").effects) == 0


def test_an_effect_claimed_before_whose_lease_is_gone_is_never_called(
    journal: Journal, keys: RunKeys
) -> None:
    """Claimed when the run opened, the effect is claimed again first: refused, never called."""
    called: list[str] = []
    journal.client.hset(keys.effects, "send", "9:0:released")  # an earlier holder stopped

    def body(run: Run) -> None:
        journal.client.set(keys.lease, "2:winner")
        run.effect("send", lambda effect: called.append("send"), timeout=5)

    with pytest.raises(Fenced, match="effect 'send' refused"):
        execute(journal, "wf", "r1", body)
    assert called == []
    assert journal.client.hgetall(keys.effects) == {b"send": b"9:0:released"}


def test_a_receipt_after_a_takeover_is_saved_and_the_run_woken(
    journal: Journal, keys: RunKeys
) -> None:
    def act(effect: Effect) -> str:
        effect.confirm()
        journal.client.set(keys.lease, "2:winner")  # taken over between the act and its receipt
        effect.accepted({"id": 7})
        return "sent"

    with pytest.raises(LeaseLost, match="lost while effect 'send' ran"):
        execute(journal, "wf", "r1", lambda run: run.effect("send", act, timeout=5))
    # The claimant knows it acted, and says so: the next holder hands the receipt over.
    assert journal.client.hget(keys.effects, "send:receipt") == b'{"id":7}'
    assert as_bytes(journal.client.hget(keys.effects, "send")).endswith(b":done")
    assert journal.client.zscore(keys.index.due, keys.run) is not None


# -- a status nobody knows -------------------------------------------------------------------


@pytest.mark.parametrize("reply", [7, [9, b"x"], [], b"1", None])
def test_a_status_nobody_knows_is_refused(reply: object) -> None:
    with pytest.raises(UnknownScriptStatus) as unknown:
        code("record", reply, Recorded)
    assert str(unknown.value) == f"script record returned unknown status {reply!r}"


def test_a_script_answering_an_unknown_status_stops_the_run(
    journal: Journal, keys: RunKeys
) -> None:
    foreign = Script(journal.client, "return {5}")
    backend = copy.copy(journal.backend)
    backend.scripts = dataclasses.replace(journal.backend.scripts, renew=foreign)
    lease_with = Lease(keys, backend, TTL_MS)
    grant = acquire(lease_with, millis(T0))
    with pytest.raises(UnknownScriptStatus, match="script renew returned unknown status"):
        lease_with.renew(grant.holder)
    assert lease_with.release(grant.holder)

    journal.backend.scripts = dataclasses.replace(journal.backend.scripts, record=foreign)
    with pytest.raises(UnknownScriptStatus, match="script record returned unknown status"):
        execute(journal, "wf", "r1", lambda run: run.step("a", lambda: "A"))
    assert journal.client.hlen(keys.steps) == 0


# -- Redis lost --------------------------------------------------------------------------------


@dataclasses.dataclass
class Outage:
    """A client whose server a test can take away and give back."""

    client: redis.Redis
    cut: Callable[[], None]
    restore: Callable[[], None]


@pytest.fixture(params=["redis", "fakeredis"])
def outage(
    request: pytest.FixtureRequest, shared_redis_url: str, prefix: str, tmp_path: Path
) -> Iterator[Outage]:
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()

        def connected(up: bool) -> Callable[[], None]:
            return lambda: setattr(server, "connected", up)

        yield Outage(fakeredis.FakeRedis(server=server), connected(False), connected(True))
        return
    relay = Relay(shared_redis_url, tmp_path)
    # One retry, at once: a lost server shows now instead of after redis-py's back-off.
    client = redis.Redis.from_url(relay.url, retry=Retry(NoBackoff(), 1))
    try:
        yield Outage(client, relay.cut, relay.restore)
    finally:
        relay.restore()
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()
        relay.close()


def test_redis_lost_mid_step_is_store_unavailable_and_fails_nothing(
    outage: Outage, prefix: str
) -> None:
    journal = Journal(outage.client, keyspace=Keyspace(prefix), clock=ManualClock(T0))
    keys = journal.keys("wf", "r1")
    cuts = [outage.cut]

    def body(run: Run) -> list[str]:
        return [run.step("a", lambda: "A"), run.step("b", lambda: (cuts and cuts.pop()()) or "B")]

    with pytest.raises(StoreUnavailable, match="cannot reach the journal store"):
        execute(journal, "wf", "r1", body)
    outage.restore()
    meta = journal.meta(keys)
    assert (meta["status"], "last_error" in meta) == ("running", False)
    assert journal.client.hkeys(keys.steps) == [b"a"]
    journal.client.delete(keys.lease)  # it expires: nobody could give it back
    outcome = execute(journal, "wf", "r1", body)
    assert (outcome.result, outcome.ran, outcome.replayed) == (["A", "B"], 1, 1)


def test_the_store_lost_under_an_applications_own_command_is_store_unavailable_too(
    outage: Outage, prefix: str
) -> None:
    journal = Journal(outage.client, keyspace=Keyspace(prefix), clock=ManualClock(T0))
    keys = journal.keys("wf", "r1")

    def reads_its_own_key() -> str:
        outage.cut()
        return str(outage.client.get(f"{prefix}:the-apps-own-key"))  # not the journal's command

    def body(run: Run) -> str:
        return run.step("a", reads_its_own_key)

    with pytest.raises(StoreUnavailable, match="cannot reach the journal store"):
        execute(journal, "wf", "r1", body)
    outage.restore()
    meta = journal.meta(keys)
    assert (meta["status"], "last_error" in meta) == ("running", False)  # not the run's failure


def test_a_renewal_that_hits_a_redis_error_is_retried_at_the_next_beat(
    outage: Outage, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = Journal(outage.client, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=0.3))
    held = lease(journal, 300)
    grant = acquire(held, 0)
    heartbeat = Heartbeat(held, grant.holder, grant.confirmed_at).start()
    try:
        outage.cut()
        with caplog.at_level(logging.WARNING, logger="journal._lease"):
            wait_until(lambda: "renewal for wf:" in caplog.text, 1, "a failed renewal")
        renewals = heartbeat.renewals
        outage.restore()
        wait_until(lambda: heartbeat.renewals > renewals, 1, "a renewal after the outage")
        assert not heartbeat.lost.is_set()
        heartbeat.ensure()
    finally:
        heartbeat.stop()


def test_a_short_lease_added_while_the_beats_sleep_on_a_long_one_is_renewed_in_time(
    make_journal: MakeJournal,
) -> None:
    """The beat thread is woken only for a beat due before it would look again: this one is."""
    journal = make_journal()
    slow = Lease(journal.keys("wf", "slow"), journal.backend, 60_000)
    fast = Lease(journal.keys("wf", "fast"), journal.backend, 300)
    slow_grant, fast_grant = acquire(slow, 0), acquire(fast, 0)
    sleeper = Heartbeat(slow, slow_grant.holder, slow_grant.confirmed_at).start()
    time.sleep(0.05)  # the thread now sleeps until the slow beat is due, 20 s away
    beating = Heartbeat(fast, fast_grant.holder, fast_grant.confirmed_at).start()
    try:
        wait_until(lambda: beating.renewals >= 3, 1.0, "three renewals of the 0.3 s lease")
        assert sleeper.renewals == 0
        assert not beating.lost.is_set()
    finally:
        beating.stop()
        sleeper.stop()


# -- the heartbeat and the step boundary -------------------------------------------------------


def test_ensure_renews_synchronously_when_the_beat_is_held_back(
    make_journal: MakeJournal, keys: RunKeys
) -> None:
    journal = make_journal(lease_ttl=0.3)
    held = lease(journal, 300)
    grant = acquire(held, 0)
    # Never started: no beat renews. Each heartbeat is told when the lease was last confirmed.
    fresh = Heartbeat(held, grant.holder, grant.confirmed_at)
    fresh.ensure()  # just confirmed: nothing to ask Redis
    assert fresh.renewals == 0

    stale = Heartbeat(held, grant.holder, time.monotonic() - 0.16)  # past half the TTL
    journal.client.pexpire(keys.lease, 100)
    stale.ensure()
    assert stale.renewals == 1
    assert journal.client.pttl(keys.lease) > 200
    stale.ensure()  # confirmed again just now
    assert stale.renewals == 1

    taken = Heartbeat(held, grant.holder, time.monotonic() - 0.16)
    journal.client.set(keys.lease, "2:winner")
    with pytest.raises(LeaseLost, match="expired or was taken over"):
        taken.ensure()
    assert taken.lost.is_set()
    assert journal.client.get(keys.lease) == b"2:winner"
    journal.client.delete(keys.lease)
    with pytest.raises(LeaseLost):
        taken.ensure()  # lost stays lost, without asking again
    assert taken.renewals == 0


def test_a_lost_lease_is_logged_once_whether_the_boundary_or_the_beat_finds_it(
    make_journal: MakeJournal, keys: RunKeys, caplog: pytest.LogCaptureFixture
) -> None:
    journal = make_journal(lease_ttl=0.3)
    held = lease(journal, 300)
    grant = acquire(held, 0)
    taken = Heartbeat(held, grant.holder, time.monotonic() - 0.16)  # past half the TTL
    journal.client.set(keys.lease, "2:winner")

    with caplog.at_level(logging.ERROR, logger="journal._lease"):
        with pytest.raises(LeaseLost):
            taken.ensure()  # the step boundary's own renewal finds it first
        taken.beat()  # then the beat: already lost, it says nothing more
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]

    assert lines == [f"lease on {keys.run} lost; the run stops at its next step"]


def test_a_confirmation_dates_from_before_its_request_not_from_its_late_reply(
    shared_redis_url: str, prefix: str, tmp_path: Path
) -> None:
    relay = Relay(shared_redis_url, tmp_path)
    client = redis.Redis.from_url(relay.url)
    try:
        journal = Journal(client, keyspace=Keyspace(prefix))
        held = lease(journal, 300)
        # Connected, and the scripts loaded on this server, before replies start to lag: a
        # NOSCRIPT retry would cost two more lagging round trips than the one this measures.
        held.release(acquire(held, 0).holder)
        held.renew("0:none")
        relay.lag = 0.2  # each reply arrives 0.2 s after its request: past half the TTL
        asked = time.monotonic()
        grant = acquire(held, 0)
        assert grant.confirmed_at - asked < 0.1
        heartbeat = Heartbeat(held, grant.holder, grant.confirmed_at)
        heartbeat.ensure()  # the grant is 0.2 s old by the time it arrived: renew now
        assert heartbeat.renewals == 1
        heartbeat.ensure()  # and so is that renewal
        assert heartbeat.renewals == 2
        asked = time.monotonic()
        heartbeat.confirm()
        assert heartbeat._confirmed_at - asked < 0.1  # stamped before the request, not after
    finally:
        relay.lag = 0
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()
        relay.close()


def test_the_beat_renews_at_a_third_of_the_ttl_and_stops_when_lost(
    make_journal: MakeJournal, keys: RunKeys
) -> None:
    journal = make_journal(lease_ttl=0.3)
    held = lease(journal, 300)
    grant = acquire(held, 0)
    heartbeat = Heartbeat(held, grant.holder, grant.confirmed_at)
    heartbeat.start()
    try:
        time.sleep(0.35)  # past the first lease's expiry
        assert journal.client.exists(keys.lease)
        assert 2 <= heartbeat.renewals <= 5
        journal.client.set(keys.lease, "2:winner")
        wait_until(heartbeat.lost.is_set, 1, "the beat to notice the takeover")
        with pytest.raises(LeaseLost):
            heartbeat.ensure()  # confirmed moments ago, but the beat has since found it lost
        count = heartbeat.renewals
        time.sleep(0.15)
        assert heartbeat.renewals == count
    finally:
        heartbeat.stop()
    assert journal.client.get(keys.lease) == b"2:winner"

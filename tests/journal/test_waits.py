"""Durable waits on real Redis and on fakeredis: sleep, signals with timeouts, version gates.

A movable clock stands in for time: a wait's wake-up is a recorded number, so moving the
clock past it is exactly what a real wait is, minus the waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import pytest

from journal import Journal, ManualClock, Run, SignalResult
from journal._clock import millis
from journal._delivery import Runner
from journal._redis.backend import Closed, Closing
from journal._schema.keys import RunKeys
from journal._schema.meta import Wait
from journal._waits import Suspend
from journal.ops.views import inspect_run
from tests.conftest import MakeJournal
from tests.support import execute, only_index

T0 = 1_800_000_000.0
X = TypeVar("X")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def journal(make_journal: MakeJournal, clock: ManualClock) -> Journal:
    return make_journal(clock=clock)


def due_ms(journal: Journal, keys: RunKeys) -> float | None:
    """The run's score in the due index, or None when nothing will wake it."""
    score = journal.client.zscore(only_index(journal).due, keys.run)
    return None if score is None else float(score)


def stored(journal: Journal, keys: RunKeys, step: str) -> Any:
    """One step's record as stored."""
    raw = journal.client.hget(keys.steps, step)
    assert raw is not None, f"{step} is not recorded"
    return orjson.loads(raw)


def counted(calls: list[str], name: str, value: X) -> X:
    """A step body that notes it ran."""
    calls.append(name)
    return value


def rerun(journal: Journal, keys: RunKeys) -> None:
    """Make a finished run executable again, as a replay of its whole journal."""
    journal.client.hdel(keys.meta, "status")


# -- sleep ------------------------------------------------------------------------------------


def cool_off(calls: list[str]) -> Callable[[Run], str]:
    """A step, a 60 s durable sleep, a step."""

    def body(run: Run) -> str:
        run.step("before", lambda: counted(calls, "before", "b"))
        run.sleep("cool-off", 60)
        return str(run.step("after", lambda: counted(calls, "after", "a")))

    return body


def test_sleep_records_its_wake_time_and_frees_the_lease(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    calls: list[str] = []

    body = cool_off(calls)

    outcome = execute(journal, "wf", "r1", body)

    assert outcome.status == "waiting"
    assert outcome.wait == Wait(kind="sleep", step="sleep:cool-off", until=T0 + 60)
    assert (outcome.ran, outcome.replayed) == (2, 0)
    assert calls == ["before"]
    meta = journal.meta(keys)
    assert meta["status"] == "waiting"
    assert orjson.loads(meta["wait"]) == {
        "kind": "sleep",
        "step": "sleep:cool-off",
        "until": T0 + 60,
        "signal": None,
        "attempt": 0,
        "reason": "",
    }
    record = stored(journal, keys, "sleep:cool-off")
    assert (record["result"], record["kind"]) == (T0 + 60, "sleep")
    assert due_ms(journal, keys) == millis(T0 + 60)
    assert journal.client.exists(keys.lease) == 0
    view = inspect_run(journal, "wf", "r1")
    assert (view.status, view.lease_holder, view.wait) == ("waiting", None, outcome.wait)


def test_sleep_woken_early_suspends_again_until_the_same_time_then_goes_on(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    calls: list[str] = []

    body = cool_off(calls)

    execute(journal, "wf", "r1", body)
    clock.advance(59)
    early = execute(journal, "wf", "r1", body)

    assert early.status == "waiting"
    assert early.wait is not None and early.wait.until == T0 + 60  # not 59 + 60
    assert (early.ran, early.replayed) == (0, 2)
    assert stored(journal, keys, "sleep:cool-off")["result"] == T0 + 60
    assert due_ms(journal, keys) == millis(T0 + 60)
    assert journal.client.exists(keys.lease) == 0

    clock.advance(1)
    woken = execute(journal, "wf", "r1", body)

    assert (woken.status, woken.result) == ("done", "a")
    assert (woken.ran, woken.replayed) == (1, 2)
    assert calls == ["before", "after"]
    assert journal.meta(keys)["status"] == "done"
    assert "wait" not in journal.meta(keys)
    assert due_ms(journal, keys) is None


def test_a_suspended_run_leaves_no_heartbeat_behind(
    make_journal: MakeJournal, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    journal: Journal = make_journal(clock=clock, lease_ttl=0.3)  # renewed every 0.1 s
    keys = journal.keys("wf", "r1")

    outcome = execute(journal, "wf", "r1", lambda run: run.sleep("nap", 3600))

    assert outcome.status == "waiting"
    time.sleep(0.35)  # three renewal periods, for a leaked heartbeat to show itself
    assert due_ms(journal, keys) == millis(T0 + 3600)
    assert "lost" not in caplog.text


def test_a_sleep_already_over_when_reached_does_not_suspend(
    journal: Journal, clock: ManualClock
) -> None:
    def body(run: Run) -> str:
        run.sleep("none", 0)
        return "went on"

    outcome = execute(journal, "wf", "r1", body)
    assert (outcome.status, outcome.result) == ("done", "went on")


# -- signals ----------------------------------------------------------------------------------


def waiter(timeout: float | None = 600) -> tuple[list[str], Callable[[Run], dict[str, Any]]]:
    calls: list[str] = []

    def body(run: Run) -> dict[str, Any]:
        run.step("draft", lambda: counted(calls, "draft", "d"))
        answer = run.wait_for_signal("approval", timeout=timeout)
        return {"received": answer.received, "payload": answer.payload}

    return calls, body


def test_a_signal_sent_before_the_run_waits_is_not_lost(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> SignalResult:
        run.sleep("first", 30)
        return run.wait_for_signal("approval", timeout=600)

    assert execute(journal, "wf", "r1", body).status == "waiting"
    assert journal.send_signal("wf", "r1", "approval", {"ok": 1}) is True
    assert due_ms(journal, keys) == millis(T0 + 30)  # a sleep is not cut short by a signal

    clock.advance(30)
    outcome = execute(journal, "wf", "r1", body)

    assert outcome.status == "done"
    assert outcome.result == SignalResult(True, {"ok": 1})


def test_a_signal_sent_before_the_run_exists_is_kept_for_it(journal: Journal) -> None:
    calls, body = waiter()
    assert journal.send_signal("wf", "r1", "approval", "yes") is True
    outcome = execute(journal, "wf", "r1", body)
    assert (outcome.status, outcome.result) == ("done", {"received": True, "payload": "yes"})
    assert calls == ["draft"]


def test_a_signal_wakes_a_suspended_run_and_its_next_execution_returns_the_payload(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    calls, body = waiter(timeout=600)

    first = execute(journal, "wf", "r1", body)

    assert first.status == "waiting"
    assert first.wait == Wait("signal", "signal:approval", until=T0 + 600, signal="approval")
    assert due_ms(journal, keys) == millis(T0 + 600)
    assert journal.client.exists(keys.lease) == 0

    clock.advance(5)
    assert journal.send_signal("wf", "r1", "approval", {"approved": True}) is True
    assert due_ms(journal, keys) == millis(T0 + 5)  # due now: the next sweep claims it

    woken = execute(journal, "wf", "r1", body)

    assert woken.status == "done"
    assert woken.result == {"received": True, "payload": {"approved": True}}
    assert calls == ["draft"]
    assert due_ms(journal, keys) is None
    record = stored(journal, keys, "signal:approval")
    assert record["result"] == {"received": True, "payload": {"approved": True}}


def test_a_signal_wait_with_no_timeout_leaves_the_due_index_until_signalled(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    _, body = waiter(timeout=None)
    first = execute(journal, "wf", "r1", body)
    assert first.wait is not None and first.wait.until is None
    assert due_ms(journal, keys) is None
    clock.advance(1)
    journal.send_signal("wf", "r1", "approval", 7)
    assert due_ms(journal, keys) == millis(T0 + 1)


def test_the_timeout_ends_the_wait_and_a_later_signal_does_not_change_it(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    calls, body = waiter(timeout=60)
    execute(journal, "wf", "r1", body)
    clock.advance(59.999)
    assert execute(journal, "wf", "r1", body).status == "waiting"

    clock.advance(0.001)
    expired = execute(journal, "wf", "r1", body)

    assert expired.result == {"received": False, "payload": None}
    assert journal.send_signal("wf", "r1", "approval", "too late") is True
    rerun(journal, keys)
    replayed = execute(journal, "wf", "r1", body)
    assert replayed.result == {"received": False, "payload": None}
    assert (replayed.ran, replayed.replayed) == (0, 3)
    assert calls == ["draft"]


def test_the_first_signal_wins_and_is_what_every_replay_returns(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    _, body = waiter()
    execute(journal, "wf", "r1", body)
    assert journal.send_signal("wf", "r1", "approval", "first") is True
    assert journal.send_signal("wf", "r1", "approval", "second") is False
    assert execute(journal, "wf", "r1", body).result["payload"] == "first"

    # Even if the stored signal were replaced now, the journal holds the answer the run saw.
    journal.client.hset(keys.signals, "approval", orjson.dumps("third"))
    rerun(journal, keys)
    assert execute(journal, "wf", "r1", body).result["payload"] == "first"
    assert journal.send_signal("wf", "r1", "approval", "fourth") is False


def test_a_signal_between_the_check_and_the_suspension_is_taken_at_once(
    journal: Journal,
) -> None:
    keys = journal.keys("wf", "r1")
    attempts: list[int] = []

    def body(run: Run) -> SignalResult:
        try:
            return run.wait_for_signal("approval", timeout=600)
        except Suspend:
            # The run looked and found nothing; the signal lands before its wait is recorded.
            if not attempts:
                assert journal.send_signal("wf", "r1", "approval", "raced") is True
            attempts.append(1)
            raise

    outcome = execute(journal, "wf", "r1", body)

    assert (outcome.status, outcome.result) == ("done", SignalResult(True, "raced"))
    assert attempts == [1]
    assert journal.meta(keys)["status"] == "done"
    assert due_ms(journal, keys) is None


class SignalAfterWaitIsRecorded(Runner):
    """Delivers the signal right after the wait is recorded and the lease given back."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal.backend, journal.settings, journal.clock, journal.hints)
        self.journal = journal

    def _close(self, keys: RunKeys, holder: str, closing: Closing) -> Closed:
        status = super()._close(keys, holder, closing)
        if closing.fields.get("status") == "waiting":
            assert self.journal.send_signal(keys.workflow, keys.run_id, "approval", "late") is True
        return status


@pytest.mark.parametrize("timeout", [None, 600.0])
def test_a_signal_right_after_the_wait_is_recorded_still_wakes_the_run(
    journal: Journal, clock: ManualClock, timeout: float | None
) -> None:
    racy = Journal(
        journal.client, keyspace=journal.keyspace, settings=journal.settings, clock=clock
    )
    racy.runner = SignalAfterWaitIsRecorded(racy)
    keys = journal.keys("wf", "r1")
    _, body = waiter(timeout=timeout)

    first = execute(racy, "wf", "r1", body)

    assert first.status == "waiting"
    assert due_ms(journal, keys) == millis(T0)  # due now, not at the timeout (or never)
    assert [k.run for k in journal.claim_due()] == ["wf:r1"]
    woken = execute(journal, "wf", "r1", body)
    assert woken.result == {"received": True, "payload": "late"}


def test_signals_racing_suspensions_are_never_lost(journal: Journal) -> None:
    """Threads: whatever the interleaving, a waiting run with its signal stored is due now."""
    rounds = 40
    _, body = waiter(timeout=None)
    for i in range(rounds):
        run_id = f"race{i}"
        keys = journal.keys("wf", run_id)
        barrier = threading.Barrier(2)

        def signal(run_id: str = run_id, barrier: threading.Barrier = barrier) -> None:
            barrier.wait(timeout=5)
            journal.send_signal("wf", run_id, "approval", "go")

        sender = threading.Thread(target=signal)
        sender.start()

        def racing_body(run: Run, barrier: threading.Barrier = barrier) -> object:
            if not run._cursor.has("draft"):
                barrier.wait(timeout=5)
            return body(run)

        outcome = execute(journal, "wf", run_id, racing_body)
        sender.join(timeout=5)
        if outcome.status == "waiting":
            assert due_ms(journal, keys) == millis(journal.clock.now()), run_id
            outcome = execute(journal, "wf", run_id, racing_body)
        assert outcome.result == {"received": True, "payload": "go"}, run_id


# -- version gates ----------------------------------------------------------------------------


def test_a_new_run_records_the_current_version(journal: Journal) -> None:
    keys = journal.keys("wf", "r1")
    outcome = execute(journal, "wf", "r1", lambda run: run.version("enrich", 2))
    assert outcome.result == 2
    record = stored(journal, keys, "version:enrich")
    assert (record["result"], record["kind"]) == (2, "version")


def test_a_run_recorded_before_the_gate_gets_0_and_keeps_its_old_path(
    journal: Journal, clock: ManualClock
) -> None:
    keys = journal.keys("wf", "r1")
    calls: list[str] = []

    def old_code(run: Run) -> str:
        run.step("select", lambda: counted(calls, "select", 1))
        run.step("compose", lambda: counted(calls, "compose", "old"))
        run.sleep("review", 60)
        return "unreachable in this test"

    def new_code(run: Run) -> list[object]:
        run.step("select", lambda: counted(calls, "select", 1))
        version = run.version("enrich", 1)
        if version >= 1:
            run.step("enrich", lambda: counted(calls, "enrich", "new"))
        composed = run.step("compose", lambda: counted(calls, "compose", "new"))
        run.sleep("review", 60)
        return [version, composed]

    assert execute(journal, "wf", "r1", old_code).status == "waiting"
    assert execute(journal, "wf", "r1", new_code).status == "waiting"  # no ReplayMismatch
    clock.advance(60)
    outcome = execute(journal, "wf", "r1", new_code)

    assert outcome.result == [0, "old"]
    assert calls == ["select", "compose"]
    assert journal.client.hexists(keys.steps, "version:enrich") == 0
    assert journal.client.hexists(keys.steps, "enrich") == 0


def test_a_recorded_version_is_replayed_even_when_the_code_moved_on(
    journal: Journal, clock: ManualClock
) -> None:
    def code(current: int) -> Callable[[Run], int]:
        def body(run: Run) -> int:
            version = run.version("format", current)
            run.sleep("review", 60)
            return version

        return body

    assert execute(journal, "wf", "r1", code(1)).status == "waiting"
    clock.advance(60)
    assert execute(journal, "wf", "r1", code(2)).result == 1
    assert execute(journal, "wf", "r2", code(2)).status == "waiting"
    assert execute(journal, "wf", "r2", code(3)).status == "waiting"  # woken early, still 2
    clock.advance(60)
    assert execute(journal, "wf", "r2", code(3)).result == 2

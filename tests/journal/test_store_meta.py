"""What ``Journal`` leaves in a run's meta when it cancels, parks, ends or suspends a run.

The console, ``inspect`` and the sweep read these fields: a cancelled run's finish time, a
parked run's last update, a count reset to zero, a wait cleared once nothing waits. Each test
moves the clock between phases so every timestamp names the phase that wrote it. Found by
mutation testing (docs/mutation.md): the statuses were checked, the fields beside them not.
"""

from __future__ import annotations

import random

import pytest
import redis

from journal import Effect, ManualClock, Run, StepEvent
from journal._cancel import CANCEL_FIELD
from journal._clock import millis
from journal._journal import jitter
from journal._schema.meta import RunMeta
from journal.errors import CorruptJournal, LeaseLost, RunParked, StoreUnavailable
from journal.ops.actions import cancel
from tests.conftest import MakeJournal
from tests.support import execute, only_index

T0 = 1_800_000_000.0


def nap(run: Run) -> None:
    run.sleep("nap", 60)


def crash(run: Run) -> None:
    """A start that dies before recording anything: the process is gone, the lease stays."""
    raise SystemExit(137)


def test_a_run_found_cancelled_at_start_ends_with_its_times_and_no_wait(
    make_journal: MakeJournal,
) -> None:
    """The cancel landed while the last holder was between its wait and its release."""
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    keys = journal.keys("wf", "r1")
    assert execute(journal, "wf", "r1", nap).status == "waiting"
    journal.client.hset(keys.meta, CANCEL_FIELD, "operator")
    clock.advance(5)

    outcome = execute(journal, "wf", "r1", nap)
    meta = journal.meta(keys)
    assert (outcome.run, outcome.status) == ("wf:r1", "cancelled")
    assert (meta["status"], meta["finished_at"], meta["updated_at"]) == (
        "cancelled",
        str(millis(T0 + 5)),
        str(millis(T0 + 5)),
    )
    assert meta["starts_without_progress"] == "0"
    assert "wait" not in meta


def test_a_run_cancelled_mid_run_resets_its_count_of_starts(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> int:
        run.step("a", lambda: cancel(journal, "wf", "r1", "stop") and 1)
        clock.advance(3)
        return run.step("b", lambda: 2)

    outcome = execute(journal, "wf", "r1", body)
    meta = journal.meta(keys)
    assert (outcome.run, outcome.status, outcome.ran, outcome.replayed) == (
        "wf:r1",
        "cancelled",
        1,
        0,
    )
    assert (meta["finished_at"], meta["updated_at"]) == (str(millis(T0 + 3)),) * 2
    assert meta["starts_without_progress"] == "0"


def test_a_cancel_pending_when_the_run_suspends_cancels_it_instead_of_waiting(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> None:
        run.step("a", lambda: cancel(journal, "wf", "r1", "stop") and 1)
        run.sleep("nap", 60)  # recorded (the cancel only stops new steps), then suspends

    outcome = execute(journal, "wf", "r1", body)
    assert (outcome.run, outcome.status, outcome.wait) == ("wf:r1", "cancelled", None)
    assert journal.meta(keys)["status"] == "cancelled"
    assert "wait" not in journal.meta(keys)
    assert journal.client.zscore(only_index(journal).due, keys.run) is None


def test_a_suspension_records_when_it_was_written(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)

    def body(run: Run) -> None:
        clock.advance(7)
        nap(run)

    execute(journal, "wf", "r1", body)
    meta = journal.meta(journal.keys("wf", "r1"))
    assert (meta["status"], meta["updated_at"]) == ("waiting", str(millis(T0 + 7)))


def test_an_ended_run_delivered_again_names_its_run(make_journal: MakeJournal) -> None:
    journal = make_journal(clock=ManualClock(T0))
    execute(journal, "wf", "done", lambda run: run.step("a", lambda: "A"))
    execute(journal, "wf", "gone", nap)
    cancel(journal, "wf", "gone")
    done = execute(journal, "wf", "done", lambda run: "never")
    gone = execute(journal, "wf", "gone", nap)
    assert (done.run, done.status, done.result) == ("wf:done", "already-done", "A")
    assert (gone.run, gone.status) == ("wf:gone", "cancelled")


def test_parking_records_when_the_run_was_parked(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock, max_stalled_starts=1)
    keys = journal.keys("wf", "r1")
    with pytest.raises(SystemExit):
        execute(journal, "wf", "r1", crash)
    journal.client.delete(keys.lease)  # the dead start's lease expired
    clock.advance(9)
    with pytest.raises(RunParked):
        execute(journal, "wf", "r1", crash)
    meta = journal.meta(keys)
    assert (meta["parked"], meta["updated_at"]) == ("1", str(millis(T0 + 9)))


def test_a_parked_run_with_no_count_is_refused_as_parked_after_none(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    journal.client.hset(keys.meta, mapping={"status": "failed", "parked": "1"})
    with pytest.raises(RunParked) as caught:
        execute(journal, "wf", "r1", crash)
    assert (caught.value.run, caught.value.starts) == ("wf:r1", 0)


def test_a_parked_run_whose_count_is_not_one_names_the_field_and_its_start(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    count = "x" * 39 + "yz"  # 41 characters: only the first 40 are quoted
    journal.client.hset(
        keys.meta, mapping={"status": "failed", "parked": "1", "starts_without_progress": count}
    )
    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", crash)
    assert (caught.value.run, caught.value.field, caught.value.detail) == (
        "wf:r1",
        "meta.starts_without_progress",
        f"'{'x' * 39}y' is not a count",
    )


@pytest.mark.parametrize(
    ("seconds", "widest"),
    [(0.5, 0.7), (1.0, 1.2), (10.0, 12.0)],
    ids=["below-a-second", "a-second", "above"],
)
def test_jitter_adds_up_to_a_fifth_of_the_delay_and_never_less_than_a_fifth_of_a_second(
    monkeypatch: pytest.MonkeyPatch, seconds: float, widest: float
) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    assert jitter(seconds) == widest
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    assert jitter(seconds) == seconds


def test_the_sweep_claims_a_hundred_runs_at_a_time_by_default(make_journal: MakeJournal) -> None:
    journal = make_journal(clock=ManualClock(T0))
    journal.client.zadd(only_index(journal).due, {f"wf:r{n}": millis(T0) - n for n in range(101)})
    claimed = journal.claim_due()
    assert len(claimed) == 100
    assert claimed[0].run == "wf:r100"  # the longest overdue first


def test_an_unreadable_due_entry_is_logged_and_removed_and_the_rest_claimed(
    make_journal: MakeJournal, caplog: pytest.LogCaptureFixture
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    journal.client.zadd(
        only_index(journal).due, {"no-colon": millis(T0) - 2, "wf:ok": millis(T0) - 1}
    )
    with caplog.at_level("ERROR", logger="journal._journal"):
        claimed = journal.claim_due()
    assert [keys.run for keys in claimed] == ["wf:ok"]
    assert [r.getMessage() for r in caplog.records] == [
        "due index holds an unreadable run b'no-colon'; removing it"
    ]
    assert journal.client.zscore(only_index(journal).due, "no-colon") is None


def test_a_failed_run_records_when_it_failed_and_clears_its_wait(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    keys = journal.keys("wf", "r1")
    execute(journal, "wf", "r1", nap)
    clock.advance(60)  # woken: the nap replays and is over

    def body(run: Run) -> None:
        nap(run)
        journal.client.hset(keys.meta, "wait", "left over")  # a write the fenced status must undo
        clock.advance(5)  # after the start's own write of updated_at
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", body)
    meta = journal.meta(keys)
    assert (meta["status"], meta["last_error"]) == ("failed", "RuntimeError: boom")
    assert meta["updated_at"] == str(millis(T0 + 65))
    assert "wait" not in meta


def test_a_failure_whose_status_cannot_be_saved_is_logged_naming_run_and_error(
    make_journal: MakeJournal, caplog: pytest.LogCaptureFixture
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> None:
        journal.client.delete(keys.lease)  # lost just before failing: nothing may be written
        raise RuntimeError("boom")

    with caplog.at_level("WARNING", logger="journal._journal"), pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", body)
    assert [r.getMessage() for r in caplog.records] == [
        "run wf:r1 failed (boom) and its status could not be saved"
    ]
    assert journal.meta(keys)["status"] == "running"


def test_a_finished_run_records_when_it_finished_and_clears_any_wait(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> str:
        journal.client.hset(keys.meta, "wait", "left over")  # a write the fenced status undoes
        clock.advance(4)
        return "ok"

    execute(journal, "wf", "r1", body)
    meta = journal.meta(keys)
    assert (meta["status"], meta["finished_at"], meta["updated_at"]) == (
        "done",
        str(millis(T0 + 4)),
        str(millis(T0 + 4)),
    )
    assert "wait" not in meta


def test_each_renewal_pushes_the_runs_due_time_to_its_new_lease_deadline(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock, lease_ttl=30, recovery_grace=5)
    keys = journal.keys("wf", "r1")
    due: list[float | None] = []

    def send(effect: Effect) -> str:
        due.append(journal.client.zscore(only_index(journal).due, keys.run))
        clock.advance(100)
        effect.confirm()  # a synchronous renewal
        due.append(journal.client.zscore(only_index(journal).due, keys.run))
        return "sent"

    execute(journal, "wf", "r1", lambda run: run.effect("send", send, timeout=60))
    assert due == [millis(T0 + 35), millis(T0 + 135)]


def test_a_start_announces_the_run_its_holder_and_clears_the_wait_it_resumes_from(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    keys = journal.keys("wf", "r1")
    first = execute(journal, "wf", "r1", nap)
    assert (first.run, first.status) == ("wf:r1", "waiting")
    clock.advance(60)
    seen: list[dict[str, str]] = []

    def body(run: Run) -> str:
        seen.append({**journal.meta(keys), "expected_holder": run.holder})
        nap(run)
        return "up"

    execute(journal, "wf", "r1", body)
    meta = seen[0]
    assert (meta["status"], meta["workflow"], meta["run_id"]) == ("running", "wf", "r1")
    assert meta["holder"] == meta["expected_holder"]
    assert "wait" not in meta


@pytest.mark.parametrize(
    ("error", "detail"),
    [(redis.ConnectionError("server gone"), "server gone"), (redis.TimeoutError(), "TimeoutError")],
    ids=["with-a-message", "without"],
)
def test_a_connection_lost_under_a_step_is_store_unavailable_with_its_reason(
    make_journal: MakeJournal, error: Exception, detail: str
) -> None:
    journal = make_journal()

    def body(run: Run) -> None:
        raise error

    with pytest.raises(StoreUnavailable) as caught:
        execute(journal, "wf", "r1", body)
    assert (caught.value.url, caught.value.detail) == ("redis", detail)


def test_a_lease_lost_before_the_final_status_is_raised_naming_the_run(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> str:
        journal.client.delete(keys.lease)  # expired while the body ran its last line
        return "done"

    with pytest.raises(LeaseLost) as caught:
        execute(journal, "wf", "r1", body)
    assert (caught.value.run, caught.value.detail) == (
        "wf:r1",
        "the lease was lost before the run's status could be saved",
    )


def test_frozen_args_that_are_not_an_object_are_refused_saying_so(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    journal.client.hset(keys.meta, "args", b"[1, 2]")
    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", nap)
    assert (caught.value.run, caught.value.field, caught.value.detail) == (
        "wf:r1",
        "meta.args",
        "not a JSON object",
    )


@pytest.mark.parametrize(
    ("error", "detail"),
    [(redis.ConnectionError("refused"), "refused"), (redis.TimeoutError(), "TimeoutError")],
    ids=["with-a-message", "without"],
)
def test_the_store_turns_a_lost_connection_into_store_unavailable_with_its_reason(
    make_journal: MakeJournal, error: Exception, detail: str
) -> None:
    journal = make_journal()
    execute(journal, "wf", "r1", nap)

    def down(*args: object, **kwargs: object) -> None:
        raise error

    journal.client.hgetall = down  # type: ignore[method-assign,assignment]
    journal.client.zrevrange = down  # type: ignore[method-assign,assignment]
    with pytest.raises(StoreUnavailable) as caught:
        journal.meta(journal.keys("wf", "r1"))
    assert (caught.value.url, caught.value.detail) == ("redis", detail)
    # A listing is read a page at a time, as its reader asks: each page is translated too.
    with pytest.raises(StoreUnavailable) as caught:
        list(journal.backend.runs_newest(10))
    assert (caught.value.url, caught.value.detail) == ("redis", detail)


def test_a_meta_field_name_that_is_not_utf8_is_read_with_a_replacement_character() -> None:
    assert dict(RunMeta.parse("wf:r1", {b"\xffx": b"v", b"status": b"done"})) == {
        "\ufffdx": "v",
        "status": "done",
    }


def test_a_cancel_arriving_between_the_waits_record_and_the_wait_cancels_the_run(
    make_journal: MakeJournal,
) -> None:
    """The sleep is recorded, then the cancel lands, then the run writes ``waiting``."""
    journal = make_journal(clock=ManualClock(T0))
    keys = journal.keys("wf", "r1")

    def on_step(event: StepEvent) -> None:
        if event.key == "sleep:nap":
            cancel(journal, "wf", "r1", "stop")

    outcome = execute(journal, "wf", "r1", nap, on_step=on_step)
    assert (outcome.run, outcome.status, outcome.wait) == ("wf:r1", "cancelled", None)
    meta = journal.meta(keys)
    assert meta["status"] == "cancelled"
    assert "wait" not in meta

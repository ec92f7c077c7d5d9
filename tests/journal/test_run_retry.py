"""A run that fails for a transient cause stays due and is retried; any other failure is final.

The application says which errors are transient (``RunRetry.retryable``); the journal keeps
such a run in the due index at its back-off, so the due sweep claims it again, until it
succeeds or the retry deadline passes and it is failed for good, logged at ERROR.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

import pytest

from journal import Journal, ManualClock, RetryPolicy, Run, RunRetry
from journal._clock import millis
from journal._delivery import STREAK
from journal.errors import GaveUp, RetryScheduled
from journal.ops.views import inspect_run
from tests.conftest import MakeJournal
from tests.support import execute, only_index

T0 = 1_800_000_000.0


class Outage(Exception):
    """What the application calls transient here."""


class Refused(Exception):
    """What it does not: a failure retrying cannot fix."""


def transient(error: BaseException) -> bool:
    return isinstance(error, Outage)


def retrying(**options: float) -> RunRetry:
    return RunRetry(retryable=transient, **options)


def flaky(fails: list[BaseException], ran: list[str]) -> Callable[[Run], str]:
    """A workflow whose second step raises the next of ``fails``, then succeeds."""

    def second() -> str:
        if fails:
            raise fails.pop(0)
        return "sent"

    def body(run: Run) -> str:
        run.step("first", lambda: ran.append("first") or "ok")
        return str(run.step("second", lambda: ran.append("second") or second()))

    return body


def streak(meta: Mapping[str, str]) -> dict[str, str]:
    """The meta fields that record a streak of transient failures."""
    return {name: value for name, value in meta.items() if name in STREAK}


def due_at(journal: Journal, run: str = "wf:r1") -> float | None:
    score = journal.client.zscore(only_index(journal).due, run)
    return None if score is None else score / 1000


def test_a_transient_failure_stays_due_and_the_sweep_retries_it(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, run_retry=retrying(first_delay=60))
    ran: list[str] = []
    body = flaky([Outage("the model API is down")], ran)

    with pytest.raises(RetryScheduled) as caught:
        execute(journal, "wf", "r1", body)

    scheduled = caught.value
    assert isinstance(scheduled.__cause__, Outage)
    assert scheduled.error == "Outage: the model API is down"
    assert T0 + 54 <= scheduled.retry_at <= T0 + 60  # 60 s, up to 10% earlier
    assert scheduled.give_up_at == T0 + 86400
    assert due_at(journal) == millis(scheduled.retry_at) / 1000
    view = inspect_run(journal, "wf", "r1")
    assert view.status == "retrying"
    assert streak(view.meta) == {
        "retry_at": str(millis(scheduled.retry_at)),
        "retry_until": str(millis(T0 + 86400)),
        "failing_since": str(millis(T0)),
        "failures": "1",
    }
    assert view.meta["last_error"] == "Outage: the model API is down"
    assert view.lease_holder is None  # the lease is released: any worker may retry it
    assert str(scheduled).startswith(
        "run wf:r1 failed (Outage: the model API is down); the due sweep retries it at "
    )

    clock.advance(scheduled.retry_at - T0 - 0.001)
    assert journal.claim_due() == []
    clock.advance(0.001)
    assert [keys.run for keys in journal.claim_due()] == ["wf:r1"]

    outcome = execute(journal, "wf", "r1", body)
    assert (outcome.status, outcome.result, outcome.replayed) == ("done", "sent", 1)
    assert ran == ["first", "second", "second"]  # the recorded step is not run again
    view = inspect_run(journal, "wf", "r1")
    assert view.status == "done"
    assert streak(view.meta) == {}
    assert "last_error" not in view.meta
    assert due_at(journal) is None


def test_the_back_off_doubles_up_to_its_cap(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(
        clock=clock, run_retry=retrying(first_delay=60, max_delay=3600, give_up_after=10**6)
    )
    body = flaky([Outage(f"down {n}") for n in range(9)], [])
    ceilings = []
    for _ in range(9):
        with pytest.raises(RetryScheduled) as caught:
            execute(journal, "wf", "r1", body)
        waited = caught.value.retry_at - clock.now()
        ceiling = next(c for c in (60, 120, 240, 480, 960, 1920, 3600) if waited <= c)
        assert waited >= ceiling * 0.9
        ceilings.append(ceiling)
        clock.advance(waited)

    assert ceilings == [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
    assert inspect_run(journal, "wf", "r1").meta["failures"] == "9"


def test_after_the_deadline_the_run_is_failed_for_good(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(
        clock=clock, run_retry=retrying(first_delay=60, max_delay=60, give_up_after=200)
    )
    body = flaky([Outage(f"down {n}") for n in range(20)], [])
    retries = []
    while True:
        try:
            execute(journal, "wf", "r1", body)
        except RetryScheduled as scheduled:
            retries.append(scheduled.retry_at)
            clock.advance(scheduled.retry_at - clock.now())
            continue
        except GaveUp as gave_up:
            final = gave_up
            break

    # Three back-offs of 54-60 s, then the last retry on the deadline rather than past it.
    assert len(retries) == 4
    assert retries[-1] == T0 + 200
    assert isinstance(final.__cause__, Outage)
    assert (final.failures, final.since) == (5, T0)
    assert str(final) == (
        "run wf:r1 failed for good after 5 transient failures since 2027-01-15 08:00:00 UTC "
        "(the last: Outage: down 4); it is not retried again: fix the cause, then start it "
        "again deliberately"
    )
    view = inspect_run(journal, "wf", "r1")
    assert view.status == "failed"
    assert streak(view.meta) == {
        "gave_up_at": str(millis(T0 + 200)),
        "failing_since": str(millis(T0)),
        "failures": "5",
    }
    assert due_at(journal) is None
    clock.advance(10**6)
    assert journal.claim_due() == []


def test_a_deliberate_start_after_giving_up_earns_a_new_retry_window(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, run_retry=retrying(give_up_after=60))
    body = flaky([Outage("a"), Outage("b"), Outage("c")], [])
    with pytest.raises(RetryScheduled):
        execute(journal, "wf", "r1", body)
    clock.advance(60)
    with pytest.raises(GaveUp):
        execute(journal, "wf", "r1", body)

    clock.advance(3600)
    with pytest.raises(RetryScheduled) as caught:
        execute(journal, "wf", "r1", body)

    assert caught.value.give_up_at == clock.now() + 60
    view = inspect_run(journal, "wf", "r1")
    assert view.status == "retrying"
    assert (view.meta["failures"], view.meta["failing_since"]) == ("1", str(millis(clock.now())))
    assert "gave_up_at" not in view.meta


@pytest.mark.parametrize(
    ("run_retry", "failure"),
    [
        (retrying(), Refused("the account is out of credit")),
        (RunRetry(), Outage("down")),  # transient to the application, but none is retried
        (retrying(give_up_after=0), Outage("down")),  # transient, but retries are off
    ],
    ids=["not-transient", "nothing-retryable", "retries-off"],
)
def test_any_other_failure_is_final_at_once(
    make_journal: MakeJournal, run_retry: RunRetry, failure: Exception
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, run_retry=run_retry)

    with pytest.raises(type(failure)):
        execute(journal, "wf", "r1", flaky([failure], []))

    view = inspect_run(journal, "wf", "r1")
    assert view.status == "failed"
    assert view.meta["last_error"] == f"{type(failure).__name__}: {failure}"
    assert streak(view.meta) == {}
    assert due_at(journal) is None


def test_a_final_failure_ends_a_streak(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, run_retry=retrying())
    body = flaky([Outage("down"), Refused("out of credit")], [])
    with pytest.raises(RetryScheduled):
        execute(journal, "wf", "r1", body)
    clock.advance(60)

    with pytest.raises(Refused):
        execute(journal, "wf", "r1", body)

    view = inspect_run(journal, "wf", "r1")
    assert (view.status, streak(view.meta)) == ("failed", {})
    assert due_at(journal) is None


def test_a_retrying_run_started_early_runs_and_shows_running(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, run_retry=retrying())
    seen: list[tuple[str, str | None]] = []

    def body(run: Run) -> str:
        meta = journal.meta(run.keys)
        seen.append((meta["status"], meta.get("retry_at")))
        if len(seen) == 1:
            raise Outage("down")
        return "sent"

    with pytest.raises(RetryScheduled):
        execute(journal, "wf", "r1", body)
    assert execute(journal, "wf", "r1", body).status == "done"  # a manual start, before its time

    assert seen == [("running", None), ("running", None)]


def test_run_retry_refuses_nonsense_and_never_overflows() -> None:
    with pytest.raises(ValueError, match="first_delay=0 must be positive"):
        RunRetry(first_delay=0)
    with pytest.raises(ValueError, match="at most max_delay=10"):
        RunRetry(first_delay=60, max_delay=10)
    with pytest.raises(ValueError, match="give_up_after=-1 must not be negative"):
        RunRetry(give_up_after=-1)
    policy = RunRetry(first_delay=0.1, max_delay=3600)
    assert 3240 <= policy.delay(10**7, random.Random(1)) <= 3600
    assert policy.delay(1, random.Random(1)) == pytest.approx(0.1, rel=0.1)


def test_a_retry_due_after_the_runs_wake_by_time_is_due_at_it_instead(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, run_retry=retrying(first_delay=3600))
    fails: list[BaseException] = [Outage("down"), Outage("down")]

    def body(run: Run) -> str:
        run.wake_by(T0 + 600)
        return flaky(fails, [])(run)

    with pytest.raises(RetryScheduled) as caught:
        execute(journal, "wf", "r1", body)
    assert caught.value.retry_at == T0 + 600
    assert due_at(journal) == T0 + 600

    clock.advance(601)  # past it: the wake-by time brings nothing forward any more
    with pytest.raises(RetryScheduled) as caught:
        execute(journal, "wf", "r1", body)
    assert caught.value.retry_at >= T0 + 601 + 0.9 * 3600


def test_a_suspended_backoff_ends_by_the_runs_wake_by_time(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock)
    policy = RetryPolicy(max_attempts=3, base_delay=1000, max_delay=1000, retryable=transient)

    def down() -> str:
        raise Outage("down")

    def body(run: Run) -> str:
        run.wake_by(T0 + 60)
        return run.step("call", down, retry=policy)

    outcome = execute(journal, "wf", "r2", body)

    assert outcome.status == "waiting"
    assert outcome.wait is not None and outcome.wait.until == T0 + 60

"""A step's long back-off as a durable wait: resumed early, on time, and counted across it.

A back-off longer than ``suspend_over`` suspends the run with a retry wait that carries the
attempts made so far. A delivery before the wait ends suspends again without calling (that
would only earn another 429); one at the wait's end calls at once; and the attempt count goes
on from where the wait left it, so ``max_attempts`` bounds the attempts of all deliveries.
Each failed attempt counts one ``retry`` event. Found by mutation testing (docs/mutation.md).
"""

from __future__ import annotations

from journal import ManualClock, RetryPolicy, Run, StepEvent
from journal._schema.meta import Wait
from tests.conftest import MakeJournal
from tests.support import execute, recorded_events

T0 = 1_800_000_000.0


class Flaky:
    """A call refused ``times`` times (a 429 asking for a minute), then answered."""

    def __init__(self, times: int) -> None:
        self.left = times
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise ConnectionRefusedError("429")
        return "answer"


POLICY = RetryPolicy(
    max_attempts=5,
    base_delay=1.0,
    retryable=lambda error: isinstance(error, ConnectionRefusedError),
    retry_after=lambda error: 60.0,
    suspend_over=10.0,
)


def test_a_retry_wait_is_kept_early_ended_on_time_and_counts_every_attempt(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    flaky = Flaky(times=2)
    events: list[StepEvent] = []

    def body(run: Run) -> str:
        return run.step("call", flaky, retry=POLICY)

    def deliver() -> tuple[str, Wait | None]:
        outcome = execute(journal, "wf", "r1", body, on_step=events.append)
        return outcome.status, outcome.wait

    first_wait = Wait("retry", "call", until=T0 + 60, attempt=1, reason="429")
    with recorded_events() as counted:
        assert deliver() == ("waiting", first_wait)
        assert flaky.calls == 1
        clock.advance(30)  # a duplicate delivery half-way through the wait: no call
        assert deliver() == ("waiting", first_wait)
        assert flaky.calls == 1
        clock.advance(30)  # exactly at the wait's end: the call is made
        assert deliver() == ("waiting", Wait("retry", "call", T0 + 120, attempt=2, reason="429"))
        assert flaky.calls == 2
        clock.advance(60)
        assert deliver() == ("done", None)
    assert flaky.calls == 3
    assert events == [StepEvent("call", False, "step", 3)]
    assert counted == [
        ("retry", "ConnectionRefusedError", 1.0),
        ("retry", "ConnectionRefusedError", 1.0),
        ("step_ran", "call", 0.0),  # the manual clock stood still during the call
        ("run_finished", "done", 120.0),  # created at T0, done two minutes of waits later
    ]


def test_a_retry_wait_of_one_step_does_not_resume_another(make_journal: MakeJournal) -> None:
    """Only the step that suspended inherits the attempt count; a step before it starts at 1."""
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    flaky = Flaky(times=1)
    events: list[StepEvent] = []

    def body(run: Run) -> str:
        run.step("first", lambda: "ok")
        return run.step("call", flaky, retry=POLICY)

    execute(journal, "wf", "r1", body)
    journal.client.hdel(journal.keys("wf", "r1").steps, "first")  # as if it had not recorded
    clock.advance(60)
    outcome = execute(journal, "wf", "r1", body, on_step=events.append)
    assert outcome.status == "done"
    assert events == [StepEvent("first", False, "step", 1), StepEvent("call", False, "step", 2)]


def test_a_back_off_of_exactly_suspend_over_blocks_instead_of_suspending(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)
    flaky = Flaky(times=1)
    policy = RetryPolicy(
        base_delay=1.0,
        retryable=lambda error: isinstance(error, ConnectionRefusedError),
        retry_after=lambda error: 10.0,
        suspend_over=10.0,
    )
    outcome = execute(journal, "wf", "r1", lambda run: run.step("call", flaky, retry=policy))
    assert (outcome.status, outcome.result, flaky.calls) == ("done", "answer", 2)
    assert clock.slept == [10.0]

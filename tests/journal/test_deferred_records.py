"""Records that ride the run's next write: a round trip less, nothing lost.

A step whose body is safe to run again (a set union, a delete of one's own claims) need not
wait for its record before the run goes on: the record goes with the next step's record, or
with the run's closing, in that write's round trip. A crash before that write runs the body
again, which is what ``repeatable`` allows. An effect whose receipt the store holds needs no
record before the run goes on either: a crash before its record replays it from the receipt,
and nothing is done twice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from journal import Effect, Journal, Run
from tests.conftest import MakeJournal
from tests.support import as_text, execute


def recorded(journal: Journal, run_id: str) -> set[str]:
    """The steps the run's journal holds now."""
    return {as_text(k) for k in journal.client.hkeys(journal.keys("wf", run_id).steps)}


def test_its_record_goes_with_the_next_steps_record(make_journal: MakeJournal) -> None:
    journal = make_journal()
    seen_by_next: list[set[str]] = []

    def body(run: Run) -> list[int]:
        first = run.step("mark", lambda: 1, repeatable=True)
        second = run.step("next", lambda: seen_by_next.append(recorded(journal, "r1")) or 2)
        return [first, second]

    outcome = execute(journal, "wf", "r1", body)
    assert outcome.result == [1, 2]
    assert seen_by_next == [set()]  # not written while the next step's body ran
    assert recorded(journal, "r1") == {"mark", "next"}
    assert (outcome.ran, outcome.replayed) == (2, 0)


def test_a_last_repeatable_step_is_written_by_the_runs_closing(make_journal: MakeJournal) -> None:
    journal = make_journal()
    outcome = execute(journal, "wf", "r1", lambda run: run.step("done", lambda: 7, repeatable=True))
    assert outcome.result == 7
    assert recorded(journal, "r1") == {"done"}
    assert journal.meta(journal.keys("wf", "r1"))["status"] == "done"


def test_a_failing_run_writes_them_with_its_failure(make_journal: MakeJournal) -> None:
    journal = make_journal()
    calls: list[str] = []

    def body(fail: bool) -> Callable[[Run], str]:
        def run_body(run: Run) -> str:
            run.step("mark", lambda: calls.append("mark") or "m", repeatable=True)
            if fail:
                raise ValueError("the next step's input is bad")
            return str(run.step("next", lambda: calls.append("next") or "n"))

        return run_body

    with pytest.raises(ValueError, match="input is bad"):
        execute(journal, "wf", "r1", body(True))
    assert recorded(journal, "r1") == {"mark"}
    again = execute(journal, "wf", "r1", body(False))
    assert again.result == "n"
    assert calls == ["mark", "next"]  # the failure's closing kept it: not run again


def test_a_crash_before_the_next_write_runs_it_again(make_journal: MakeJournal) -> None:
    """An interpreter exit writes nothing: the record was never sent, so the body runs again."""
    journal = make_journal()
    calls: list[str] = []

    def body(crash: bool) -> Callable[[Run], str]:
        def run_body(run: Run) -> str:
            run.step("mark", lambda: calls.append("mark") or "m", repeatable=True)
            if crash:
                raise SystemExit(137)
            return str(run.step("next", lambda: "n"))

        return run_body

    with pytest.raises(SystemExit):
        execute(journal, "wf", "r1", body(True))
    assert recorded(journal, "r1") == set()
    journal.client.delete(journal.keys("wf", "r1").lease)  # the crashed holder's lease gone
    assert execute(journal, "wf", "r1", body(False)).result == "n"
    assert calls == ["mark", "mark"]


def test_a_run_waiting_for_a_signal_keeps_them(make_journal: MakeJournal) -> None:
    journal = make_journal()
    calls: list[str] = []

    def body(run: Run) -> bool:
        run.step("mark", lambda: calls.append("mark") or "m", repeatable=True)
        return run.wait_for_signal("approved", timeout=None).received

    assert execute(journal, "wf", "r1", body).status == "waiting"
    assert recorded(journal, "r1") == {"mark", "wait:approved"}
    journal.send_signal("wf", "r1", "approved", True)
    assert execute(journal, "wf", "r1", body).result is True
    assert calls == ["mark"]


def sending(acts: list[str], *, receipt: bool = True) -> Callable[[Effect], str]:
    """An effect that acts once, saving its receipt (or not); a replay of it says so."""

    def send(effect: Effect) -> str:
        if effect.earlier is not None:
            return f"sent earlier: {effect.earlier}"
        effect.confirm()
        effect.last_moment()
        acts.append("sent")
        if receipt:
            effect.accepted("r-1")
        return "sent"

    return send


def test_a_settled_effects_record_goes_with_the_next_write(make_journal: MakeJournal) -> None:
    journal = make_journal()
    acts: list[str] = []
    seen_by_next: list[set[str]] = []

    def body(run: Run) -> str:
        sent = run.effect("send", sending(acts), timeout=5)
        run.step("next", lambda: seen_by_next.append(recorded(journal, "r1")) or 1)
        return sent

    assert execute(journal, "wf", "r1", body).result == "sent"
    assert seen_by_next == [set()]
    assert recorded(journal, "r1") == {"send", "next"}
    assert acts == ["sent"]


def test_a_crash_before_it_is_recorded_replays_it_from_its_receipt(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    acts: list[str] = []

    def body(crash: bool) -> Callable[[Run], str]:
        def run_body(run: Run) -> str:
            sent = run.effect("send", sending(acts), timeout=5)
            if crash:
                raise SystemExit(137)
            run.step("next", lambda: 1)
            return sent

        return run_body

    with pytest.raises(SystemExit):
        execute(journal, "wf", "r1", body(True))
    assert recorded(journal, "r1") == set()
    journal.client.delete(journal.keys("wf", "r1").lease)  # the crashed holder's lease gone
    assert execute(journal, "wf", "r1", body(False)).result == "sent earlier: r-1"
    assert acts == ["sent"]


def test_an_effect_that_saved_no_receipt_is_recorded_at_once(make_journal: MakeJournal) -> None:
    """Its record is all that tells a replay it happened: the run waits for it."""
    journal = make_journal()
    seen_by_next: list[set[str]] = []

    def body(run: Run) -> str:
        sent = run.effect("send", sending([], receipt=False), timeout=5)
        run.step("next", lambda: seen_by_next.append(recorded(journal, "r1")) or 1)
        return sent

    execute(journal, "wf", "r1", body)
    assert seen_by_next == [{"send"}]

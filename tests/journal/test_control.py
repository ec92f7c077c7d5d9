"""Operator control on real Redis and on fakeredis: cancel, retry and fork, for any workflow.

A cancel of a held run is honoured at the holder's next step boundary, learnt inside the
fenced record and renewal scripts; a cancel of a run nobody holds (waiting, failed, a dead
holder's) is immediate. A fork keeps the steps before its step and runs the rest under its
own id.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from journal import Effect, Journal, Run
from journal._lease import Lease
from journal._redis.backend import Purging
from journal.errors import ControlRefused, EffectUnderway
from journal.ops.actions import cancel, fork, retry, unsettled_effects
from journal.ops.views import inspect_run
from tests.conftest import MakeJournal
from tests.support import acquire, execute, only_index


@pytest.fixture
def journal(make_journal: MakeJournal) -> Journal:
    return make_journal(lease_ttl=30)


def steps_of(journal: Journal, run_id: str) -> list[str]:
    return [record.key for record in inspect_run(journal, "wf", run_id).steps]


def send_then_bookkeeping(act: Callable[[Effect], str]) -> Callable[[Run], str]:
    """A workflow that performs ``act`` as its effect, then a step after it."""

    def body(run: Run) -> str:
        run.effect("send", act, timeout=10)
        run.step("after", lambda: "bookkeeping")
        return "finished"

    return body


def test_a_cancel_before_an_effects_confirmation_lands_and_the_effect_never_acts(
    journal: Journal,
) -> None:
    """Until its confirmation an effect cannot have happened: nothing holds the cancel back."""
    acted: list[str] = []

    def act(effect: Effect) -> str:
        assert cancel(journal, "wf", "r", "not this week").immediate is False  # at its boundary
        effect.confirm()
        acted.append("sent")
        return "sent"

    outcome = execute(journal, "wf", "r", send_then_bookkeeping(act))

    assert outcome.status == "cancelled"
    assert acted == []
    assert steps_of(journal, "r") == []
    assert journal.effect_states(journal.keys("wf", "r")) == {}


def test_a_cancel_is_refused_once_an_effect_is_confirmed_and_the_run_finishes(
    journal: Journal,
) -> None:
    refusals: list[EffectUnderway] = []

    def act(effect: Effect) -> str:
        effect.confirm()
        with pytest.raises(EffectUnderway) as refused:  # confirmed: it may happen any moment
            cancel(journal, "wf", "r", "too late")
        refusals.append(refused.value)
        return "sent"

    outcome = execute(journal, "wf", "r", send_then_bookkeeping(act))

    assert (outcome.status, outcome.result) == ("done", "finished")
    assert steps_of(journal, "r") == ["send", "after"]
    [refused] = refusals
    assert (refused.effect, refused.state) == ("send", "confirmed")
    assert str(refused) == "run wf:r: its effect 'send' is under way; it will finish"
    assert "cancel" not in journal.meta(journal.keys("wf", "r"))


def test_a_revocable_effect_does_not_refuse_a_cancel_nor_keep_the_run_from_a_purge(
    journal: Journal,
) -> None:
    def create(effect: Effect) -> str:
        effect.confirm()
        return "b1"

    def body(run: Run) -> str:
        run.effect("batch", create, timeout=10, revocable=True)
        run.sleep("look", 3600)
        return "finished"

    assert execute(journal, "wf", "r", body).status == "waiting"
    keys = journal.keys("wf", "r")
    assert journal.effect_states(keys) == {"batch": "confirmed"}  # not settled, yet revocable

    assert cancel(journal, "wf", "r", "not this week").immediate  # its application undoes it

    meta = journal.meta(keys)
    assert meta["status"] == "cancelled"
    assert unsettled_effects(journal, keys) == {}
    assert journal.backend.purge(keys, meta["updated_at"], 0.0, ["cancelled"]) is Purging.DELETED


def test_a_running_run_finishes_its_step_in_flight_and_starts_no_other(journal: Journal) -> None:
    in_step = threading.Event()
    release = threading.Event()
    calls: list[str] = []

    def body(run: Run) -> str:
        def slow() -> str:
            calls.append("a")
            in_step.set()
            assert release.wait(10)
            return "A"

        run.step("a", slow)
        run.step("b", lambda: calls.append("b"))
        return "finished"

    outcomes: list[Any] = []
    runner = threading.Thread(target=lambda: outcomes.append(execute(journal, "wf", "r", body)))
    runner.start()
    assert in_step.wait(10)

    landed = cancel(journal, "wf", "r", "wrong week")
    release.set()
    runner.join(10)

    assert landed.immediate is False
    assert (outcomes[0].status, outcomes[0].ran) == ("cancelled", 1)
    assert calls == ["a"]
    view = inspect_run(journal, "wf", "r")
    assert (view.status, view.meta["cancel"], view.lease_holder) == (
        "cancelled",
        "wrong week",
        None,
    )
    assert steps_of(journal, "r") == ["a"]
    assert journal.client.zscore(only_index(journal).due, "wf:r") is None
    assert execute(journal, "wf", "r", body).status == "cancelled"
    assert calls == ["a"]


def test_a_waiting_run_is_cancelled_at_once_and_never_woken(journal: Journal) -> None:
    def body(run: Run) -> Any:
        run.step("a", lambda: 1)
        return run.wait_for_signal("go", timeout=600).payload

    assert execute(journal, "wf", "r", body).status == "waiting"
    assert journal.client.zscore(only_index(journal).due, "wf:r") is not None

    assert cancel(journal, "wf", "r").immediate is True

    view = inspect_run(journal, "wf", "r")
    assert (view.status, view.wait) == ("cancelled", None)
    assert journal.client.zscore(only_index(journal).due, "wf:r") is None
    journal.send_signal("wf", "r", "go", 1)
    assert execute(journal, "wf", "r", body).status == "cancelled"
    assert steps_of(journal, "r") == ["a", "wait:go"]


def test_a_run_about_to_wait_is_cancelled_instead(journal: Journal) -> None:
    def body(run: Run) -> Any:
        run.step("a", lambda: cancel(journal, "wf", "r").immediate)
        return run.wait_for_signal("go", timeout=600).payload

    outcome = execute(journal, "wf", "r", body)

    assert outcome.status == "cancelled"
    assert inspect_run(journal, "wf", "r").status == "cancelled"
    assert steps_of(journal, "r") == ["a"]


def test_a_dead_holders_successor_cancels_before_its_first_step(journal: Journal) -> None:
    keys = journal.keys("wf", "r")
    journal.client.hset(keys.meta, mapping={"status": "running"})
    acquire(Lease(keys, journal.backend, 60_000), 0)  # a holder that will never come back

    assert cancel(journal, "wf", "r").immediate is False
    journal.client.delete(keys.lease)  # its lease expires
    calls: list[str] = []

    outcome = execute(journal, "wf", "r", lambda run: run.step("a", lambda: calls.append("a")))

    assert (outcome.status, calls) == ("cancelled", [])
    assert inspect_run(journal, "wf", "r").status == "cancelled"


def test_cancel_refuses_an_unknown_or_ended_run(journal: Journal) -> None:
    execute(journal, "wf", "r", lambda run: run.step("a", lambda: 1))

    with pytest.raises(ControlRefused, match=r"run wf:r: it is done already"):
        cancel(journal, "wf", "r")
    with pytest.raises(ControlRefused, match=r"run wf:nope: no such run"):
        cancel(journal, "wf", "nope")


def test_retry_takes_a_failed_run_only_and_unparks_it(journal: Journal) -> None:
    def boom(run: Run) -> None:
        run.step("a", lambda: 1)
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r", boom, args={"to": "x"})
    keys = journal.keys("wf", "r")
    journal.client.hset(keys.meta, "parked", "1")

    assert retry(journal, "wf", "r") == {"to": "x"}
    assert "parked" not in journal.meta(keys)
    assert execute(journal, "wf", "r", lambda run: run.step("a", lambda: 2)).result == 1

    with pytest.raises(ControlRefused, match=r"it is done; only a failed run can be retried"):
        retry(journal, "wf", "r")


def test_a_fork_keeps_the_steps_before_its_step_and_runs_the_rest_under_its_own_id(
    journal: Journal,
) -> None:
    calls: list[str] = []

    def body(run: Run) -> list[str]:
        def call(name: str) -> str:
            calls.append(name)
            return f"{name}@{run.idempotency_key()}"

        return [run.step(name, functools.partial(call, name)) for name in "abcd"]

    execute(journal, "wf", "r", body, args={"week": 42})
    calls.clear()

    forked = fork(journal, "wf", "r", "c")
    outcome = execute(journal, "wf", forked.run_id, body)

    assert forked.run_id == "r-fork1"
    assert calls == ["c", "d"]
    assert outcome.result == ["a@wf-r", "b@wf-r", "c@wf-r-fork1", "d@wf-r-fork1"]
    view = inspect_run(journal, "wf", "r-fork1")
    assert view.meta["forked_from"] == "wf:r"
    assert view.meta["forked_at_step"] == "c"
    assert '"week":42' in view.meta["args"]
    assert fork(journal, "wf", "r", "a").run_id == "r-fork2"
    assert steps_of(journal, "r-fork2") == []
    with pytest.raises(ControlRefused, match=r"run wf:r-fork1: that run exists already"):
        fork(journal, "wf", "r", "b", "r-fork1")
    with pytest.raises(ControlRefused, match=r"it has no step 'z' to fork from"):
        fork(journal, "wf", "r", "z")


@pytest.mark.parametrize(("settled", "kept"), [("ambiguous", True), ("released", False)])
def test_a_purge_keeps_a_failed_run_whose_effect_may_have_happened(
    journal: Journal, settled: str, kept: bool
) -> None:
    def act(effect: Effect) -> str:
        effect.confirm()
        if settled == "released":
            effect.release()
        raise RuntimeError("the relay hung up")

    def body(run: Run) -> str:
        return run.effect("send", act, timeout=10, repeatable=True)

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r", body)
    keys = journal.keys("wf", "r")
    assert journal.effect_states(keys) == {"send": settled}
    meta = journal.meta(keys)
    assert meta["status"] == "failed"
    # The script itself refuses, whatever the caller read: a run that may have acted stays.
    deleted = journal.backend.purge(keys, meta["updated_at"], 0.0, ["failed"])
    assert deleted is (Purging.EFFECT_UNSETTLED if kept else Purging.DELETED)
    assert bool(journal.meta(keys)) is kept

"""The deterministic helpers (now, uuid, version, sleep, signals) as the journal and hooks see them.

Each helper records a step of its own kind under its own key, reports it to ``on_step`` with
that key and kind when it runs and when it replays, and counts in ``ran``/``replayed`` exactly
like a plain step: a dashboard, ``inspect`` and the drift check all rely on it. So does an
effect's record: its kind, its one attempt and its start time. Found by
mutation testing (docs/mutation.md): the helpers' results were checked, their records not.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from journal import Effect, Journal, ManualClock, Run, StepEvent
from journal._clock import millis
from journal._lease import Lease
from journal.errors import CorruptJournal, Fenced, LeaseLost, UnserializableResult
from tests.conftest import MakeJournal
from tests.support import acquire, execute, recorded_events

T0 = 1_800_000_000.0

HELPERS = [
    ("now:t", "now"),
    ("uuid:u", "uuid"),
    ("version:v", "version"),
    ("sleep:nap", "sleep"),
    ("wait:approval", "wait"),
    ("signal:approval", "signal"),
    ("wait:go", "wait"),
    ("signal:go", "signal"),
]


def helpers(run: Run) -> list[Any]:
    now, uuid, version = run.now("t"), run.uuid("u"), run.version("v", 2)
    run.sleep("nap", 0)  # wakes at once: recorded, never suspends
    approval = run.wait_for_signal("approval", timeout=0)  # ends at once, not received
    return [now, uuid, version, approval, run.wait_for_signal("go", timeout=None)]


def summary(results: list[Any]) -> list[Any]:
    now, uuid, version, approval, go = results
    return [
        now,
        len(uuid),
        version,
        approval.received,
        approval.payload,
        go.received,
        go.payload,
    ]


def rerun(journal: Journal) -> None:
    """Make the next ``execute`` run the body again, replaying what it recorded."""
    journal.client.hdel(journal.keys("wf", "r1").meta, "status")


def test_each_helper_reports_its_own_key_and_kind_when_it_runs_and_when_it_replays(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    journal.send_signal("wf", "r1", "go", {"ok": 1})
    first_events: list[StepEvent] = []
    first = execute(
        journal, "wf", "r1", lambda run: summary(helpers(run)), on_step=first_events.append
    )
    rerun(journal)
    again_events: list[StepEvent] = []
    again = execute(
        journal, "wf", "r1", lambda run: summary(helpers(run)), on_step=again_events.append
    )

    assert first.result == [T0, 36, 2, False, None, True, {"ok": 1}]
    assert again.result == first.result
    assert first_events == [StepEvent(key, False, kind, 1) for key, kind in HELPERS]
    assert again_events == [StepEvent(key, True, kind, 1) for key, kind in HELPERS]
    assert (first.ran, first.replayed) == (8, 0)
    assert (again.ran, again.replayed) == (0, 8)


def test_each_helper_stores_its_kind_and_a_timed_out_wait_stores_no_payload(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    journal.send_signal("wf", "r1", "go", {"ok": 1})
    execute(journal, "wf", "r1", helpers)
    raw = cast(dict[bytes, bytes], journal.client.hgetall(journal.keys("wf", "r1").steps))
    stored = {key.decode(): orjson.loads(value) for key, value in raw.items()}
    assert {key: record["kind"] for key, record in stored.items()} == dict(HELPERS)
    assert stored["signal:approval"]["result"] == {"received": False, "payload": None}
    assert stored["signal:go"]["result"] == {"received": True, "payload": {"ok": 1}}
    assert stored["sleep:nap"]["result"] == T0
    assert stored["wait:go"]["result"] is None


def test_a_step_after_replayed_helpers_is_new_and_runs_once(make_journal: MakeJournal) -> None:
    journal = make_journal(clock=ManualClock(T0))
    journal.send_signal("wf", "r1", "go", {"ok": 1})
    execute(journal, "wf", "r1", helpers)
    rerun(journal)
    calls: list[str] = []

    def after() -> str:
        calls.append("after")
        return "new"

    def more(run: Run) -> str:
        helpers(run)
        return run.step("after", after)

    outcome = execute(journal, "wf", "r1", more)
    assert (outcome.status, outcome.result, calls) == ("done", "new", ["after"])
    assert (outcome.ran, outcome.replayed) == (1, 8)


def test_a_map_item_left_over_from_an_earlier_attempt_is_not_drift_for_the_new_items(
    make_journal: MakeJournal,
) -> None:
    """The week's items changed between attempts: ``m:b`` stays recorded, ``m:c`` is new.

    ``m:b`` belongs to the map that is running, so the steps and version gate inside ``m:c``
    must not see it as older history: no ReplayMismatch, and the gate records the new version.
    """
    journal = make_journal(clock=ManualClock(T0))
    execute(journal, "wf", "r1", lambda run: run.map("m", ["a", "b"], str.upper, key=str))
    rerun(journal)

    def body(run: Run) -> list[Any]:
        def item(name: str) -> list[Any]:
            return [run.version(f"v:{name}", 2), run.step(f"in:{name}", lambda: name)]

        return run.map("m", ["a", "c"], item, key=str)

    outcome = execute(journal, "wf", "r1", body)
    assert outcome.status == "done"
    assert outcome.result == ["A", [2, "c"]]
    assert (outcome.ran, outcome.replayed) == (3, 1)


def test_a_corrupt_record_met_by_the_drift_check_is_named_by_run_and_step(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    execute(journal, "wf", "r1", lambda run: run.step("a", lambda: 1))
    rerun(journal)
    journal.client.hset(journal.keys("wf", "r1").steps, "a", b"{")
    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", lambda run: run.step("b", lambda: 2))
    assert (caught.value.run, caught.value.field) == ("wf:r1", "a")
    assert caught.value.detail.startswith("not valid JSON: ")


def test_an_effect_records_its_kind_its_single_attempt_and_when_it_started(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal = make_journal(clock=clock)

    def send(effect: Effect) -> str:
        clock.advance(2)  # the call itself takes time: started and finished differ
        effect.confirm()
        return "sent"

    first: list[StepEvent] = []
    execute(
        journal, "wf", "r1", lambda run: run.effect("send", send, timeout=60), on_step=first.append
    )
    raw = journal.client.hget(journal.keys("wf", "r1").steps, "send")
    assert raw is not None
    stored = orjson.loads(raw)
    assert (stored["result"], stored["kind"], stored["attempt"]) == ("sent", "effect", 1)
    assert (stored["started_at"], stored["finished_at"]) == (millis(T0), millis(T0 + 2))
    rerun(journal)
    again: list[StepEvent] = []
    outcome = execute(
        journal, "wf", "r1", lambda run: run.effect("send", send, timeout=60), on_step=again.append
    )
    assert outcome.result == "sent"
    assert (first, again) == (
        [StepEvent("send", False, "effect", 1)],
        [StepEvent("send", True, "effect", 1)],
    )


def test_a_record_from_before_kinds_and_attempts_replays_as_a_first_attempt_step(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(clock=ManualClock(T0))
    older = {"result": "A", "seq": 1, "fence": 1, "started_at": 0, "finished_at": 0}
    journal.client.hset(journal.keys("wf", "r1").steps, "a", orjson.dumps(older))
    events: list[StepEvent] = []
    outcome = execute(
        journal, "wf", "r1", lambda run: run.step("a", lambda: "B"), on_step=events.append
    )
    assert outcome.result == "A"
    assert events == [StepEvent("a", True, "step", 1)]


def test_a_result_json_cannot_hold_is_refused_naming_run_and_step(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    with pytest.raises(UnserializableResult) as caught:
        execute(journal, "wf", "r1", lambda run: run.step("a", object))
    assert (caught.value.run, caught.value.step) == ("wf:r1", "a")
    assert caught.value.detail == "Type is not JSON serializable: object"


def test_a_record_refused_for_an_expired_or_moved_lease_names_the_run(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    lease_key = journal.keys("wf", "r1").lease

    def expired(run: Run) -> int:
        journal.client.delete(lease_key)
        return run.step("a", lambda: 1)

    with pytest.raises(LeaseLost) as lost:
        execute(journal, "wf", "r1", expired)
    assert (lost.value.run, lost.value.detail) == (
        "wf:r1",
        "the lease expired before 'a' could be recorded",
    )

    def moved(run: Run) -> int:
        journal.client.delete(lease_key)
        taker = acquire(Lease(journal.keys("wf", "r1"), journal.backend, 60_000), 0)
        moved_to.append(taker.holder)
        return run.step("b", lambda: 2)

    moved_to: list[str] = []
    journal.client.hdel(journal.keys("wf", "r1").meta, "status")
    with recorded_events() as events, pytest.raises(Fenced) as fenced:
        execute(journal, "wf", "r1", moved)
    assert (fenced.value.run, fenced.value.detail) == (
        "wf:r1",
        f"'b' refused: the run is now held by {moved_to[0]}",
    )
    assert [event for event in events if event[0] == "fenced"] == [("fenced", "", 1.0)]

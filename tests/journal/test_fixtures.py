"""Recorded runs as fixtures, on real Redis and on fakeredis: export, replay, deploy check.

A run is recorded for real through ``Workflow.run_here``, exported, and replayed in memory
against the workflow as recorded and against edited versions of it: a renamed step, a step
run live, a step the fixture lacks, a version gate. Calls are counted: a replayed step's
function is never called, and the deploy check never calls one at all.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

import journal._redact as redaction
from journal import Effect, Journal, Run
from journal._workflow import Workflow, workflow
from journal.errors import BadFixture, ControlRefused, ReplayMismatch, StepNotInFixture
from journal.testing import replay
from journal.testing.fixture import Fixture, export
from journal.testing.preflight import check_run, unended_runs
from tests.conftest import MakeJournal

SECRET = "hunter2-very-secret"


@pytest.fixture
def journal(make_journal: MakeJournal) -> Journal:
    return make_journal(lease_ttl=30)


@pytest.fixture
def calls() -> Counter[str]:
    return Counter()


def order(
    calls: Counter[str], *, rename: str | None = None, gated: bool = False
) -> Workflow[Any, Any]:
    """The same workflow, as first written or edited: ``price`` renamed, or renamed behind
    a version gate (new runs take the new name, recorded ones keep the old)."""

    def counted(key: str, value: Any) -> Any:
        calls[key] += 1
        return value

    @workflow("order")
    def body(run: Run, customer: str) -> dict[str, Any]:
        load = run.step("load", lambda: counted("load", {"cents": 300, "who": customer}))
        lines = run.map("line", ["a", "b"], lambda sku: counted(sku, sku.upper()), key=str)
        name = "price"
        if rename is not None and (not gated or run.version("price-name", 1) >= 1):
            name = rename
        price = run.step(name, lambda: counted(name, load["cents"] * 2))

        def charge(effect: Effect) -> str:
            calls["charge"] += 1
            effect.confirm()
            effect.accepted(f"rcpt-{price}")
            return f"rcpt-{price}"

        receipt = run.effect("charge", charge, timeout=10)
        approval = run.wait_for_signal("ship", timeout=None)
        run.step("ship", lambda: counted("ship", approval.payload))
        return {"lines": lines, "receipt": receipt, "secret": load["who"]}

    return body


def record(journal: Journal, calls: Counter[str], *, ship: bool = True) -> Fixture:
    """Run the order for real (waiting for ``ship`` unless sent first), and export it."""
    flow = order(calls)
    if ship:
        journal.send_signal("order", "o1", "ship", {"by": "carrier"})
    flow.start("o1", {"customer": f"https://user:{SECRET}@example.com"}, journal=journal)
    calls.clear()
    return export(journal, "order", "o1")


def test_a_fixture_is_a_versioned_document_read_back_as_written(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)

    read = Fixture.loads(recorded.dumps())

    assert read == recorded
    assert [step.key for step in read.steps] == [
        "load",
        "line:a",
        "line:b",
        "price",
        "charge",
        "wait:ship",
        "signal:ship",
        "ship",
    ]
    assert read.signals == {"ship": {"by": "carrier"}}
    assert read.meta["status"] == "done" and "holder" not in read.meta
    document = recorded.to_json()
    assert (document["format"], document["version"]) == ("journal-fixture", 1)
    with pytest.raises(BadFixture, match="version 2; this version reads 1"):
        Fixture.from_json({**document, "version": 2})
    with pytest.raises(BadFixture, match="step 'load' is not a record"):
        Fixture.from_json({**document, "steps": [{"key": "load", "result": 1}]})


def test_an_export_masks_every_secret(
    journal: Journal, calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal_secret = "registered-token-9f8e7d"
    monkeypatch.setattr(redaction, "_secrets", ())  # this test's secret goes with it
    redaction.add_secret(journal_secret)
    flow = order(calls)
    journal.send_signal("order", "o1", "ship", {"token": journal_secret})
    flow.start("o1", {"customer": f"redis://:{SECRET}@db:6379"}, journal=journal)

    text = export(journal, "order", "o1").dumps()

    assert SECRET not in text and journal_secret not in text
    assert "redis://:***@db:6379" in text


def test_an_export_of_no_run_is_refused(journal: Journal) -> None:
    with pytest.raises(ControlRefused, match="no such run"):
        export(journal, "order", "nobody")


def test_a_replay_calls_no_step_and_returns_what_the_run_returned(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)

    replayed = replay(order(calls), recorded)

    assert calls == Counter()  # nor the effect: its receipt came from the fixture
    assert replayed.status == "done"
    assert replayed.result == {
        "lines": ["A", "B"],
        "receipt": "rcpt-600",
        "secret": "https://user:***@example.com",
    }
    assert replayed.ran == () and replayed.unreplayed == ()


def test_a_renamed_step_fails_the_replay_naming_both_keys(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)

    with pytest.raises(ReplayMismatch) as drift:
        replay(order(calls, rename="quote"), recorded)

    assert (drift.value.recorded, drift.value.requested) == ("price", "quote")
    assert "'quote'" in str(drift.value) and "'price'" in str(drift.value)
    assert calls == Counter()


def test_a_step_the_fixture_lacks_fails_naming_it_and_the_nearest_recorded(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)
    last_renamed = Fixture.from_json(
        {
            **recorded.to_json(),
            "steps": [s for s in recorded.to_json()["steps"] if s["key"] != "ship"],
        }
    )

    with pytest.raises(StepNotInFixture) as missing:
        replay(order(calls), last_renamed)

    assert missing.value.key == "ship"
    assert set(missing.value.nearest[:2]) == {"wait:ship", "signal:ship"}
    assert "step 'ship' is not in the fixture" in str(missing.value)
    assert calls == Counter()


def test_a_live_step_runs_for_real_and_the_rest_still_replays(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)

    replayed = replay(order(calls), recorded, live={"price", "line"})

    assert calls == Counter({"price": 1, "a": 1, "b": 1})
    assert replayed.ran == ("line:a", "line:b", "price")
    assert replayed.result["receipt"] == "rcpt-600"


def test_one_live_key_given_bare_is_that_key_not_its_letters(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)

    replayed = replay(order(calls), recorded, live="line:a")

    assert calls == Counter({"a": 1}) and replayed.ran == ("line:a",)


def test_an_effect_the_fixture_lacks_is_never_performed(
    journal: Journal, calls: Counter[str]
) -> None:
    recorded = record(journal, calls)
    without_charge = Fixture.from_json(
        {
            **recorded.to_json(),
            "steps": [s for s in recorded.to_json()["steps"] if s["key"] == "load"],
        }
    )

    with pytest.raises(StepNotInFixture, match="effect 'charge' is not in the fixture"):
        replay(order(calls), without_charge, live=lambda key: key not in ("load", "charge"))

    assert calls == Counter({"a": 1, "b": 1, "price": 1})  # and no charge


def everything(client: redis.Redis) -> dict[bytes, Any]:
    """Every key of the store with its value, as DUMP serializes it."""
    return {key: client.dump(key) for key in client.scan_iter(count=1000)}


def test_check_run_finds_the_drift_of_a_waiting_run_and_the_gate_that_avoids_it(
    journal: Journal, calls: Counter[str]
) -> None:
    record(journal, calls, ship=False)  # waits for `ship`, the effect already performed
    client = journal.client
    assert isinstance(client, redis.Redis)
    before = everything(client)

    same = check_run(journal, order(calls), "o1")
    renamed = check_run(journal, order(calls, rename="quote"), "o1")
    gated = check_run(journal, order(calls, rename="quote", gated=True), "o1")

    assert same.clean and same.stopped == "waiting at signal:ship"
    assert not renamed.clean and renamed.state == "waiting"
    assert renamed.drift is not None
    assert (renamed.drift.expected, renamed.drift.found) == ("price", "quote")
    assert gated.clean and gated.gates == {"price-name": 0}
    assert calls == Counter()  # no step function, no effect
    assert everything(client) == before  # and nothing written
    assert unended_runs(journal, "order") == ["o1"]


def test_check_run_stops_where_a_failed_run_would_go_on(journal: Journal) -> None:
    def failing(run: Run) -> None:
        run.step("a", lambda: 1)
        run.step("b", lambda: 1 / 0)

    with pytest.raises(ZeroDivisionError):
        Workflow("flaky", failing).start("f1", journal=journal)

    verdict = check_run(journal, Workflow("flaky", failing), "f1")

    assert (verdict.clean, verdict.state, verdict.stopped) == (True, "failed", "at b")

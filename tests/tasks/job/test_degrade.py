"""Degradation by a deadline (``DIGEST_DEGRADE_AT``), through the real SDK against the fake API.

The run's deadline is frozen with its options at its first start. Until it passes, a failing
model is retried as always; once it has, every item still without a model summary gets the
offline summary (the body's first sentence), recorded with the reason in its step, so no
later delivery decides again. A refused item stays skipped. The journal's clock is a manual
one: the deadline passes when the test says so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from journal import Journal, Keyspace, ManualClock, RunRetry, Settings
from journal.errors import RetryScheduled
from journal.ops.views import inspect_run
from tasks.config import Config
from tasks.config.limits import Overrides
from tasks.errors import is_transient_failure
from tasks.job.report import degraded_words
from tasks.job.workflow import DigestOptions, run_digest
from tasks.llm.client import AnthropicSummarizer
from tasks.llm.ratelimit import RateLimiter
from tasks.ops.cli.render import outcome_line, render_view, result_lines
from tasks.ops.console import Names, create_app
from tasks.runtime import Runtime
from tasks.worker import metrics
from tests.fakes.anthropic_server import PROMPT_TOO_LONG, FakeAnthropic
from tests.support import counted_by, execute, fake_api_runtime

ITEMS = [{"id": i, "title": f"Item {i}", "body": f"Body {i}. More {i}."} for i in ("a", "b", "c")]
START = 1_800_000_000.0
DEADLINE = START + 600  # ten minutes after the run's first start


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def runtime(
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    fake_anthropic: FakeAnthropic,
    clock: ManualClock,
) -> Runtime:
    """One model per call kind; a transient failure retried by the sweep an hour later."""
    items = tmp_path / "items.json"
    items.write_text(json.dumps(ITEMS), encoding="utf-8")
    config = Config(
        state_dir=tmp_path / "state",
        items_path=str(items),
        key_prefix=prefix,
        concurrency=1,
        retry_base_delay=0.01,
    )
    config.check()
    retry = RunRetry(retryable=is_transient_failure, first_delay=3600, max_delay=3600)
    settings = Settings(lease_ttl=2, run_retry=retry)
    journal = Journal(real_redis, keyspace=Keyspace(prefix), settings=settings, clock=clock)
    return fake_api_runtime(config, real_redis, journal, fake_anthropic)


def degraded_count(kind: str) -> float:
    """``digest_degraded_items_total{kind}`` as this process counted it."""
    return counted_by(metrics.DEGRADED, kind=kind)


def deliver(runtime: Runtime, run_id: str) -> dict[str, Any]:
    """One delivery of the run with its deadline frozen, as a worker's would be; its report."""
    options = DigestOptions(degrade_at=DEADLINE)
    outcome = execute(
        runtime.journal,
        "digest",
        run_id,
        lambda run: run_digest(run, runtime, options),
        args={"degrade_at": DEADLINE},
    )
    assert isinstance(outcome.result, dict)
    return outcome.result


def test_a_run_retrying_past_the_deadline_is_due_at_the_deadline_then_sent_degraded(
    runtime: Runtime, fake_anthropic: FakeAnthropic, clock: ManualClock, tmp_path: Path
) -> None:
    fake_anthropic.fail_when("Body b.", 400, message=PROMPT_TOO_LONG)  # refused: skipped
    fake_anthropic.fail_when("Body c.", 529)  # overloaded until further notice
    counted = {kind: degraded_count(kind) for kind in ("summary", "opening")}

    with pytest.raises(RetryScheduled):
        deliver(runtime, "w1")

    view = inspect_run(runtime.journal, "digest", "w1")
    assert view.status == "retrying"
    assert int(view.meta["retry_at"]) == DEADLINE * 1000  # not an hour later: at the deadline
    asked = fake_anthropic.calls
    assert asked == 1 + 1 + 5  # a answered, b refused, c five times overloaded

    clock.advance(DEADLINE - clock.now())
    fake_anthropic.clear_faults()  # the API is back; the decision is the deadline's all the same
    fake_anthropic.fail_when("Body b.", 400, message=PROMPT_TOO_LONG)
    result = deliver(runtime, "w1")

    assert fake_anthropic.calls == asked  # nothing asked after the deadline: c and the opening
    assert result["status"] == "sent"
    assert result["degraded"] == {
        "offline": ["c"],
        "of": 2,
        "opening": True,
        "deadline": DEADLINE,
    }
    assert [entry["id"] for entry in result["skipped"]] == ["b"]
    view = inspect_run(runtime.journal, "digest", "w1")
    c = view.step("summarize:c")
    assert c is not None and c.result["model"] == "offline"
    assert c.result["degraded"].startswith("the model had not answered by 2027-01-15 08:10:00 UTC")
    a = view.step("summarize:a")
    assert a is not None and a.result["model"] == "claude-haiku-5-5" and "degraded" not in a.result
    [sent] = (tmp_path / "state" / "outbox").glob("*.json")
    body = json.loads(sent.read_text())["body"]
    assert "* Item c: Body c." in body
    assert (
        "Summarized offline (each update's first sentence), because the model API had not "
        "answered by 2027-01-15 08:10:00 UTC: Item c; the opening paragraph too."
    ) in body
    assert outcome_line(view.meta).startswith("sent (degraded: 1 of 2 offline): 2 items")
    assert (
        result_lines(result).splitlines()[-1].startswith("sent (degraded: 1 of 2 offline): 2 items")
    )
    shown = render_view(view)
    assert "[offline] Body c." in shown
    assert "answered by claude-haiku-5-5 (1), offline (2)" in shown  # c and the opening
    assert "deadline 2027-01-15 08:10:00 UTC (DIGEST_DEGRADE_AT)" in shown
    page = create_app(runtime, Names.bound("127.0.0.1", 80)).test_client().get("/runs/w1")
    console = page.get_data(as_text=True)
    assert "Sent 2 items (degraded: 1 of 2 offline)" in console
    assert "Summarized offline: Item c, and the opening paragraph" in console
    assert "[claude-haiku-5-5] summary of Item a" in console  # the model of each item
    assert "[offline] Body c." in console
    assert degraded_count("summary") == counted["summary"] + 1  # c: the metric, by kind
    assert degraded_count("opening") == counted["opening"] + 1


def test_a_backoff_the_api_asks_past_the_deadline_wakes_at_the_deadline(
    runtime: Runtime, fake_anthropic: FakeAnthropic, clock: ManualClock
) -> None:
    fake_anthropic.fail_always(529, headers={"retry-after": "1800"})  # half an hour, it says

    outcome = execute(
        runtime.journal,
        "digest",
        "w2",
        lambda run: run_digest(run, runtime, DigestOptions(degrade_at=DEADLINE)),
    )

    assert outcome.status == "waiting"
    assert outcome.wait is not None and outcome.wait.until == DEADLINE
    assert fake_anthropic.calls == 1

    clock.advance(DEADLINE - clock.now())
    result = deliver(runtime, "w2")
    assert fake_anthropic.calls == 1
    assert result["degraded"] == {
        "offline": ["a", "b", "c"],
        "of": 3,
        "opening": True,
        "deadline": DEADLINE,
    }


def test_without_a_deadline_nothing_is_summarized_offline(
    runtime: Runtime, fake_anthropic: FakeAnthropic, clock: ManualClock
) -> None:
    fake_anthropic.fail_when("Body c.", 529)

    with pytest.raises(RetryScheduled):
        execute(runtime.journal, "digest", "w3", lambda run: run_digest(run, runtime))
    clock.advance(2 * 3600)  # past the time a deadline would have had, had there been one

    with pytest.raises(RetryScheduled):
        execute(runtime.journal, "digest", "w3", lambda run: run_digest(run, runtime))
    assert fake_anthropic.calls_for("Body c.") == 10


def test_a_batch_in_flight_at_the_deadline_is_cancelled_and_its_items_summarized_offline(
    runtime: Runtime, fake_anthropic: FakeAnthropic, clock: ManualClock
) -> None:
    fake_anthropic.batch_processing_time = 3600.0  # no request of it finishes in this test
    options = DigestOptions(batch=True, degrade_at=DEADLINE)
    args = {"batch": True, "degrade_at": DEADLINE}
    wakes: list[float] = []
    for _ in range(20):  # each delivery as the due sweep would make it, at its wake-up time
        outcome = execute(
            runtime.journal,
            "digest",
            "w4",
            lambda run: run_digest(run, runtime, options),
            args=args,
        )
        if outcome.status != "waiting":
            break
        assert outcome.wait is not None and outcome.wait.until is not None
        wakes.append(outcome.wait.until)
        clock.advance(max(0.0, outcome.wait.until - clock.now()))

    assert DEADLINE in wakes  # the looks woke at the deadline, not at their own pace after it
    assert clock.now() <= DEADLINE + 5.0  # one look after the cancel (its cancel_look)
    assert isinstance(outcome.result, dict) and outcome.result["status"] == "sent"
    assert outcome.result["degraded"] == {
        "offline": ["a", "b", "c"],
        "of": 3,
        "opening": True,
        "deadline": DEADLINE,
    }
    [batch] = fake_anthropic.batches  # the summaries' batch, cancelled; none for the opening
    assert batch.cancel_at is not None and batch.counts()["canceled"] == 3
    assert fake_anthropic.calls == 0  # past the deadline nothing is asked synchronously
    view = inspect_run(runtime.journal, "digest", "w4")
    a = view.step("summarize:a")
    assert a is not None and a.result["model"] == "offline" and "degraded" in a.result


def test_a_wait_for_rate_limit_room_stops_at_the_deadline_and_the_item_is_summarized_offline(
    runtime: Runtime, fake_anthropic: FakeAnthropic, clock: ManualClock
) -> None:
    # One request a minute, set by the operator: the second call's room is a minute away,
    # a wait slept in the worker (under its 120 s bound), on the run's clock.
    limiter = RateLimiter(
        runtime.client,
        runtime.keys,
        "acct",
        wait_over=120,
        overrides=Overrides({"claude-haiku-5-5": {"requests": 1}}),
        sleep=clock.advance,
        now=clock.now,
    )
    summarizer = AnthropicSummarizer(
        functools.partial(fake_anthropic.client, timeout=5.0),
        runtime.config.summary_models[0],
        runtime.config.intro_models[0],
        limiter=limiter,
    )
    limited = dataclasses.replace(runtime, summarizer=summarizer, limiter=limiter)
    clock.advance(DEADLINE - 10 - clock.now())  # started ten seconds before its deadline

    outcome = execute(
        runtime.journal,
        "digest",
        "w5",
        lambda run: run_digest(run, limited, DigestOptions(degrade_at=DEADLINE)),
        args={"degrade_at": DEADLINE},
    )

    assert clock.now() == DEADLINE  # b waited for room until the deadline, not a minute
    assert isinstance(outcome.result, dict) and outcome.result["status"] == "sent"
    assert outcome.result["degraded"] == {
        "offline": ["b", "c"],
        "of": 3,
        "opening": True,
        "deadline": DEADLINE,
    }
    assert fake_anthropic.calls == 1  # a; b never went out
    assert outcome.result["model_calls"] == 1
    view = inspect_run(runtime.journal, "digest", "w5")
    b = view.step("summarize:b")
    assert b is not None and b.result["model"] == "offline" and "degraded" in b.result


def test_a_run_whose_only_offline_text_is_its_opening_says_so_not_none_of_its_items() -> None:
    def words(offline: list[str]) -> str:
        report = {"status": "sent", "degraded": {"offline": offline, "of": 3, "opening": True}}
        return degraded_words(report)

    assert words([]) == "sent (degraded: the opening paragraph offline)"
    assert words(["c"]) == "sent (degraded: 1 of 3 offline)"

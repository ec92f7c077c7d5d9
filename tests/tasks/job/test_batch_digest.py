"""The digest by Message Batches, in process: the real workflow, journal, SDK and fake API.

Each test runs ``run_digest`` with ``batch`` under ``Journal.execute`` on the shared Redis, the
SDK pointed at the fake API, whose batches take a fraction of a second; between looks the run
is suspended (``waiting``) and the test executes it again at its wake-up time. What is pinned:
two batches and no synchronous call, each item's answer recorded as its own step at half the
price with its cache tokens, one refusal table for both modes, the fallbacks, and one model
for money and limits (the budget holds the batch as a whole; the rate limiter sees none of it).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from journal import Journal, Keyspace, Outcome, Settings
from journal.ops.views import inspect_run
from journal.testing import fixture, replay
from tasks.config import DEFAULT_INTRO_MODEL, DEFAULT_SUMMARY_MODEL, Config
from tasks.errors import ModelRefused
from tasks.job.report import batch_lines
from tasks.job.workflow import DigestOptions, digest, run_digest
from tasks.keys import DigestKeys
from tasks.llm import client as model
from tasks.llm.client import AnthropicSummarizer
from tasks.llm.cost import usage_of
from tasks.llm.ratelimit import RateLimiter
from tasks.mail.smtp import FileOutbox
from tasks.ops.console import Names, create_app
from tasks.runtime import Runtime, storeless
from tests.fakes.anthropic_server import CREDIT_TOO_LOW, PROMPT_TOO_LONG, FakeAnthropic
from tests.support import as_text, execute

ITEMS = [{"id": i, "title": f"Item {i}", "body": f"Body {i}."} for i in ("a", "b", "c")]
PROCESSING = 0.3  # seconds the fake takes over a batch
LOOK = 0.2  # DIGEST_BATCH_FIRST_LOOK


class BatchDigest:
    """One deployment in this process, its model requests by batch unless told otherwise."""

    def __init__(
        self, client: redis.Redis, prefix: str, tmp_path: Path, fake: FakeAnthropic
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.fake = fake
        self.items = tmp_path / "items.json"
        self.items.write_text(json.dumps(ITEMS), encoding="utf-8")
        self.state = tmp_path / "state"
        self.journal = Journal(client, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=30))

    def runtime(self, limiter: RateLimiter | None = None, **settings: Any) -> Runtime:
        config = Config(
            state_dir=self.state,
            items_path=str(self.items),
            key_prefix=self.prefix,
            retry_base_delay=0.01,
            batch_first_look=LOOK,
            batch_max_look=1.0,
            **settings,
        )
        sdk = functools.partial(self.fake.client, timeout=5.0)
        return Runtime(
            config=config,
            client=self.client,
            journal=self.journal,
            keys=DigestKeys(self.prefix),
            summarizer=AnthropicSummarizer(
                sdk, DEFAULT_SUMMARY_MODEL, DEFAULT_INTRO_MODEL, limiter=limiter
            ),
            mailer=FileOutbox(self.state / "outbox"),
            limiter=limiter,
        )

    def finish(self, run_id: str, runtime: Runtime, *, batch: bool = True) -> Outcome:
        """Execute until the run ends, waking it at each wake-up time, as beat would."""
        for _ in range(60):
            outcome = execute(
                self.journal,
                "digest",
                run_id,
                lambda run: run_digest(run, runtime, DigestOptions(batch=batch)),
                args={"batch": batch},
            )
            if outcome.status != "waiting":
                return outcome
            assert outcome.wait is not None and outcome.wait.until is not None
            assert outcome.wait.step.startswith("sleep:look:")
            time.sleep(max(0.0, outcome.wait.until - time.time()) + 0.01)
        raise AssertionError(f"run {run_id} never ended")

    def steps(self, run_id: str) -> dict[str, Any]:
        view = inspect_run(self.journal, "digest", run_id)
        return {record.key: record.result for record in view.steps}

    def usage_hash(self, run_id: str) -> dict[str, str]:
        raw = self.client.hgetall(self.journal.keys("digest", run_id).usage)
        return {as_text(k): as_text(v) for k, v in raw.items()}


@pytest.fixture
def deployed(
    real_redis: redis.Redis, prefix: str, tmp_path: Path, fake_anthropic: FakeAnthropic
) -> BatchDigest:
    fake_anthropic.batch_processing_time = PROCESSING
    return BatchDigest(real_redis, prefix, tmp_path, fake_anthropic)


def test_the_summaries_then_the_opening_go_as_two_batches_at_half_the_price(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A system prompt long enough to cache, as a longer house style would make it.
    monkeypatch.setitem(model.CACHE_MIN_TOKENS, "claude-haiku", 10)
    monkeypatch.setitem(model.CACHE_MIN_TOKENS, "claude-sonnet", 10)
    fake_anthropic.cache_min_tokens = 10

    outcome = deployed.finish("w1", deployed.runtime())

    assert outcome.result["status"] == "sent"
    # In its last attempt, woken at its last look: the opening; the summaries came earlier.
    assert (outcome.result["model_calls"], outcome.result["batch_requests"]) == (0, 1)
    assert [len(b.requests) for b in fake_anthropic.batches] == [3, 1]
    assert fake_anthropic.calls == 0 and fake_anthropic.paid == 4
    steps = deployed.steps("w1")
    assert steps["compose:opening"]["text"] == "opening for Item a, Item b, Item c"
    summaries = [steps[f"summarize:{i['id']}"] for i in ITEMS]
    assert all(s["batch"] is True for s in summaries)
    # The first request of a batch writes the shared system prompt, every later one reads it.
    assert sum(s["cache_creation_input_tokens"] > 0 for s in summaries) == 1
    assert sum(s["cache_read_input_tokens"] > 0 for s in summaries) == 2
    usage = usage_of(steps.values())
    assert usage.calls == usage.batched == 4
    assert 0 < usage.cache_hit_ratio < 1

    # The same week, synchronously, elsewhere: the batch run cost exactly half of it.
    deployed.client.delete(DigestKeys(deployed.prefix).seen)
    fake_anthropic.forget_cache()
    sync = deployed.finish("w2", deployed.runtime(), batch=False)
    assert sync.result["model_calls"] == 4 and fake_anthropic.calls == 4
    sync_usage = usage_of(deployed.steps("w2").values())
    assert usage.cost_usd == pytest.approx(sync_usage.cost_usd / 2, rel=1e-9)
    assert sync_usage.cache_hit_ratio == pytest.approx(usage.cache_hit_ratio)


def test_a_waiting_batch_run_says_its_batch_its_counts_and_its_next_look(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    runtime = deployed.runtime()
    outcome = execute(
        deployed.journal,
        "digest",
        "w1",
        lambda run: run_digest(run, runtime, DigestOptions(batch=True)),
        args={"batch": True},
    )

    assert outcome.status == "waiting" and outcome.wait is not None
    view = inspect_run(deployed.journal, "digest", "w1")
    assert view.lease_holder is None  # nobody holds it while the batch processes
    [line] = batch_lines(view.steps, view.wait, view.effects)
    batch = fake_anthropic.batches[0].id
    assert line.startswith(f"summarize {batch} in_progress, 3 requests (3 processing); looks")


def test_the_console_shows_a_waiting_runs_batch_on_both_pages(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    runtime = deployed.runtime()
    execute(
        deployed.journal,
        "digest",
        "w1",
        lambda run: run_digest(run, runtime, DigestOptions(batch=True)),
        args={"batch": True},
    )
    client = create_app(runtime, Names.bound("127.0.0.1", 80)).test_client()
    batch = fake_anthropic.batches[0].id

    listed = client.get("/").get_data(as_text=True)
    page = client.get("/runs/w1").get_data(as_text=True)

    shown = f"summarize {batch} in_progress, 3 requests (3 processing); looks next at"
    assert f"batch {shown}" in listed
    assert f'<dd class="batch">{shown}' in page


def test_a_batch_of_one_request_is_counted_in_the_singular(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    deployed.finish("w1", deployed.runtime())
    view = inspect_run(deployed.journal, "digest", "w1")

    summaries, opening = batch_lines(view.steps, view.wait, view.effects)

    assert ", 3 requests (3 succeeded)" in summaries
    assert opening.startswith("compose ") and ", 1 request (1 succeeded)" in opening


def test_a_creation_the_api_refuses_for_its_queue_waits_its_retry_after_then_creates_once(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.queue_limit = 3
    client = fake_anthropic.client()
    client.messages.batches.create(  # another run's batch fills the queue for 0.3 s
        requests=[
            {"custom_id": f"x{n}", "params": runtime_params(n)}  # type: ignore[typeddict-item]
            for n in range(3)
        ]
    )

    outcome = deployed.finish("w1", deployed.runtime())

    assert outcome.result["status"] == "sent"
    assert [len(b.requests) for b in fake_anthropic.batches] == [3, 3, 1]  # refused, not made
    assert fake_anthropic.calls == 0


def runtime_params(n: int) -> dict[str, Any]:
    return {
        "model": DEFAULT_SUMMARY_MODEL,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"other {n}"}],
    }


def test_a_batch_run_replays_without_a_key_as_it_ran(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = deployed.finish("w1", deployed.runtime())
    recorded = fixture.export(deployed.journal, "digest", "w1")
    requests = (len(fake_anthropic.batches), fake_anthropic.calls)
    monkeypatch.delenv("ANTHROPIC_API_KEY")  # a laptop's check-replay: nothing to batch with

    with storeless():
        replayed = replay(digest, recorded)

    assert replayed.ran == () and replayed.result["status"] == "sent"
    assert replayed.result["model_calls"] == 0 and "batch_requests" not in replayed.result
    assert ran.result["receipt"] == replayed.result["receipt"]
    assert (len(fake_anthropic.batches), fake_anthropic.calls) == requests


def test_an_item_refused_in_the_batch_is_skipped_and_an_expired_one_asked_synchronously(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_when('title="Item a"', 400, message=PROMPT_TOO_LONG)
    fake_anthropic.expire_when("Body c.")  # the summary's prompt alone

    outcome = deployed.finish("w1", deployed.runtime())

    assert outcome.result["status"] == "sent" and outcome.result["items"] == 2
    [skipped] = outcome.result["skipped"]
    assert skipped["id"] == "a"
    assert skipped["error"].startswith(
        "the model refused this item: the prompt is too long for model claude-haiku-5-5 (the "
        "Anthropic Message Batches API answered in a batch invalid_request_error: prompt is too"
    )
    assert fake_anthropic.calls == 1  # "c", asked synchronously once its batch request expired
    steps = deployed.steps("w1")
    assert steps["summarize:c"].get("batch") is None and steps["summarize:b"]["batch"] is True


def test_an_account_refused_in_the_batch_fails_the_run_loudly(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(400, message=CREDIT_TOO_LOW)

    with pytest.raises(ModelRefused, match="the Anthropic account's credit balance is too low"):
        deployed.finish("w1", deployed.runtime())

    assert fake_anthropic.calls == 0 and len(fake_anthropic.batches) == 1
    assert deployed.journal.meta(deployed.journal.keys("digest", "w1"))["status"] == "failed"


def test_the_budget_holds_a_batch_whole_and_settles_it_once_from_its_results(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    runtime = deployed.runtime(max_cost_usd=1.0)

    outcome = deployed.finish("w1", runtime)
    again = deployed.finish("w1", runtime)  # already done: nothing is settled twice

    assert outcome.result["status"] == "sent" and again.status == "already-done"
    usage = deployed.usage_hash("w1")
    assert not [name for name in usage if name.startswith("r:")]  # every hold settled
    assert {"settled:summarize", "settled:compose"} <= set(usage)
    spent = int(usage["spent"]) / 1e9
    journaled = usage_of(deployed.steps("w1").values()).cost_usd
    assert spent == pytest.approx(journaled, abs=2e-9)  # rounded up per settlement


def test_a_budget_too_small_for_the_batch_stops_before_it_is_created(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    from tasks.llm.cost import BudgetExceeded

    with pytest.raises(BudgetExceeded, match="stopped before batch-summarize-1"):
        deployed.finish("w1", deployed.runtime(max_cost_usd=0.0001))

    assert fake_anthropic.batches == [] and fake_anthropic.calls == 0


def test_batch_traffic_takes_nothing_from_the_shared_rate_limiter(
    deployed: BatchDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.expire_when("Body c.")  # the summary's prompt alone
    keys = DigestKeys(deployed.prefix)
    limiter = RateLimiter(deployed.client, keys, "acct", wait_over=30)

    deployed.finish("w1", deployed.runtime(limiter=limiter))

    [haiku] = limiter.states([DEFAULT_SUMMARY_MODEL])
    assert haiku.calls == 1  # the one synchronous fallback; the batch's three took nothing
    assert limiter.states([DEFAULT_INTRO_MODEL]) == []

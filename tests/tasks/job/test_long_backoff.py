"""A model call told to come back in two minutes: the run suspends instead of holding a worker.

In-process, on a deployment's store, with the real SDK against the fake API: a ``retry-after``
longer than ``DIGEST_LONG_BACKOFF`` becomes a durable wait in the due index, and the due sweep
(a Celery app running its tasks eagerly) resumes the run once a movable clock passes it.
"""

from __future__ import annotations

import time
import uuid

import pytest
from celery import Celery

from journal import Journal, ManualClock, Run, workflow
from journal._clock import millis
from journal._schema.meta import Wait
from journal.integrations.celery import Durable
from journal.ops.views import inspect_run
from tasks.job.workflow import DigestOptions, run_digest
from tasks.llm.client import AnthropicSummarizer
from tasks.runtime import Runtime
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import RUN, TITLES, Deployment, execute, only_index

# The deployment's embedded server is a process of its own.
pytestmark = pytest.mark.slow

RETRY_AFTER = 120


def summary_calls(fake: FakeAnthropic) -> list[int]:
    """Summary requests per item, in item order (the intro's prompt lists every title too)."""
    asked = [r.text for r in fake.requests if "<updates>" not in r.text]
    return [sum(text.startswith(f'<update title="{title}">') for text in asked) for title in TITLES]


@pytest.fixture
def runtime(
    deployment: Deployment, fake_anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> Runtime:
    """The deployment's runtime on the fake API, its journal on a clock the test moves."""
    for name, value in fake_anthropic.env().items():
        monkeypatch.setenv(name, value)
    deployment.env["DIGEST_CONCURRENCY"] = "1"  # which summaries ran before the 429 is then fixed
    built = deployment.runtime()
    assert isinstance(built.summarizer, AnthropicSummarizer)
    assert built.config.long_backoff == 30
    # The shared rate limiter would hold every call for the 429's retry-after on the store's
    # clock, which this test does not move: it checks the journal's durable wait alone.
    config = built.config
    built.summarizer = AnthropicSummarizer.from_env(
        config.model_timeout, config.summary_model, config.intro_model
    )
    built.journal = Journal(
        built.client,
        keyspace=built.journal.keyspace,
        settings=built.journal.settings,
        clock=ManualClock(time.time()),
    )
    return built


def sweeper(runtime: Runtime) -> Durable:
    """The digest workflow and the due sweep on an app that runs what it enqueues at once."""
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://")
    app.conf.task_always_eager = True
    # Below the 120 s wait, so the sweep alone wakes the run (an eager app ignores countdowns).
    durable = Durable(app, lambda: runtime.journal, max_countdown=60)

    @workflow("digest", options=DigestOptions)
    def digest(run: Run, options: DigestOptions) -> dict[str, object]:
        return run_digest(run, runtime, options)

    durable.register(digest, task_name="t.digest")

    return durable


def test_a_long_retry_after_suspends_the_run_and_the_sweep_retries_it_later(
    runtime: Runtime, deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    journal = runtime.journal
    clock = journal.clock
    assert isinstance(clock, ManualClock)
    t0 = clock.now()
    keys = journal.keys("digest", RUN)
    fake_anthropic.fail_next(
        429, headers={"retry-after": str(RETRY_AFTER)}, contains='<update title="Faster search">'
    )

    started = time.monotonic()
    first = execute(
        journal, "digest", RUN, lambda run: run_digest(run, runtime, DigestOptions(**run.args))
    )
    # Returned without sleeping out the retry-after (the first call also imports the SDK).
    assert time.monotonic() - started < RETRY_AFTER / 4

    assert first.status == "waiting"
    assert first.wait is not None
    assert (first.wait.kind, first.wait.step, first.wait.until, first.wait.attempt) == (
        "retry",
        "summarize:i2",
        t0 + RETRY_AFTER,
        1,
    )
    assert "429" in first.wait.reason
    assert clock.slept == []
    view = inspect_run(journal, "digest", RUN)
    assert (view.status, view.lease_holder, view.wait) == ("waiting", None, first.wait)
    assert journal.client.zscore(only_index(journal).due, keys.run) == millis(t0 + RETRY_AFTER)
    # One summary at a time: i1 was recorded, i2 was told to wait, i3..i8 never started.
    assert [s.key for s in view.steps] == ["select", "summarize:i1"]
    assert summary_calls(fake_anthropic) == [1, 1, 0, 0, 0, 0, 0, 0]
    assert deployment.outbox() == []

    durable = sweeper(runtime)
    clock.advance(RETRY_AFTER - 1)
    assert durable.sweep() == 0
    clock.advance(1)
    assert durable.sweep() == 1

    done = inspect_run(journal, "digest", RUN)
    assert done.status == "done"
    assert journal.meta(keys)["deliveries"] == "1"
    retried = done.step("summarize:i2")
    assert retried is not None and retried.attempt == 2
    assert retried.result["text"] == "summary of Faster search"
    assert all(s.attempt == 1 for s in done.steps if s.key != "summarize:i2")
    assert summary_calls(fake_anthropic) == [2 if t == "Faster search" else 1 for t in TITLES]
    assert fake_anthropic.calls == 10  # 8 summaries, the one retry, the opening
    assert len(deployment.outbox()) == 1
    assert journal.client.zscore(only_index(journal).due, keys.run) is None


@pytest.mark.parametrize(
    "retry_after", ["999999999", "1e300", "Fri, 31 Dec 2100 23:59:59 GMT"], ids=str.split
)
def test_an_enormous_retry_after_is_capped_at_max_retry_after(
    runtime: Runtime, fake_anthropic: FakeAnthropic, retry_after: str
) -> None:
    journal = runtime.journal
    clock = journal.clock
    assert isinstance(clock, ManualClock)
    assert runtime.config.max_retry_after == 3600  # DIGEST_MAX_RETRY_AFTER's default
    fake_anthropic.fail_next(
        429, headers={"retry-after": retry_after}, contains='<update title="Faster search">'
    )

    first = execute(
        journal, "digest", RUN, lambda run: run_digest(run, runtime, DigestOptions(**run.args))
    )

    assert first.status == "waiting"
    assert first.wait is not None
    assert (first.wait.kind, first.wait.step) == ("retry", "summarize:i2")
    # An hour from the 429, not decades: the run is retried today. (The clock stands still
    # but for the back-offs slept, should an earlier attempt of the call have failed.)
    assert first.wait.until == clock.now() + 3600
    keys = journal.keys("digest", RUN)
    assert journal.client.zscore(only_index(journal).due, keys.run) == millis(clock.now() + 3600)


def test_a_delivery_before_the_back_off_ends_waits_again_without_calling_the_model(
    runtime: Runtime, fake_anthropic: FakeAnthropic
) -> None:
    journal = runtime.journal
    clock = journal.clock
    assert isinstance(clock, ManualClock)
    t0 = clock.now()
    fake_anthropic.fail_next(
        429, headers={"retry-after": str(RETRY_AFTER)}, contains='<update title="Faster search">'
    )
    durable = sweeper(runtime)
    task = durable.tasks["digest"]

    assert task.delay(RUN).get()["status"] == "waiting"
    clock.advance(RETRY_AFTER / 2)
    again = task.delay(RUN).get()  # a duplicate delivery, or someone enqueued it by hand

    assert again["status"] == "waiting"
    assert fake_anthropic.calls == 2
    wait = inspect_run(journal, "digest", RUN).wait
    assert wait is not None and "429" in wait.reason
    # An earlier call's own quick retry (a slow machine's timeout) moves the manual clock by
    # milliseconds; what matters is that the wait still ends at the first retry-after.
    assert wait == Wait("retry", "summarize:i2", until=wait.until, attempt=1, reason=wait.reason)
    assert wait.until == pytest.approx(t0 + RETRY_AFTER, abs=1)

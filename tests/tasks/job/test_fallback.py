"""A fallback chain per call kind, through the real SDK against the fake API.

``DIGEST_SUMMARY_MODEL=claude-haiku-5-5,claude-sonnet-5-5``: the primary answers 529 to every
call, so each summary moves to the fallback once the primary has failed its attempts, and the
journal records the model that answered. The fake counts calls per model; nothing of ours is
patched. A refusal (a 400) is never a reason to ask the next model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from journal import Journal, Keyspace, Settings
from journal.ops.views import inspect_run
from tasks.config import Config
from tasks.errors import ModelRefused, ModelUnavailable
from tasks.job.workflow import run_digest
from tasks.ops.cli.render import render_view
from tasks.runtime import Runtime
from tasks.worker import metrics
from tests.fakes.anthropic_server import PROMPT_TOO_LONG, FakeAnthropic
from tests.support import counted_by, execute, fake_api_runtime

ITEMS = [{"id": i, "title": f"Item {i}", "body": f"Body {i}."} for i in ("a", "b", "c")]
PRIMARY = "claude-haiku-5-5"
FALLBACK = "claude-sonnet-5-5"
# The step's attempts on one model before the next is asked (``model_retry_policy``).
ATTEMPTS = 5


@pytest.fixture
def items_file(tmp_path: Path) -> Path:
    path = tmp_path / "items.json"
    path.write_text(json.dumps(ITEMS), encoding="utf-8")
    return path


@pytest.fixture
def runtime(
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    items_file: Path,
    fake_anthropic: FakeAnthropic,
) -> Runtime:
    """Summaries from the primary, then the fallback; the opening from the fallback alone."""
    config = Config(
        state_dir=tmp_path / "state",
        items_path=str(items_file),
        key_prefix=prefix,
        summary_model=f"{PRIMARY},{FALLBACK}",
        intro_model=FALLBACK,
        concurrency=1,
        retry_base_delay=0.01,
    )
    config.check()
    journal = Journal(real_redis, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=2))
    return fake_api_runtime(config, real_redis, journal, fake_anthropic)


def fallbacks_from(model: str) -> float:
    """``digest_model_fallbacks_total{model}`` as this process counted it."""
    return counted_by(metrics.FALLBACKS, model=model)


def answered_by(runtime: Runtime, run_id: str) -> dict[str, str]:
    """The model each summary step's recorded answer names (a skipped item has none)."""
    view = inspect_run(runtime.journal, "digest", run_id)
    return {
        step.key: step.result["model"]
        for step in view.steps
        if step.key.startswith("summarize:") and "model" in step.result
    }


def test_an_overloaded_primary_falls_back_and_the_journal_names_the_fallback(
    runtime: Runtime, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(529, model=PRIMARY)
    fell_back = fallbacks_from(PRIMARY)

    outcome = execute(runtime.journal, "digest", "w1", lambda run: run_digest(run, runtime))

    assert outcome.result["status"] == "sent"
    assert fallbacks_from(PRIMARY) == fell_back + 3  # the metric: one per item given up on
    # Each item: five 529s from the primary, then one answer from the fallback; the opening.
    assert fake_anthropic.calls_per_model() == {PRIMARY: 3 * ATTEMPTS, FALLBACK: 3 + 1}
    assert answered_by(runtime, "w1") == dict.fromkeys(
        ("summarize:a", "summarize:b", "summarize:c"), FALLBACK
    )
    view = inspect_run(runtime.journal, "digest", "w1")
    summary = view.step("summarize:a")
    assert summary is not None
    # Priced as the model that answered (sonnet: $3 in, $15 out per million tokens).
    tokens = (summary.result["input_tokens"], summary.result["output_tokens"])
    assert summary.result["cost_usd"] == pytest.approx((tokens[0] * 3 + tokens[1] * 15) / 1e6)
    assert summary.attempt == ATTEMPTS + 1
    shown = render_view(view).splitlines()
    [line] = [line for line in shown if line.startswith("summarize:a ")]
    assert line.endswith(f"[{FALLBACK}] summary of Item a")  # digest show names who answered


def test_a_resumed_run_never_asks_the_primary_again_for_what_the_fallback_answered(
    runtime: Runtime, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(529, model=PRIMARY)
    # The opening's one model is overloaded past its attempts: the run fails after summaries.
    fake_anthropic.fail_next(529, times=ATTEMPTS, contains="<updates>")

    with pytest.raises(ModelUnavailable, match="compose: the model API kept failing"):
        execute(runtime.journal, "digest", "w2", lambda run: run_digest(run, runtime))
    assert fake_anthropic.calls_per_model() == {PRIMARY: 3 * ATTEMPTS, FALLBACK: 3 + ATTEMPTS}

    resumed = execute(runtime.journal, "digest", "w2", lambda run: run_digest(run, runtime))

    assert resumed.result["status"] == "sent"
    assert resumed.result["model_calls"] == 1  # the opening: every summary replayed
    assert fake_anthropic.calls_per_model() == {PRIMARY: 3 * ATTEMPTS, FALLBACK: 3 + ATTEMPTS + 1}
    assert answered_by(runtime, "w2") == dict.fromkeys(
        ("summarize:a", "summarize:b", "summarize:c"), FALLBACK
    )


def test_a_refusal_by_the_primary_is_not_a_reason_to_fall_back(
    runtime: Runtime, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_when("Body b.", 400, message=PROMPT_TOO_LONG, model=PRIMARY)

    outcome = execute(runtime.journal, "digest", "w3", lambda run: run_digest(run, runtime))

    assert outcome.result["status"] == "sent"
    assert fake_anthropic.calls_per_model() == {PRIMARY: 3, FALLBACK: 1}  # the opening only
    assert answered_by(runtime, "w3") == {"summarize:a": PRIMARY, "summarize:c": PRIMARY}


def test_a_bad_request_from_the_primary_fails_the_run_without_the_fallback(
    runtime: Runtime, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(400, model=PRIMARY)

    with pytest.raises(ModelRefused, match="the API refused the request for model claude-haiku"):
        execute(runtime.journal, "digest", "w4", lambda run: run_digest(run, runtime))

    assert fake_anthropic.calls_per_model() == {PRIMARY: 1}

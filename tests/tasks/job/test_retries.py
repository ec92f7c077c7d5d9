"""Transient model errors through the real SDK: retried per step, counted, and resumed from.

The SDK's own retries are off, so every attempt is one HTTP request the fake server counts and
one attempt the step's record keeps. Item prompts carry the item's body, which the opening
paragraph's prompt does not: ``calls_for("Body b.")`` counts the summary calls for b only.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from journal import Journal, Keyspace, Settings
from journal.ops.views import inspect_run
from tasks.config import DEFAULT_INTRO_MODEL, DEFAULT_SUMMARY_MODEL, Config
from tasks.job.workflow import run_digest
from tasks.keys import DigestKeys
from tasks.llm.client import AnthropicSummarizer
from tasks.mail.smtp import FileOutbox
from tasks.runtime import Runtime
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment, execute

ITEMS = [{"id": i, "title": f"Item {i}", "body": f"Body {i}."} for i in ("a", "b", "c")]


@pytest.fixture
def items_file(tmp_path: Path) -> Path:
    path = tmp_path / "items.json"
    path.write_text(json.dumps(ITEMS), encoding="utf-8")
    return path


def arrivals(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, str]]:
    """Record when each request reached the server, with its prompt text."""
    seen: list[tuple[float, str]] = []
    lock = threading.Lock()
    answer = fake.respond

    def stamped(path: str, headers: Any, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        with lock:
            seen.append((time.monotonic(), raw.decode()))
        return answer(path, headers, raw)

    monkeypatch.setattr(fake, "respond", stamped)
    return seen


@pytest.mark.parametrize(
    ("status", "headers", "gap"),
    [(429, {"retry-after": "0.2"}, 0.2), (529, {}, 0.0)],
    ids=["rate-limited", "overloaded"],
)
def test_a_transient_error_is_retried_within_the_step(
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    items_file: Path,
    fake_anthropic: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    headers: dict[str, str],
    gap: float,
) -> None:
    journal = Journal(real_redis, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=2))
    runtime = Runtime(
        config=Config(
            state_dir=tmp_path / "state",
            items_path=str(items_file),
            key_prefix=prefix,
            concurrency=1,
            retry_base_delay=0.01,
        ),
        client=real_redis,
        journal=journal,
        keys=DigestKeys(prefix),
        summarizer=AnthropicSummarizer(
            functools.partial(fake_anthropic.client, timeout=5.0),
            DEFAULT_SUMMARY_MODEL,
            DEFAULT_INTRO_MODEL,
        ),
        mailer=FileOutbox(tmp_path / "state" / "outbox"),
    )
    seen = arrivals(fake_anthropic, monkeypatch)
    fake_anthropic.fail_next(status, times=2, headers=headers, contains="Body b.")

    outcome = execute(journal, "digest", "w1", lambda run: run_digest(run, runtime))
    assert outcome.result["status"] == "sent"
    assert outcome.result["model_calls"] == 6  # a, b three times, c, compose
    assert fake_anthropic.calls == 6
    assert fake_anthropic.calls_for("Body b.") == 3
    assert [r.status for r in fake_anthropic.requests] == [200, status, status, 200, 200, 200]
    steps = {r.key: r.attempt for r in inspect_run(journal, "digest", "w1").steps}
    assert steps["summarize:b"] == 3
    assert {key for key, attempt in steps.items() if attempt != 1} == {"summarize:b"}

    tries = [at for at, text in seen if "Body b." in text]
    assert len(tries) == 3
    assert tries[1] - tries[0] >= gap
    assert tries[2] - tries[1] >= gap


@pytest.mark.slow
def test_a_step_that_keeps_failing_fails_the_run_and_a_later_run_resumes_from_it(
    deployment: Deployment, fake_anthropic: FakeAnthropic, items_file: Path
) -> None:
    deployment.env.update(
        fake_anthropic.env(), DIGEST_ITEMS=str(items_file), DIGEST_CONCURRENCY="1"
    )
    fake_anthropic.fail_next(429, times=5, contains="Body b.")
    failed = deployment.cli("run", "w1")
    assert failed.returncode == 1
    [line] = failed.stderr.splitlines()
    assert line.startswith(
        "failed: run digest:w1 failed (ModelUnavailable: summarize: the model API kept failing "
        "after 5 attempts (RateLimitError: "
    )
    assert "; the due sweep retries it at " in line  # transient: the system retries it
    assert fake_anthropic.calls_for("Body b.") == 5
    assert fake_anthropic.calls == 6  # a, then b five times; c never started
    view = deployment.view("w1")
    assert view.status == "retrying"
    assert view.meta["last_error"].startswith("ModelUnavailable: summarize: the model API kept")
    assert [r.key for r in view.steps] == ["select", "summarize:a"]
    assert view.lease_holder is None
    assert deployment.outbox() == []

    fake_anthropic.clear_faults()
    resumed = deployment.cli("run", "w1")
    assert resumed.returncode == 0
    assert resumed.stdout == (
        "  replayed select\n"
        "  replayed summarize:a\n"
        "  ran      summarize:b\n"
        "  ran      summarize:c\n"
        "  ran      compose\n"
        "  ran      send\n"
        "  ran      mark-seen\n"
        "  ran      done\n"
        "sent: 3 items, 3 model calls in this attempt, email sent (digest-w1)\n"
    )
    assert fake_anthropic.calls == 9
    assert fake_anthropic.calls_for("Body a.") == 1
    assert [p.name for p in deployment.outbox()] == ["digest-w1.json"]
    finished = deployment.view("w1")
    assert finished.status == "done"
    assert "last_error" not in finished.meta

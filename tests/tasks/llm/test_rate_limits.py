"""One rate limiter for every process on an API key, against the fake API's enforced limits.

Two real workers and a ``digest run`` share the limits through Redis: together they keep to
the API's pace without being refused. In-process, a wait longer than a step may block becomes
the step's durable wait, as a long ``retry-after`` does.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import anthropic
import pytest
import redis
from prometheus_client import generate_latest

from tasks.config import Config
from tasks.config.limits import Overrides
from tasks.errors import BadInput
from tasks.keys import DigestKeys
from tasks.llm.client import is_transient, retry_after_seconds
from tasks.llm.ratelimit import CapacityWait, NoRoomByDeadline, RateLimiter, account_of
from tasks.worker.metrics import store_registry
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import ROOT, Deployment, wait_until
from tests.tasks.worker.test_metrics import free_port, scrape

RATE = 4  # requests a second, a burst of 4
ITEMS = 12


def items_file(directory: Path, tag: str) -> Path:
    """``ITEMS`` updates of the shipped week, under ids and titles of this tag's own."""
    shipped = json.loads((ROOT / "data" / "items.json").read_text())
    items = [
        {**shipped[n % len(shipped)], "id": f"{tag}{n}", "title": f"{tag} update {n}"}
        for n in range(ITEMS)
    ]
    path = directory / f"items-{tag}.json"
    path.write_text(json.dumps(items))
    return path


@pytest.mark.slow
def test_two_workers_and_a_command_line_share_one_limit_and_are_not_refused(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrivals: list[float] = []
    with FakeAnthropic(delay=0.1, log=lambda line: arrivals.append(time.monotonic())) as fake:
        fake.limit(requests=RATE, per=1)
        deployment.env.update(fake.env(), DIGEST_LEASE_TTL="10")
        port = free_port()
        for name in ("a", "b"):  # one run each: each worker's week is its own items file
            env = {"DIGEST_ITEMS": str(items_file(tmp_path, name))}
            if name == "a":
                env["DIGEST_METRICS_PORT"] = str(port)
            deployment.worker(name, concurrency=1, env=env)
        for week in ("2026-w40", "2026-w41"):
            assert deployment.cli("enqueue", week).returncode == 0

        here = deployment.cli("run", "2026-w42", "--items", str(items_file(tmp_path, "c")))

        assert here.returncode == 0, here.stderr
        weeks = ("2026-w40", "2026-w41", "2026-w42")
        wait_until(
            lambda: all(deployment.view(w).status == "done" for w in weeks), 60, "every week"
        )

    calls = 3 * (ITEMS + 1)
    assert fake.answered() == calls
    assert fake.refused == 0  # before the shared limiter: a dozen and more
    # The summaries kept to the limit's pace, and did not go much slower either.
    summaries = sorted(t for t, r in zip(arrivals, fake.requests, strict=True) if r.status == 200)
    span = summaries[-1] - summaries[0]
    assert (calls - RATE - 1) / RATE * 0.95 <= span

    # Visible: the shared limits' state and what waiting on them cost, in show and metrics.
    shown = deployment.cli("show", "2026-w42").stdout
    [line] = [x for x in shown.splitlines() if x.startswith("limits   claude-haiku-5-5: ")]
    found = re.fullmatch(
        r"limits   claude-haiku-5-5: (\d+) calls, ([\d.]+) s waited for room, 0 refused \(429\); "
        r"requests 240/min \(burst [34], \d left at the last answer\)",
        line,
    )
    assert found, shown
    assert int(found.group(1)) == 3 * ITEMS
    assert float(found.group(2)) > 1  # the calls waited for room rather than being refused
    waited = scrape(port)[
        ("digest_model_capacity_wait_seconds_total", (("model", "claude-haiku-5-5"),))
    ]
    assert 0 < waited <= float(found.group(2))  # worker a's share of the wait
    # Each call's wait for room is journalled with its step, for the run page's waterfall.
    recorded = [
        r.result.get("waited_ms", 0)
        for week in weeks
        for r in deployment.view(week).steps
        if r.key.startswith("summarize:")
    ]
    assert len(recorded) == 3 * ITEMS
    assert sum(recorded) / 1000 == pytest.approx(float(found.group(2)), abs=0.1)
    # The limits themselves come from the one exporter that reads the store.
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    runtime = deployment.runtime()
    exported = generate_latest(store_registry(lambda: runtime.journal, None, runtime.limit_states))
    assert (
        b'digest_model_limit_per_minute{kind="requests",model="claude-haiku-5-5"} 240.0' in exported
    )


@pytest.mark.slow  # the shared Valkey
def test_a_wait_longer_than_a_step_may_block_is_handed_to_the_retry_policy(
    real_redis: redis.Redis, prefix: str
) -> None:
    with FakeAnthropic() as fake:
        fake.fail_next(429, headers={"retry-after": "120"})  # no ratelimit headers: a hold
        limiter = RateLimiter(
            real_redis, DigestKeys(prefix), account_of(fake.url, "k"), wait_over=30
        )
        take = limiter.take("claude-haiku-5-5", 100, 1024)
        client = fake.client()
        try:
            client.messages.create(
                model="claude-haiku-5-5", max_tokens=8, messages=[{"role": "user", "content": "x"}]
            )
        except anthropic.RateLimitError as refused:
            wait = retry_after_seconds(refused)
            limiter.settle(take, refused.response.headers, refused=True, retry_after=wait)

        with pytest.raises(CapacityWait) as waiting:
            limiter.take("claude-haiku-5-5", 100, 1024)

    assert 115 < waiting.value.seconds <= 120
    assert is_transient(waiting.value)
    assert retry_after_seconds(waiting.value) == waiting.value.seconds
    state = limiter.state("claude-haiku-5-5")
    assert state is not None
    assert (state.refused, state.calls, state.kinds) == (1, 1, {})


@pytest.mark.slow  # the shared Valkey
def test_an_operators_override_sets_a_limit_without_asking_the_api(
    real_redis: redis.Redis, prefix: str
) -> None:
    overrides = Overrides.from_env({"DIGEST_RATE_LIMITS": '{"m": {"requests": 2}}'})
    limiter = RateLimiter(
        real_redis, DigestKeys(prefix), account_of("http://api", "k"), 5, overrides
    )

    limiter.take("m", 10, 100)
    limiter.take("m", 10, 100)  # no probe: the override is known before any answer
    with pytest.raises(CapacityWait) as waiting:
        limiter.take("m", 10, 100)

    assert 25 < waiting.value.seconds <= 30  # 2 a minute: the next in 30 s
    limiter.take("other", 10, 100)  # another model is not limited by it


@pytest.mark.slow  # the shared Valkey
def test_a_wait_for_room_past_the_runs_deadline_ends_at_it(
    real_redis: redis.Redis, prefix: str
) -> None:
    overrides = Overrides.from_env({"DIGEST_RATE_LIMITS": '{"m": {"requests": 1}}'})
    now = 1_800_000_000.0
    slept: list[float] = []

    def limiter(wait_over: float) -> RateLimiter:
        account = account_of("http://api", "k")
        return RateLimiter(
            real_redis, DigestKeys(prefix), account, wait_over, overrides, slept.append, lambda: now
        )

    limiter(120).take("m", 10, 100)  # the minute's one request
    with pytest.raises(NoRoomByDeadline):
        limiter(120).take("m", 10, 100, until=now + 10)
    assert slept == [10.0]  # up to the deadline, not the minute to the room

    # The deadline further than a worker may wait: suspended durably, woken by the deadline.
    with pytest.raises(CapacityWait):
        limiter(5).take("m", 10, 100, until=now + 10)
    assert slept == [10.0]


@pytest.mark.parametrize(
    "text",
    ["{", '{"m": {"requests": 0}}', '{"m": {"rpm": 5}}', '{"m": 5}', '{"m": {"requests": 1.5}}'],
)
def test_a_bad_override_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(BadInput, match=r"^DIGEST_RATE_LIMITS: ") as refused:
        Config.from_env({"DIGEST_RATE_LIMITS": text})
    assert "\n" not in str(refused.value)

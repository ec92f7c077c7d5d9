"""While a model's limits are unlearned, a process's calls wait for its own probe's answer.

Until the first answer teaches the limits, one call at a time asks the API; the store tells the
others to ask again every 50 ms. Against a real API that answers in about a second, that is
some twenty asks per waiting call. Calls of the process whose own call probes wait for its
answer in the process instead, and then ask once each.
"""

from __future__ import annotations

import threading

import redis

from tasks.keys import DigestKeys
from tasks.llm.ratelimit import RateLimiter, account_of
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import round_trips

MODEL = "claude-haiku-5-5"
CALLS = 3


def test_a_processs_calls_wait_for_its_own_probe_then_ask_once_each(
    own_redis_url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(own_redis_url)
    probing = threading.Event()
    with FakeAnthropic(delay=0.5) as fake:
        fake.limit(requests=100, per=60)
        limiter = RateLimiter(client, DigestKeys(prefix), account_of(fake.url, "k"), wait_over=30)
        api = fake.client()
        limiter.settle(limiter.take("warm-up", 1, 1), {})  # the scripts are loaded: not counted

        def call() -> None:
            take = limiter.take(MODEL, 100, 1024)
            if take.probe:
                probing.set()
            raw = api.messages.with_raw_response.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}]
            )
            message = raw.parse()
            limiter.settle(
                take, raw.headers, used=(message.usage.input_tokens, message.usage.output_tokens)
            )

        def calls_at_once() -> None:
            first = threading.Thread(target=call)
            first.start()
            assert probing.wait(5)  # the others come while the first probes
            others = [threading.Thread(target=call) for _ in range(CALLS - 1)]
            for thread in others:
                thread.start()
            for thread in [first, *others]:
                thread.join(10)

        sent = round_trips(client, calls_at_once)

    assert fake.answered() == CALLS
    reserves = [command for command in sent if command.startswith("EVALSHA")]
    # Each call's take and settle, and one more ask each for the two that met the probe.
    assert len(reserves) == 2 * CALLS + (CALLS - 1), sent
    client.close()

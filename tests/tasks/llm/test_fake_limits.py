"""The fake API enforces rate limits the way the real one describes them, with its headers.

The rest of the limits' tests (the limiter, the bench) trust these answers, so they are checked
here with the real SDK: a burst, the refusal past it, and the headers that describe both.
"""

from __future__ import annotations

import time
from datetime import datetime

import anthropic
import pytest
from anthropic.types import Message

from tests.fakes.anthropic_server import FakeAnthropic


def ask(client: anthropic.Anthropic, words: int = 3) -> anthropic.APIResponse[Message]:
    return client.messages.with_raw_response.create(
        model="claude-haiku-5-5",
        max_tokens=16,
        messages=[{"role": "user", "content": " ".join(["word"] * words)}],
    )


def test_a_burst_passes_the_next_call_is_refused_with_the_real_headers() -> None:
    with FakeAnthropic() as fake:
        fake.limit(requests=4, per=1)
        client = fake.client()
        remaining = [
            int(ask(client).headers["anthropic-ratelimit-requests-remaining"]) for _ in range(4)
        ]
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(client)

    assert remaining == [3, 2, 1, 0]
    headers = refused.value.response.headers
    assert refused.value.type == "rate_limit_error"
    assert headers["retry-after"] == "1"  # whole seconds, rounded up, as the real API says
    assert headers["anthropic-ratelimit-requests-limit"] == "240"  # 4 a second, per minute
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"])
    assert 0 < reset.timestamp() - time.time() <= 1.0  # four calls' worth, at 4 a second
    assert (fake.refused, fake.answered(), fake.calls) == (1, 4, 5)


def test_input_tokens_bind_before_requests_and_refill_at_their_rate() -> None:
    with FakeAnthropic() as fake:
        fake.limit(requests=100, input_tokens=20, per=1)
        client = fake.client()
        first = ask(client, words=12)
        with pytest.raises(anthropic.RateLimitError):
            ask(client, words=12)
        time.sleep(0.7)  # 14 tokens back: 8 + 14 >= 12
        ask(client, words=12)

    assert first.headers["anthropic-ratelimit-input-tokens-remaining"] == "8"
    assert first.headers["anthropic-ratelimit-requests-remaining"] == "99"
    assert fake.refused == 1


def test_an_alias_is_answered_with_a_dated_id_and_cache_usage() -> None:
    with FakeAnthropic() as fake:
        fake.dated_models = {"claude-haiku-5-5": "claude-haiku-5-5-20261001"}
        fake.cache_tokens = (7, 11)
        message = ask(fake.client()).parse()

    assert message.model == "claude-haiku-5-5-20261001"
    usage = message.usage
    assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (7, 11)

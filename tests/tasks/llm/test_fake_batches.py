"""The fake's Message Batches API, through the official SDK (``client.messages.batches``).

What the batch step relies on, checked against the fake as the real API documents it: a batch
is ``in_progress`` with every request ``processing`` until the whole batch ends; results come
as JSONL, in no promised order, one per request with its type; a cancel ends what had not
finished as ``canceled``; the list is newest first and pages with ``after_id``; errors carry
the real bodies.
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import anthropic
import pytest
from anthropic.types import TextBlockParam
from anthropic.types.messages.batch_create_params import Request

from tests.fakes.anthropic_server import CREDIT_TOO_LOW, PROMPT_TOO_LONG, FakeAnthropic


def request(custom_id: str, text: str, system: Any = "Summarize.") -> Request:
    return cast(
        Request,
        {
            "custom_id": custom_id,
            "params": {
                "model": "claude-haiku-5-5",
                "max_tokens": 64,
                "system": system,
                "messages": [
                    {"role": "user", "content": f'<update title="{text}">\nbody\n</update>'}
                ],
            },
        },
    )


def results(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    """Each request's result by its custom_id (typed loosely: a union of four result types)."""
    entries = client.messages.batches.results(batch_id)
    return {entry.custom_id: cast(Any, entry.result) for entry in entries}


def test_a_batch_is_processing_until_it_ends_then_its_results_are_each_requests() -> None:
    with FakeAnthropic() as fake:
        fake.batch_processing_time = 0.3
        client = fake.client()
        batch = client.messages.batches.create(
            requests=[request("i1", "Dark mode"), request("i2", "Search")]
        )
        assert batch.processing_status == "in_progress"
        assert batch.request_counts.processing == 2 and batch.results_url is None
        time.sleep(0.35)

        ended = client.messages.batches.retrieve(batch.id)

        assert ended.processing_status == "ended" and ended.ended_at is not None
        assert (ended.request_counts.succeeded, ended.request_counts.processing) == (2, 0)
        answers = results(client, batch.id)
        assert set(answers) == {"i1", "i2"}
        first = answers["i1"]
        assert first.type == "succeeded"
        assert first.message.content[0].text == "summary of Dark mode"
        assert first.message.usage.output_tokens == 4
        assert fake.paid == 2 and fake.calls == 0  # batch requests are not synchronous calls


def test_every_result_type_errored_expired_canceled_with_the_real_bodies() -> None:
    with FakeAnthropic() as fake:
        fake.batch_processing_time = 1.0
        fake.fail_when("Too long", 400, message=PROMPT_TOO_LONG)
        fake.fail_when("Broke", 400, message=CREDIT_TOO_LOW)
        fake.expire_when("Slow")
        client = fake.client()
        created = client.messages.batches.create(
            requests=[
                request("a", "Too long"),
                request("b", "Broke"),
                request("c", "Slow"),
                request("d", "Fine"),
            ]
        )
        time.sleep(0.6)  # the first two of four requests have finished
        canceling = client.messages.batches.cancel(created.id)
        assert canceling.processing_status in ("canceling", "ended")

        ended = client.messages.batches.retrieve(created.id)

        assert ended.processing_status == "ended"
        counts = ended.request_counts
        assert (counts.errored, counts.canceled, counts.succeeded, counts.expired) == (2, 2, 0, 0)
        answers = results(client, created.id)
        assert answers["a"].type == "errored"
        assert answers["a"].error.error.message == PROMPT_TOO_LONG
        assert answers["a"].error.error.type == "invalid_request_error"
        assert answers["b"].error.error.message == CREDIT_TOO_LOW
        assert (answers["c"].type, answers["d"].type) == ("canceled", "canceled")
        assert fake.paid == 0

        again = client.messages.batches.create(
            requests=[request("c", "Slow"), request("d", "Fine")]
        )
        fake.end_batches_now()
        after = results(client, again.id)
        assert (after["c"].type, after["d"].type) == ("expired", "succeeded")
        assert fake.paid == 1


def test_the_list_is_newest_first_and_pages_on() -> None:
    with FakeAnthropic() as fake:
        client = fake.client()
        ids = [
            client.messages.batches.create(requests=[request(f"r{n}", "x")]).id for n in range(5)
        ]
        page = client.messages.batches.list(limit=2)
        assert [batch.id for batch in page.data] == ids[::-1][:2]
        assert [batch.id for batch in page] == ids[::-1]  # the SDK follows the pages
        assert [b.id for b in fake.batches] == ids


def test_unknown_batches_and_malformed_requests_get_the_apis_errors() -> None:
    with FakeAnthropic() as fake:
        client = fake.client()
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve("msgbatch_nope")
        with pytest.raises(anthropic.BadRequestError, match="custom_id"):
            client.messages.batches.create(requests=[request("has space", "x")])
        with pytest.raises(anthropic.BadRequestError, match="not unique"):
            client.messages.batches.create(requests=[request("a", "x"), request("a", "y")])
        fake.fail_batch_next(529)
        with pytest.raises(anthropic.InternalServerError) as overloaded:
            client.messages.batches.create(requests=[request("a", "x")])
        assert overloaded.value.type == "overloaded_error"
        fake.queue_limit = 1
        client.messages.batches.create(requests=[request("a", "x")])
        with pytest.raises(anthropic.RateLimitError) as full:
            client.messages.batches.create(requests=[request("b", "x")])
        assert full.value.response.headers["retry-after"] == "1"
        assert len(fake.batches) == 1


def test_a_held_creation_exists_before_its_answer_arrives() -> None:
    with FakeAnthropic() as fake:
        fake.hold_batch_creates()
        client = fake.client()
        answer: list[str] = []
        caller = threading.Thread(
            target=lambda: answer.append(
                client.messages.batches.create(requests=[request("a", "x")]).id
            )
        )
        caller.start()
        fake.wait_for_batches(1)
        assert answer == [] and len(fake.batches) == 1
        fake.release_batch_creates()
        caller.join(5)
        assert answer == [fake.batches[0].id]


def test_a_marked_system_prompt_long_enough_is_written_once_then_read() -> None:
    with FakeAnthropic() as fake:
        fake.cache_min_tokens = 5
        client = fake.client()
        marked: list[TextBlockParam] = [
            {
                "type": "text",
                "text": "one two three four five six",
                "cache_control": {"type": "ephemeral"},
            }
        ]
        short: list[TextBlockParam] = [
            {"type": "text", "text": "one two", "cache_control": {"type": "ephemeral"}}
        ]
        usages = [
            client.messages.create(
                model="claude-haiku-5-5",
                max_tokens=10,
                system=system,
                messages=[{"role": "user", "content": "hello there"}],
            ).usage
            for system in (marked, marked, short)
        ]
        assert [
            (u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens)
            for u in usages
        ] == [
            (2, 6, 0),
            (2, 0, 6),
            (4, 0, 0),
        ]

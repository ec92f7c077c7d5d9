"""The Anthropic Message Batches API as ``journal.batch`` calls it (``BatchApi``).

One adapter over the SDK client the synchronous calls use (``client.messages.batches``), with
their timeout and no SDK retries: the batch step's retry policy owns the attempts, as the
summaries' does. Which limits apply: a batch's creation is one request to the batch
endpoints, not a model call, so it takes nothing from the shared rate limiter's requests or
tokens; the API's own batch limits (requests per batch, requests waiting in its processing
queue) answer a creation over them with a 400 or a 429 with ``retry-after``, which the step
honours as a durable wait. The batch step keeps each batch within ``max_requests``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from journal.batch import BatchEntry, BatchState
from tasks.errors import BadInput

if TYPE_CHECKING:
    import anthropic
    from anthropic.types.messages import MessageBatch
    from anthropic.types.messages.batch_create_params import Request

# The API's own limit of requests in one batch (it also limits a batch to 256 MB).
MAX_REQUESTS = 100_000
# The list is read newest first, a page at a time, until batches older than asked for.
PAGE = 100


class AnthropicBatches:
    """The batch endpoints of one API key, through the SDK client ``client()`` builds.

    Args:
        client: the SDK client (built once, shared with the synchronous calls).
    """

    def __init__(self, client: Callable[[], anthropic.Anthropic]) -> None:
        self._client = client

    def create(self, requests: Sequence[Mapping[str, Any]]) -> BatchState:
        """One batch of ``{"custom_id", "params"}`` requests."""
        asked = cast("list[Request]", [dict(request) for request in requests])
        return state_of(self._client().messages.batches.create(requests=asked))

    def retrieve(self, batch_id: str) -> BatchState:
        """The batch now."""
        return state_of(self._client().messages.batches.retrieve(batch_id))

    def recent(self, since: float) -> Iterator[BatchState]:
        """Batches created at or after ``since``, newest first (the list's own order)."""
        for batch in self._client().messages.batches.list(limit=PAGE):
            state = state_of(batch)
            if state.created_at < since:
                return
            yield state

    def cancel(self, batch_id: str) -> BatchState:
        """Ask the API to stop processing the batch."""
        return state_of(self._client().messages.batches.cancel(batch_id))

    def results(self, batch_id: str) -> Iterable[BatchEntry]:
        """Every entry of the ended batch, read from its JSONL results."""
        for line in self._client().messages.batches.results(batch_id):
            result = line.result.model_dump(mode="json")
            kind = str(result.get("type"))
            body = result.get("message") if kind == "succeeded" else result.get("error")
            yield BatchEntry(line.custom_id, kind, body)

    def answered(self, error: BaseException) -> bool:
        """An HTTP error status: the API refused the creation, so it created nothing."""
        import anthropic

        return isinstance(error, anthropic.APIStatusError)


class NoBatches:
    """The batch API of a process with no ``ANTHROPIC_API_KEY``: a replay never calls it.

    A batch run replayed without a key (``digest check-replay`` on a laptop, a fixture) takes
    the same path as it did, its recorded steps answering; a live request fails in one line.
    """

    def create(self, requests: Sequence[Mapping[str, Any]]) -> BatchState:
        """Refuse (see the class)."""
        raise _no_key()

    def retrieve(self, batch_id: str) -> BatchState:
        """Refuse (see the class)."""
        raise _no_key()

    def recent(self, since: float) -> Iterator[BatchState]:
        """Refuse (see the class)."""
        raise _no_key()

    def cancel(self, batch_id: str) -> BatchState:
        """Refuse (see the class)."""
        raise _no_key()

    def results(self, batch_id: str) -> Iterable[BatchEntry]:
        """Refuse (see the class)."""
        raise _no_key()

    def answered(self, error: BaseException) -> bool:
        """Its own refusal: nothing was created."""
        return isinstance(error, BadInput)


def _no_key() -> BadInput:
    return BadInput(
        "ANTHROPIC_API_KEY is not set, and this run asks by Message Batches (frozen at its "
        "first start): set the key, then run it again"
    )


def state_of(batch: MessageBatch) -> BatchState:
    """The SDK's batch as the journal records it."""
    counts = batch.request_counts
    return BatchState(
        batch.id,
        batch.processing_status,
        {
            "processing": counts.processing,
            "succeeded": counts.succeeded,
            "errored": counts.errored,
            "canceled": counts.canceled,
            "expired": counts.expired,
        },
        _seconds(batch.created_at),
    )


def _seconds(when: datetime) -> float:
    return when.timestamp()

"""What a batch step records and asks its provider: shared by the engine and the views.

The engine (``journal._batch``) runs the step, with fenced effects and replay; the views
(``journal.batch``) read what it recorded. Apart, so that reading a run's batches
(``digest show``) imports none of the engine's machinery.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from journal._clock import check_doubling

# What a provider accepts as a request's custom_id (Anthropic's pattern).
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
COUNTS = ("processing", "succeeded", "errored", "canceled", "expired")
# Entry types whose item is asked synchronously: the provider did not answer it.
UNANSWERED = ("canceled", "expired")


@dataclass(frozen=True)
class BatchState:
    """A provider batch as its provider describes it.

    Attributes:
        id: the provider's batch id.
        status: ``in_progress``, ``canceling`` or ``ended``.
        counts: requests by state (``processing``, ``succeeded``, ``errored``, ``canceled``,
            ``expired``); all ``processing`` until the batch has ended.
        created_at: when the provider created it, seconds since the epoch (its clock).
    """

    id: str
    status: str
    counts: Mapping[str, int] = field(default_factory=dict)
    created_at: float = 0.0

    @property
    def ended(self) -> bool:
        """Whether processing has ended: the results can be read."""
        return self.status == "ended"

    @property
    def requests(self) -> int:
        """How many requests the batch holds."""
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        """As a step records it."""
        return {
            "id": self.id,
            "status": self.status,
            "counts": {name: int(self.counts.get(name, 0)) for name in COUNTS},
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchState:
        """Read back what ``to_json`` recorded."""
        counts = data.get("counts") or {}
        return cls(
            str(data["id"]),
            str(data["status"]),
            {name: int(counts.get(name, 0)) for name in COUNTS},
            float(data.get("created_at") or 0.0),
        )


@dataclass(frozen=True)
class BatchEntry:
    """One item's entry in an ended batch's results.

    Attributes:
        key: the request's ``custom_id``: the item's key (``custom_id(key)``).
        type: ``succeeded``, ``errored``, ``canceled`` or ``expired``.
        body: the answer (JSON): the message of a ``succeeded`` entry, the error body of an
            ``errored`` one, None otherwise.
    """

    key: str
    type: str
    body: Any = None


class BatchApi(Protocol):
    """A provider's batch endpoints, as ``Run.batch`` calls them; the application's adapter.

    Each method is one request (or one paged read), its errors the provider client's: the
    step's ``RetryPolicy`` says which are transient.
    """

    def create(self, requests: Sequence[Mapping[str, Any]]) -> BatchState:
        """Submit one batch of ``{"custom_id": KEY, "params": REQUEST}`` requests."""
        ...

    def retrieve(self, batch_id: str) -> BatchState:
        """The batch as it is now."""
        ...

    def recent(self, since: float) -> Iterable[BatchState]:
        """The batches created at or after ``since`` (seconds since the epoch), newest first."""
        ...

    def cancel(self, batch_id: str) -> BatchState:
        """Ask the provider to stop processing the batch; harmless once it has ended."""
        ...

    def results(self, batch_id: str) -> Iterable[BatchEntry]:
        """Every entry of an ended batch, in no promised order."""
        ...

    def answered(self, error: BaseException) -> bool:
        """Whether ``error`` is the provider's answer to a create: nothing was created."""
        ...


@dataclass(frozen=True)
class BatchPolicy:
    """How a batch step waits, when it gives up, and what it may ask in one batch.

    Attributes:
        first_look: seconds from the creation to the first look; doubles after each look.
        max_look: the longest wait between two looks (a ``retry-after`` may ask longer).
        deadline: seconds from the step's first plan after which a batch still processing
            is cancelled and its items asked synchronously; None waits for the provider
            (whose batches expire by themselves, after 24 h for Anthropic).
        until: an instant (seconds since the epoch, the run's clock) that ends the wait as
            ``deadline`` does, whichever comes first: a run's own deadline (``Run.wake_by``),
            which a batch in flight must not outlast. None: no such instant.
        cancel_look: seconds between looks once a deadline cancel was asked.
        cancel_grace: how long after that cancel the run waits for the batch to end before
            asking what it lacks synchronously.
        max_requests: the provider's limit of requests in one batch.
        create_timeout: seconds after its claim within which a creation may still be sent
            (the create request's own timeout must stay within it).
        skew: how far the provider's clock may be behind the run's, when looking for a batch
            an earlier holder may have created.
    """

    first_look: float = 30.0
    max_look: float = 300.0
    deadline: float | None = None
    until: float | None = None
    cancel_look: float = 5.0
    cancel_grace: float = 60.0
    max_requests: int = 100_000
    create_timeout: float = 30.0
    skew: float = 300.0

    def __post_init__(self) -> None:
        check_doubling(self, "first_look", "max_look")
        if self.max_requests < 1:
            raise ValueError("max_requests must be at least 1")


def custom_id(key: str) -> str:
    """The ``custom_id`` of the item keyed ``key``: itself, or a digest where it would not do.

    A provider takes 1-64 of ``[a-zA-Z0-9_-]``; a feed's item ids are URLs. The digest is the
    same on every attempt, so a resumed run matches the results it reads to its items.
    """
    if CUSTOM_ID.fullmatch(key):
        return key
    return "k" + hashlib.sha256(key.encode()).hexdigest()[:40]


def plan_key(prefix: str, n: int) -> str:
    """The step that plans batch ``n`` of step ``prefix``."""
    return f"plan:{prefix}-{n}"


def effect_key(prefix: str, n: int) -> str:
    """The effect that creates batch ``n`` (no colon: an effect's key is a hash field)."""
    return f"batch-{prefix}-{n}"


LOOK = "look:"


def look_key(prefix: str, n: int, k: int) -> str:
    """Look ``k`` at batch ``n``; its sleep is ``StepKey.SLEEP`` and this."""
    return f"{LOOK}{prefix}-{n}:{k}"


def cancel_key(prefix: str, n: int) -> str:
    """The deadline's cancel of batch ``n``."""
    return f"cancel:{prefix}-{n}"

"""``Run.batch``: one provider batch per step, awaited by durable sleeps, each item recorded.

Contract tests on both backends, against an in-memory provider on the run's own clock (a
``ManualClock``: every wait is a suspension the test ends by moving time, none is slept). What
each test pins is a line of ``journal.batch``'s docstring: one batch, durable looks, results
per item, the deadline's fallback, an operator's cancel, and a creation that may have
happened: adopted, its duplicates cancelled, and the window left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from journal import Journal, ManualClock, Outcome, RetryPolicy, Run
from journal.batch import BatchEntry, BatchPolicy, BatchState, batches, cancel_batches
from journal.ops.actions import cancel
from journal.ops.views import inspect_run
from tests.conftest import MakeJournal
from tests.support import execute

T0 = 1_800_000_000.0
ITEMS = ["a", "b", "c"]


class Refused(Exception):
    """The provider answered the create with an error: nothing was created."""

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("overloaded")
        self.retry_after = retry_after


class Lost(Exception):
    """No answer came back (a timeout, a dead connection): it may have been created."""


@dataclass
class Held:
    """One batch in the provider: requests finish evenly over ``processing`` seconds."""

    id: str
    keys: list[str]
    created_at: float
    processing: float
    cancel_at: float | None = None

    def finishes(self, index: int) -> float:
        return self.created_at + self.processing * (index + 1) / len(self.keys)

    def ends(self) -> float:
        return self.cancel_at if self.cancel_at is not None else self.created_at + self.processing


@dataclass
class Provider:
    """A provider's batch endpoints in memory, on the run's clock; counts what it is asked."""

    clock: ManualClock
    processing: float = 100.0
    held: dict[str, Held] = field(default_factory=dict)
    expired: set[str] = field(default_factory=set)
    errored: set[str] = field(default_factory=set)
    create_faults: list[type[Exception]] = field(default_factory=list)
    look_faults: list[Exception] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    listings: int = 0
    on_list: Callable[[int], None] | None = None
    on_retrieve: Callable[[], object] | None = None

    def add(self, keys: Sequence[str], at: float | None = None) -> Held:
        batch = Held(
            f"b{len(self.held) + 1}",
            list(keys),
            self.clock.now() if at is None else at,
            self.processing,
        )
        self.held[batch.id] = batch
        return batch

    def state(self, batch: Held) -> BatchState:
        now = self.clock.now()
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        if now < batch.ends():
            counts["processing"] = len(batch.keys)
            status = "canceling" if batch.cancel_at is not None else "in_progress"
            return BatchState(batch.id, status, counts, batch.created_at)
        for entry in self.entries(batch):
            counts[entry.type] += 1
        return BatchState(batch.id, "ended", counts, batch.created_at)

    def entries(self, batch: Held) -> list[BatchEntry]:
        found = []
        for index, key in enumerate(batch.keys):
            if batch.finishes(index) > batch.ends():
                found.append(BatchEntry(key, "canceled"))
            elif key in self.expired:
                found.append(BatchEntry(key, "expired"))
            elif key in self.errored:
                found.append(BatchEntry(key, "errored", {"error": {"type": "invalid_request"}}))
            else:
                found.append(BatchEntry(key, "succeeded", {"text": f"answer {key}"}))
        return found[::-1]

    # -- the BatchApi

    def create(self, requests: Sequence[Mapping[str, Any]]) -> BatchState:
        fault = self.create_faults.pop(0) if self.create_faults else None
        if fault is Refused:
            raise Refused(retry_after=1.0)
        batch = self.add([request["custom_id"] for request in requests])
        if fault is Lost:
            raise Lost("the connection dropped after the request was sent")
        return self.state(batch)

    def retrieve(self, batch_id: str) -> BatchState:
        if self.on_retrieve is not None:
            self.on_retrieve()
        if self.look_faults:
            raise self.look_faults.pop(0)
        return self.state(self.held[batch_id])

    def recent(self, since: float) -> Iterable[BatchState]:
        self.listings += 1
        newest = sorted(self.held.values(), key=lambda b: b.created_at, reverse=True)
        listed = [self.state(b) for b in newest if b.created_at >= since]
        if self.on_list is not None:
            self.on_list(self.listings)  # what arrives after the listing was made
        return listed

    def cancel(self, batch_id: str) -> BatchState:
        batch = self.held[batch_id]
        if batch.cancel_at is None and self.clock.now() < batch.ends():
            batch.cancel_at = self.clock.now()
        self.cancelled.append(batch_id)
        return self.state(batch)

    def results(self, batch_id: str) -> Iterable[BatchEntry]:
        self.read.append(batch_id)
        return self.entries(self.held[batch_id])

    def answered(self, error: BaseException) -> bool:
        return isinstance(error, Refused)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def journal(make_journal: MakeJournal, clock: ManualClock) -> Journal:
    return make_journal(clock=clock)


@pytest.fixture
def provider(clock: ManualClock) -> Provider:
    return Provider(clock)


RETRY = RetryPolicy(
    max_attempts=5,
    base_delay=0.01,
    retryable=lambda error: isinstance(error, Refused | Lost | TimeoutError),
    retry_after=lambda error: getattr(error, "retry_after", None),
)


class Digestish:
    """A workflow of one batch step over ``ITEMS``; counts its synchronous asks."""

    def __init__(self, provider: Provider, policy: BatchPolicy | None = None) -> None:
        self.provider = provider
        self.policy = policy or BatchPolicy(first_look=30, max_look=300, create_timeout=30)
        self.asked: list[str] = []
        self.reserved: list[tuple[str, list[str]]] = []
        self.settle_fails: set[str] = set()

    def settle(self, item: str, entry: BatchEntry) -> dict[str, Any]:
        if item in self.settle_fails:
            self.settle_fails.discard(item)
            raise RuntimeError(f"the process died while recording {item}")
        if entry.type == "errored":
            return {"error": "refused"}
        return {"text": entry.body["text"], "batch": True}

    def fallback(self, item: str) -> dict[str, Any]:
        self.asked.append(item)
        return {"text": f"sync {item}"}

    def body(self, run: Run) -> list[dict[str, Any]]:
        return run.batch(
            "ask",
            ITEMS,
            lambda item: {"prompt": item},
            key=lambda item: item,
            api=self.provider,
            settle=self.settle,
            fallback=self.fallback,
            policy=self.policy,
            retry=RETRY,
            reserve=lambda effect, items: self.reserved.append((effect, list(items))),
        )


def drive(
    journal: Journal, clock: ManualClock, body: Callable[[Run], Any], run_id: str = "r1"
) -> tuple[Outcome, list[float]]:
    """Execute until the run ends, moving the clock to each wake-up; the outcome, the waits."""
    waits: list[float] = []
    for _ in range(100):
        outcome = execute(journal, "wf", run_id, body)
        if outcome.status != "waiting":
            return outcome, waits
        assert outcome.wait is not None and outcome.wait.until is not None
        waits.append(outcome.wait.until - clock.now())
        clock.advance(max(0.0, outcome.wait.until - clock.now()))
    raise AssertionError("the run never ended")


def keys_of(journal: Journal, run_id: str = "r1") -> list[str]:
    return [record.key for record in inspect_run(journal, "wf", run_id).steps]


def test_one_batch_is_awaited_by_durable_sleeps_and_each_item_recorded(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider)

    first = execute(journal, "wf", "r1", flow.body)

    assert first.status == "waiting"  # suspended: no worker waits for the batch
    assert first.wait is not None and first.wait.step == "sleep:look:ask-1:1"
    assert first.wait.until == T0 + 30
    assert [b.keys for b in provider.held.values()] == [ITEMS]
    assert flow.reserved == [("batch-ask-1", ITEMS)]
    outcome, waits = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert outcome.result == [{"text": f"answer {item}", "batch": True} for item in ITEMS]
    assert waits[1:] == [60, 120]  # 30 s doubling: looks at 30, 90 and 210 s; it ended at 100
    assert len(provider.held) == 1 and provider.read == ["b1"] and flow.asked == []
    assert keys_of(journal) == [
        "plan:ask-1",
        "batch-ask-1",
        "sleep:look:ask-1:1",
        "look:ask-1:1",
        "sleep:look:ask-1:2",
        "look:ask-1:2",
        "sleep:look:ask-1:3",
        "look:ask-1:3",
        "ask:a",
        "ask:b",
        "ask:c",
    ]
    view = inspect_run(journal, "wf", "r1")
    assert {r.kind for r in view.steps if r.key.startswith("ask:")} == {"batch"}
    journal.client.hset(journal.keys("wf", "r1").meta, "status", "running")  # deliver again
    replayed = execute(journal, "wf", "r1", flow.body)
    assert (replayed.ran, replayed.result) == (0, outcome.result)  # a replay costs nothing
    assert provider.read == ["b1"] and len(provider.held) == 1


def test_a_crash_between_results_records_only_the_rest(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider)
    flow.settle_fails = {"b"}
    with pytest.raises(RuntimeError, match="recording b"):
        drive(journal, clock, flow.body)
    assert [k for k in keys_of(journal) if k.startswith("ask:")] == ["ask:a"]

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert [r["text"] for r in outcome.result] == ["answer a", "answer b", "answer c"]
    assert len(provider.held) == 1 and provider.read == ["b1", "b1"]  # read again, not re-asked
    assert flow.asked == []


def test_errored_items_are_settled_and_expired_or_canceled_ones_asked_synchronously(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.errored = {"a"}
    provider.expired = {"c"}
    flow = Digestish(provider)

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.result == [
        {"error": "refused"},
        {"text": "answer b", "batch": True},
        {"text": "sync c"},
    ]
    assert flow.asked == ["c"]
    kinds = {r.key: r.kind for r in inspect_run(journal, "wf", "r1").steps}
    assert (kinds["ask:a"], kinds["ask:c"]) == ("batch", "step")


def test_past_the_deadline_the_batch_is_cancelled_and_what_it_lacks_asked_synchronously(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.processing = 300.0  # items finish at 100, 200, 300 s
    policy = BatchPolicy(first_look=30, max_look=300, deadline=150, cancel_look=5)
    flow = Digestish(provider, policy)

    outcome, waits = drive(journal, clock, flow.body)

    # Looks at 30 and 90 s; the third is brought forward to the deadline at 150 s, cancels,
    # and the look 5 s later finds the batch ended: "a" was done, the rest cancelled.
    assert waits == [30, 60, 60, 5]
    assert outcome.result == [
        {"text": "answer a", "batch": True},
        {"text": "sync b"},
        {"text": "sync c"},
    ]
    assert provider.cancelled == ["b1"] and flow.asked == ["b", "c"]
    assert "cancel:ask-1" in keys_of(journal)


def test_an_instant_until_ends_the_wait_as_the_deadline_does_whichever_comes_first(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.processing = 300.0  # items finish at 100, 200, 300 s
    policy = BatchPolicy(first_look=30, max_look=300, deadline=150, until=T0 + 120, cancel_look=5)
    flow = Digestish(provider, policy)

    outcome, waits = drive(journal, clock, flow.body)

    # Looks at 30 and 90 s; the third is brought forward to the instant at 120 s, before the
    # deadline's 150 s, cancels, and the look 5 s later finds "a" done and the rest cancelled.
    assert waits == [30, 60, 30, 5]
    assert [r["text"] for r in outcome.result] == ["answer a", "sync b", "sync c"]
    assert provider.cancelled == ["b1"] and flow.asked == ["b", "c"]


def test_no_batch_is_created_past_the_instant_until(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider, BatchPolicy(until=T0 - 1))

    outcome, waits = drive(journal, clock, flow.body)

    assert waits == [] and provider.held == {}
    assert flow.asked == ITEMS
    assert [r["text"] for r in outcome.result] == ["sync a", "sync b", "sync c"]


def test_a_batch_that_will_not_end_after_its_cancel_is_given_up_on(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.processing = 1000.0
    policy = BatchPolicy(first_look=30, deadline=40, cancel_look=5, cancel_grace=12)
    flow = Digestish(provider, policy)
    provider.cancel = lambda batch_id: provider.state(provider.held[batch_id])  # type: ignore[method-assign]

    outcome, waits = drive(journal, clock, flow.body)

    assert waits == [30, 10, 5, 5, 5]  # the deadline at 40, then looks until 12 s after it
    assert flow.asked == ITEMS
    assert [r["text"] for r in outcome.result] == ["sync a", "sync b", "sync c"]


def test_a_refused_creation_is_released_and_created_later(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.create_faults = [Refused]
    flow = Digestish(provider)

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.status == "done" and len(provider.held) == 1
    assert provider.listings == 0  # released, not ambiguous: no batch to look for


def test_a_creation_that_may_have_happened_adopts_the_batch_it_made(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.create_faults = [Lost]  # created, and the answer lost
    flow = Digestish(provider)

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert list(provider.held) == ["b1"] and provider.read == ["b1"]  # one batch, paid once
    assert provider.cancelled == []
    owner = journal.client.hget(journal.keyspace.batches, "b1")
    assert owner == b"wf:r1"


def test_a_batch_another_run_owns_is_never_adopted(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.create_faults = [Lost]
    other = provider.add(["x", "y", "z"], at=T0 - 10)  # same size, owned by another run
    journal.backend.own_batch(other.id, "wf:other", first=False)
    flow = Digestish(provider)

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert provider.read == ["b2"]  # its own orphan, not the other run's batch
    assert provider.cancelled == []


def test_a_duplicate_found_after_adopting_is_cancelled_before_it_is_processed(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.create_faults = [Lost]

    def late_duplicate(listing: int) -> None:
        if listing == 1:  # an earlier holder's request arrives right after the first listing
            provider.add(ITEMS, at=clock.now() + 1)

    provider.on_list = late_duplicate
    flow = Digestish(provider)

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert provider.read == ["b1"] and provider.cancelled == ["b2"]
    assert provider.state(provider.held["b2"]).counts["canceled"] == 3  # none paid for


def test_the_window_a_duplicate_after_the_second_listing_is_processed_too(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.create_faults = [Lost]

    def too_late(listing: int) -> None:
        if listing == 2:  # right after the listing that cancels duplicates: nobody sees it
            provider.held["late"] = Held("late", list(ITEMS), clock.now() + 1, 100.0)

    provider.on_list = too_late
    flow = Digestish(provider)

    outcome, _ = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert provider.read == ["b1"] and provider.cancelled == []
    assert provider.state(provider.held["late"]).counts["succeeded"] == 3  # paid, never read


def test_large_steps_are_asked_as_several_batches_one_after_another(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider, BatchPolicy(first_look=30, max_look=300, max_requests=2))

    outcome, _ = drive(journal, clock, flow.body)

    assert [r["text"] for r in outcome.result] == ["answer a", "answer b", "answer c"]
    assert [b.keys for b in provider.held.values()] == [["a", "b"], ["c"]]


def test_a_transient_look_error_waits_at_least_what_the_provider_asked(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.look_faults = [Refused(retry_after=500.0)]
    flow = Digestish(provider)

    outcome, waits = drive(journal, clock, flow.body)

    assert outcome.status == "done"
    assert waits[:2] == [30, 500]
    look = inspect_run(journal, "wf", "r1").step("look:ask-1:1")
    assert look is not None and look.result["error"] == "overloaded"


def test_an_operators_cancel_of_a_waiting_run_cancels_its_batch(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider)
    assert execute(journal, "wf", "r1", flow.body).status == "waiting"

    landed = cancel(journal, "wf", "r1", "not this week")  # not refused: the batch is revocable

    assert landed.immediate
    assert cancel_batches(journal, "wf", "r1", provider) == ["b1"]
    assert provider.state(provider.held["b1"]).counts["canceled"] == 3


def test_a_holder_that_learns_of_a_cancel_cancels_its_batch(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider)
    assert execute(journal, "wf", "r1", flow.body).status == "waiting"
    clock.advance(30)
    provider.on_retrieve = lambda: cancel(journal, "wf", "r1")  # lands while the run is held

    outcome = execute(journal, "wf", "r1", flow.body)

    assert outcome.status == "cancelled"
    assert provider.cancelled == ["b1"]


def test_a_cancel_while_the_creation_may_have_happened_finds_the_batch(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    provider.create_faults = [Lost]
    flow = Digestish(provider)
    no_retry = RetryPolicy(max_attempts=1)

    def body(run: Run) -> Any:
        return run.batch(
            "ask",
            ITEMS,
            lambda item: {"prompt": item},
            key=lambda item: item,
            api=provider,
            settle=flow.settle,
            fallback=flow.fallback,
            policy=flow.policy,
            retry=no_retry,
        )

    with pytest.raises(Lost):
        execute(journal, "wf", "r1", body)
    assert journal.effect_states(journal.keys("wf", "r1")) == {"batch-ask-1": "ambiguous"}

    assert cancel(journal, "wf", "r1").immediate  # cancelled at once, not refused
    assert cancel_batches(journal, "wf", "r1", provider) == ["b1"]


def test_the_batches_a_run_records_are_what_operators_read(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    flow = Digestish(provider)
    execute(journal, "wf", "r1", flow.body)
    clock.advance(30)
    waiting = execute(journal, "wf", "r1", flow.body)

    view = inspect_run(journal, "wf", "r1")
    [shown] = batches(view.steps, view.effects, view.wait)

    assert (shown.step, shown.n, shown.keys) == ("ask", 1, tuple(ITEMS))
    assert shown.state is not None and shown.state.id == "b1"
    assert (shown.state.status, shown.state.counts["processing"]) == ("in_progress", 3)
    assert waiting.wait is not None and shown.next_look == waiting.wait.until == T0 + 90
    assert (shown.outcome, shown.creating, shown.cancelled) == (None, False, False)


def test_keys_a_provider_would_refuse_are_sent_as_their_digest_and_matched_back(
    journal: Journal, clock: ManualClock, provider: Provider
) -> None:
    urls = ["https://example.com/a", "tag:example.com,2026:b"]

    def body(run: Run) -> list[dict[str, Any]]:
        flow = Digestish(provider)
        return run.batch(
            "ask",
            urls,
            lambda item: {"prompt": item},
            key=lambda item: item,
            api=provider,
            settle=flow.settle,
            fallback=flow.fallback,
            policy=flow.policy,
        )

    outcome, _ = drive(journal, clock, body)

    [sent] = [b.keys for b in provider.held.values()]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", custom) for custom in sent)
    assert [r["text"] for r in outcome.result] == [f"answer {custom}" for custom in sent]
    assert [k for k in keys_of(journal) if k.startswith("ask:")] == [f"ask:{u}" for u in urls]


def test_a_batch_policy_refuses_a_first_look_beyond_its_cap() -> None:
    with pytest.raises(
        ValueError, match="first_look=600 must be positive and at most max_look=300"
    ):
        BatchPolicy(first_look=600, max_look=300)
    with pytest.raises(ValueError, match="max_requests must be at least 1"):
        BatchPolicy(max_requests=0)

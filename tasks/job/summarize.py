"""Summarizing the week: one model call per item and one for the opening, or two Message Batches.

Every call is held in the run's budget before it is made and settled at what it cost
(``priced``); transient failures are retried by the journal's policy (``model_retry_policy``)
and, once they outlast it, named with the way out (``giving_up``). A batch run sends the same
requests as Message Batches, and what a batch does not answer is asked synchronously, through
the same budget and refusal table.

Each call kind has a fallback chain (``tasks.llm.fallback``): a step asks the primary for the
retry policy's attempts, then the next model while the primary stays overloaded or
unavailable, each call reserved, limited and priced as the model it asks. The step records
the model that answered, so a replay never asks again.

A run with a deadline (``DIGEST_DEGRADE_AT``, frozen at its first start) degrades past it:
an item's step that runs after the deadline is answered by the offline summarizer instead of
the model, and records why (``degraded``), so the decision is the journal's, never taken
again. Only steps that have not recorded an answer run: a summary the model gave, or a
refusal it recorded, stays as it is.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from journal import RetryPolicy, Run
from journal.batch import BatchApi, BatchEntry, BatchPolicy
from journal.events import emit
from tasks.config.prices import alias_of
from tasks.errors import EveryItemRefused, ItemRefused, ModelUnavailable
from tasks.job.items import Item
from tasks.llm.batches import MAX_REQUESTS
from tasks.llm.budget import Reservation
from tasks.llm.client import (
    INTRO_OUTPUT,
    MAX_TOKENS,
    ApiError,
    Completion,
    OfflineSummarizer,
    Summarizer,
    checked_calls,
    completion_of,
    is_transient,
    refusal_for,
    request_params,
    retry_after_seconds,
)
from tasks.llm.cost import OFFLINE_MODEL, UnpricedAnswer
from tasks.llm.fallback import Chain
from tasks.llm.prompts import (
    INTRO_PROMPT,
    INTRO_SYSTEM,
    SUMMARY_PROMPT,
    SUMMARY_SYSTEM,
    estimated_tokens,
    intro_prompt,
    summary_prompt,
)
from tasks.llm.ratelimit import NoRoomByDeadline
from tasks.runtime import Runtime


class CallCounter:
    """Completions asked for in this attempt (replayed steps ask for none).

    Attributes:
        count: model calls, the API's to pay for.
        offline: the offline summarizer's completions: free, and no model call, so the run's
            result never counts them as calls.
        batched: batch requests answered and recorded in this attempt (half the price).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.offline = 0
        self.batched = 0

    def add(self, summarizer: Summarizer) -> None:
        """Count one completion asked of ``summarizer``."""
        with self._lock:
            if summarizer.name == OFFLINE_MODEL:
                self.offline += 1
            else:
                self.count += 1

    def withdraw(self) -> None:
        """Take back a model call counted before it went out: it never did (no room in time)."""
        with self._lock:
            self.count -= 1

    def add_batched(self) -> None:
        """Count one request a batch answered (recorded in this attempt)."""
        with self._lock:
            self.batched += 1


def model_retry_policy(runtime: Runtime) -> RetryPolicy:
    """429, 529, other 5xx, timeouts and connection errors: five attempts, then the run fails."""
    return RetryPolicy(
        max_attempts=5,
        base_delay=runtime.config.retry_base_delay,
        max_delay=30.0,
        retryable=is_transient,
        retry_after=retry_after_seconds,
        max_retry_after=runtime.config.max_retry_after,
        suspend_over=runtime.config.long_backoff,
    )


def chained(runtime: Runtime, models: tuple[str, ...], policy: RetryPolicy) -> ChainedPolicy:
    """A chain over ``models`` and the step policy that gives each model its attempts.

    The bound on one model is the policy's own ``max_attempts``: a single-model chain keeps
    today's policy unchanged.
    """
    chain = Chain(models, policy.max_attempts)
    return ChainedPolicy(chain, dataclasses.replace(policy, max_attempts=chain.attempts))


@dataclasses.dataclass(frozen=True)
class Deadline:
    """When a run stops waiting for the model and summarizes what is left offline.

    Attributes:
        at: epoch seconds, frozen with the run's options; None, never.
    """

    at: float | None = None

    def passed(self, run: Run) -> bool:
        """Whether the run's clock has reached the deadline."""
        return self.at is not None and run.clock.now() >= self.at

    @property
    def reason(self) -> str:
        """Why a step was answered offline, as its record and the email say it."""
        when = datetime.fromtimestamp(self.at or 0.0, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"the model had not answered by {when} (DIGEST_DEGRADE_AT)"

    def offline(self, completion: Completion, prompt: str, calls: CallCounter) -> dict[str, Any]:
        """The step result of an offline ``completion`` made in the model's place: free."""
        calls.add(OFFLINE)
        emit("degraded", "opening" if prompt == INTRO_PROMPT else "summary")
        return completion.to_json() | {"prompt": prompt, "cost_usd": 0.0, "degraded": self.reason}


OFFLINE = OfflineSummarizer()
"""The stand-in a degraded step asks: it keeps no state a run could share but ``used``."""


@dataclasses.dataclass(frozen=True)
class ChainedPolicy:
    """A call kind's fallback chain, and the retry policy of a step that walks it."""

    chain: Chain
    policy: RetryPolicy


def summarize(
    runtime: Runtime,
    run: Run,
    item: Item,
    calls: CallCounter,
    chain: Chain | None = None,
    deadline: Deadline = Deadline(),
) -> dict[str, Any]:
    """One model call, to the model the chain names now; a refused prompt skips the item.

    Any other refusal (``ModelRefused``: the account, the key, the model) propagates and fails
    the run: it would refuse every item alike. An error that says the model is unavailable
    is counted by the chain, which may name the next model for the step's next attempt.
    Past the run's deadline, checked at every attempt and ending a wait for rate-limit room,
    the offline summary instead.
    """
    if deadline.passed(run):
        return deadline.offline(OFFLINE.summarize(item), SUMMARY_PROMPT, calls)
    step = f"summarize:{item.id}"
    chain = chain or Chain(runtime.config.summary_models[:1], 1)
    model = chain.model(step)
    tokens = estimated_tokens(SUMMARY_SYSTEM, summary_prompt(item))
    estimate = runtime.budget.estimate(model, tokens, MAX_TOKENS)
    with runtime.budget.hold(run.keys, step, estimate) as reservation:
        calls.add(runtime.summarizer)
        try:
            with checked_calls(run.check_lease, deadline.at):
                completion = runtime.summarizer.summarize(item, model)
        except ItemRefused as refused:
            return {"error": f"the model refused this item: {refused}"}
        except NoRoomByDeadline:
            calls.withdraw()
            return deadline.offline(OFFLINE.summarize(item), SUMMARY_PROMPT, calls)
        except Exception as error:
            chain.failed(step, model, error)
            raise
        return priced(runtime, run, completion, model, reservation, SUMMARY_PROMPT)


def batch_policy(runtime: Runtime, deadline: Deadline = Deadline()) -> BatchPolicy:
    """How a batch run waits for its batches, and when it asks synchronously instead.

    The run's own deadline ends the wait too (``until``): a batch in flight then is cancelled,
    and what it did not answer is summarized offline by ``summarize``, which the deadline
    sends there instead of to the model.
    """
    config = runtime.config
    return BatchPolicy(
        first_look=config.batch_first_look,
        max_look=config.batch_max_look,
        deadline=config.batch_deadline,
        until=deadline.at,
        cancel_look=min(5.0, config.batch_first_look),
        max_requests=MAX_REQUESTS,
        # Within it the create is sent; the SDK's own timeout bounds the request itself.
        create_timeout=config.model_timeout,
    )


def summarize_batch(
    runtime: Runtime,
    run: Run,
    batches: BatchApi,
    week: list[Item],
    calls: CallCounter,
    policy: RetryPolicy,
    deadline: Deadline = Deadline(),
) -> list[dict[str, Any]]:
    """Every item's summary as one Message Batch (``run.batch``), priced at batch prices.

    What the batch does not answer (expired, cancelled, past ``DIGEST_BATCH_DEADLINE``, or an
    error the API calls transient) is asked synchronously by ``summarize``, through the shared
    rate limiter and the budget like any call; past the run's deadline, which cancels a batch
    still in flight, ``summarize`` writes it offline instead. The batch itself is held in the
    budget as a whole before it is created and settled from its results once they are recorded.
    """
    model = runtime.config.summary_models[0]
    walk = chained(runtime, runtime.config.summary_models, policy)

    def ask(item: Item) -> dict[str, Any]:
        return summarize(runtime, run, item, calls, walk.chain, deadline)

    def settle(item: Item, entry: BatchEntry) -> dict[str, Any]:
        return answered(runtime, run, entry, model, SUMMARY_PROMPT, calls, lambda: ask(item))

    def reserve(effect: str, items: Sequence[Item]) -> None:
        estimate = sum(
            runtime.budget.estimate(
                model,
                estimated_tokens(SUMMARY_SYSTEM, summary_prompt(item)),
                MAX_TOKENS,
                batch=True,
            )
            for item in items
        )
        runtime.budget.reserve_batch(run.keys, effect, estimate)

    results = run.batch(
        "summarize",
        week,
        lambda item: request_params(model, SUMMARY_SYSTEM, summary_prompt(item)),
        key=lambda item: item.id,
        api=batches,
        settle=settle,
        fallback=ask,
        policy=batch_policy(runtime, deadline),
        retry=walk.policy,
        concurrency=runtime.config.concurrency,
        reserve=reserve,
    )
    runtime.budget.settle_batch(run.keys, "summarize", batch_cost(results))
    return results


def compose_batch(
    runtime: Runtime,
    run: Run,
    batches: BatchApi,
    kept: list[tuple[Item, str]],
    calls: CallCounter,
    policy: RetryPolicy,
    deadline: Deadline = Deadline(),
) -> dict[str, Any]:
    """The opening paragraph as a second Message Batch, of one request (``compose:opening``).

    A refusal of it fails the run, as the synchronous call's does: there is no email without it.
    """
    model = runtime.config.intro_models[0]
    walk = chained(runtime, runtime.config.intro_models, policy)

    def ask(pairs: list[tuple[Item, str]]) -> dict[str, Any]:
        return compose(runtime, run, pairs, calls, walk.chain, deadline)

    def settle(pairs: list[tuple[Item, str]], entry: BatchEntry) -> dict[str, Any]:
        return answered(
            runtime, run, entry, model, INTRO_PROMPT, calls, lambda: ask(pairs), skip=False
        )

    def reserve(effect: str, items: Sequence[list[tuple[Item, str]]]) -> None:
        estimate = sum(
            runtime.budget.estimate(
                model, estimated_tokens(INTRO_SYSTEM, intro_prompt(pairs)), MAX_TOKENS, batch=True
            )
            for pairs in items
        )
        runtime.budget.reserve_batch(run.keys, effect, estimate)

    [intro] = run.batch(
        "compose",
        [kept],
        lambda pairs: request_params(model, INTRO_SYSTEM, intro_prompt(pairs), INTRO_OUTPUT),
        key=lambda _: "opening",
        api=batches,
        settle=settle,
        fallback=ask,
        policy=batch_policy(runtime, deadline),
        retry=walk.policy,
        reserve=reserve,
    )
    runtime.budget.settle_batch(run.keys, "compose", batch_cost([intro]))
    return intro


def answered(
    runtime: Runtime,
    run: Run,
    entry: BatchEntry,
    model: str,
    prompt: str,
    calls: CallCounter,
    again: Callable[[], dict[str, Any]],
    *,
    skip: bool = True,
) -> dict[str, Any]:
    """The step result of a request a batch answered: priced, skipped, asked again, or failed.

    ``succeeded``: the completion at batch prices. ``errored``: through the same refusal table
    as a synchronous call: this item's prompt refused is skipped (``skip``, else it fails the
    run), an account or request refused fails the run, and a transient error is asked again
    synchronously (``again``).

    Raises:
        ModelRefused: the API refused the account or the request.
        ItemRefused: this prompt was refused and ``skip`` is False.
    """
    setting = "DIGEST_SUMMARY_MODEL" if prompt == SUMMARY_PROMPT else "DIGEST_INTRO_MODEL"
    if entry.type == "succeeded":
        try:
            completion = completion_of(entry.body or {}, model)
        except ItemRefused as refused:
            if not skip:
                raise
            return {"error": f"the model refused this item: {refused}"}
        calls.add_batched()
        result = priced(runtime, run, completion, model, None, prompt, batch=True)
        result["batch"] = True
        return result
    error = ApiError.of_body(entry.body or {})
    refusal = refusal_for(error)
    if refusal is None:
        return again()  # the API's own trouble, not this request's: asked synchronously
    line = refusal.describe(error, "the Anthropic Message Batches API", model, setting)
    if refusal.error is ItemRefused and skip:
        return {"error": f"the model refused this item: {line}"}
    raise refusal.error(line)


def batch_cost(results: Iterable[Any]) -> float:
    """What the batch-answered results cost (the synchronous ones settled call by call)."""
    return sum(
        float(r.get("cost_usd") or 0.0) for r in results if isinstance(r, dict) and r.get("batch")
    )


def every_item_refused(skipped: list[dict[str, str]]) -> EveryItemRefused:
    """The run's failure when no item could be summarized: one line, the first reason."""
    ids = ", ".join(entry["id"] for entry in skipped)
    first = skipped[0]
    return EveryItemRefused(
        f"the model refused every item ({ids}); {first['id']}: {first['error']}; nothing was "
        "sent or marked seen, so they come again next week: fix them (digest show RUN lists "
        "each reason)"
    )


def compose(
    runtime: Runtime,
    run: Run,
    kept: list[tuple[Item, str]],
    calls: CallCounter,
    chain: Chain | None = None,
    deadline: Deadline = Deadline(),
) -> dict[str, Any]:
    """One model call for the opening paragraph, to the model the chain names now.

    Past the run's deadline, or at it while waiting for rate-limit room, the offline opening
    instead: there is no email without one.
    """
    if deadline.passed(run):
        return deadline.offline(OFFLINE.compose(kept), INTRO_PROMPT, calls)
    chain = chain or Chain(runtime.config.intro_models[:1], 1)
    model = chain.model("compose")
    estimate = runtime.budget.estimate(
        model, estimated_tokens(INTRO_SYSTEM, intro_prompt(kept)), MAX_TOKENS
    )
    with runtime.budget.hold(run.keys, "compose", estimate) as reservation:
        calls.add(runtime.summarizer)
        try:
            with checked_calls(run.check_lease, deadline.at):
                completion = runtime.summarizer.compose(kept, model)
        except NoRoomByDeadline:
            calls.withdraw()
            return deadline.offline(OFFLINE.compose(kept), INTRO_PROMPT, calls)
        except Exception as error:
            chain.failed("compose", model, error)
            raise
        return priced(runtime, run, completion, model, reservation, INTRO_PROMPT)


def priced(
    runtime: Runtime,
    run: Run,
    completion: Completion,
    requested: str,
    reservation: Reservation | None,
    prompt: str,
    *,
    batch: bool = False,
) -> dict[str, Any]:
    """The step result of a call: its text and tokens, its prompt's version, its cost today.

    Priced as the model asked for when the answer names it or a dated snapshot of it (the API
    answers an alias with a dated id), else as the model that answered; at batch prices for a
    request a batch answered. The cost settles the call's reservation of the run's budget.

    Raises:
        UnpricedAnswer: a budget is set and the answering model has no price; the call's
            reservation is kept as its cost, since what it cost is unknown.
    """
    result = completion.to_json()
    result["prompt"] = prompt
    model = requested if alias_of(completion.model) == alias_of(requested) else completion.model
    cost = runtime.config.prices.cost(
        model,
        completion.input_tokens,
        completion.output_tokens,
        cache_write=completion.cache_creation_input_tokens,
        cache_read=completion.cache_read_input_tokens,
        batch=batch,
    )
    if reservation is not None:
        if cost is None:
            reservation.settle(reservation.amount)
            raise UnpricedAnswer(run.keys.run, requested, completion.model)
        reservation.settle(cost, with_record=True)
    result["cost_usd"] = cost
    emit("batch_request" if batch else "model_call", completion.model)
    emit("input_tokens", completion.model, completion.input_tokens)
    emit("output_tokens", completion.model, completion.output_tokens)
    emit("cache_write_tokens", completion.model, completion.cache_creation_input_tokens)
    emit("cache_read_tokens", completion.model, completion.cache_read_input_tokens)
    if cost is not None:
        emit("cost_usd", completion.model, cost)
    return result


@contextmanager
def giving_up(step: str, policy: RetryPolicy) -> Iterator[None]:
    """Name the step and the way out when transient model errors outlast the retry budget."""
    try:
        yield
    except Exception as error:
        if not is_transient(error):
            raise
        raise ModelUnavailable(
            f"{step}: the model API kept failing after {policy.max_attempts} attempts "
            f"({type(error).__name__}: {error}); run the digest again later to resume from here"
        ) from error


def summarize_week(
    runtime: Runtime,
    run: Run,
    batches: BatchApi | None,
    week: list[Item],
    calls: CallCounter,
    policy: RetryPolicy,
    deadline: Deadline = Deadline(),
) -> tuple[list[tuple[Item, str]], list[dict[str, str]], list[str]]:
    """Every item's summary, one call each or one batch.

    Returns:
        The summarized items, the skipped ones, and the ids of those summarized offline
        because the deadline passed.

    Raises:
        EveryItemRefused: not "nothing new": there was news and none of it could be summarized.
    """
    walk = chained(runtime, runtime.config.summary_models, policy)
    with giving_up("summarize", walk.policy):
        if batches is not None:
            summaries = summarize_batch(runtime, run, batches, week, calls, policy, deadline)
        else:
            summaries = run.map(
                "summarize",
                week,
                lambda item: summarize(runtime, run, item, calls, walk.chain, deadline),
                key=lambda item: item.id,
                concurrency=runtime.config.concurrency if runtime.summarizer.remote else 1,
                retry=walk.policy,
            )
    kept = [(item, s["text"]) for item, s in zip(week, summaries, strict=True) if "text" in s]
    skipped = [
        {"id": item.id, "error": s["error"]}
        for item, s in zip(week, summaries, strict=True)
        if "error" in s
    ]
    if not kept:
        raise every_item_refused(skipped)
    offline = [item.id for item, s in zip(week, summaries, strict=True) if "degraded" in s]
    return kept, skipped, offline


def compose_opening(
    runtime: Runtime,
    run: Run,
    batches: BatchApi | None,
    kept: list[tuple[Item, str]],
    calls: CallCounter,
    policy: RetryPolicy,
    deadline: Deadline = Deadline(),
) -> dict[str, Any]:
    """The opening paragraph's step result, from the summaries: one call, or a second batch."""
    walk = chained(runtime, runtime.config.intro_models, policy)
    with giving_up("compose", walk.policy):
        if batches is not None:
            return compose_batch(runtime, run, batches, kept, calls, policy, deadline)
        return run.step(
            "compose",
            lambda: compose(runtime, run, kept, calls, walk.chain, deadline),
            retry=walk.policy,
        )

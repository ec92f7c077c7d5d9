"""The weekly digest as durable steps: select, summarize, compose, send, mark-seen, done.

Read it top to bottom as the job; everything durable happens in ``run.step`` and
``run.map`` (or, for a run frozen with ``batch``, ``run.batch``: the summaries as one Message
Batch, then the opening as a second, each awaited without a worker). Every value the control
flow depends on comes from a step, so a resumed run takes the same path as the first attempt,
and the only side effects (the email, the seen set) carry a key derived from the run or are a
set union, so repeating them is harmless.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import redis

from journal import Effect, Journal, Record, RetryPolicy, Run, SignalResult, Wait, workflow
from journal.batch import BatchApi, BatchEntry, BatchPolicy
from journal.batch import batches as batch_views
from journal.events import emit
from journal.ops.views import RunView
from tasks.errors import EveryItemRefused, ItemRefused, ModelUnavailable
from tasks.job import faults
from tasks.job.claims import Held, held_elsewhere, let_go
from tasks.job.items import Item, load_items
from tasks.job.prompts import (
    INTRO_PROMPT,
    INTRO_SYSTEM,
    SUMMARY_PROMPT,
    SUMMARY_SYSTEM,
    estimated_tokens,
    intro_prompt,
    summary_prompt,
)
from tasks.keys import text
from tasks.llm.batches import MAX_REQUESTS
from tasks.llm.budget import Reservation
from tasks.llm.client import (
    INTRO_OUTPUT,
    MAX_TOKENS,
    ApiError,
    Completion,
    Summarizer,
    completion_of,
    is_transient,
    refusal_for,
    request_params,
    retry_after_seconds,
)
from tasks.llm.cost import OFFLINE_MODEL, UnpricedAnswer, alias_of
from tasks.mail.smtp import Email, Receipt
from tasks.runtime import Runtime, process_config, process_runtime
from tasks.scripts import script

T = TypeVar("T")


@dataclass(frozen=True)
class DigestOptions:
    """What one digest may be given besides its run id; what is left None is a setting.

    Attributes:
        to: the recipient (``DIGEST_TO``).
        items: the items file (``DIGEST_ITEMS``).
        approval: wait for a human's approval before sending (``DIGEST_APPROVAL``).
        batch: ask the model by Message Batches (``DIGEST_BATCH``); a run frozen before this
            option existed (None) asks synchronously, as it started.
    """

    to: str | None = None
    items: str | None = None
    approval: bool | None = None
    batch: bool | None = None


def frozen_settings() -> dict[str, Any]:
    """The recipient, the approval gate and the batch mode, frozen at a run's first start.

    A process with no API key has nothing to batch with (offline summaries are free): its
    runs ask synchronously whatever ``DIGEST_BATCH`` says.
    """
    config = process_config()
    frozen: dict[str, Any] = {"to": config.recipient, "approval": config.approval}
    if config.batch and os.environ.get("ANTHROPIC_API_KEY"):
        frozen["batch"] = True  # left out, a run asks synchronously, as every run did before
    return frozen


def _journal() -> Journal:
    return process_runtime().journal


@workflow(
    "digest",
    options=DigestOptions,
    journal=_journal,
    defaults=frozen_settings,
    on_step=faults.after_step,
)
def digest(run: Run, options: DigestOptions) -> dict[str, Any]:
    """The weekly digest for one run id: ``digest.delay("2026-w42")`` or ``digest run``.

    Defined here, where Celery is not imported, so ``digest run`` runs it without Celery;
    ``tasks.worker.app`` delivers this same workflow as the task ``tasks.digest``.
    """
    return run_digest(run, process_runtime(), options)


@workflow("digest-dry", options=DigestOptions, journal=_journal, on_step=faults.after_step)
def preview(run: Run, options: DigestOptions) -> dict[str, Any]:
    """A dry run (``digest run --dry-run``): every step but send and mark-seen.

    A workflow of its own, in a scratch journal the command line deletes afterwards, and never
    delivered to a worker: ``DigestOptions`` has no dry-run flag a message could carry.
    """
    return run_digest(run, process_runtime(), options, dry_run=True)


@dataclass(frozen=True)
class Recorded(Generic[T]):
    """How a typed step result is recorded: to JSON and back, the one place each is written."""

    encode: Callable[[T], Any]
    decode: Callable[[Any], T]


ITEMS: Recorded[list[Item]] = Recorded(
    lambda items: [item.to_json() for item in items],
    lambda recorded: [Item.from_json(entry) for entry in recorded],
)
EMAIL: Recorded[Email] = Recorded(lambda email: email_json(email), lambda drafted: Email(**drafted))


def typed_step(run: Run, key: str, recorded: Recorded[T], fn: Callable[[], T]) -> T:
    """``run.step`` for a result that is a type: recorded as JSON, handed back decoded.

    Decoded on the first attempt as on a replay, so both see the very same value (the JSON
    form, not the object ``fn`` built), and the record is what the journal always held.
    """
    return recorded.decode(run.step(key, lambda: recorded.encode(fn())))


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


def run_digest(
    run: Run,
    runtime: Runtime,
    options: DigestOptions = DigestOptions(),
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """The job. Returns the report the CLI prints and the Celery result stores."""
    config = runtime.config
    to, items, approval = options.to, options.items, options.approval
    calls = CallCounter()
    policy = model_retry_policy(runtime)

    # 1. Freeze this week's unseen items, so a resumed run works on exactly the same list.
    # Claimed for this run, atomically per item: an overlapping run of another week (after an
    # outage) gets the rest, never the same items. A run that ends without sending lets go.
    owner = f"{run.workflow}:{run.run_id}"
    source = items or config.items_path
    week = typed_step(
        run, "select", ITEMS, lambda: select_unseen(runtime, source, owner, claim=not dry_run)
    )
    if not week:
        run.step("done", lambda: True)
        return report("nothing-new", 0, calls, held=held_elsewhere(runtime, owner))

    # 2. One model call per item, each its own step: a crash loses at most the calls in flight.
    #    Or, for a batch run, one Message Batch of them, each answer recorded as its own step.
    batches = runtime.batches if options.batch is True else None  # as frozen at its start
    with giving_up("summarize", policy):
        if batches is not None:
            summaries = summarize_batch(runtime, run, batches, week, calls, policy)
        else:
            summaries = run.map(
                "summarize",
                week,
                lambda item: summarize(runtime, run, item, calls),
                key=lambda item: item.id,
                concurrency=config.concurrency if runtime.summarizer.remote else 1,
                retry=policy,
            )
    kept = [(item, s["text"]) for item, s in zip(week, summaries, strict=True) if "text" in s]
    skipped = [
        {"id": item.id, "error": s["error"]}
        for item, s in zip(week, summaries, strict=True)
        if "error" in s
    ]
    if not kept:
        # Not "nothing new": there was news and none of it could be summarized.
        raise every_item_refused(skipped)

    # 3. The opening paragraph, from the summaries (a batch run asks it as a second batch).
    with giving_up("compose", policy):
        if batches is not None:
            intro = compose_batch(runtime, run, batches, kept, calls, policy)
        else:
            intro = run.step("compose", lambda: compose(runtime, run, kept, calls), retry=policy)
    email = draft_email(run.run_id, to or config.recipient, intro["text"], kept)
    if dry_run:
        return report("dry-run", len(kept), calls, skipped=skipped, email=email)

    # An optional human gate: the run suspends (no worker slot held) until approved.
    if config.approval if approval is None else approval:
        # The reviewer approves this recorded draft, by its digest, and exactly it is sent.
        email = typed_step(run, "draft", EMAIL, lambda: email)
        decision = run.wait_for_signal("approval", timeout=config.approval_timeout)
        reason = _refusal(decision, draft_digest(email_json(email)))
        if reason is not None:
            status = "expired" if decision.timed_out else "rejected"
            run.step("done", lambda: release(runtime, owner, [item.id for item in week]))
            return report(status, 0, calls, skipped=skipped, reason=reason or None)

    # 4. The side effect, fenced: claimed, the lease confirmed right before delivery, the
    #    receipt saved right after; a repeat carries an idempotency key derived from the run.
    #    A send that may have happened is repeated under its key only where the receiver
    #    drops repeats (or the operator chose a second copy); otherwise the run waits for
    #    `digest mark-sent` or `digest resend`.
    receipt = run.effect(
        "send",
        lambda effect: send(runtime, run.idempotency_key(), email, effect),
        timeout=runtime.mailer.timeout,
        repeatable=runtime.mailer.deduplicates or config.ambiguous_send == "resend",
    )

    # 5. Remember what this digest covered. A set union: safe to repeat.
    run.step("mark-seen", lambda: mark_seen(runtime, [item.id for item, _ in kept]))
    run.step("done", lambda: release(runtime, owner, [entry["id"] for entry in skipped]))
    held = held_elsewhere(runtime, owner)
    return report("sent", len(kept), calls, skipped=skipped, receipt=receipt, held=held)


# -- the steps' bodies ------------------------------------------------------------------------


def select_unseen(runtime: Runtime, source: str, owner: str, *, claim: bool = True) -> list[Item]:
    """This week's items no earlier digest covered and no other run holds, claimed for ``owner``.

    One script reads the seen set and claims (``tasks/lua/claim_items.lua``): of two runs
    selecting at once each item goes to one, and a run marking items seen meanwhile lands
    wholly before or after it. A preview (``claim=False``) takes the items nobody else holds
    without claiming them.
    """
    items = load_items(source, runtime.config.items_timeout)
    if not items:
        return []
    keys, ids = [runtime.keys.seen, runtime.keys.claims], [item.id for item in items]
    replies = script(runtime.client, "claim_items")(keys, [owner, int(claim), *ids])
    unseen = [(item, holder) for item, holder in zip(items, replies, strict=True) if holder != 0]
    holders = [holder for _, holder in unseen]
    if claim and unseen:
        holders = take_over_from_cancelled(runtime, owner, [item.id for item, _ in unseen], holders)
    return [
        item
        for (item, _), holder in zip(unseen, holders, strict=True)
        if holder is None or text(holder) == owner
    ]


def take_over_from_cancelled(
    runtime: Runtime, owner: str, ids: list[str], holders: list[bytes | str | None]
) -> list[bytes | str | None]:
    """Claim for ``owner`` the items held by cancelled or purged runs; the holders after it.

    A cancelled run ends without sending and never runs again, but it is stopped from outside,
    between two of its steps, so it cannot let go of its claims itself; nor can a run whose
    keys ``digest purge`` removed (no status: a run holding claims has opened, so it had one).
    The claims are moved under ``WATCH``: of two runs taking one item over at once, one wins.
    A run whose send was claimed is never taken from, cancelled or not: its email may be out
    (a cancel is refused then; this is the second lock on the same door).
    """
    others = {text(holder) for holder in holders if holder is not None and text(holder) != owner}
    cancelled = {
        other
        for other in others
        if run_status(runtime, other) in ("cancelled", None) and not send_claimed(runtime, other)
    }
    if not cancelled:
        return holders
    claims = runtime.keys.claims
    with runtime.client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(claims)
                holders = pipe.hmget(claims, ids)
                taken = [
                    item_id
                    for item_id, holder in zip(ids, holders, strict=True)
                    if holder is not None and text(holder) in cancelled
                ]
                if not taken:
                    return holders
                pipe.multi()
                pipe.hset(claims, mapping=dict.fromkeys(taken, owner))
                pipe.hmget(claims, ids)
                return list(pipe.execute()[-1])
            except redis.WatchError:
                continue


def send_claimed(runtime: Runtime, owner: str) -> bool:
    """Whether the run named ``workflow:run`` claimed its send (it may have emailed)."""
    workflow, _, run_id = owner.partition(":")
    claim = runtime.client.hget(runtime.journal.keys(workflow, run_id).effects, "send")
    return claim is not None and not text(claim).endswith(":released")


def run_status(runtime: Runtime, owner: str) -> str | None:
    """The status of the run named ``workflow:run`` (a claim's holder)."""
    workflow, _, run_id = owner.partition(":")
    return runtime.journal.meta(runtime.journal.keys(workflow, run_id)).get("status")


def release(runtime: Runtime, owner: str, ids: list[str]) -> bool:
    """Let go of ``owner``'s claims on ``ids`` (items it ends without sending): next week's."""
    if ids:
        let_go(runtime, owner, ids)
    return True


def summarize(runtime: Runtime, run: Run, item: Item, calls: CallCounter) -> dict[str, Any]:
    """One model call; a refusal of this item's prompt skips the item only.

    Any other refusal (``ModelRefused``: the account, the key, the model) propagates and fails
    the run: it would refuse every item alike.
    """
    model = runtime.config.summary_model
    tokens = estimated_tokens(SUMMARY_SYSTEM, summary_prompt(item))
    estimate = runtime.budget.estimate(model, tokens, MAX_TOKENS)
    with runtime.budget.hold(run.keys, f"summarize:{item.id}", estimate) as reservation:
        calls.add(runtime.summarizer)
        try:
            completion = runtime.summarizer.summarize(item)
        except ItemRefused as refused:
            return {"error": f"the model refused this item: {refused}"}
        return priced(runtime, run, completion, model, reservation, SUMMARY_PROMPT)


def batch_policy(runtime: Runtime) -> BatchPolicy:
    """How a batch run waits for its batches, and when it asks synchronously instead."""
    config = runtime.config
    return BatchPolicy(
        first_look=config.batch_first_look,
        max_look=config.batch_max_look,
        deadline=config.batch_deadline,
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
) -> list[dict[str, Any]]:
    """Every item's summary as one Message Batch (``run.batch``), priced at batch prices.

    What the batch does not answer (expired, cancelled, past ``DIGEST_BATCH_DEADLINE``, or an
    error the API calls transient) is asked synchronously by ``summarize``, through the shared
    rate limiter and the budget like any call. The batch itself is held in the budget as a
    whole before it is created and settled from its results once they are recorded.
    """
    model = runtime.config.summary_model

    def ask(item: Item) -> dict[str, Any]:
        return summarize(runtime, run, item, calls)

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
        policy=batch_policy(runtime),
        retry=policy,
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
) -> dict[str, Any]:
    """The opening paragraph as a second Message Batch, of one request (``compose:opening``).

    A refusal of it fails the run, as the synchronous call's does: there is no email without it.
    """
    model = runtime.config.intro_model

    def ask(pairs: list[tuple[Item, str]]) -> dict[str, Any]:
        return compose(runtime, run, pairs, calls)

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
        policy=batch_policy(runtime),
        retry=policy,
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
    runtime: Runtime, run: Run, kept: list[tuple[Item, str]], calls: CallCounter
) -> dict[str, Any]:
    """One model call for the opening paragraph."""
    model = runtime.config.intro_model
    estimate = runtime.budget.estimate(
        model, estimated_tokens(INTRO_SYSTEM, intro_prompt(kept)), MAX_TOKENS
    )
    with runtime.budget.hold(run.keys, "compose", estimate) as reservation:
        calls.add(runtime.summarizer)
        completion = runtime.summarizer.compose(kept)
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
        reservation.settle(cost)
    result["cost_usd"] = cost
    emit("batch_request" if batch else "model_call", completion.model)
    emit("input_tokens", completion.model, completion.input_tokens)
    emit("output_tokens", completion.model, completion.output_tokens)
    emit("cache_write_tokens", completion.model, completion.cache_creation_input_tokens)
    emit("cache_read_tokens", completion.model, completion.cache_read_input_tokens)
    if cost is not None:
        emit("cost_usd", completion.model, cost)
    return result


def draft_email(run_id: str, to: str, intro: str, kept: list[tuple[Item, str]]) -> Email:
    """The email, built only from recorded step results, so every attempt builds the same."""
    lines = "\n".join(f"* {item.title}: {summary}" for item, summary in kept)
    return Email(to=to, subject=f"Your weekly digest ({run_id})", body=f"{intro}\n\n{lines}")


def email_json(email: Email) -> dict[str, str]:
    """The email as a step result."""
    return {"to": email.to, "subject": email.subject, "body": email.body}


def draft_digest(draft: dict[str, str]) -> str:
    """What an approval names: the recorded draft's SHA-256, short, over its canonical JSON."""
    canonical = json.dumps(draft, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def send(runtime: Runtime, key: str, email: Email, effect: Effect) -> dict[str, Any]:
    """Deliver as a fenced effect; the dangerous moment is after delivery, before the record."""
    started = time.monotonic()
    try:
        receipt = runtime.mailer.send(key, email, effect)
    finally:
        emit("send_seconds", type(runtime.mailer).__name__, time.monotonic() - started)
    faults.before_saving_send()
    return receipt.to_json()


def mark_seen(runtime: Runtime, ids: list[str]) -> int:
    """Add this digest's items to the seen set; returns how many items it now holds."""
    pipe = runtime.client.pipeline(transaction=True)
    pipe.sadd(runtime.keys.seen, *ids)
    pipe.hdel(runtime.keys.claims, *ids)  # seen now: the claim has done its work
    pipe.scard(runtime.keys.seen)
    return int(pipe.execute()[-1])


def report(
    status: str,
    items: int,
    calls: CallCounter,
    *,
    skipped: list[dict[str, str]] | None = None,
    receipt: dict[str, Any] | None = None,
    email: Email | None = None,
    reason: str | None = None,
    held: list[Held] | None = None,
) -> dict[str, Any]:
    """The run's result: JSON, so it survives Celery's result backend and the journal.

    ``held`` names the items other runs hold (a failed run keeps its own): a week that finds
    nothing new because another run holds it all says so.
    """
    result: dict[str, Any] = {"status": status, "items": items, "model_calls": calls.count}
    if calls.offline:
        result["offline_summaries"] = calls.offline
    if calls.batched:
        result["batch_requests"] = calls.batched
    if skipped:
        result["skipped"] = skipped
    if receipt is not None:
        result["receipt"] = receipt
    if email is not None:
        result["email"] = email_json(email)
    if reason:
        result["reason"] = reason
    if held:
        result["held"] = [entry.to_json() for entry in held]
    return result


def receipt_line(result: dict[str, Any]) -> str:
    """``, email sent (digest-2026-w42)``, as the tutorial prints it."""
    raw = result.get("receipt")
    if not raw:
        return ""
    receipt = Receipt.from_json(raw)
    state = "sent" if receipt.sent else "already sent earlier, not resent"
    return f", email {state} ({receipt.id})"


def email_state(view: RunView) -> str:
    """Whether a run's email went out, as ``digest show`` and the console say it."""
    send = view.step("send")
    if send is not None:
        return f"sent ({Receipt.from_json(send.result).id})"
    state = view.effects.get("send")
    if state in ("claimed", "confirmed", "resend"):
        return "being sent (the run finishes it)"
    if state == "ambiguous":
        why = view.effect_details.get("send", "")
        return f"may have been sent ({why}); {decide_send(view.run.partition(':')[2])}"
    if state == "done":
        return "sent (the run finishes its bookkeeping)"
    return "not sent"


def batch_lines(
    steps: Sequence[Record], wait: Wait | None, effects: Mapping[str, str] | None = None
) -> list[str]:
    """Each batch of a run in a line: its id, status and counts, and when the run looks next.

    ``summarize msgbatch_01 in_progress, 8 requests (8 processing); looks next at ...``, as
    ``digest show``, ``digest runs`` and the console say it. Without ``effects`` (a listing
    reads none) a batch with no receipt yet reads as being created.
    """
    lines = []
    for shown in batch_views(steps, effects or {}, wait):
        size = f"{len(shown.keys)} requests"
        if shown.state is None:
            creating = effects is None or shown.creating
            state = "being created" if creating else "not created"
            lines.append(f"{shown.step} {state}, {size}")
            continue
        counts = ", ".join(f"{n} {kind}" for kind, n in shown.state.counts.items() if n)
        line = f"{shown.step} {shown.state.id} {shown.state.status}, {size} ({counts})"
        if shown.cancelled:
            line += "; cancelled at its deadline"
        if shown.outcome == "results" and shown.state.counts.get("succeeded") == len(shown.keys):
            line += "; every answer recorded"
        elif shown.outcome == "results":
            line += "; its answers recorded, the rest asked synchronously"
        elif shown.outcome == "give-up":
            line += "; given up on: the rest asked synchronously"
        elif shown.next_look is not None:
            line += f"; looks next at {utc(shown.next_look)}"
        lines.append(line)
    return lines


def utc(seconds: float) -> str:
    """A time as ``digest`` prints every time: ``2026-10-12 08:03:00 UTC``."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def decide_send(run_id: str) -> str:
    """The way out of a send that may have happened, in the operator's words."""
    return (
        f"check the recipient's mailbox, then `digest mark-sent {run_id}` (it arrived: the run "
        f"finishes) or `digest resend {run_id}` (it did not: sent again, same Message-ID)"
    )


def _refusal(decision: SignalResult, digest: str) -> str | None:
    """None to send; else why not ("" for a decision that gave no reason)."""
    payload = decision.payload if isinstance(decision.payload, dict) else {}
    if decision.timed_out or not payload.get("approved"):
        return str(payload.get("reason") or "")
    if payload.get("draft") != digest:
        return (
            f"the approval names draft {payload.get('draft')!r}, the recorded draft is "
            f"{digest!r}: nothing was sent"
        )
    return None


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

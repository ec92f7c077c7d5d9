"""The weekly digest as durable steps: select, summarize, compose, send, mark-seen, done.

Read it top to bottom as the job; everything durable happens in ``run.step`` and
``run.map`` (or, for a run frozen with ``batch``, ``run.batch``: the summaries as one Message
Batch, then the opening as a second, each awaited without a worker). Every value the control
flow depends on comes from a step, so a resumed run takes the same path as the first attempt,
and the only side effects (the email, the seen set) carry a key derived from the run or are a
set union, so repeating them is harmless.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from journal import Effect, Journal, Run, SignalResult, workflow
from journal.events import emit
from tasks.job import faults
from tasks.job.claims import Held, Seen, held_elsewhere, mark_seen, release, select_unseen
from tasks.job.items import Item
from tasks.job.names import APPROVAL, WORKFLOW
from tasks.job.report import Degraded, draft_digest, draft_email, email_json, report
from tasks.job.summarize import (
    CallCounter,
    Deadline,
    compose_opening,
    model_retry_policy,
    summarize_week,
)
from tasks.mail.message import Email
from tasks.runtime import Runtime, process_config, process_runtime

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
        degrade_at: the run's deadline in epoch seconds, the first ``DIGEST_DEGRADE_AT`` after
            its week's scheduled time (after its first start, for an id that names no week):
            what has no model summary by then is summarized offline; None, never (and for
            every run frozen before this option existed).
    """

    to: str | None = None
    items: str | None = None
    approval: bool | None = None
    batch: bool | None = None
    degrade_at: float | None = None


def frozen_settings(run_id: str) -> dict[str, Any]:
    """The recipient, the approval gate, the batch mode and the deadline, frozen at first start.

    A process with no API key has nothing to batch with (offline summaries are free): its
    runs ask synchronously whatever ``DIGEST_BATCH`` says. The deadline is an instant, not
    the setting's text, so a run resumed after the setting changed keeps the one it began with;
    a week's run takes its week's (``Config.degrade_deadline``).
    """
    config = process_config()
    frozen: dict[str, Any] = {"to": config.recipient, "approval": config.approval}
    if config.batch and os.environ.get("ANTHROPIC_API_KEY"):
        frozen["batch"] = True  # left out, a run asks synchronously, as every run did before
    deadline = config.degrade_deadline(run_id, time.time())
    if deadline is not None:
        frozen["degrade_at"] = deadline
    return frozen


def _journal() -> Journal:
    return process_runtime().journal


@workflow(
    WORKFLOW,
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


def run_digest(
    run: Run,
    runtime: Runtime,
    options: DigestOptions = DigestOptions(),
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """The job. Returns the report the CLI prints and the Celery result stores."""
    config = runtime.config
    calls = CallCounter()
    policy = model_retry_policy(runtime)
    batches = runtime.batches if options.batch is True else None  # as frozen at its start

    # 1. Freeze this week's unseen items, claimed for this run atomically per item: a resumed
    #    run works on the same list, an overlapping run of another week never on the same items.
    owner = f"{run.workflow}:{run.run_id}"
    source = options.items or config.items_path
    week = typed_step(
        run, "select", ITEMS, lambda: select_unseen(runtime, source, owner, claim=not dry_run)
    )
    if not week:
        run.step("done", lambda: True, repeatable=True)
        return report("nothing-new", 0, calls, held=held_elsewhere(runtime, owner))

    # 2. One model call per item (or one Message Batch), each answer its own step: a crash
    #    loses at most the calls in flight. Past the run's deadline, if it has one, what the
    #    model has not answered is summarized offline; every retry wakes by the deadline.
    deadline = Deadline(options.degrade_at)
    run.wake_by(deadline.at)
    kept, skipped, offline = summarize_week(runtime, run, batches, week, calls, policy, deadline)

    # 3. The opening paragraph, from the summaries (a batch run asks it as a second batch).
    intro = compose_opening(runtime, run, batches, kept, calls, policy, deadline)
    degraded = Degraded.of_run(deadline, kept, offline, intro)
    email = draft_email(run.run_id, options.to or config.recipient, intro["text"], kept, degraded)
    if dry_run:
        return report("dry-run", len(kept), calls, skipped=skipped, email=email, degraded=degraded)

    # An optional human gate: the run suspends (no worker slot held) until approved.
    if config.approval if options.approval is None else options.approval:
        email, refused = await_approval(run, config.approval_timeout, email)
        if refused is not None:
            let_go_at_the_end(run, runtime, owner, [item.id for item in week])
            return report(refused.status, 0, calls, skipped=skipped, reason=refused.reason)

    # 4. The side effect, fenced, under an idempotency key derived from the run. A send that
    #    may have happened is repeated only where the receiver drops repeats (or the operator
    #    chose a second copy); else the run waits for `digest mark-sent` or `digest resend`.
    receipt = run.effect(
        "send",
        lambda effect: send(runtime, run.idempotency_key(), email, effect),
        timeout=runtime.mailer.timeout,
        repeatable=runtime.mailer.deduplicates or config.ambiguous_send == "resend",
    )

    # 5. Remember what this digest covered, and let go of what it skipped.
    held = remember_sent(run, runtime, owner, kept, skipped)
    return report(
        "sent", len(kept), calls, skipped=skipped, receipt=receipt, held=held, degraded=degraded
    )


# -- the steps' bodies ------------------------------------------------------------------------


def remember_sent(
    run: Run,
    runtime: Runtime,
    owner: str,
    kept: list[tuple[Item, str]],
    skipped: list[dict[str, str]],
) -> list[Held]:
    """Mark the sent items seen (a set union: safe to repeat), release the skipped ones.

    Returns the items other runs hold, for the report, with what marking found when it ran in
    this attempt rather than replayed.
    """
    seen: list[Seen] = []

    def remember() -> int:
        seen.append(mark_seen(runtime, [item.id for item, _ in kept]))
        return seen[0].count

    run.step("mark-seen", remember, repeatable=True)  # a set union: its record rides the closing
    let_go_at_the_end(run, runtime, owner, [entry["id"] for entry in skipped])
    return held_elsewhere(runtime, owner, seen[0] if seen else None)


def let_go_at_the_end(run: Run, runtime: Runtime, owner: str, ids: list[str]) -> None:
    """The last step, ``done``: the run lets go of the items it holds and does not send.

    Safe to repeat (only this run's own claims are deleted), so its record goes with the
    run's closing rather than in a round trip of its own.
    """
    run.step("done", lambda: release(runtime, owner, ids), repeatable=True)


@dataclass(frozen=True)
class Refused:
    """Why an approval gate did not let the draft through.

    Attributes:
        status: ``rejected``, or ``expired`` when nobody decided in time.
        reason: the reviewer's reason; None when they gave none.
    """

    status: str
    reason: str | None


def await_approval(run: Run, timeout: float, email: Email) -> tuple[Email, Refused | None]:
    """Record the draft, wait for a human's decision on it; the recorded draft and any refusal.

    The reviewer approves this recorded draft, by its digest, and exactly it is sent: the email
    handed back is the one the journal holds, on the first attempt as on a replay.
    """
    email = typed_step(run, "draft", EMAIL, lambda: email)
    decision = run.wait_for_signal(APPROVAL, timeout=timeout)
    reason = _refusal(decision, draft_digest(email_json(email)))
    if reason is None:
        return email, None
    return email, Refused("expired" if decision.timed_out else "rejected", reason or None)


def send(runtime: Runtime, key: str, email: Email, effect: Effect) -> dict[str, Any]:
    """Deliver as a fenced effect; the dangerous moment is after delivery, before the record."""
    started = time.monotonic()
    try:
        receipt = runtime.mailer.send(key, email, effect)
    finally:
        emit("send_seconds", type(runtime.mailer).__name__, time.monotonic() - started)
    faults.before_saving_send()
    return receipt.to_json()


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

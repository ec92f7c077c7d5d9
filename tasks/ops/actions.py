"""What an operator does to a digest, one code path for the command line and the console.

Each action answers with the line the operator reads, or raises ``ControlRefused`` (a run the
action does not apply to) naming the run and why. Retry and fork hand the run to the workers
at once; the Celery app is imported then, not before, so the other commands stay light.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from journal import StepKey
from journal.batch import cancel_batches
from journal.errors import ControlRefused, EffectUnderway, NothingToDecide
from journal.ops import actions as control
from journal.ops.views import inspect_run
from tasks.errors import BadInput
from tasks.job.claims import STUCK, holdings, let_go
from tasks.job.names import APPROVAL, WORKFLOW
from tasks.job.report import decide_send, draft_digest
from tasks.job.weeks import is_week_id
from tasks.llm.batches import AnthropicBatches
from tasks.mail.message import Receipt
from tasks.runtime import Runtime


@dataclass(frozen=True)
class Answer:
    """What an action did: the line to show, and the run to look at next."""

    run_id: str
    line: str


def enqueue(run_id: str, kwargs: dict[str, Any] | None = None) -> str:
    """Hand a run to the workers, its options checked first; returns the Celery task id."""
    from tasks.worker.app import digest as task

    return str(task.apply_async(args=[run_id], kwargs=kwargs or {}).id)


def cancel(runtime: Runtime, run_id: str, reason: str = "") -> Answer:
    """Cancel a digest: at once if nobody runs it, else before its next step; its batches too.

    Refused once its send is claimed: the email may be out, and the run must mark its items
    seen, or the next week would email them again.

    Raises:
        ControlRefused: the run does not exist, has ended, or its email is under way.
    """
    try:
        landed = control.cancel(runtime.journal, WORKFLOW, run_id, reason)
    except EffectUnderway as underway:
        raise send_refusal(underway, run_id, "cancelled") from None
    # Its batches too: nobody will read what they answer. A holder that learns of the cancel
    # cancels its own as well; cancelling twice is harmless.
    stopped = ""
    if isinstance(runtime.batches, AnthropicBatches):  # a run that made none needs no key
        asked = cancel_batches(runtime.journal, WORKFLOW, run_id, runtime.batches)
        stopped = f"; its batch {', '.join(asked)} was cancelled" if asked else ""
    if landed.immediate:
        # Ended without sending, now: its items go to the next run.
        let_go(runtime, landed.run)
        return Answer(run_id, f"cancelled {landed.run}{stopped}; nothing more will run or be sent")
    return Answer(
        run_id,
        f"cancelling {landed.run}{stopped}: its worker stops before its next step and sends "
        "nothing more; `digest show` says cancelled once it has",
    )


def release(runtime: Runtime, run_id: str) -> Answer:
    """End a failed digest for good and let go of its items, for the next run to take.

    The run is cancelled first, so no retry can send what it held, then its claims go.

    Raises:
        BadInput: it holds no items, or it is not failed (a running or waiting run still
            sends them; a cancel of it ends it and lets them go).
    """
    owner = f"{WORKFLOW}:{run_id}"
    keys = runtime.journal.keys(WORKFLOW, run_id)
    send = runtime.journal.effect_states(keys).get("send", "released")
    if send != "released":  # read again, atomically, by the cancel below
        raise send_refusal(EffectUnderway(owner, "send", send), run_id, "released")
    held = holdings(runtime).get(owner, 0)
    if not held:
        raise BadInput(
            f"{owner} holds no items; nothing was released: release a failed run "
            "`digest runs` shows holding items"
        )
    status = runtime.journal.meta(runtime.journal.keys(WORKFLOW, run_id)).get("status")
    if status not in STUCK:
        raise BadInput(
            f"{owner} is {status}, not failed; nothing was released: it may still send its "
            f"{held} items (`digest cancel {run_id}` ends it and lets them go)"
        )
    try:
        landed = control.cancel(runtime.journal, WORKFLOW, run_id, "released: its items go on")
    except EffectUnderway as underway:
        raise send_refusal(underway, run_id, "released") from None
    if not landed.immediate:  # a retry took it meanwhile: it stops at its next step
        raise BadInput(
            f"{owner} started again meanwhile; nothing was released: it stops before its next "
            "step, then its items go to the next run"
        )
    count = let_go(runtime, owner)
    return Answer(
        run_id,
        f"released {count} items of {owner}: it is cancelled and will send nothing; "
        "the next run takes them",
    )


def send_refusal(underway: EffectUnderway, run_id: str, verb: str) -> ControlRefused:
    """Why a run whose email may be out is neither cancelled nor released, and the way out.

    Its items stay claimed: handing them on could email them twice.
    """
    if underway.effect != "send":
        return underway
    if underway.state == "ambiguous":
        said = f"may have been sent; nothing was {verb}: {decide_send(run_id)}"
    elif underway.state == "done":
        said = f"was sent; it will finish; nothing was {verb}"
    else:
        said = f"is being sent; it will finish; nothing was {verb}"
    return ControlRefused(underway.run, f"its email {said}")


def mark_sent(runtime: Runtime, run_id: str) -> Answer:
    """Settle a send that may have happened as done: the run finishes without sending again.

    Raises:
        ControlRefused: the run does not exist, or its send is not in doubt.
    """
    receipt = Receipt(id=send_key(run_id), sent=True).to_json()
    args = _decide_send(runtime, run_id, happened=True, receipt=receipt)
    task = enqueue(run_id, args)
    return Answer(
        run_id,
        f"marked the email of {WORKFLOW}:{run_id} as sent; it finishes now as task {task} "
        f"(its items are marked seen), or run `digest run {run_id}`",
    )


def resend(runtime: Runtime, run_id: str) -> Answer:
    """Settle a send that may have happened as not done: it is sent again, same Message-ID.

    Raises:
        ControlRefused: the run does not exist, or its send is not in doubt.
    """
    args = _decide_send(runtime, run_id, happened=False)
    task = enqueue(run_id, args)
    return Answer(
        run_id,
        f"resending the email of {WORKFLOW}:{run_id} (key {send_key(run_id)}) now as task "
        f"{task}, or run `digest run {run_id}`",
    )


def _decide_send(runtime: Runtime, run_id: str, *, happened: bool, receipt: Any = None) -> Any:
    try:
        return control.decide(
            runtime.journal, WORKFLOW, run_id, "send", happened=happened, receipt=receipt
        )
    except NothingToDecide as clear:
        words = {
            "": "was never sent",
            "done": "was sent",
            "released": "was not sent",
            "claimed": "is being sent",
            "resend": "is being sent again",
            "confirmed": "is still being sent (its holder may finish it)",
        }
        raise ControlRefused(
            clear.run,
            f"its email {words.get(clear.state, clear.state)}; there is nothing to decide: "
            "mark-sent and resend settle an email `digest show` says may have been sent",
        ) from None


def send_key(run_id: str) -> str:
    """The idempotency key a digest's email is sent under (``Run.idempotency_key``)."""
    return f"{WORKFLOW}-{run_id}"


def retry(runtime: Runtime, run_id: str) -> Answer:
    """Hand a failed digest (parked or not) to the workers now; it resumes where it failed."""
    args = control.retry(runtime.journal, WORKFLOW, run_id)
    task = enqueue(run_id, args)
    line = f"retrying {WORKFLOW}:{run_id} now as task {task}; it resumes from the failed step"
    return Answer(run_id, line)


def fork(runtime: Runtime, run_id: str, step: str, new_run_id: str | None = None) -> Answer:
    """Start a new digest from ``run_id``'s journal up to ``step``; it sends under its own key.

    Raises:
        BadInput: ``new_run_id`` is a week's id, which the schedule owns (a fork under it
            would make the real week answer already-done and never send its items), or is
            not of the fork form ``RUN-fork-NAME``; nothing is written.
    """
    if new_run_id is not None and not fork_id(run_id, new_run_id):
        what = "is a week the schedule runs" if is_week_id(new_run_id) else "is not a fork's id"
        raise BadInput(
            f"{new_run_id} {what}; nothing was forked: a fork takes an id of its own, "
            f"--as {run_id}-fork-NAME, or leave --as out for {run_id}-forkN"
        )
    keys = control.fork(runtime.journal, WORKFLOW, run_id, step, new_run_id)
    task = enqueue(keys.run_id, runtime.journal.run_args(keys))
    return Answer(
        keys.run_id,
        f"forked {WORKFLOW}:{run_id} at {step} as {keys.run} (task {task}); it keeps the steps "
        f"before {step} and runs the rest, its email keyed digest-{keys.run_id}",
    )


def fork_id(run_id: str, new_run_id: str) -> bool:
    """Whether ``new_run_id`` is of the fork form: ``RUN-forkN`` or ``RUN-fork-NAME``.

    Derived from the forked run's id, it can never be a week's id the schedule will reach.
    """
    rest = new_run_id.removeprefix(f"{run_id}-fork")
    return rest != new_run_id and bool(re.fullmatch(r"\d+|-[A-Za-z0-9._-]+", rest))


def decide(runtime: Runtime, run_id: str, decision: dict[str, Any]) -> Answer:
    """Approve or reject a digest at its approval gate; the first decision stands.

    The decision is stored only for a run waiting at its gate with a recorded draft, and names
    that draft by its digest: nothing is approved before anyone could see it.

    Raises:
        BadInput: the run does not wait for a decision, its gate expired already, or a
            decision was made before.
    """
    view = inspect_run(runtime.journal, WORKFLOW, run_id)
    gate = view.step(StepKey.SIGNAL.of(APPROVAL))
    if gate is not None and not gate.result["received"]:
        # The journal holds the run's answer, and a late decision would never be read.
        raise BadInput(f"{WORKFLOW}:{run_id} expired waiting for a decision; that outcome stands")
    draft = view.step("draft")
    waiting = view.status == "waiting" and view.wait is not None and view.wait.signal == APPROVAL
    if not waiting or draft is None:
        # Deciding early would approve a draft nobody has seen, or one that does not exist yet.
        state = "it does not exist" if view.status == "new" else f"it is {view.status}"
        raise BadInput(
            f"{WORKFLOW}:{run_id} is not waiting for approval ({state}); nothing was decided: "
            "decide on a run `digest show` lists as awaiting approval"
        )
    from tasks.worker.app import durable

    digest = draft_digest(draft.result)
    decided = {**decision, "draft": digest}
    # Stored, and the run enqueued at once: a worker resumes it without waiting for a sweep.
    if not durable.send_signal(WORKFLOW, run_id, APPROVAL, decided, runtime.journal):
        raise BadInput(f"{WORKFLOW}:{run_id} already has a decision; the first one stands")
    verb = "approved" if decision["approved"] else "rejected"
    return Answer(
        run_id,
        f"{verb} {WORKFLOW}:{run_id} (draft {digest}); a worker resumes it now, "
        f"or run `digest run {run_id}`",
    )

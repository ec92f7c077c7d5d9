"""What a run says: the email it drafts, the report it returns, the lines operators read.

The email is built only from recorded step results, so every attempt drafts the same one;
the report is JSON, so it survives Celery's result backend and the journal; the lines
(``receipt_line``, ``email_state``, ``batch_lines``) and their counts (``counted``) are worded
once for ``digest`` and the console alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from journal import Record, Wait
from journal.batch import batches as batch_views
from journal.ops.views import RunView
from tasks.llm.cost import is_completion
from tasks.mail.message import Email, Receipt

if TYPE_CHECKING:  # the run's own types: the lines operators read import none of its steps
    from tasks.job.claims import Held
    from tasks.job.items import Item
    from tasks.job.summarize import CallCounter, Deadline


@dataclass(frozen=True)
class Degraded:
    """What a run summarized offline because its deadline passed, from its recorded steps.

    Attributes:
        offline: the ids of the items summarized offline, in item order.
        titles: their titles, for the email.
        of: the items the email summarizes (refused ones are skipped, not counted).
        opening: whether the opening paragraph was written offline too.
        deadline: the run's deadline, epoch seconds.
    """

    offline: tuple[str, ...]
    titles: tuple[str, ...]
    of: int
    opening: bool
    deadline: float

    @classmethod
    def of_run(
        cls,
        deadline: Deadline,
        kept: list[tuple[Item, str]],
        offline: list[str],
        intro: Mapping[str, Any],
    ) -> Degraded | None:
        """The run's degradation; None when the model wrote everything (or it has no deadline)."""
        opening = "degraded" in intro
        if deadline.at is None or not (offline or opening):
            return None
        titles = tuple(item.title for item, _ in kept if item.id in offline)
        return cls(tuple(offline), titles, len(kept), opening, deadline.at)

    def to_json(self) -> dict[str, Any]:
        """As the run's report holds it."""
        return {
            "offline": list(self.offline),
            "of": self.of,
            "opening": self.opening,
            "deadline": self.deadline,
        }

    def note(self) -> str:
        """The email's last paragraph: which parts were summarized offline, and why."""
        if not self.titles:
            parts = "the opening paragraph"
        else:
            parts = ", ".join(self.titles) + ("; the opening paragraph too" if self.opening else "")
        return (
            "Summarized offline (each update's first sentence), because the model API had not "
            f"answered by {utc(self.deadline)}: {parts}."
        )


def degraded_words(result: Mapping[str, Any]) -> str:
    """``sent (degraded: 3 of 8 offline)``: a run's status as it ended, a degraded one marked."""
    degraded = result.get("degraded")
    if not isinstance(degraded, dict):
        return str(result["status"])
    if not degraded["offline"]:  # every item the model's; the opening paragraph was not
        return f"{result['status']} (degraded: the opening paragraph offline)"
    return f"{result['status']} (degraded: {len(degraded['offline'])} of {degraded['of']} offline)"


def answered_by(steps: Sequence[Record]) -> str:
    """``answered by claude-haiku-5-5 (5), claude-sonnet-5-5 (4)``: who wrote a run's text.

    The summaries and the opening as their steps recorded them, ``offline`` for the offline
    summarizer's; empty before any answer. Worded once for ``digest show`` and ``digest runs``.
    """
    counts: dict[str, int] = {}
    for record in steps:
        answer = record.result
        if (record.key.startswith("summarize:") or record.key == "compose") and is_completion(
            answer
        ):
            model = str(answer.get("model"))
            counts[model] = counts.get(model, 0) + 1
    listed = ", ".join(f"{model} ({n})" for model, n in sorted(counts.items()))
    return f"answered by {listed}" if listed else ""


def draft_email(
    run_id: str, to: str, intro: str, kept: list[tuple[Item, str]], degraded: Degraded | None
) -> Email:
    """The email, built only from recorded step results, so every attempt builds the same.

    A degraded run's email ends by saying what was summarized offline and why.
    """
    lines = "\n".join(f"* {item.title}: {summary}" for item, summary in kept)
    body = f"{intro}\n\n{lines}"
    if degraded is not None:
        body += f"\n\n{degraded.note()}"
    return Email(to=to, subject=f"Your weekly digest ({run_id})", body=body)


def email_json(email: Email) -> dict[str, str]:
    """The email as a step result."""
    return {"to": email.to, "subject": email.subject, "body": email.body}


def draft_digest(draft: dict[str, str]) -> str:
    """What an approval names: the recorded draft's SHA-256, short, over its canonical JSON."""
    canonical = json.dumps(draft, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


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
    degraded: Degraded | None = None,
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
    if degraded is not None:
        result["degraded"] = degraded.to_json()
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


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and its noun agreeing, as a sentence says it: "1 step", "2 steps", "no steps".

    A count pasted before a plural noun reads "1 steps" whenever the count is one; every count
    the console and these lines show goes through here. ``plural``: when it is not the noun
    and an s (``deliveries``).
    """
    many = plural or f"{noun}s"
    if n == 0:
        return f"no {many}"
    return f"{n} {noun if n == 1 else many}"


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
        size = counted(len(shown.keys), "request")
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

"""What a run's console page says, computed from one snapshot: its outcome and its waterfall.

The page reads top to bottom as an operator asks: what happened (``outcome``: sent to whom
and when, rejected and why, held, failed and the way out, a send that may have happened),
then how (``waterfall``: each delivery's steps as bars on one time axis, with the waits
between them as labelled gaps).

A wait can last days while a step lasts milliseconds: drawn to one linear scale, every step
would be a sliver (the complaint that started this page). So steps keep their true length on
the axis, and a wait longer than ``BREAK_MS`` is drawn as a break of fixed width labelled with
its real length, as charts of uneven data break their axis.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape

from journal import Record, StepKey
from journal.batch import is_batch_look
from journal.logs import redact
from journal.ops.views import RunView
from tasks.job.claims import Held
from tasks.job.names import APPROVAL
from tasks.job.report import counted, degraded_words

# A wait longer than this is drawn as a break of ``BREAK_SHARE`` of the axis, not to scale.
BREAK_MS = 2_000
BREAK_SHARE = 0.12


def when(ms: int | str | None) -> str:
    """A stored millisecond time as UTC text, or a dash."""
    try:
        value = int(ms) if ms is not None else None
    except ValueError:
        return "?"
    if not value:
        return "-"
    return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def stamp(ms: int | str | None) -> Markup:
    """A stored millisecond time as a ``<time>``: UTC in its text and on hover.

    ``/console.js`` rewrites the text into the browser's own zone; without script it reads
    as UTC, which it says.
    """
    text = when(ms)
    if text in ("-", "?"):
        return Markup(escape(text))
    iso = text.replace(" ", "T") + "Z"
    return Markup(
        f'<time datetime="{escape(iso)}" title="{escape(text)} UTC">{escape(text)} UTC</time>'
    )


def span(start: int | None, end: int | None) -> str:
    """A duration as people read it: 850 ms, 12.3 s, 4 min."""
    if not start or not end or end < start:
        return "-"
    ms = end - start
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.0f} min"


# A step's key as the operator reads it; a key not here is shown as it is recorded.
STEP_WORDS = {
    "select": "select the week's items",
    "compose": "compose the introduction",
    "draft": "draft the email",
    "send": "send the email",
    "mark-seen": "mark the items sent",
    "done": "finish",
    StepKey.DEADLINE.of(APPROVAL): "ask for approval",
    StepKey.SIGNAL.of(APPROVAL): "approval decision",
}


def step_words(key: str) -> str:
    """A step's name in words: ``summarize:i1`` is "summarize i1", a journal prefix is gone."""
    if key in STEP_WORDS:
        return STEP_WORDS[key]
    if is_batch_look(key):
        return "look at the batch"
    for prefix, word in (
        (StepKey.SLEEP, "sleep"),
        (StepKey.DEADLINE, "deadline of"),
        (StepKey.SIGNAL, "signal"),
    ):
        if key.startswith(prefix.value):
            return f"{word} {key.removeprefix(prefix.value)}"
    name, _, item = key.partition(":")
    return f"{name} {item}" if item else name


def badge(state: str, meta: Mapping[str, str]) -> str:
    """The one word of a run's status badge: how a finished run ended, not just ``done``.

    ``held`` is a week that found nothing new because other runs hold its items; ``released``
    a failed run cancelled so that its items go on to the next week.
    """
    if state == "cancelled":
        return "released" if meta.get("cancel", "").startswith("released") else "cancelled"
    if state != "done":
        return state
    report = _report(meta)
    status = str(report.get("status", "done"))
    if status == "nothing-new" and report.get("held"):
        return "held"
    return status.replace("-", " ")


@dataclass(frozen=True)
class Outcome:
    """Where a run stands, in the operator's words.

    Attributes:
        kind: ``sent``, ``rejected``, ``expired``, ``nothing-new``, ``waiting``, ``approval``,
            ``ambiguous``, ``retrying``, ``failed``, ``running``, ``gone``, ``cancelled`` or
            ``new``: the page's colour and the buttons it offers.
        headline: one sentence; ``at_ms`` the time it speaks of, if any.
        lines: what else to know (the reason, who else holds items), one sentence each.
        fix: the way out, when the operator must act.
        at_word: how ``at_ms`` joins the headline (``at``, ``until``, ``since``).
    """

    kind: str
    headline: str
    at_ms: int | None = None
    lines: tuple[str, ...] = ()
    fix: str = ""
    at_word: str = "at"


def outcome_of(view: RunView, run_id: str, now_ms: int) -> Outcome:
    """The run's outcome from its snapshot (see ``Outcome``)."""
    meta, state = view.meta, view.state
    if view.effects.get("send") == "ambiguous":
        why = redact(view.effect_details.get("send", ""))
        return Outcome(
            "ambiguous",
            "The email may have been sent: the run waits for you to say whether it arrived",
            _ms(meta, "updated_at"),
            (f"Why it is not known: {why}.",) if why else (),
            f"Look in the recipient's mailbox for Message-ID <digest-{run_id}@durable-digest>.",
        )
    if state == "done":
        return _finished(view, _report(meta))
    if state == "waiting" and view.wait is not None:
        return _waiting(view)
    if state in ("retrying", "failed", "parked"):
        return _failing(view, run_id)
    if state in ("running", "cancelling", "new"):
        if view.lease_holder is None and state != "new":
            return Outcome(
                "gone",
                "Holder gone: the run resumes at the next sweep, from its last recorded step",
                _ms(meta, "updated_at"),
                at_word="last heard of",
            )
        word = (
            "Cancelled: it stops before its next step; running"
            if state == "cancelling"
            else "Running"
        )
        flying = sorted(view.in_flight.items(), key=lambda item: item[1])
        now = (
            ("In flight now: " + ", ".join(step_words(key) for key, _ in flying),) if flying else ()
        )
        return Outcome("running", word, _ms(meta, "created_at"), now, at_word="since")
    reason = meta.get("cancel", "")
    return Outcome(
        state, f"The run was {state}", _ms(meta, "finished_at"), (reason,) if reason else ()
    )


def _finished(view: RunView, report: dict[str, Any]) -> Outcome:
    status = str(report.get("status", "done"))
    ended = _ms(view.meta, "finished_at")
    held = tuple(Held(**entry).line() for entry in report.get("held", []))
    if status == "sent":
        send = view.step("send")
        receipt = send.result.get("id", "") if send and isinstance(send.result, dict) else ""
        items = report.get("items", 0)
        return Outcome(
            "sent",
            f"Sent {counted(items, 'item')}{_degraded(report)}",
            send.finished_at if send else ended,
            ((f"Message-ID {receipt}.",) if receipt else ()) + _offline(view, report) + held,
        )
    if status in ("rejected", "expired"):
        gate = view.step(StepKey.SIGNAL.of(APPROVAL))
        decided = gate.finished_at if gate else ended
        reason = report.get("reason") or "no reason given"
        who = _decider(gate)
        said: tuple[str, ...] = ()
        if status == "expired":
            headline = "Expired: nobody decided in time"
        else:
            headline, said = f"Rejected{who}", (f"Reason: {reason}",)
        let_go = "Nothing was sent; its items were let go for the next week."
        return Outcome(status, headline, decided, (*said, let_go))
    if status == "nothing-new" and held:
        return Outcome(
            "nothing-new", "Held: other runs hold this week's items; no email", ended, held
        )
    if status == "nothing-new":
        lines = ("Every item of the week was in an earlier digest.",)
        return Outcome("nothing-new", "Nothing new: no email this week", ended, lines)
    return Outcome(status, f"Done: {status}", ended)


def _degraded(report: dict[str, Any]) -> str:
    """`` (degraded: 3 of 8 offline)`` after the headline of a run its deadline degraded."""
    words = degraded_words(report)
    return words.removeprefix(str(report["status"])) if "degraded" in report else ""


def _offline(view: RunView, report: dict[str, Any]) -> tuple[str, ...]:
    """Which items a degraded run summarized offline, by title, in a sentence."""
    degraded = report.get("degraded")
    if not isinstance(degraded, dict):
        return ()
    offline = set(degraded["offline"])
    selected = view.step("select")
    chosen = selected.result if selected is not None and isinstance(selected.result, list) else []
    titles = [str(item.get("title")) for item in chosen if item.get("id") in offline]
    parts = [", ".join(titles)] if titles else []
    if degraded.get("opening"):
        parts.append("the opening paragraph")
    return (
        f"Summarized offline: {', and '.join(parts)}; the model had not answered by the "
        "deadline (DIGEST_DEGRADE_AT).",
    )


def _decider(gate: Record | None) -> str:
    payload = gate.result.get("payload") if gate and isinstance(gate.result, dict) else None
    by = payload.get("by") if isinstance(payload, dict) else None
    return f" by {by}" if by else ""


def _waiting(view: RunView) -> Outcome:
    wait = view.wait
    assert wait is not None
    until = int(wait.until * 1000) if wait.until else None
    if wait.signal == APPROVAL:
        return Outcome("approval", "Waiting for approval", until, at_word="until")
    if is_batch_look(wait.step):
        return Outcome("waiting", "Waiting for a batch of model calls", until, at_word="until")
    if wait.kind == "sleep":
        return Outcome("waiting", "Sleeping", until, at_word="until")
    if wait.step == "send":
        return Outcome("waiting", "Waiting for your word on the email", until, at_word="until")
    return Outcome("waiting", f"Waiting for {wait.signal or wait.step}", until, at_word="until")


def _failing(view: RunView, run_id: str) -> Outcome:
    meta, state = view.meta, view.state
    error = redact(meta.get("last_error", ""))
    failures = meta.get("failures", "")
    tried = (f"{counted(int(failures), 'failed attempt')} so far.",) if failures.isdigit() else ()
    if state == "retrying":
        return Outcome(
            "retrying",
            "Failed; it retries",
            _ms(meta, "retry_at"),
            (f"Error: {error}", *tried),
            Markup("It gives up after {}; fix the cause (above), or retry now.").format(
                stamp(_ms(meta, "retry_until"))
            ),
            at_word="at",
        )
    word = "Parked after too many starts" if state == "parked" else "Failed for good"
    return Outcome(
        "failed",
        word,
        _ms(meta, "gave_up_at") or _ms(meta, "updated_at"),
        (f"Error: {error}", *tried),
        f"Fix the cause, then retry (the button, or `digest retry {run_id}`): it resumes from "
        "the failed step; nothing recorded runs again.",
    )


def _report(meta: Mapping[str, str]) -> dict[str, Any]:
    try:
        report = json.loads(meta.get("outcome", "{}"))
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _ms(meta: Mapping[str, str], name: str) -> int | None:
    raw = meta.get(name, "")
    return int(raw) if raw.isdigit() and int(raw) else None


@dataclass(frozen=True)
class Bar:
    """One row of the waterfall: a step's attempt, a wait, or the attempt that failed.

    Attributes:
        kind: ``step``, ``wait``, ``failed``, or ``flight``: a step its holder runs now.
        label: the step or the wait in words (``waiting for approval``).
        start_ms, end_ms: its real times; ``left``/``width`` its place on the axis (percent).
        attempt: the attempt that recorded the step.
        record: the step's record, for its result and usage.
        error: a failed attempt's error.
    """

    kind: str
    label: str
    start_ms: int
    end_ms: int
    left: float = 0.0
    width: float = 0.0
    attempt: int = 1
    record: Record | None = None
    error: str = ""


@dataclass(frozen=True)
class Delivery:
    """The steps one holder recorded (one fence): a delivery of the run to a worker."""

    number: int
    fence: int
    bars: list[Bar] = field(default_factory=list)


def waterfall(view: RunView, now_ms: int) -> list[Delivery]:
    """Each delivery's steps and the waits between them, placed on one axis (see module)."""
    rows = _rows(view, now_ms)
    if not rows:
        return []
    placed = _place([bar for _, bar in rows])
    deliveries: list[Delivery] = []
    for (fence, _), bar in zip(rows, placed, strict=True):
        if not deliveries or deliveries[-1].fence != fence:
            deliveries.append(Delivery(len(deliveries) + 1, fence))
        deliveries[-1].bars.append(bar)
    return deliveries


def _rows(view: RunView, now_ms: int) -> list[tuple[int, Bar]]:
    """Steps in order with a wait bar before any step that began well after the last ended."""
    rows: list[tuple[int, Bar]] = []
    previous: Record | None = None
    for record in view.steps:
        if previous is not None and record.started_at - previous.finished_at > BREAK_MS / 4:
            label = _gap_label(previous, record)
            rows.append((record.fence, Bar("wait", label, previous.finished_at, record.started_at)))
        # A model call's wait for the shared rate limits' room, journalled with its step.
        waited = record.result.get("waited_ms", 0) if isinstance(record.result, dict) else 0
        began = record.started_at + waited if isinstance(waited, int) and waited > 0 else 0
        if began:
            label = f"rate limit: waited {span(record.started_at, began)} for room"
            rows.append((record.fence, Bar("wait", label, record.started_at, began)))
        rows.append(
            (
                record.fence,
                Bar(
                    "step",
                    step_words(record.key),
                    began or record.started_at,
                    record.finished_at,
                    0,
                    0,
                    record.attempt,
                    record,
                ),
            )
        )
        previous = record
    rows.extend(_open_end(view, previous, now_ms))
    return rows


def _gap_label(before: Record, after: Record) -> str:
    """What a gap between two steps was spent on, from the step that ended it."""
    key = after.key
    if key == StepKey.SIGNAL.of(APPROVAL):
        return "waiting for approval"
    if is_batch_look(key):
        return "waiting for the batch"
    if key.startswith("sleep:"):
        return "durable sleep"
    if after.fence != before.fence:
        return "until the next delivery (retry back-off or redelivery)"
    if key.startswith("summarize") or key == "compose":
        return "model call: rate limit or retries"
    return "gap"


def _open_end(view: RunView, last: Record | None, now_ms: int) -> list[tuple[int, Bar]]:
    """A failed attempt (red), or the wait the run is in now, after its last step."""
    start = last.finished_at if last else int(view.meta.get("created_at", "0") or 0)
    fence = int(view.meta.get("fence", "0") or 0)
    updated = int(view.meta.get("updated_at", "0") or 0)
    error = redact(view.meta.get("last_error", ""))
    if view.state in ("retrying", "failed", "parked") and error:
        step = step_words(view.wait.step) if view.wait and view.wait.step else "the next step"
        failed = Bar("failed", f"{step} failed", start, max(updated, start + 1), error=error)
        rows = [(fence, failed)]
        if view.state == "retrying":
            rows.append((fence, Bar("wait", "retry back-off", failed.end_ms, max(now_ms, updated))))
        return rows
    if view.state == "waiting" and view.wait is not None:
        label = _waiting(view).headline.lower()
        return [(fence, Bar("wait", label + " (now)", start, max(now_ms, start + 1)))]
    if view.state in ("running", "cancelling") and view.lease_holder is not None:
        return [
            (fence, Bar("flight", f"{step_words(key)} (in flight now)", at, max(now_ms, at + 1)))
            for key, at in sorted(view.in_flight.items(), key=lambda item: item[1])
        ]
    return []


def _place(bars: Sequence[Bar]) -> list[Bar]:
    """Each bar's left and width in percent: steps to scale, long waits as fixed breaks."""
    origin = min(bar.start_ms for bar in bars)
    lengths = [max(bar.end_ms - bar.start_ms, 0) for bar in bars]
    broken = [bar.kind == "wait" and n > BREAK_MS for bar, n in zip(bars, lengths, strict=True)]
    breaks = sum(broken)
    scaled = sum(n for n, b in zip(lengths, broken, strict=True) if not b) or 1
    share = min(BREAK_SHARE, 0.6 / breaks) if breaks else 0.0
    unit = 100 * (1 - share * breaks) / scaled
    placed, cursor = [], 0.0
    events = sorted(range(len(bars)), key=lambda i: bars[i].start_ms - origin)
    for i in events:
        width = 100 * share if broken[i] else lengths[i] * unit
        placed.append((i, cursor, width))
        cursor += width
    out = list(bars)
    for i, left, width in placed:
        bar = bars[i]
        out[i] = Bar(
            bar.kind,
            bar.label,
            bar.start_ms,
            bar.end_ms,
            round(left, 2),
            round(max(width, 0.4), 2),
            bar.attempt,
            bar.record,
            bar.error,
        )
    return out

"""What ``digest`` prints about a run: its page (``show``), its JSON, its lines in a listing.

Everything printed from the journal, a model or an API passes ``printable`` first: stored
text is data, never terminal commands.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from journal import Record, Wait
from journal.logs import redact
from journal.ops.views import RunView
from tasks.job.claims import MAYBE_SENT, STUCK, Held
from tasks.job.names import APPROVAL
from tasks.job.report import (
    answered_by,
    batch_lines,
    degraded_words,
    draft_digest,
    email_state,
    receipt_line,
    utc,
)
from tasks.llm.cost import Usage, dollars, is_call, is_completion, usage_of
from tasks.llm.prompts import PROMPTS
from tasks.ops.cli.parser import SHOW_SCHEMA

if TYPE_CHECKING:  # the replay machinery is check-replay's alone: not imported to show a run
    from journal.testing.preflight import Verdict
    from tasks.llm.ratelimit import LimitState

# Every C0 and C1 control character but tab (and newline, where a text may span lines).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, newlines: bool = False) -> str:
    r"""Text from the journal, a model or an API error, made safe to print on a terminal.

    It is data, never terminal commands: each control character (ESC, and with it every
    escape sequence; CR; C1's CSI) is shown escaped, as ``\x1b``. Unless ``newlines``, a
    newline is escaped too, so a stored text cannot forge a line of the report.
    """
    pattern = _CONTROL_BUT_NEWLINE if newlines else _CONTROL
    return pattern.sub(lambda found: ascii(found.group())[1:-1], text)


def _preview(value: Any, width: int = 60) -> str:
    text = value.get("text") if isinstance(value, dict) and "text" in value else value
    flat = json.dumps(text, ensure_ascii=False) if not isinstance(text, str) else text
    flat = " ".join(flat.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _result_text(record: Record) -> str:
    """A step's result in a line: the send step's receipt in words, as ``digest run`` says it.

    Its record's ``sent`` means "delivered by this attempt": false for an email an earlier
    attempt delivered, which would read as "not sent".

    A completion is prefixed with the model that answered it: with a fallback chain, the
    primary or a fallback, as the journal recorded it.
    """
    if record.key == "send" and isinstance(record.result, dict) and "id" in record.result:
        return receipt_line({"receipt": record.result}).removeprefix(", ")
    if is_completion(record.result) and isinstance(record.result.get("model"), str):
        return f"[{printable(record.result['model'])}] {_preview(record.result)}"
    return _preview(record.result)


def _cost(value: Any) -> str:
    if not is_call(value):
        return ""
    cost = value.get("cost_usd")
    return "unpriced" if cost is None else dollars(float(cost))


def _usage(value: Any) -> str:
    if isinstance(value, dict) and "input_tokens" in value:
        return f"{value['input_tokens']}+{value['output_tokens']} tok"
    return ""


def fate(meta: Mapping[str, str]) -> str:
    """What becomes of a run that failed, or waits on an operator.

    A run that failed for a transient cause: its next retry, or none; one whose email may have
    been sent: the decision it waits for.
    """
    wait = meta.get("wait")
    deciding = wait and Wait.from_meta(meta.get("run_id", "?"), wait).kind == "decision"
    if meta.get("status") == "waiting" and deciding:
        return "(its email may have been sent: digest mark-sent or digest resend decides)"
    failures = meta.get("failures", "?")
    if meta.get("status") == "retrying":
        return (
            f"(next retry {_when_ms(meta, 'retry_at')}, gives up after "
            f"{_when_ms(meta, 'retry_until')}; transient failures so far: {failures})"
        )
    if meta.get("status") == "failed" and "gave_up_at" in meta:
        return (
            f"for good (gave up {_when_ms(meta, 'gave_up_at')}; transient failures: {failures}; "
            "not retried again)"
        )
    return ""


def outcome_line(meta: Mapping[str, str]) -> str:
    """A finished run's outcome in words: ``sent: 8 items, email sent (...)``, ``rejected``."""
    if meta.get("status") != "done" or "outcome" not in meta:
        return ""
    result = json.loads(meta["outcome"])
    if not isinstance(result, dict) or "status" not in result:
        return ""
    if result["status"] == "sent":
        return f"{degraded_words(result)}: {result['items']} items{receipt_line(result)}"
    reason = result.get("reason")
    return f"{result['status']} ({reason})" if reason else str(result["status"])


def _when_ms(meta: Mapping[str, str], name: str) -> str:
    raw = meta.get(name, "")
    return utc(int(raw) / 1000) if raw.isdigit() else f"unknown ({name}={raw!r})"


# A run longer than this shows its first and last steps, the rest counted in one line: a
# week of thousands of items would otherwise print thousands of lines before its totals.
STEPS_SHOWN = 40


def render_view(
    view: RunView, held: int = 0, limits: Sequence[LimitState] = (), *, every_step: bool = False
) -> str:
    """``digest show``: the run's state, its steps with their usage, and a draft awaiting approval.

    ``held`` is how many items the run holds; ``limits`` the model API's rate limits as last
    stated, shared by every process on the key, not the run's own. A run of more than
    ``STEPS_SHOWN`` steps lists its first and last steps and sums up the ones between, unless
    ``every_step``.
    """
    usage = usage_of(record.result for record in view.steps)
    lines = _state_lines(view, held)
    lines += _step_lines(view, usage, limits, every_step)
    lines += _draft_lines(view)
    return "\n".join(lines)


def _state_lines(view: RunView, held: int) -> list[str]:
    """Where the run stands: status, claims, lease, starts, email, error, wait, batches."""
    meta = view.meta
    then = fate(meta)  # the next retry, or that it gave up
    outcome = outcome_line(meta)
    status = f"{view.status}: {outcome}" if outcome else f"{view.status} {then}".rstrip()
    lines = [f"run      {view.run}", f"status   {status}"]
    if held:
        ways = ": digest retry sends them, digest release hands them on"
        stuck = view.status in STUCK and view.effects.get("send") not in MAYBE_SENT
        lines.append(f"holds    {held} items{ways if stuck else ''}")
    if meta.get("cancel"):
        lines.append(
            f"cancel   {meta['cancel']} (asked {utc(int(meta['cancel_requested_at']) / 1000)})"
        )
    if meta.get("forked_from"):
        lines.append(f"forked   from {meta['forked_from']} at {meta.get('forked_at_step', '?')}")
    if meta.get("parked"):
        lines.append("parked   yes: starts kept dying; `digest run RUN --retry` resets it")
    if view.lease_holder:
        expires = f"{(view.lease_ttl_ms or 0) / 1000:.1f}s"
        lines.append(f"lease    fence {view.lease_holder.split(':')[0]}, expires in {expires}")
    else:
        lines.append("lease    free")
    lines.append(
        f"starts   {meta.get('starts', '0')} (deliveries {meta.get('deliveries', '0')}, "
        f"fence {meta.get('fence', '0')})"
    )
    lines.append(f"email    {email_state(view)}")
    answered = answered_by(view.steps)
    if answered:
        lines.append(f"models   {answered}")
    deadline = (view.meta.args or {}).get("degrade_at")
    if isinstance(deadline, int | float):
        lines.append(f"deadline {utc(deadline)} (DIGEST_DEGRADE_AT)")
    if meta.get("last_error"):
        lines.append(f"error    {printable(meta['last_error'])}")
    if view.wait is not None and view.wait.kind == "decision":
        lines.append(f"waiting  for a decision on {view.wait.step}: mark-sent or resend")
    elif view.wait is not None:
        until = utc(view.wait.until) if view.wait.until else "no limit"
        lines.append(
            f"waiting  {view.wait.kind} {view.wait.signal or view.wait.step} until {until}"
        )
    shown = batch_lines(view.steps, view.wait, view.effects)
    lines.extend(f"{'batch' if n == 0 else '':8} {line}" for n, line in enumerate(shown))
    return lines


def _step_lines(
    view: RunView, usage: Usage, limits: Sequence[LimitState], every_step: bool
) -> list[str]:
    """The cache and the rate limits, then a line per step, then what the run used in all."""
    lines = [
        f"cache    hit ratio {usage.cache_hit_ratio:.2f} ({usage.cache_read_tokens} prompt "
        f"tokens read from the cache, {usage.cache_write_tokens} written to it)"
    ]
    # Not the run's own: every process on the API key shares them (tasks.llm.ratelimit).
    lines.extend(f"{'limits' if n == 0 else '':8} {state.line()}" for n, state in enumerate(limits))
    lines.append("")
    lines.append(f"{'step':22} {'finished':23} {'try':>3} {'usage':>13} {'cost':>9}  result")
    steps, half = view.steps, STEPS_SHOWN // 2
    if every_step or len(steps) <= STEPS_SHOWN:
        lines += [_step_line(record) for record in steps]
    else:
        lines += [_step_line(record) for record in steps[:half]]
        lines.append(_hidden_line(view.run, steps[half:-half]))
        lines += [_step_line(record) for record in steps[-half:]]
    lines += _prompt_lines(view)
    unpriced = f" ({usage.unpriced} calls unpriced)" if usage.unpriced else ""
    offline = f" ({usage.offline} offline summaries)" if usage.offline else ""
    batched = f" ({usage.batched} by batch, at half the price)" if usage.batched else ""
    lines.append(
        f"\n{len(view.steps)} steps, {usage.calls} model calls{batched}{offline}, "
        f"{usage.input_tokens} input + {usage.output_tokens} output tokens, "
        f"{dollars(usage.cost_usd)}{unpriced}"
    )
    return lines


def _step_line(record: Record) -> str:
    return (
        f"{record.key:22} {utc(record.finished_at / 1000):23} {record.attempt:>3} "
        f"{_usage(record.result):>13} {_cost(record.result):>9}  {_result_text(record)}"
    )


def _hidden_line(run: str, hidden: Sequence[Record]) -> str:
    """The steps a long run's listing leaves out, counted by kind, with the way to see them."""
    kinds = Counter(record.key.split(":", 1)[0] for record in hidden)
    counted = ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())
    retried = sum(1 for record in hidden if record.attempt > 1)
    failed = sum(1 for r in hidden if isinstance(r.result, dict) and "error" in r.result)
    notes = "".join(
        f", {count} {what}" for count, what in ((retried, "retried"), (failed, "skipped")) if count
    )
    run_id = run.partition(":")[2]
    return (
        f"{'...':22} {len(hidden)} steps not shown ({counted}{notes}): digest show {run_id} --all"
    )


def _draft_lines(view: RunView) -> list[str]:
    """The draft a run waits at its approval gate with, for the reviewer to read."""
    draft = view.step("draft")
    if view.wait is None or view.wait.signal != APPROVAL or draft is None:
        return []
    email = draft.result
    return [
        f"\nawaiting approval (draft {draft_digest(email)}):\n"
        f"To: {email['to']}\nSubject: {email['subject']}\n",
        email["body"],
    ]


def _prompt_lines(view: RunView) -> list[str]:
    """The model steps that ran under another version of their prompt than the code's now."""
    other: dict[str, list[str]] = {}
    for record in view.steps:
        version = record.result.get("prompt") if is_call(record.result) else None
        if isinstance(version, str) and PROMPTS.get(version.split("@")[0]) != version:
            other.setdefault(version, []).append(record.key)
    return [
        f"prompt   {', '.join(keys)} ran under {version}; the code now has "
        f"{PROMPTS.get(version.split('@')[0], 'no such prompt')}"
        for version, keys in other.items()
    ]


def verdict_line(verdict: Verdict) -> str:
    """One run's verdict: clean and where it stops, or where and how it would break."""
    kept = [f"{gate}=0" for gate, answer in verdict.gates.items() if answer == 0]
    gates = f"; kept on the old path by version gate {', '.join(kept)}" if kept else ""
    head = f"{verdict.run:28} {verdict.state:9}"
    if verdict.drift is not None:
        drift = verdict.drift
        return (
            f"{head} DRIFTS at step {drift.position}: the journal recorded {drift.expected!r}, "
            f"the code asks for {drift.found!r}; gate the change with run.version(KEY, N) "
            f"(this run would get 0 and keep the old path){gates}"
        )
    if verdict.error is not None:
        return f"{head} BREAKS on its recorded steps: {verdict.error}{gates}"
    return f"{head} replays cleanly, stops {verdict.stopped}{gates}"


def view_json(view: RunView) -> dict[str, Any]:
    """``digest show --json``: every value typed (numbers, ISO 8601 times, nested objects).

    The layout is versioned (``schema``); docs/operations.md describes it.
    """
    # The wait is given once, below, with its time in ISO 8601 like every other.
    meta = {name: _typed(name, value) for name, value in view.meta.items() if name != "wait"}
    return {
        "schema": SHOW_SCHEMA,
        "run": view.run,
        "status": view.status,
        "state": view.state,
        "outcome": meta.pop("outcome", None),  # the run's result, once it ended
        "meta": meta,
        "lease": {"holder": view.lease_holder, "ttl_ms": view.lease_ttl_ms},
        "wait": _wait_json(view),
        "signals": view.signals,
        "steps": [
            {
                "key": r.key,
                "kind": r.kind,
                "seq": r.seq,
                "attempt": r.attempt,
                "fence": r.fence,
                "started_at": _iso(r.started_at),
                "finished_at": _iso(r.finished_at),
                "result": r.result,
                "text": _result_text(r),
            }
            for r in view.steps
        ],
    }


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _typed(name: str, value: str) -> Any:
    """A meta field as JSON: times in ISO 8601, counts as numbers, stored JSON as objects.

    Times are the fields stored as milliseconds since the epoch (``*_at``, ``*_until``);
    stored JSON is the outcome, the arguments and the wait; anything else stays text.
    """
    if value.isdigit():
        return _iso(int(value)) if name.endswith(("_at", "_until")) else int(value)
    if value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _wait_json(view: RunView) -> dict[str, Any] | None:
    if view.wait is None:
        return None
    wait = view.wait.to_json()
    if isinstance(wait.get("until"), int | float):
        wait["until"] = datetime.fromtimestamp(wait["until"], UTC).isoformat()
    return wait


def result_lines(result: dict[str, Any]) -> str:
    """A finished ``digest run``: the items it skipped, a dry run's email, then its line.

    ``sent: 8 items, 9 model calls in this attempt, email sent (...)``, followed by the items
    other runs hold and the way to free them.
    """
    lines = [
        f"  skipped  summarize:{skipped['id']} ({printable(redact(skipped['error']))})"
        for skipped in result.get("skipped", [])
    ]
    if result["status"] == "dry-run":
        email = result["email"]
        text = f"\nTo: {email['to']}\nSubject: {email['subject']}\n\n{email['body']}\n"
        lines.append(printable(text, newlines=True))
    held = [Held(**entry) for entry in result.get("held", [])]
    items = f"{result['items']} new items" if held else f"{result['items']} items"
    offline_made = result.get("offline_summaries", 0)
    made = (
        f"{offline_made} offline summaries (no model calls)"
        if offline_made
        else f"{result['model_calls']} model calls"
    )
    if result.get("batch_requests"):
        made += f" and {result['batch_requests']} batch requests"
    line = f"{degraded_words(result)}: {items}, {made} in this attempt{receipt_line(result)}"
    lines.append(printable("; ".join([line, *(entry.line() for entry in held)])))
    return "\n".join(lines)

"""What the campaign saw: a monitor sampling Redis while faults run, and the final snapshot.

The monitor is the only way to see what the end state hides: a fence that went down and back
up, a step record that changed, a status that left ``done``, a send that was ``ambiguous``
for a while before an operator decided. It samples every run the journal lists, a few times a
second, and skips a sample while Valkey is down (a kill -9 is one of the faults).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import defaultdict
from typing import Any

import redis

from journal._schema.keys import RunKeys
from journal.ops.views import RunView, inspect_run
from tasks.keys import text
from tasks.runtime import Runtime
from tests.chaos.checker import Call, Email, FaultWindow, Observation, RunState
from tests.chaos.stack import Stack
from tests.fakes.anthropic_server import message_text

WORKFLOW = "digest"
SAMPLE_EVERY_S = 0.25
_TITLE = re.compile(r'<update title="Update ([^"]+)"')
_LINE = re.compile(r"^\* Update ([A-Za-z0-9._-]+):", re.MULTILINE)
_SUBJECT = re.compile(r"\(([A-Za-z0-9._-]+)\)\s*$")


def item_title(item_id: str) -> str:
    """An item's title: the email's line and the prompt both name the item by it."""
    return f"Update {item_id}"


class Monitor(threading.Thread):
    """Samples every run's status, fence, step records and send state until stopped."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(daemon=True, name="chaos-monitor")
        self.runtime = runtime
        self.statuses: dict[str, list[str]] = defaultdict(list)
        self.fences: dict[str, list[int]] = defaultdict(list)
        self.records: dict[tuple[str, str], bytes] = {}
        self.rewritten: list[tuple[str, str, str, str]] = []
        self.ambiguous: set[str] = set()
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._stopping.wait(SAMPLE_EVERY_S):
            with contextlib.suppress(redis.RedisError, OSError):
                self.sample()

    def stop(self) -> None:
        """Stop sampling and wait for the thread (one sample at most)."""
        self._stopping.set()
        self.join(timeout=10)

    def run_ids(self) -> list[str]:
        """Every run of the workflow the journal's index lists."""
        index = self.runtime.journal.keys(WORKFLOW, "probe").index.runs
        listed: list[bytes] = self.runtime.client.zrange(index, 0, -1)  # type: ignore[assignment]
        names = [text(raw) for raw in listed]
        return sorted(n.partition(":")[2] for n in names if n.startswith(f"{WORKFLOW}:"))

    def sample(self) -> None:
        """One sample of every run, in one pipeline."""
        run_ids = self.run_ids()
        keys = [self.runtime.journal.keys(WORKFLOW, run_id) for run_id in run_ids]
        pipe = self.runtime.client.pipeline(transaction=False)
        for run_keys in keys:
            pipe.hget(run_keys.meta, "status")
            pipe.get(run_keys.fence)
            pipe.hgetall(run_keys.steps)
            pipe.hget(run_keys.effects, "send")
        replies = pipe.execute()
        with self._lock:
            for index, run_id in enumerate(run_ids):
                status, fence, steps, send = replies[4 * index : 4 * index + 4]
                self._note(run_id, status, fence, steps, send)

    def _note(
        self, run_id: str, status: bytes | None, fence: bytes | None, steps: Any, send: Any
    ) -> None:
        seen = self.statuses[run_id]
        now = status.decode() if status else "new"
        if not seen or seen[-1] != now:
            seen.append(now)
        fences = self.fences[run_id]
        value = int(fence or 0)
        if not fences or fences[-1] != value:
            fences.append(value)
        for key, raw in steps.items():
            step = key.decode()
            before = self.records.setdefault((run_id, step), raw)
            if before != raw:
                self.rewritten.append((run_id, step, before.decode(), raw.decode()))
                self.records[(run_id, step)] = raw
        if send is not None and send.decode().rsplit(":", 1)[-1] in ("ambiguous", "resend"):
            self.ambiguous.add(run_id)


def parse_email(message: Any, received_at: float) -> Email:
    """The run, Message-ID and items of one message the SMTP server took."""
    subject = str(message["Subject"] or "")
    matched = _SUBJECT.search(subject)
    body = message.get_content() if not message.is_multipart() else str(message)
    return Email(
        run_id=matched.group(1) if matched else subject,
        message_id=str(message["Message-ID"] or ""),
        items=tuple(_LINE.findall(body)),
        received_at=received_at,
    )


def paid_calls(stack: Stack) -> list[Call]:
    """Every paid model call: synchronous 200s and the batch requests that succeeded."""
    calls = []
    for call in stack.api.timed:
        if call.status != 200:
            continue
        calls.append(_call(call.text, call.started, call.ended))
    for batch in stack.api.batches:
        params = {r["custom_id"]: r["params"] for r in batch.requests}
        for entry in batch.results:
            if entry["result"]["type"] != "succeeded":
                continue
            text = message_text(params.get(entry["custom_id"], {}))
            ended = batch.ended_at or batch.created_at
            calls.append(_call(text, batch.created_at, ended, batch=True))
    return calls


def _call(text: str, started: float, ended: float, batch: bool = False) -> Call:
    """One paid request: an item's summary, or an opening paragraph naming its items."""
    if "<updates>" in text:
        return Call(None, started, ended, batch, tuple(sorted(_TITLE.findall(text))))
    matched = _TITLE.search(text)
    return Call(matched.group(1) if matched else None, started, ended, batch)


# The opening paragraph's step: ``compose`` when asked synchronously, its batch's item else.
OPENING_STEPS = frozenset({"compose", "compose:opening"})


def _opened(view: RunView) -> tuple[str, ...]:
    """The items of the opening paragraph the run recorded; empty when it recorded none.

    Its prompt names the items whose summary has a text (a refused item is left out), so
    the recorded summaries, a fork's copies included, name them.
    """
    if not any(record.key in OPENING_STEPS for record in view.steps):
        return ()
    return tuple(
        sorted(
            record.key.removeprefix("summarize:")
            for record in view.steps
            if record.key.startswith("summarize:")
            and isinstance(record.result, dict)
            and "text" in record.result
        )
    )


def run_state(runtime: Runtime, run_id: str, listed: set[str]) -> RunState:
    """One run as the journal holds it now."""
    view = inspect_run(runtime.journal, WORKFLOW, run_id)
    meta = view.meta
    args = json.loads(meta.get("args") or "{}")
    approval = None
    signal = view.step("signal:approval")
    if signal is not None:
        result = signal.result if isinstance(signal.result, dict) else {}
        sent = result.get("payload")
        payload = sent if isinstance(sent, dict) else {}
        if not result.get("received"):
            approval = "timed-out"
        else:
            approval = "approved" if payload.get("approved") else "rejected"
    fork_of = run_id.partition("-fork")[0] if "-fork" in run_id else None
    person = view.wait is not None and view.wait.signal == "approval"
    decision = view.effects.get("send") == "ambiguous"
    stuck = view.status in ("running", "retrying") or (
        view.status == "waiting" and not person and not decision
    )
    summarized = (
        ()
        if fork_of
        else tuple(
            r.key.removeprefix("summarize:") for r in view.steps if r.key.startswith("summarize:")
        )
    )
    select = view.step("select")
    frozen = (
        tuple(str(entry["id"]) for entry in select.result)
        if select is not None and isinstance(select.result, list) and not fork_of
        else ()
    )
    return RunState(
        run_id=run_id,
        status=meta.get("status"),
        args=args if isinstance(args, dict) else {},
        send=view.effects.get("send", ""),
        approval=approval,
        lease=view.lease_holder is not None,
        fence=int(meta.get("fence") or 0),
        step_fences={r.key: r.fence for r in view.steps},
        summarized=summarized,
        opened=_opened(view),
        listed=run_id in listed,
        frozen=frozen,
        fork_of=fork_of,
        stuck=stuck,
    )


def fence_counter(runtime: Runtime, keys: RunKeys) -> int:
    """The run's fence counter (meta's copy can lag the counter by a failed acquisition)."""
    return int(runtime.client.get(keys.fence) or 0)


def observe(
    stack: Stack,
    runtime: Runtime,
    monitor: Monitor,
    *,
    items: list[str],
    weeks: list[str],
    listed: set[str],
    faults: list[FaultWindow],
    resent: set[str],
    copies_allowed: bool,
) -> Observation:
    """Everything the checker judges, read once the campaign is quiet."""
    run_ids = monitor.run_ids()
    runs = {}
    for run_id in sorted(set(run_ids) | set(weeks)):
        state = run_state(runtime, run_id, listed)
        state.fence = fence_counter(runtime, runtime.journal.keys(WORKFLOW, run_id))
        runs[run_id] = state
    claims = {
        text(key): text(value) for key, value in runtime.client.hgetall(runtime.keys.claims).items()
    }
    seen = {text(raw) for raw in runtime.client.smembers(runtime.keys.seen)}
    received = stack.inbox.received_at
    emails = [
        parse_email(message, received[i] if i < len(received) else 0.0)
        for i, message in enumerate(stack.messages())
    ]
    return Observation(
        items=items,
        weeks=weeks,
        emails=emails,
        calls=paid_calls(stack),
        runs=runs,
        claims=claims,
        seen=seen,
        statuses=dict(monitor.statuses),
        fences=dict(monitor.fences),
        rewritten=list(monitor.rewritten),
        ambiguous=set(monitor.ambiguous) | resent,
        faults=faults,
        copies_allowed=copies_allowed,
    )

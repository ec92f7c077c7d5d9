"""Runs in every state an operator meets, made by the real digest in this process.

Each state comes from the workflow itself (offline summaries, a file outbox that can be told
to fail), not from hand-written hashes, so the pages are judged on what a run really stores.
The one exception is ``many_runs``: ten thousand finished runs, written straight into the
index and their metas, which is all a listing reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from journal import Journal, Keyspace, RunRetry, Settings
from tasks.config import Config
from tasks.errors import MailFailed, MailUnavailable, is_transient_failure
from tasks.job.report import draft_digest
from tasks.job.workflow import DigestOptions, digest
from tasks.keys import DigestKeys
from tasks.llm.client import OfflineSummarizer
from tasks.mail.message import Email, Receipt
from tasks.mail.smtp import FileOutbox, SendEffect
from tasks.runtime import Runtime, use_runtime
from tests.support import WEEK

# As a deployment's: a transient failure leaves the run retrying.
SETTINGS = Settings(run_retry=RunRetry(retryable=is_transient_failure))


class Outbox(FileOutbox):
    """The file outbox, told how to fail: ``down`` (4xx), ``refused`` (5xx), ``lost``.

    ``lost`` confirms the send, then loses the answer: the email may have gone out.
    """

    mode = "ok"

    def send(self, key: str, email: Email, effect: SendEffect | None = None) -> Receipt:
        if self.mode == "down":
            raise MailUnavailable("smtp.example.com:587 answered 421: try again later")
        if self.mode == "refused":
            raise MailFailed("smtp.example.com:587 answered 550: mailbox unavailable")
        if self.mode == "lost" and effect is not None:
            effect.confirm()
            raise TimeoutError("no answer from smtp.example.com after the end of the data")
        return super().send(key, email, effect)


def runtime_for(client: redis.Redis, prefix: str, state: Path, **settings: Any) -> Runtime:
    """A runtime of its own prefix, its workflows run in this process; ``settings`` of its
    ``Config`` besides."""
    outbox = Outbox(state / "outbox")
    outbox.deduplicates = False  # a lost answer leaves the send ambiguous
    made = Runtime(
        config=Config(key_prefix=prefix, state_dir=state, recipient="team@example.com", **settings),
        client=client,
        journal=Journal(client, keyspace=Keyspace(prefix), settings=SETTINGS),
        keys=DigestKeys(prefix),
        summarizer=OfflineSummarizer(),
        mailer=outbox,
    )
    use_runtime(made)
    return made


def week(state: Path, tag: str, size: int = 4) -> str:
    """An items file of its own (an item belongs to one digest).

    Named relative to ``state``, the working directory of the tests that use it: a page
    shows its runs' inputs, and the screenshots in docs/ should not show a temporary path.
    """
    path = state / f"items-{tag}.json"
    path.write_text(json.dumps([{**item, "id": tag + item["id"]} for item in WEEK[:size]]))
    return path.name


def start(run_id: str, **options: Any) -> Any:
    """Start (or resume) a run; a failure is a state here, not an error."""
    try:
        return digest.start(run_id, DigestOptions(**options))
    except Exception as failed:  # the state is what the test wants
        return failed


def decide(runtime: Runtime, run_id: str, approved: bool, reason: str = "") -> None:
    """Approve or reject as the console does, then let the run resume here."""
    keys = runtime.journal.keys("digest", run_id)
    draft = runtime.journal.snapshot(keys).steps[b"draft"]
    recorded = json.loads(draft)["result"]
    payload = {"approved": approved, "reason": reason, "by": "console", "draft": ""}
    payload["draft"] = draft_digest(recorded)
    runtime.journal.send_signal("digest", run_id, "approval", payload)


def every_state(runtime: Runtime, state: Path) -> dict[str, str]:
    """One run in each state the console pages show, by state name; returns their run ids.

    Run with ``state`` as the working directory (see ``week``).
    """
    outbox = runtime.mailer
    assert isinstance(outbox, Outbox)
    sent_items = week(state, "a")
    start("2026-w40", items=sent_items)
    start("2026-w41", items=week(state, "b"), approval=True)
    decide(runtime, "2026-w41", False, "the intro is wrong")
    start("2026-w41", items=week(state, "b"), approval=True)
    start("2026-w42", items=sent_items)
    start("2026-w43", items=week(state, "c"), approval=True)
    outbox.mode = "down"
    start("2026-w44", items=week(state, "d"))
    outbox.mode = "refused"
    start("2026-w45", items=week(state, "e"))
    start("2026-w46", items=week(state, "e"))  # held: w45 still holds these items
    outbox.mode = "lost"
    start("2026-w47", items=week(state, "f"))
    outbox.mode = "ok"
    return {
        "sent": "2026-w40",
        "rejected": "2026-w41",
        "nothing-new": "2026-w42",
        "waiting": "2026-w43",
        "retrying": "2026-w44",
        "failed": "2026-w45",
        "held": "2026-w46",
        "ambiguous": "2026-w47",
    }


def many_runs(journal: Journal, count: int, now_ms: int) -> None:
    """``count`` finished runs a minute apart, as the index and metas a listing reads."""
    pipe = journal.backend.client.pipeline(transaction=False)
    for n in range(count):
        keys = journal.keys("digest", f"load-{n:05d}")
        at = now_ms - (count - n) * 60_000
        outcome = json.dumps({"status": "sent" if n % 3 else "nothing-new", "items": n % 9})
        pipe.hset(
            keys.meta,
            mapping={
                "status": "done",
                "created_at": at,
                "updated_at": at + 4_000,
                "finished_at": at + 4_000,
                "outcome": outcome,
            },
        )
        pipe.zadd(keys.index.runs, {keys.run: at + 4_000})
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()

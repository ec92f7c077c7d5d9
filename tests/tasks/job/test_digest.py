"""The tutorial's failure modes, in process: the real workflow, journal, SDK and outbox.

Each test runs ``run_digest`` under ``Journal.execute`` on the shared Redis (DB 14, a key prefix
of its own), with the real Anthropic SDK pointed at the fake server, so every model call is a
real HTTP request the test counts. A crash is a ``Crash`` raised at a point: a BaseException,
so, like a killed process, it neither marks the run failed nor releases its lease.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from journal import Journal, Keyspace, Outcome, Run, Settings, StepEvent
from journal.errors import CorruptJournal, LeaseBusy, LeaseLost
from tasks.config import DEFAULT_INTRO_MODEL, DEFAULT_SUMMARY_MODEL, Config
from tasks.errors import EveryItemRefused, ModelAuthFailed, ModelRefused
from tasks.job.claims import mark_seen, select_unseen
from tasks.job.items import Item
from tasks.job.workflow import DigestOptions, run_digest
from tasks.keys import DigestKeys, text
from tasks.llm.client import AnthropicSummarizer, Completion, Summarizer
from tasks.llm.prompts import Update
from tasks.llm.ratelimit import RateLimiter, account_of
from tasks.mail.message import Email, Receipt
from tasks.mail.smtp import FileOutbox, Mailer, SendEffect
from tasks.ops.cli import main
from tasks.runtime import Runtime
from tests.fakes.anthropic_server import CREDIT_TOO_LOW, PROMPT_TOO_LONG, FakeAnthropic
from tests.support import execute, wait_until, watched_client

# Renewed every third of it by the heartbeat thread: at 0.5 s a loaded two-core machine missed
# the renewals long enough for a live run to lose its lease mid-map. The expiry waits cost
# a crashed holder's remaining lease, a second or two.
LEASE_TTL = 1.5
ITEMS = [{"id": i, "title": f"Item {i}", "body": f"Body {i}."} for i in ("a", "b", "c")]


class Crash(BaseException):
    """A simulated kill: escapes ``except Exception``, so nothing cleans up after it."""


def crash_after(step: str) -> Callable[[StepEvent], None]:
    """An ``on_step`` that kills the run right after ``step`` is recorded."""

    def on_step(event: StepEvent) -> None:
        if event.key == step and not event.replayed:
            raise Crash(f"after:{step}")

    return on_step


def write_items(path: Path, items: list[dict[str, str]]) -> Path:
    path.write_text(json.dumps(items), encoding="utf-8")
    return path


@pytest.fixture
def items_file(tmp_path: Path) -> Path:
    return write_items(tmp_path / "items.json", ITEMS)


class LocalDigest:
    """One digest deployment in this process: a prefix on the shared Redis and an outbox."""

    def __init__(
        self, client: redis.Redis, prefix: str, tmp_path: Path, fake: FakeAnthropic, items: Path
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.fake = fake
        self.items = items
        self.outbox_dir = tmp_path / "state" / "outbox"
        self.journal = Journal(
            client, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=LEASE_TTL)
        )

    def runtime(
        self,
        *,
        concurrency: int = 1,
        mailer: Mailer | None = None,
        summarizer: Summarizer | None = None,
    ) -> Runtime:
        config = Config(
            state_dir=self.outbox_dir.parent,
            items_path=str(self.items),
            key_prefix=self.prefix,
            concurrency=concurrency,
            lease_ttl=LEASE_TTL,
            retry_base_delay=0.01,
        )
        sdk = functools.partial(self.fake.client, timeout=5.0)
        return Runtime(
            config=config,
            client=self.client,
            journal=self.journal,
            keys=DigestKeys(self.prefix),
            summarizer=summarizer
            or AnthropicSummarizer(sdk, DEFAULT_SUMMARY_MODEL, DEFAULT_INTRO_MODEL),
            mailer=mailer or FileOutbox(self.outbox_dir),
        )

    def run(
        self,
        run_id: str,
        *,
        on_step: Callable[[StepEvent], None] | None = None,
        runtime: Runtime | None = None,
        **options: Any,
    ) -> Outcome:
        active = runtime or self.runtime()
        return execute(
            self.journal,
            "digest",
            run_id,
            lambda run: run_digest(run, active, DigestOptions(**options)),
            args=options,
            on_step=on_step,
        )

    def outbox(self) -> list[str]:
        return sorted(p.name for p in self.outbox_dir.glob("*.json"))

    def emails(self) -> list[dict[str, Any]]:
        return [json.loads((self.outbox_dir / name).read_text()) for name in self.outbox()]

    def seen(self) -> set[str]:
        return {text(m) for m in self.client.smembers(DigestKeys(self.prefix).seen)}

    def meta(self, run_id: str) -> Mapping[str, str]:
        return self.journal.meta(self.journal.keys("digest", run_id))

    def wait_for_lease_expiry(self, run_id: str) -> None:
        lease = self.journal.keys("digest", run_id).lease
        wait_until(lambda: not self.client.exists(lease), 5, f"the lease of {run_id} to expire")


@pytest.fixture
def digest(
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    fake_anthropic: FakeAnthropic,
    items_file: Path,
) -> LocalDigest:
    return LocalDigest(real_redis, prefix, tmp_path, fake_anthropic, items_file)


# --- the tutorial's seven tests


def test_a_step_runs_once_and_later_attempts_replay_its_saved_result(digest: LocalDigest) -> None:
    runs: list[int] = []
    attempts: list[int] = []

    def x() -> int:
        runs.append(1)
        return len(runs)

    def body(run: Run) -> int:
        attempts.append(1)
        value = run.step("x", x)
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails after x")
        return value

    with pytest.raises(RuntimeError):
        execute(digest.journal, "steps", "r1", body)
    events: list[StepEvent] = []
    second = execute(digest.journal, "steps", "r1", body, on_step=events.append)
    assert second.result == 1
    assert runs == [1]
    assert events == [StepEvent("x", True, "step", 1)]
    assert (second.ran, second.replayed) == (0, 1)


@pytest.mark.parametrize(
    "stored",
    [b'{"result": {"text": "summary of Item b", "input_tok', b'{"result": "summary of Item b"}'],
    ids=["torn", "missing-fields"],
)
def test_a_partial_record_is_corrupt_and_is_never_run_again(
    digest: LocalDigest, fake_anthropic: FakeAnthropic, stored: bytes
) -> None:
    with pytest.raises(Crash):
        digest.run("w1", on_step=crash_after("summarize:a"))
    steps = digest.journal.keys("digest", "w1").steps
    digest.client.hset(steps, "summarize:b", stored)
    digest.wait_for_lease_expiry("w1")

    with pytest.raises(CorruptJournal) as caught:
        digest.run("w1")
    assert caught.value.field == "summarize:b"
    assert fake_anthropic.calls == 1  # summarize:a only: nothing ran again, nothing new ran
    assert digest.client.hget(steps, "summarize:b") == stored
    assert digest.outbox() == []
    assert not digest.client.exists(digest.journal.keys("digest", "w1").lease)


def test_a_step_whose_record_never_landed_runs_again(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    class DiesAfterAnswer:
        """Gets the model's answer for b, then dies before the step can record it."""

        name = "dies after answer"
        remote = True

        def __init__(self, inner: AnthropicSummarizer) -> None:
            self.inner = inner

        def summarize(self, item: Update, model: str | None = None) -> Completion:
            assert isinstance(item, Item)  # the job hands its own items to the model
            completion = self.inner.summarize(item, model)
            if item.id == "b":
                raise Crash("between the answer and its record")
            return completion

        def compose(
            self, pairs: Sequence[tuple[Update, str]], model: str | None = None
        ) -> Completion:
            return self.inner.compose(pairs, model)

    sdk = AnthropicSummarizer(functools.partial(fake_anthropic.client, timeout=5.0), "m1", "m2")
    with pytest.raises(Crash):
        digest.run("w1", runtime=digest.runtime(summarizer=DiesAfterAnswer(sdk)))
    recorded = digest.client.hkeys(digest.journal.keys("digest", "w1").steps)
    assert sorted(text(k) for k in recorded) == ["select", "summarize:a"]
    assert fake_anthropic.calls == 2
    digest.wait_for_lease_expiry("w1")

    resumed = digest.run("w1")
    assert resumed.result["status"] == "sent"
    assert resumed.result["model_calls"] == 3  # b again, c, compose
    assert fake_anthropic.calls == 5
    assert fake_anthropic.calls_for('title="Item b"') == 3  # twice alone, once in the intro


def test_a_call_that_waited_for_the_rate_limits_past_its_lease_is_not_paid_for(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    # A worker stopped (SIGSTOP) while its calls waited for the shared limits' room: the lease
    # ran out meanwhile and the run went to another worker. Resumed, the calls must not go out:
    # the new holder pays for them again, and these answers could never be recorded.
    lease = digest.journal.keys("digest", "w1").lease

    class PausedInTheWait(RateLimiter):
        def take(
            self, model: str, input_tokens: int, max_tokens: int, until: float | None = None
        ) -> Any:
            digest.client.delete(lease)  # expired while the process was stopped
            time.sleep(LEASE_TTL)  # long enough for the heartbeat to find it gone
            return super().take(model, input_tokens, max_tokens, until)

    limiter = PausedInTheWait(
        digest.client, DigestKeys(digest.prefix), account_of(fake_anthropic.url, "k"), 30
    )
    sdk = functools.partial(fake_anthropic.client, timeout=5.0)
    summarizer = AnthropicSummarizer(sdk, "m1", "m2", limiter=limiter)

    with pytest.raises(LeaseLost):
        digest.run("w1", runtime=digest.runtime(summarizer=summarizer))
    assert fake_anthropic.calls == 0
    recorded = digest.client.hkeys(digest.journal.keys("digest", "w1").steps)
    assert [text(k) for k in recorded] == ["select"]


def test_a_live_lease_blocks_and_a_dead_one_is_taken_over(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.hold()
    outcomes: list[Outcome] = []
    holder = threading.Thread(target=lambda: outcomes.append(digest.run("w1")))
    holder.start()
    try:
        fake_anthropic.wait_for_calls(1)
        with pytest.raises(LeaseBusy) as busy:
            digest.run("w1")
        assert 0 < busy.value.remaining_ms <= LEASE_TTL * 1000
        time.sleep(LEASE_TTL * 2)  # the holder's heartbeat keeps a live lease alive
        with pytest.raises(LeaseBusy):
            digest.run("w1")
    finally:
        fake_anthropic.release()
        holder.join(timeout=10)
    assert [o.result["status"] for o in outcomes] == ["sent"]
    assert fake_anthropic.calls == 4

    with pytest.raises(Crash):
        digest.run("w2", on_step=crash_after("select"))
    with pytest.raises(LeaseBusy):
        digest.run("w2")  # the dead holder's lease has not expired yet
    digest.wait_for_lease_expiry("w2")
    taken_over = digest.run("w2")
    assert taken_over.result["status"] == "nothing-new"
    assert digest.meta("w2")["fence"] == "2"
    assert fake_anthropic.calls == 4


def test_the_outbox_delivers_once_per_idempotency_key(tmp_path: Path) -> None:
    outbox = FileOutbox(tmp_path / "outbox")
    email = Email(to="a@example.com", subject="s", body="b")
    assert outbox.send("digest-w1", email) == Receipt("digest-w1", sent=True)
    assert outbox.send("digest-w1", email) == Receipt("digest-w1", sent=False)
    assert sorted(p.name for p in (tmp_path / "outbox").iterdir()) == ["digest-w1.json"]


def test_a_crash_mid_run_resumes_without_repeating_finished_model_calls(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    with pytest.raises(Crash):
        digest.run("w1", on_step=crash_after("summarize:b"))
    assert fake_anthropic.calls == 2  # a and b were summarized
    digest.wait_for_lease_expiry("w1")

    events: list[StepEvent] = []
    resumed = digest.run("w1", on_step=events.append)
    assert resumed.result["status"] == "sent"
    assert resumed.result["model_calls"] == 2  # only c and compose
    assert fake_anthropic.calls == 4
    assert [e.key for e in events if e.replayed] == ["select", "summarize:a", "summarize:b"]
    assert [e.key for e in events if not e.replayed] == [
        "summarize:c",
        "compose",
        "send",
        "mark-seen",
        "done",
    ]
    assert digest.outbox() == ["digest-w1.json"]


def test_a_crash_after_sending_but_before_saving_does_not_send_twice(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    class DiesAfterDelivery:
        """Delivers through the real outbox, then dies before ``send`` is recorded, once."""

        timeout = FileOutbox.timeout
        deduplicates = FileOutbox.deduplicates

        def __init__(self, outbox: FileOutbox) -> None:
            self.outbox = outbox
            self.died = False

        def send(self, key: str, email: Email, effect: SendEffect | None = None) -> Receipt:
            receipt = self.outbox.send(key, email, effect)
            if not self.died:
                self.died = True
                raise Crash("before-save:send")
            return receipt

    mailer = DiesAfterDelivery(FileOutbox(digest.outbox_dir))
    with pytest.raises(Crash):
        digest.run("w1", runtime=digest.runtime(mailer=mailer))
    assert digest.outbox() == ["digest-w1.json"]
    digest.wait_for_lease_expiry("w1")

    resumed = digest.run("w1", runtime=digest.runtime(mailer=mailer))
    assert resumed.result["receipt"] == {"id": "digest-w1", "sent": False}
    assert resumed.result["model_calls"] == 0
    assert digest.outbox() == ["digest-w1.json"]
    assert fake_anthropic.calls == 4


def test_a_finished_run_is_not_repeated_and_the_next_run_covers_only_new_items(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    first = digest.run("w1")
    assert first.result == {
        "status": "sent",
        "items": 3,
        "model_calls": 4,
        "receipt": {"id": "digest-w1", "sent": True},
    }
    again = digest.run("w1")
    assert again.status == "already-done"
    assert (again.ran, again.replayed) == (0, 0)
    assert digest.run("w2").result == {"status": "nothing-new", "items": 0, "model_calls": 0}
    assert fake_anthropic.calls == 4
    assert digest.outbox() == ["digest-w1.json"]


# --- beyond the tutorial


@pytest.mark.parametrize("before_trip", range(3))
def test_a_week_selecting_while_another_marks_its_items_seen_never_takes_them(
    digest: LocalDigest, shared_redis_url: str, before_trip: int
) -> None:
    """Found by the fault campaign: week 43 read the seen set, week 42 then marked its items
    seen and let go of their claims, and week 43's claims on them succeeded: both emailed the
    same items. Here week 42 marks them seen right before each of week 43's round trips, and
    after the last."""
    first = digest.runtime()
    ids = [item["id"] for item in ITEMS]
    source = first.config.items_path
    execute(
        digest.journal,
        "digest",
        "2026-w42",
        lambda run: select_unseen(first, source, "digest:2026-w42"),
    )
    trips: list[bytes] = []

    def before_send(request: bytes) -> None:
        if started.is_set():
            trips.append(request)
            if len(trips) == before_trip + 1:
                mark_seen(first, ids)  # on another connection: week 42 ends now

    started = threading.Event()
    client = watched_client(shared_redis_url, before_send)
    client.ping()  # the connection's handshake is not week 43's selection
    started.set()
    second = dataclasses.replace(first, client=client)
    try:
        taken = select_unseen(second, source, "digest:2026-w43")
    finally:
        client.close()
    if len(trips) <= before_trip:
        mark_seen(first, ids)  # week 42 ends after week 43's selection
    assert digest.seen() == set(ids)
    assert [item.id for item in taken] == []
    assert digest.client.hgetall(DigestKeys(digest.prefix).claims) == {}


def test_an_item_the_model_refuses_is_skipped_and_covered_next_week(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_when('title="Item b"', 400, message=PROMPT_TOO_LONG)
    first = digest.run("w1").result
    assert first["status"] == "sent"
    assert first["items"] == 2
    assert [s["id"] for s in first["skipped"]] == ["b"]
    assert "the model refused this item: the prompt is too long" in first["skipped"][0]["error"]
    assert fake_anthropic.calls == 4  # a, b (refused, not retried), c, compose
    assert fake_anthropic.calls_for('title="Item b"') == 1
    [email] = digest.emails()
    assert "Item a" in email["body"] and "Item c" in email["body"]
    assert "Item b" not in email["body"]
    assert digest.seen() == {"a", "c"}

    fake_anthropic.clear_faults()
    second = digest.run("w2").result
    assert (second["status"], second["items"], second["model_calls"]) == ("sent", 1, 2)
    assert "skipped" not in second
    assert "* Item b: summary of Item b" in digest.emails()[1]["body"]
    assert digest.seen() == {"a", "b", "c"}


def test_out_of_credit_fails_the_run_and_every_later_delivery_alike(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    # The API answers every request with the same 400: not three refused items, one account.
    fake_anthropic.fail_always(400, message=CREDIT_TOO_LOW)

    for attempt in (1, 2):
        with pytest.raises(ModelRefused, match="credit balance is too low") as caught:
            digest.run("w1")
        assert type(caught.value) is ModelRefused
        assert fake_anthropic.calls == attempt  # one call per delivery, then the run fails
    meta = digest.meta("w1")
    assert meta["status"] == "failed"
    assert meta["last_error"].startswith("ModelRefused: the Anthropic account's credit balance")
    assert digest.outbox() == []
    assert digest.seen() == set()

    fake_anthropic.clear_faults()
    resumed = digest.run("w1").result
    assert (resumed["status"], resumed["items"]) == ("sent", 3)
    assert digest.seen() == {"a", "b", "c"}


def test_every_item_refused_fails_the_run_instead_of_nothing_new(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(400, message=PROMPT_TOO_LONG)

    with pytest.raises(EveryItemRefused) as caught:
        digest.run("w1")

    line = str(caught.value)
    assert line.startswith("the model refused every item (a, b, c); a: the model refused")
    assert "prompt is too long" in line
    assert "\n" not in line
    assert fake_anthropic.calls == 3  # each item asked once; a refusal is not retried
    meta = digest.meta("w1")
    assert meta["status"] == "failed"
    assert meta["last_error"].startswith("EveryItemRefused: ")
    assert digest.outbox() == []
    assert digest.seen() == set()


def test_a_refused_key_fails_the_run_at_once(
    digest: LocalDigest, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(401)
    with pytest.raises(ModelAuthFailed, match="ANTHROPIC_API_KEY"):
        digest.run("w1")
    meta = digest.meta("w1")
    assert meta["status"] == "failed"
    assert "ModelAuthFailed" in meta["last_error"]
    assert "ANTHROPIC_API_KEY" in meta["last_error"]
    assert fake_anthropic.calls == 1
    assert digest.outbox() == []
    assert digest.seen() == set()


def test_a_dry_run_sends_nothing_marks_nothing_and_leaves_no_journal(
    digest: LocalDigest,
    fake_anthropic: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    shared_redis_url: str,
) -> None:
    monkeypatch.setenv("REDIS_URL", shared_redis_url)
    monkeypatch.setenv("DIGEST_KEY_PREFIX", digest.prefix)
    monkeypatch.setenv("DIGEST_STATE_DIR", str(digest.outbox_dir.parent))
    monkeypatch.setenv("DIGEST_ITEMS", str(digest.items))
    monkeypatch.setenv("DIGEST_CONCURRENCY", "1")

    assert main(["run", "w1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "To: team@example.com\nSubject: Your weekly digest (w1)\n" in out
    assert "* Item c: summary of Item c" in out
    assert out.endswith("dry-run: 3 items, 4 model calls in this attempt\n")
    assert fake_anthropic.calls == 4
    assert digest.outbox() == []
    # No journal, no seen set; only the model API's rate limits, learned for every run.
    assert digest.client.keys(f"{digest.prefix}:*") == digest.client.keys(
        f"{digest.prefix}:{{model-api:*}}:limits"
    )

    assert main(["run", "w1"]) == 0
    out = capsys.readouterr().out
    assert out.count("  ran      summarize:") == 3
    assert "replayed" not in out
    assert out.endswith("sent: 3 items, 4 model calls in this attempt, email sent (digest-w1)\n")
    assert fake_anthropic.calls == 8
    assert digest.outbox() == ["digest-w1.json"]
    assert digest.seen() == {"a", "b", "c"}


def test_the_command_names_the_retry_and_then_the_give_up(
    digest: LocalDigest,
    fake_anthropic: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    shared_redis_url: str,
) -> None:
    monkeypatch.setenv("REDIS_URL", shared_redis_url)
    monkeypatch.setenv("DIGEST_KEY_PREFIX", digest.prefix)
    monkeypatch.setenv("DIGEST_STATE_DIR", str(digest.outbox_dir.parent))
    monkeypatch.setenv("DIGEST_ITEMS", str(digest.items))
    monkeypatch.setenv("DIGEST_RETRY_BASE_DELAY", "0.01")
    monkeypatch.setenv("DIGEST_GIVE_UP_AFTER", "0.5")
    fake_anthropic.fail_next(529, times=5, contains="<updates>")  # compose: the model is down

    assert main(["run", "w1"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("failed: run digest:w1 failed (ModelUnavailable: compose: the model ")
    assert "; the due sweep retries it at " in line
    assert main(["show", "w1"]) == 0
    assert "\nstatus   retrying (next retry " in capsys.readouterr().out
    assert main(["runs"]) == 0
    assert "transient failures so far: 1)" in capsys.readouterr().out

    time.sleep(0.5)  # past DIGEST_GIVE_UP_AFTER: the next failure is the last
    fake_anthropic.fail_next(529, times=5, contains="<updates>")
    assert main(["run", "w1"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("failed: run digest:w1 failed for good after 2 transient failures")
    assert main(["show", "w1"]) == 0
    assert "\nstatus   failed for good (gave up " in capsys.readouterr().out
    assert main(["runs"]) == 0
    assert "transient failures: 2; not retried again)" in capsys.readouterr().out
    assert digest.outbox() == []


def test_titles_reach_the_model_escaped_and_the_email_verbatim(
    digest: LocalDigest, fake_anthropic: FakeAnthropic, tmp_path: Path
) -> None:
    title = 'Quotes "><x'
    items = write_items(tmp_path / "odd.json", [{"id": "q", "title": title, "body": "<b>&</b>"}])
    outcome = digest.run("w1", items=str(items))
    assert outcome.result["status"] == "sent"
    summary, intro = fake_anthropic.requests
    escaped = "Quotes &quot;&gt;&lt;x"
    assert summary.text == f'<update title="{escaped}">\n&lt;b&gt;&amp;&lt;/b&gt;\n</update>'
    assert f'<update title="{escaped}">summary of {escaped}</update>' in intro.text
    assert title not in summary.text + intro.text
    [email] = digest.emails()
    assert f"* {title}: summary of {title}" in email["body"]


def test_at_most_the_configured_number_of_calls_are_in_flight(
    digest: LocalDigest,
    fake_anthropic: FakeAnthropic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seven = [{"id": f"n{i}", "title": f"Note {i}", "body": f"Body {i}."} for i in range(7)]
    items = write_items(tmp_path / "seven.json", seven)
    lock = threading.Lock()
    in_flight = [0, 0]  # now, most
    answer = fake_anthropic.respond

    def counting(path: str, headers: Any, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
        try:
            return answer(path, headers, raw)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(fake_anthropic, "respond", counting)
    fake_anthropic.delay = 0.02
    fake_anthropic.hold()
    outcomes: list[Outcome] = []
    runner = threading.Thread(
        target=lambda: outcomes.append(
            digest.run("w1", runtime=digest.runtime(concurrency=3), items=str(items))
        )
    )
    runner.start()
    try:
        fake_anthropic.wait_for_calls(3)
        time.sleep(0.3)  # long enough for a fourth call to arrive, if the bound were broken
        assert fake_anthropic.calls == 3
    finally:
        fake_anthropic.release()
        runner.join(timeout=10)
    assert outcomes[0].result["model_calls"] == 8
    assert fake_anthropic.calls == 8
    assert in_flight == [0, 3]
    summaries = [r for r in fake_anthropic.requests if r.model == DEFAULT_SUMMARY_MODEL]
    assert len(summaries) == 7

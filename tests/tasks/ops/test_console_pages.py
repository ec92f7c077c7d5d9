"""What each run's page says, in words, for every state the real digest leaves a run in.

In process, with Flask's test client; the same runs are seen in a browser in
``test_console_states_browser``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from journal import Run
from tasks.job.claims import Held
from tasks.job.report import counted
from tasks.llm.client import Completion, OfflineSummarizer
from tasks.llm.prompts import Update
from tasks.ops.console import Names, create_app
from tasks.ops.run_page import badge
from tests.support import execute
from tests.tasks.ops.console_states import every_state, runtime_for, start, week

LOCAL = Names.bound("127.0.0.1", 80)


@pytest.fixture
def pages(
    real_redis: redis.Redis, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)
    runtime = runtime_for(real_redis, prefix, tmp_path)
    runs = every_state(runtime, tmp_path)
    client = create_app(runtime, LOCAL).test_client()
    return {
        state: client.get(f"/runs/{run_id}").get_data(as_text=True)
        for state, run_id in runs.items()
    }


def test_a_rejected_run_says_rejected_with_its_reason_and_who_decided(
    pages: dict[str, str],
) -> None:
    page = pages["rejected"]
    assert "Rejected by console" in page
    assert "Reason: the intro is wrong" in page
    assert "Nothing was sent" in page


def test_each_outcome_is_said_in_words(pages: dict[str, str]) -> None:
    assert "Sent 4 items" in pages["sent"] and "to team@example.com" in pages["sent"]
    assert 'Subject: <strong id="subject">Your weekly digest (2026-w40)' in pages["sent"]
    assert "Nothing new: no email this week" in pages["nothing-new"]
    assert "Waiting for approval" in pages["waiting"] and 'id="approve"' in pages["waiting"]
    assert "Failed; it retries" in pages["retrying"] and "answered 421" in pages["retrying"]
    assert "Failed for good" in pages["failed"] and "answered 550" in pages["failed"]
    assert "This run holds 4 items" in pages["failed"]
    assert "held by digest:2026-w45" in pages["held"]
    assert "Held: other runs hold this week&#39;s items; no email" in pages["held"]
    assert "1 failed attempt so far." in pages["retrying"]
    assert "marked sent: 4 items sent in all weeks so far" in pages["sent"]
    assert "may have been sent" in pages["ambiguous"]
    assert 'id="mark-sent"' in pages["ambiguous"] and 'id="resend"' in pages["ambiguous"]


def test_the_timeline_draws_waits_and_the_failed_attempt(pages: dict[str, str]) -> None:
    assert "waiting for approval (now)" in pages["waiting"]
    assert 'class="error" open' in pages["retrying"] and "retry back-off" in pages["retrying"]
    assert pages["sent"].count('class="lane step"') >= 6
    assert "fork-step" in pages["sent"] and pages["sent"].count("Fork from here") == 0


# What the journal calls things, which an operator should not have to learn.
INTERNAL = ("signal:", "wait:", "fence", "a worker 0 times", "deliveries 0", "true", "false")


def shown(page: str) -> str:
    """A page's text as read before opening anything: a disclosure's summary, not its body."""
    page = re.sub(r"<(style|script)\b.*?</\1>", "", page, flags=re.S)
    page = re.sub(
        r"<details\b[^>]*>\s*<summary[^>]*>(.*?)</summary>.*?</details>", r"\1", page, flags=re.S
    )
    page = re.sub(r"<time\b[^>]*>.*?</time>", "TIME", page, flags=re.S)
    return re.sub(r"<[^>]+>", " ", page)


def test_the_pages_speak_the_operators_words_with_times_in_the_readers_zone(
    pages: dict[str, str],
) -> None:
    for state, page in pages.items():
        text = shown(page)
        for word in INTERNAL:
            assert word not in text, (state, word)
        assert not re.search(r'[{\[]"', text), (state, "JSON outside a disclosure")
        # Every time is a <time> the browser shows in its own zone, with UTC on hover.
        assert not re.search(r"\d{4}-\d\d-\d\d", text), (state, "a time in UTC text")
        assert "/tmp/" not in text and str(Path.home()) not in text, state


def test_a_runs_status_badge_says_how_it_ended_not_done(pages: dict[str, str]) -> None:
    badges = {state: re.findall(r'id="state">([^<]*)<', page) for state, page in pages.items()}
    assert badges == {
        "sent": ["sent"],
        "rejected": ["rejected"],
        "nothing-new": ["nothing new"],
        "waiting": ["waiting"],
        "retrying": ["retrying"],
        "failed": ["failed"],
        "held": ["held"],
        "ambiguous": ["may be sent"],
    }


@pytest.mark.parametrize(
    ("state", "meta", "word"),
    [
        ("done", {"outcome": '{"status": "expired"}'}, "expired"),
        ("cancelled", {"cancel": "by an operator"}, "cancelled"),
        ("cancelled", {"cancel": "released: its items go on"}, "released"),
        ("done", {"outcome": '{"status": "nothing-new", "held": [{"run": "digest:x"}]}'}, "held"),
        ("done", {"outcome": "not json"}, "done"),
        ("running", {}, "running"),
    ],
)
def test_each_ending_has_its_own_badge(state: str, meta: dict[str, str], word: str) -> None:
    assert badge(state, meta) == word


def test_a_live_runs_page_shows_the_steps_its_holder_has_in_flight(
    real_redis: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    runtime = runtime_for(real_redis, prefix, tmp_path)
    keys = runtime.journal.keys("digest", "2026-w49")
    now = int(runtime.journal.clock.now() * 1000)
    # As a holder's renewal leaves them (renew.lua): its lease, and two summaries running.
    real_redis.hset(keys.meta, mapping={"status": "running", "created_at": now - 9_000})
    real_redis.set(keys.lease, "1:abc", px=30_000)
    real_redis.hset(keys.flight, mapping={"summarize:i1": now - 4_000, "summarize:i2": now - 1_000})
    page = create_app(runtime, LOCAL).test_client().get("/runs/2026-w49").get_data(as_text=True)
    assert "Running since TIME" in shown(page)
    assert "In flight now: summarize i1, summarize i2" in shown(page)
    assert re.findall(r'class="name flight"[^>]*>([^<]*)<', page) == [
        "summarize i1 (in flight now)",
        "summarize i2 (in flight now)",
    ]
    real_redis.delete(keys.lease)  # the holder gone: what it published is not shown
    page = create_app(runtime, LOCAL).test_client().get("/runs/2026-w49").get_data(as_text=True)
    assert "in flight" not in shown(page).lower()


def test_a_calls_wait_for_the_rate_limit_is_a_labelled_gap_before_its_bar(
    real_redis: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    runtime = runtime_for(real_redis, prefix, tmp_path)

    def body(run: Run) -> None:
        run.step("select", lambda: [])
        run.step("summarize:i1", lambda: {"text": "ok", "waited_ms": 1_500})

    execute(runtime.journal, "digest", "2026-w49", body)
    page = create_app(runtime, LOCAL).test_client().get("/runs/2026-w49").get_data(as_text=True)
    names = re.findall(r'class="name (\w+)"[^>]*>([^<]*)<', page)
    assert names[-2:] == [("wait", "rate limit: waited 1.5 s for room"), ("step", "summarize i1")]
    assert "this run's model calls waited 1.5 s for room in all" in page


@pytest.fixture
def listing(
    real_redis: redis.Redis, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    monkeypatch.chdir(tmp_path)
    runtime = runtime_for(real_redis, prefix, tmp_path, flower_url="http://flower.example:5555/")
    every_state(runtime, tmp_path)
    crashed = runtime.journal.keys("digest", "2026-w48")
    now = int(runtime.journal.clock.now() * 1000)
    real_redis.hset(crashed.meta, mapping={"status": "running", "created_at": now - 90_000})
    real_redis.zadd(crashed.index.runs, {crashed.run: now})
    return create_app(runtime, LOCAL).test_client()


def test_the_runs_page_searches_filters_and_says_a_holder_is_gone(listing: Any) -> None:
    page = listing.get("/").get_data(as_text=True)
    assert "holder gone, resumes at the next sweep" in page
    assert re.search(r"1\.[5-9] min|9\d\.\d s", page)  # the crashed run: now minus its start
    assert 'id="flower" href="http://flower.example:5555/"' in page

    found = listing.get("/?q=w41").get_data(as_text=True)
    assert re.findall(r'href="/runs/([^"]+)"', found) == ["2026-w41"]
    assert "the intro is wrong" in found

    text = shown(page)
    for word in ("signal:", "wait:", " at send "):
        assert word not in text
    assert not re.search(r"\d{4}-\d\d-\d\d", text)
    assert re.findall(r'class="state[^"]*">([^<]*)<', page)[-2:] == ["rejected", "sent"]

    sent = listing.get("/?outcome=nothing-new").get_data(as_text=True)
    assert 'id="flower"' in sent
    assert re.findall(r'href="/runs/([^"]+)"', sent) == ["2026-w46", "2026-w42"]
    assert listing.get("/?outcome=bogus").status_code == 400


@pytest.mark.parametrize(
    ("n", "said"),
    [(0, "no model calls"), (1, "1 model call"), (2, "2 model calls")],
)
def test_a_count_agrees_with_its_noun(n: int, said: str) -> None:
    assert counted(n, "model call") == said


def test_a_count_takes_a_plural_that_is_not_the_noun_and_s() -> None:
    assert [counted(n, "delivery", "deliveries") for n in (1, 3)] == ["1 delivery", "3 deliveries"]


def test_a_run_of_one_item_counts_it_in_the_singular(
    real_redis: redis.Redis, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    runtime = runtime_for(real_redis, prefix, tmp_path)
    start("2026-w40", items=week(tmp_path, "a", size=1))
    page = create_app(runtime, LOCAL).test_client().get("/runs/2026-w40").get_data(as_text=True)
    text = " ".join(shown(page).split())
    assert "Sent 1 item to team@example.com" in text
    assert "1 delivery to a worker so far" in text
    assert "$0.0000 for no model calls" in text  # offline summaries are no model call
    assert "marked sent: 1 item sent in all weeks so far" in text
    assert not re.search(r"\b1 (item|step|model call|deliverie)s\b", text)


@pytest.mark.parametrize("send", ["", "ambiguous"])
def test_what_another_run_holds_agrees_with_one_item(send: str) -> None:
    # As a held week's page and its report say it, one of its lines per holder.
    one = Held("digest:2026-w45", 1, "failed", "the API key was refused", send).line()
    assert one.startswith("1 is held by digest:2026-w45 (")
    assert Held("digest:2026-w45", 8, "failed", send=send).line().startswith("8 are held by ")


class PricedOpening(OfflineSummarizer):
    """Offline summaries, and an opening from a priced model: a fork that costs something."""

    name = "claude-haiku-5-5"
    remote = True

    def compose(self, pairs: Sequence[tuple[Update, str]], model: str | None = None) -> Completion:
        return Completion("A new opening.", 1000, 200, model or self.name)


def test_a_forks_preview_says_its_steps_and_its_cost_in_the_operators_words(
    real_redis: redis.Redis, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    runtime = runtime_for(real_redis, prefix, tmp_path)
    start("2026-w40", items=week(tmp_path, "a", size=1))  # recorded with offline summaries
    client = create_app(replace(runtime, summarizer=PricedOpening()), LOCAL).test_client()

    page = client.get("/runs/2026-w40/fork?step=compose").get_data(as_text=True)
    text = " ".join(shown(page).split())
    assert "Fork 2026-w40: run again from “compose the introduction”?" in text
    assert (
        "The fork would run 1 step (compose the introduction) and make 1 model call, "
        "costing $0.0060" in text
    )
    assert "+A new opening." in text
    assert re.search(r'id="fork-confirm">Fork: run again from “compose the introduction”<', page)

    page = client.get("/runs/2026-w40/fork?step=summarize:ai1").get_data(as_text=True)
    text = " ".join(shown(page).split())
    assert (
        "would run 2 steps (summarize ai1, compose the introduction) and make 2 model calls" in text
    )

    offline = create_app(runtime, LOCAL).test_client()
    page = offline.get("/runs/2026-w40/fork?step=compose").get_data(as_text=True)
    assert "and make no model calls, costing nothing" in " ".join(shown(page).split())

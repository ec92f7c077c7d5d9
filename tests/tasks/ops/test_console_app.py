"""The console's pages and guards, in-process with Flask's test client on a real journal.

Untrusted text (model output, item titles) reaches the page escaped; secrets masked; every
action needs the page's CSRF token; a console bound beyond loopback needs its token.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

# prometheus_client picks its value class once, when it is first imported, from
# PROMETHEUS_MULTIPROC_DIR. Imported here, before the metrics test below sets that variable for
# itself alone, it counts in memory for every later test of this process; imported by that
# test, its counters would look for the variable after it is gone and fail on first use.
import tasks.worker.metrics  # noqa: F401
from journal import Effect, Journal, Keyspace, Run
from journal._redact import add_secret
from journal.testing.fixture import Fixture, export
from tasks.config import Config
from tasks.errors import BadInput
from tasks.keys import DigestKeys
from tasks.llm.client import OfflineSummarizer
from tasks.mail.smtp import FileOutbox
from tasks.ops.console import Names, check_binding, create_app
from tasks.runtime import Runtime
from tests.support import execute

# The test client's requests name ``localhost`` on the default port.
LOCAL = Names.bound("127.0.0.1", 80)
HOSTILE = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


@pytest.fixture
def runtime(real_redis: redis.Redis, prefix: str, tmp_path: Path) -> Runtime:
    journal = Journal(real_redis, keyspace=Keyspace(prefix))
    return Runtime(
        config=Config(key_prefix=prefix, state_dir=tmp_path),
        client=real_redis,
        journal=journal,
        keys=DigestKeys(prefix),
        summarizer=OfflineSummarizer(),
        mailer=FileOutbox(tmp_path / "outbox"),
    )


def hostile_run(run: Run) -> None:
    run.step(
        "summarize:x",
        lambda: {
            "text": HOSTILE,
            "input_tokens": 3,
            "output_tokens": 2,
            "model": "claude-haiku-5-5",
            "cost_usd": 0.25,
        },
    )
    run.step("draft", lambda: {"to": "t@example.com", "subject": HOSTILE, "body": "sk-secret-123"})
    run.wait_for_signal("approval", timeout=600)


def test_model_output_is_escaped_and_secrets_masked(runtime: Runtime) -> None:
    add_secret("sk-secret-123")
    execute(runtime.journal, "digest", "w1", hostile_run)
    client = create_app(runtime, LOCAL).test_client()

    page = client.get("/runs/w1").get_data(as_text=True)
    listing = client.get("/").get_data(as_text=True)

    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "sk-secret-123" not in page and "***" in page
    assert 'id="approve"' in page and 'id="reject"' in page
    assert "$0.2500" in page and "$0.2500" in listing
    assert re.search(r'href="/runs/w1">w1</a>', listing)
    assert "default-src 'none'" in client.get("/").headers["Content-Security-Policy"]


def test_an_action_without_the_pages_token_or_from_another_site_is_refused(
    runtime: Runtime,
) -> None:
    execute(runtime.journal, "digest", "w1", hostile_run)
    client = create_app(runtime, LOCAL).test_client()
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/runs/w1").get_data(as_text=True))
    assert token is not None

    assert client.post("/runs/w1/cancel").status_code == 403
    assert client.post("/runs/w1/cancel", data={"csrf": "guess"}).status_code == 403
    cross = client.post(
        "/runs/w1/cancel", data={"csrf": token.group(1)}, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert cross.status_code == 403
    assert runtime.journal.meta(runtime.journal.keys("digest", "w1"))["status"] == "waiting"

    done = client.post("/runs/w1/cancel", data={"csrf": token.group(1)})
    assert (done.status_code, done.headers["Location"]) == (303, "/runs/w1")
    assert runtime.journal.meta(runtime.journal.keys("digest", "w1"))["status"] == "cancelled"
    assert "cancelled digest:w1; nothing more will run or be sent" in client.get(
        "/runs/w1"
    ).get_data(as_text=True)


def test_a_console_beyond_loopback_needs_its_token(runtime: Runtime) -> None:
    with pytest.raises(BadInput, match="needs DIGEST_CONSOLE_TOKEN"):
        check_binding("0.0.0.0", {})
    assert check_binding("127.0.0.1", {}) is None
    secret = "a-long-console-token"
    assert check_binding("0.0.0.0", {"DIGEST_CONSOLE_TOKEN": secret}) == secret
    client = create_app(runtime, LOCAL, token=secret).test_client()

    assert client.get("/").status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    entered = client.get("/?token=" + secret)
    assert entered.status_code == 302
    assert client.get("/").status_code == 200  # the cookie it set
    assert (
        create_app(runtime, LOCAL, token=secret)
        .test_client()
        .get("/", headers={"Authorization": f"Bearer {secret}"})
        .status_code
        == 200
    )


def test_the_console_serves_the_journals_gauges_at_metrics(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    execute(runtime.journal, "digest", "w1", hostile_run)

    page = create_app(runtime, LOCAL).test_client().get("/metrics").get_data(as_text=True)

    assert 'journal_runs{state="waiting",workflow="digest"} 1.0' in page
    assert 'journal_runs{state="done",workflow="digest"} 0.0' in page
    assert "journal_due_lag_seconds 0.0" in page
    assert 'digest_build_info{python="' in page
    assert "process_cpu_seconds_total" in page


def test_a_console_answers_to_its_bound_address_and_its_configured_origin_only() -> None:
    local = Names.bound("127.0.0.1", 8765)
    assert local.hosts == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert "http://[::1]:8765" in local.origins
    public = Names.bound("0.0.0.0", 8765, "https://Digest.Example.com/")
    assert public.hosts == {"digest.example.com", "digest.example.com:443"}
    assert public.origins == {"https://digest.example.com"}
    assert Names.bound("10.0.0.5", 8080).hosts == {"10.0.0.5:8080"}
    with pytest.raises(BadInput, match="answers to no name"):
        Names.bound("0.0.0.0", 8765)
    with pytest.raises(BadInput, match="not an origin"):
        Names.bound("127.0.0.1", 8765, "digest.example.com")


def test_a_foreign_host_is_refused_before_anything_is_read(runtime: Runtime) -> None:
    execute(runtime.journal, "digest", "w1", hostile_run)
    client = create_app(runtime, LOCAL).test_client()
    refused = client.get("/runs/w1", headers={"Host": "rebound.example"})
    assert refused.status_code == 421
    assert "csrf" not in refused.get_data(as_text=True)
    assert client.get("/runs/w1", headers={"Host": "127.0.0.1"}).status_code == 200


def test_a_fork_as_a_weeks_id_is_refused_in_the_console_too_and_nothing_is_written(
    runtime: Runtime,
) -> None:
    execute(runtime.journal, "digest", "w1", hostile_run)
    client = create_app(runtime, LOCAL).test_client()
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/runs/w1").get_data(as_text=True))
    assert token is not None

    form = {"csrf": token.group(1), "step": "draft", "as": "2026-w43"}
    answer = client.post("/runs/w1/fork", data=form, follow_redirects=True)

    page = answer.get_data(as_text=True)
    assert "2026-w43 is a week the schedule runs; nothing was forked" in page
    assert runtime.journal.meta(runtime.journal.keys("digest", "2026-w43")) == {}
    assert "Waiting for approval" in page


def test_a_runs_page_links_its_export_the_fixture_digest_export_writes(runtime: Runtime) -> None:
    add_secret("sk-secret-123")
    execute(runtime.journal, "digest", "w1", hostile_run)
    client = create_app(runtime, LOCAL).test_client()

    page = client.get("/runs/w1").get_data(as_text=True)
    answer = client.get("/runs/w1/export")

    assert 'id="export" href="/runs/w1/export"' in page
    assert answer.status_code == 200
    assert answer.headers["Content-Disposition"] == 'attachment; filename="digest-w1.json"'
    document = answer.get_data(as_text=True)
    assert "sk-secret-123" not in document
    fresh = export(runtime.journal, "digest", "w1")
    assert Fixture.loads(document).steps == fresh.steps and fresh.steps
    assert client.get("/runs/nobody/export").status_code == 404


def test_the_runs_page_pages_through_every_run_once_newest_first(runtime: Runtime) -> None:
    for n in range(5):
        execute(runtime.journal, "digest", f"w{n}", lambda run: run.step("select", lambda: True))
    execute(runtime.journal, "digest", "waits", hostile_run)
    client = create_app(runtime, LOCAL).test_client()

    seen: list[list[str]] = []
    url: str | None = "/?status=done&limit=2"
    while url is not None:
        page = client.get(url).get_data(as_text=True)
        assert 'id="flower"' not in page  # no DIGEST_FLOWER_URL, no link
        seen.append(re.findall(r'<a href="/runs/([^"]+)">', page))
        older = re.search(r'<a id="older" href="([^"]+)"', page)
        url = older.group(1).replace("&amp;", "&") if older else None

    assert seen == [["w4", "w3"], ["w2", "w1"], ["w0"]]
    assert 'id="newest" href="/?limit=2&amp;status=done"' in page
    for query, reason in [
        ("limit=0", "limit '0' is not a number of runs from 1 to 1000"),
        ("limit=x", "limit 'x' is not a number of runs from 1 to 1000"),
        ("before=w1", "before: 'w1' is not a listing cursor (RUN@MILLISECONDS); follow"),
        ("status=gone", "status 'gone' is none of:"),
    ]:
        answer = client.get("/?" + query)
        assert answer.status_code == 400
        assert answer.get_data(as_text=True).startswith("digest console: " + reason)
        assert answer.get_data(as_text=True).count("\n") == 1


def maybe_sent_run(run: Run) -> None:
    def act(effect: Effect) -> None:
        effect.confirm()
        raise ConnectionResetError("the relay hung up at the end of the message")

    run.effect("send", act, timeout=30)


def test_a_send_that_may_have_happened_offers_mark_sent_and_resend_not_release(
    runtime: Runtime,
) -> None:
    assert execute(runtime.journal, "digest", "w1", maybe_sent_run).status == "waiting"
    execute(runtime.journal, "digest", "w2", hostile_run)
    client = create_app(runtime, LOCAL).test_client()

    page = client.get("/runs/w1").get_data(as_text=True)
    assert 'class="outcome o-ambiguous"' in page
    assert 'id="mark-sent"' in page and 'id="resend"' in page
    assert "may have been sent" in page
    assert "Why it is not known: the relay hung up at the end of the message" in page
    assert "digest release" not in page

    other = client.get("/runs/w2").get_data(as_text=True)
    assert 'id="mark-sent"' not in other
    token = re.search(r'name="csrf" value="([^"]+)"', other)
    assert token is not None
    refused = client.post("/runs/w2/resend", data={"csrf": token.group(1)}, follow_redirects=True)
    assert (
        "run digest:w2: its email was never sent; there is nothing to decide: mark-sent and "
        "resend settle an email `digest show` says may have been sent"
    ) in refused.get_data(as_text=True)

"""Model refusals with real processes: an account refused fails loudly, one item is skipped.

The fake API answers with the real API's bodies over HTTP, so the SDK's own exception types
and the digest's table of what each means are what gets exercised, by the ``digest`` command
and by a real ``celery -A tasks worker``. Out of credit, the API refuses every request with a
400: a week that looked like "nothing new" before must now fail where monitoring sees it.
"""

from __future__ import annotations

import json

import pytest

from tasks.keys import DigestKeys, text
from tests.failure.conftest import (
    ITEMS,
    RUN,
    WEEK,
    enqueue,
    task_state,
    wait_for_status,
)
from tests.fakes.anthropic_server import CREDIT_TOO_LOW, PROMPT_TOO_LONG, FakeAnthropic
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow

CREDIT_LINE = (
    "failed: the Anthropic account's credit balance is too low (the Anthropic API at {url} "
    f"answered HTTP 400 invalid_request_error: {CREDIT_TOO_LOW}); buy credits or upgrade under "
    "Plans & Billing in the Anthropic Console, then run the digest again"
)


def seen(deployment: Deployment) -> set[str]:
    keys = DigestKeys(deployment.env["DIGEST_KEY_PREFIX"])
    return {text(member) for member in deployment.client().smembers(keys.seen)}


def test_out_of_credit_fails_loudly_on_a_worker_and_on_the_command_line(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    live.env["DIGEST_CONCURRENCY"] = "1"  # one call in flight: the count is exact
    fake_anthropic.fail_always(400, message=CREDIT_TOO_LOW)
    worker = live.worker("w1", concurrency=1)

    [task_id] = enqueue(live)
    wait_for_status(live, "failed", 30)

    # What monitoring of the task queue sees.
    wait_until(lambda: task_state(live, task_id) == "FAILURE", 10, "the task's failure")
    # The pool child stores the failure before it logs it: wait for the line, do not race it.
    refused = "ModelRefused: the Anthropic account's credit balance is too low"
    wait_until(lambda: refused in worker.text(), 10, "the worker's error line")
    view = live.view(RUN)
    assert view.meta["last_error"].startswith("ModelRefused: the Anthropic account's credit")
    assert fake_anthropic.calls == 1
    assert (live.outbox(), seen(live)) == ([], set())
    assert live.client().zscore(f"{live.env['DIGEST_KEY_PREFIX']}:due", f"digest:{RUN}") is None

    # The next delivery is not a silent "already-done": it asks once more and fails alike.
    again = live.cli("run", RUN)
    assert again.returncode == 1
    assert again.stderr.splitlines() == [CREDIT_LINE.format(url=fake_anthropic.url)]
    assert "already-done" not in again.stdout
    assert fake_anthropic.calls == 2
    shown = live.cli("show", RUN)
    assert "status   failed\n" in shown.stdout
    assert "error    ModelRefused: the Anthropic account's credit balance" in shown.stdout
    assert (live.outbox(), seen(live)) == ([], set())

    # Credit bought: the same run resumes and sends, once.
    fake_anthropic.clear_faults()
    done = live.cli("run", RUN)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"sent: {ITEMS} items")
    assert len(live.outbox()) == 1
    assert seen(live) == {item["id"] for item in WEEK}


def test_every_item_refused_fails_rather_than_report_nothing_new(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_always(400, message=PROMPT_TOO_LONG)

    done = live.cli("run", RUN)

    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    ids = ", ".join(item["id"] for item in WEEK)
    assert line.startswith(f"failed: the model refused every item ({ids}); i1: the model ")
    assert "prompt is too long" in line
    assert "nothing-new" not in done.stdout
    assert fake_anthropic.calls == ITEMS  # each item asked once: a refused prompt is not retried
    view = live.view(RUN)
    assert view.status == "failed"
    assert view.meta["last_error"].startswith("EveryItemRefused: the model refused every item")
    assert (live.outbox(), seen(live)) == ([], set())


def test_one_refused_item_is_skipped_and_the_rest_is_sent(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    refused = WEEK[2]
    fake_anthropic.fail_when(f'title="{refused["title"]}"', 400, message=PROMPT_TOO_LONG)

    done = live.cli("run", RUN)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        f"  skipped  summarize:{refused['id']} (the model refused this item: the prompt is too "
        "long for model claude-haiku-5-5" in done.stdout
    )
    assert lines[-1].startswith(f"sent: {ITEMS - 1} items, {ITEMS + 1} model calls")
    assert fake_anthropic.calls == ITEMS + 1  # the refused item was asked once
    [email] = [json.loads(path.read_text()) for path in live.outbox()]
    assert refused["title"] not in email["body"]
    assert seen(live) == {item["id"] for item in WEEK} - {refused["id"]}

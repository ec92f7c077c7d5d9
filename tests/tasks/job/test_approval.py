"""The approval gate as an operator meets it: ``digest run --approval``, show, approve, reject.

Real processes on an isolated deployment with the offline summarizer. While the digest waits
for its decision it holds no lease and no process; every decision is final.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime

import pytest

from journal._clock import millis
from tasks.job.report import draft_digest
from tasks.keys import DigestKeys
from tests.support import Deployment, only_index, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"
WAITING = (
    f"waiting: signal approval (until {{until}}); `digest approve {RUN}` or "
    f"`digest reject {RUN} --reason ...`\n"
)


@pytest.fixture(autouse=True)
def offline(deployment: Deployment) -> None:
    """The offline summarizer, whatever the environment that runs the tests holds."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        deployment.env.pop(name, None)


def digest(deployment: Deployment, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = deployment.cli(*args)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    return done


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout.splitlines()[-1]


def seen(deployment: Deployment) -> int:
    """Items marked as covered by a sent digest."""
    return int(deployment.client().scard(DigestKeys(deployment.env["DIGEST_KEY_PREFIX"]).seen))


def outcome(deployment: Deployment) -> dict[str, object]:
    result: dict[str, object] = json.loads(deployment.view(RUN).meta["outcome"])
    return result


def wait_for_approval(deployment: Deployment) -> float:
    """Start the run at its gate; the wake-up time it recorded."""
    timeout = deployment.config.approval_timeout
    started = time.time()
    done = digest(deployment, "run", RUN, "--approval")
    view = deployment.view(RUN)
    assert view.wait is not None and view.wait.until is not None
    assert started + timeout <= view.wait.until <= time.time() + timeout
    until = view.wait.until
    assert done.stdout.endswith(WAITING.format(until=when(until)))
    assert "  ran      draft\n  ran      wait:approval\n" in done.stdout
    return until


def when(seconds: float) -> str:
    """A time as the command prints it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_an_approved_digest_is_sent_once_and_a_second_decision_is_refused(
    deployment: Deployment,
) -> None:
    until = wait_for_approval(deployment)

    shown = digest(deployment, "show", RUN).stdout
    assert "status   waiting\n" in shown
    assert "lease    free\n" in shown
    assert f"waiting  signal approval until {when(until)}\n" in shown
    draft = deployment.view(RUN).step("draft")
    assert draft is not None
    digest_of_draft = draft_digest(draft.result)
    assert (
        f"awaiting approval (draft {digest_of_draft}):\nTo: team@example.com\n"
        f"Subject: Your weekly digest ({RUN})\n\nThis week brings 8 updates: Dark mode, "
    ) in shown
    assert "* Keyboard shortcuts: Press ? anywhere to see every keyboard shortcut." in shown
    view = deployment.view(RUN)
    assert (view.status, view.lease_holder) == ("waiting", None)
    due = only_index(deployment.runtime().journal).due
    assert deployment.client().zscore(due, f"digest:{RUN}") == millis(until)

    approved = digest(deployment, "approve", RUN)
    assert approved.stdout.startswith(f"approved digest:{RUN} (draft {digest_of_draft}); ")
    again = digest(deployment, "approve", RUN, code=2)
    assert again.stderr == f"digest: digest:{RUN} already has a decision; the first one stands\n"
    assert deployment.view(RUN).signals == {
        "approval": {"approved": True, "draft": digest_of_draft}
    }

    resumed = digest(deployment, "run", RUN)
    assert "  ran      signal:approval\n  ran      send\n" in resumed.stdout
    assert last_line(resumed) == (
        f"sent: 8 items, 0 model calls in this attempt, email sent (digest-{RUN})"
    )
    assert len(deployment.outbox()) == 1
    assert seen(deployment) == 8


def test_a_rejected_digest_ends_without_sending_or_marking_anything(
    deployment: Deployment,
) -> None:
    wait_for_approval(deployment)

    rejected = digest(deployment, "reject", RUN, "--reason", "typo in the intro")
    assert rejected.stdout.startswith(f"rejected digest:{RUN} (draft ")
    ended = digest(deployment, "run", RUN)

    assert last_line(ended) == "rejected: 0 items, 0 model calls in this attempt"
    assert outcome(deployment) == {
        "status": "rejected",
        "items": 0,
        "model_calls": 0,
        "reason": "typo in the intro",
    }
    view = deployment.view(RUN)
    assert view.status == "done"
    assert view.step("send") is None and view.step("mark-seen") is None
    assert deployment.outbox() == []
    assert seen(deployment) == 0
    # The outcome in words, not a bare "done".
    shown = digest(deployment, "show", RUN).stdout.splitlines()
    assert shown[1] == "status   done: rejected (typo in the intro)"
    listed = digest(deployment, "runs").stdout
    assert "rejected (typo in the intro)" in listed


def test_an_undecided_digest_expires_without_sending_or_marking_anything(
    deployment: Deployment,
) -> None:
    deployment.env["DIGEST_APPROVAL_TIMEOUT"] = "1"
    until = wait_for_approval(deployment)
    wait_until(lambda: time.time() > until + 0.05, 5, "the approval timeout to pass")

    ended = digest(deployment, "run", RUN)

    assert last_line(ended) == "expired: 0 items, 0 model calls in this attempt"
    assert outcome(deployment) == {"status": "expired", "items": 0, "model_calls": 0}
    view = deployment.view(RUN)
    assert view.status == "done"
    record = view.step("signal:approval")
    assert record is not None and record.result == {"received": False, "payload": None}
    assert record.finished_at >= millis(until)
    assert deployment.outbox() == []
    assert seen(deployment) == 0
    late = digest(deployment, "approve", RUN, code=2)
    assert late.stderr == (
        f"digest: digest:{RUN} expired waiting for a decision; that outcome stands\n"
    )
    assert deployment.view(RUN).signals == {}


def test_a_decision_is_refused_unless_the_run_waits_for_one_with_a_draft(
    deployment: Deployment,
) -> None:
    for verb in (["approve", RUN], ["reject", RUN, "--reason", "no"]):
        refused = digest(deployment, *verb, code=2)
        assert refused.stderr == (
            f"digest: digest:{RUN} is not waiting for approval (it does not exist); nothing was "
            "decided: decide on a run `digest show` lists as awaiting approval\n"
        )
    assert deployment.view(RUN).signals == {}  # nothing pre-approved: the run does not exist

    digest(deployment, "run", RUN)  # no gate: sent at once
    refused = digest(deployment, "approve", RUN, code=2)
    assert "is not waiting for approval (it is done)" in refused.stderr
    assert deployment.view(RUN).signals == {}


def test_the_recipient_and_the_gate_are_frozen_and_exactly_the_draft_is_sent(
    deployment: Deployment,
) -> None:
    deployment.env.update(DIGEST_APPROVAL="1", DIGEST_TO="reviewed@example.com")
    waiting = digest(deployment, "run", RUN)
    assert "waiting: signal approval" in waiting.stdout
    draft = deployment.view(RUN).step("draft")
    assert draft is not None and draft.result["to"] == "reviewed@example.com"

    # Changed after review: neither may change what the reviewer approved.
    deployment.env.update(DIGEST_APPROVAL="0", DIGEST_TO="someone-else@example.com")
    digest(deployment, "approve", RUN)
    resumed = digest(deployment, "run", RUN)

    assert last_line(resumed).startswith("sent: 8 items")
    [sent] = deployment.outbox()
    delivered = json.loads(sent.read_text())
    assert {k: delivered[k] for k in ("to", "subject", "body")} == draft.result
    # What was given and what the settings filled in; an option left unset is not frozen.
    assert deployment.view(RUN).meta["args"] == json.dumps(
        {"to": "reviewed@example.com", "approval": True}, separators=(",", ":")
    )

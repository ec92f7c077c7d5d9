"""Run control as an operator uses it: ``digest cancel``, ``retry``, ``fork`` and ``runs --status``.

Real processes on an isolated deployment: the CLI, a real ``celery -A tasks worker`` and the
fake Anthropic API counting calls. A cancelled run stops before its next step and sends
nothing; a retried run resumes from its failed step; a fork keeps the steps before its step
and sends under its own key.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import time

import pytest

from tasks.keys import DigestKeys
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import CALLS, JOURNAL, Deployment, only_index, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"


def digest(deployment: Deployment, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = deployment.cli(*args)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    return done


def offline(deployment: Deployment) -> None:
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    deployment.env.pop("ANTHROPIC_BASE_URL", None)
    deployment.env["DIGEST_OFFLINE"] = "1"


def settled(deployment: Deployment, run_id: str, status: str) -> bool:
    view = deployment.view(run_id)
    return view.status == status and view.lease_holder is None


def broker_is_empty(deployment: Deployment) -> bool:
    client = deployment.client()
    return (client.llen("celery"), client.hlen("unacked")) == (0, 0)  # kombu's queue, unacked


def test_a_running_digest_cancelled_mid_call_records_that_call_and_runs_nothing_more(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env())
    deployment.env["DIGEST_CONCURRENCY"] = "1"
    worker = deployment.worker("w1", concurrency=1)
    fake_anthropic.hold()
    digest(deployment, "enqueue", RUN)
    fake_anthropic.wait_for_calls(1, timeout=30)

    asked = digest(deployment, "cancel", RUN, "--reason", "wrong recipients")
    assert asked.stdout.startswith(f"cancelling digest:{RUN}: its worker stops before its next")
    assert digest(deployment, "runs", "--status", "cancelling").stdout.startswith(f"digest:{RUN} ")
    fake_anthropic.release()

    wait_until(lambda: settled(deployment, RUN, "cancelled"), 30, "the run to stop")
    view = deployment.view(RUN)
    assert [record.key for record in view.steps] == ["select", "summarize:i1"]
    assert view.meta["cancel"] == "wrong recipients"
    assert fake_anthropic.calls == 1
    assert deployment.outbox() == []
    wait_until(lambda: "'status': 'cancelled'" in worker.text(), 10, "the delivery to return")
    wait_until(lambda: broker_is_empty(deployment), 10, "the message to be acked")
    time.sleep(1.5)  # a sweep interval: nothing wakes a cancelled run
    assert deployment.view(RUN).meta["deliveries"] == "1"
    assert "status   cancelled\n" in digest(deployment, "show", RUN).stdout


def test_a_waiting_digest_is_cancelled_at_once_and_stays_cancelled(deployment: Deployment) -> None:
    offline(deployment)
    digest(deployment, "run", RUN, "--approval")
    held = digest(deployment, "run", "2026-w43")  # the waiting run holds the week's items
    assert held.stdout.endswith(
        "nothing-new: 0 new items, 0 model calls in this attempt; "
        f"8 are held by digest:{RUN} (waiting)\n"
    )
    assert digest(deployment, "runs").stdout.splitlines()[-1].endswith("holds 8 items")

    done = digest(deployment, "cancel", RUN)
    assert "holds" not in digest(deployment, "runs").stdout  # let go at the cancel
    # A cancelled run never sends: the next run takes its items and sends them.
    assert "sent: 8 items" in digest(deployment, "run", "2026-w44").stdout

    assert done.stdout == f"cancelled digest:{RUN}; nothing more will run or be sent\n"
    listed = digest(deployment, "runs", "--status", "cancelled").stdout.splitlines()
    assert [line.split()[0] for line in listed] == [f"digest:{RUN}"]
    assert [line.split()[1] for line in listed] == ["cancelled"]
    assert (
        deployment.client().zscore(only_index(deployment.runtime().journal).due, f"digest:{RUN}")
        is None
    )
    again = digest(deployment, "run", RUN)
    assert again.stdout == f"cancelled: digest:{RUN} was cancelled; nothing more runs or is sent\n"
    refused = digest(deployment, "cancel", RUN, code=2)
    assert refused.stderr == (
        f"digest: run digest:{RUN}: it is cancelled already; there is nothing to cancel\n"
    )
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w44.json"]
    assert deployment.view(RUN).step("send") is None


def test_a_failed_digest_retried_resumes_on_a_worker_and_sends_once(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env())
    deployment.env["DIGEST_CONCURRENCY"] = "1"
    fake_anthropic.fail_always(401)  # a refused key: failed for good, not retried by itself
    digest(deployment, "run", RUN, code=1)
    fake_anthropic.clear_faults()
    assert deployment.view(RUN).status == "failed"
    assert digest(deployment, "runs", "--status", "failed").stdout.startswith(f"digest:{RUN} ")
    worker = deployment.worker("w1", concurrency=1)

    retried = digest(deployment, "retry", RUN)

    assert re.fullmatch(
        rf"retrying digest:{RUN} now as task \S+; it resumes from the failed step\n", retried.stdout
    )
    wait_until(lambda: settled(deployment, RUN, "done"), 30, "the retried run to finish")
    assert fake_anthropic.calls == 1 + CALLS
    assert [p.name for p in deployment.outbox()] == [f"digest-{RUN}.json"]
    # The worker logs the delivery's result after the run's status is saved, not before.
    wait_until(lambda: "'status': 'done'" in worker.text(), 10, "the worker's result line")
    refused = digest(deployment, "retry", RUN, code=2)
    assert refused.stderr == (
        f"digest: run digest:{RUN}: it is done; only a failed run can be retried\n"
    )


def test_a_fork_keeps_the_steps_before_its_step_and_sends_under_its_own_key(
    deployment: Deployment,
) -> None:
    offline(deployment)
    digest(deployment, "run", RUN)
    original = deployment.view(RUN)
    deployment.worker("w1", concurrency=1)

    forked = digest(deployment, "fork", RUN, "--from", "compose")
    named = digest(deployment, "fork", RUN, "--from", "send", "--as", f"{RUN}-fork-resend")

    assert forked.stdout.startswith(f"forked digest:{RUN} at compose as digest:{RUN}-fork1 (task ")
    assert named.stdout.startswith(f"forked digest:{RUN} at send as digest:{RUN}-fork-resend ")
    for run_id in (f"{RUN}-fork1", f"{RUN}-fork-resend"):
        wait_until(
            functools.partial(settled, deployment, run_id, "done"), 30, f"{run_id} to finish"
        )
    fork = deployment.view(f"{RUN}-fork1")
    assert [record.key for record in fork.steps] == JOURNAL
    for key in ["select", *(k for k in JOURNAL if k.startswith("summarize:"))]:
        assert fork.step(key) == original.step(key)  # kept as recorded, not run again
    for key in ("compose", "send"):
        mine, theirs = fork.step(key), original.step(key)
        assert mine is not None and theirs is not None and mine.finished_at > theirs.finished_at
    assert (fork.meta["forked_from"], fork.meta["forked_at_step"]) == (f"digest:{RUN}", "compose")
    assert sorted(p.name for p in deployment.outbox()) == [
        f"digest-{RUN}-fork-resend.json",
        f"digest-{RUN}-fork1.json",
        f"digest-{RUN}.json",
    ]
    resent = deployment.state_dir / "outbox" / f"digest-{RUN}-fork-resend.json"
    assert f"Your weekly digest ({RUN}-fork-resend)" in json.dumps(json.loads(resent.read_text()))
    prefix = deployment.env["DIGEST_KEY_PREFIX"]
    assert deployment.client().scard(DigestKeys(prefix).seen) == 8
    refused = digest(deployment, "fork", RUN, "--from", "nope", code=2)
    assert refused.stderr == f"digest: run digest:{RUN}: it has no step 'nope' to fork from\n"


def test_a_fork_cannot_take_a_week_the_schedule_owns_nor_an_id_not_of_the_fork_form(
    deployment: Deployment,
) -> None:
    offline(deployment)
    digest(deployment, "run", RUN)
    client = deployment.client()
    before = {key: client.type(key) for key in client.keys("*")}

    week = digest(deployment, "fork", RUN, "--from", "send", "--as", "2026-w43", code=2)
    other = digest(deployment, "fork", RUN, "--from", "send", "--as", "resend", code=2)

    assert (week.stdout, other.stdout) == ("", "")
    assert week.stderr == (
        "digest: 2026-w43 is a week the schedule runs; nothing was forked: a fork takes an id "
        f"of its own, --as {RUN}-fork-NAME, or leave --as out for {RUN}-forkN\n"
    )
    assert other.stderr == (
        "digest: resend is not a fork's id; nothing was forked: a fork takes an id "
        f"of its own, --as {RUN}-fork-NAME, or leave --as out for {RUN}-forkN\n"
    )
    assert {key: client.type(key) for key in client.keys("*")} == before  # nothing written
    assert digest(deployment, "runs").stdout.count("digest:") == 1
    assert digest(deployment, "run", "2026-w43").stdout.endswith(
        "nothing-new: 0 items, 0 model calls in this attempt\n"
    )

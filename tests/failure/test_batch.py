"""Batch runs with real processes: a worker, a killed pool child, the command line, a cancel.

The fake API processes each batch over a few seconds; a run looks at it after half a second,
then every second (``DIGEST_BATCH_FIRST_LOOK``, ``DIGEST_BATCH_MAX_LOOK``), suspended in
between. Counted exactly each time: the batches created and the requests paid for (the
fake's ``paid``: requests that ended ``succeeded``), the synchronous calls, the emails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tasks.keys import DigestKeys
from tests.failure.conftest import (
    ITEMS,
    RUN,
    WEEK,
    enqueue,
    log_problems,
    recorded,
    task_returned,
    wait_for_status,
)
from tests.fakes.anthropic_server import PROMPT_TOO_LONG, FakeAnthropic
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow

LOOKS = {"DIGEST_BATCH_FIRST_LOOK": "0.5", "DIGEST_BATCH_MAX_LOOK": "1"}


@pytest.fixture
def batched(live: Deployment, fake_anthropic: FakeAnthropic) -> Deployment:
    """A deployment whose runs ask by batches the fake processes in two seconds."""
    live.env.update(LOOKS)
    fake_anthropic.batch_processing_time = 2.0
    return live


def run_to_the_end(
    deployment: Deployment,
    first: tuple[str, ...] = ("--batch",),
    timeout: float = 90,
    env: dict[str, str] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """``digest run`` again at each look, as an operator following its advice would.

    Until it ends, fails or crashes; the outputs of every invocation.
    """
    done: list[subprocess.CompletedProcess[str]] = []
    args = ["run", *first, RUN]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ran = deployment.cli(*args, env=env)
        done.append(ran)
        if ran.returncode != 0 or not ran.stdout.splitlines()[-1].startswith("waiting: batch"):
            return done
        wait = deployment.view(RUN).wait
        assert wait is not None and wait.until is not None
        time.sleep(min(5.0, max(0.0, wait.until - time.time())) + 0.05)
        args = ["run", RUN]
    raise AssertionError(f"run {RUN} did not end within {timeout}s")


def seen(deployment: Deployment) -> int:
    return int(deployment.client().scard(DigestKeys(deployment.env["DIGEST_KEY_PREFIX"]).seen))


def test_a_batch_run_on_a_worker_frees_its_slot_while_the_batch_processes(
    batched: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.batch_processing_time = 4.0
    batched.env["DIGEST_BATCH"] = "1"
    worker = batched.worker("w1", concurrency=1)
    batched.beat()
    [first] = enqueue(batched)

    wait_for_status(batched, "waiting", 30)
    assert len(fake_anthropic.batches) == 1 and fake_anthropic.batches[0].status == "in_progress"
    assert task_returned(batched, first)["status"] == "waiting"
    # The one slot is free: another week runs through it while the batch processes (its
    # items are all this run's, so it has nothing new).
    [other] = enqueue(batched, run_id="2026-w43")
    wait_until(lambda: batched.view("2026-w43").status == "done", 20, "the other week to end first")
    assert fake_anthropic.batches[0].status == "in_progress"
    wait_for_status(batched, "done", 60)

    assert task_returned(batched, other)["result"]["status"] == "nothing-new"
    assert [len(b.requests) for b in fake_anthropic.batches] == [ITEMS, 1]
    assert fake_anthropic.paid == ITEMS + 1 and fake_anthropic.calls == 0
    assert len(batched.outbox()) == 1 and seen(batched) == ITEMS
    view = batched.view(RUN)
    assert view.meta["starts"] != "1"  # woken for its looks, each a delivery of its own
    assert log_problems(worker) == []


def test_a_pool_child_killed_right_after_the_create_leaves_one_batch_paid_for(
    batched: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    batched.env["DIGEST_BATCH"] = "1"
    fake_anthropic.hold_batch_creates()  # the batch exists; its answer never reaches the child
    worker = batched.worker("w1", concurrency=1)
    enqueue(batched)
    fake_anthropic.wait_for_batches(1, timeout=30)
    [child] = worker.children()
    os.kill(child, signal.SIGKILL)
    fake_anthropic.release_batch_creates()

    wait_for_status(batched, "done", 60)

    # The redelivery found the creation confirmed and its claimant gone, looked for the batch
    # it had made, and adopted it: no second batch of summaries.
    assert [len(b.requests) for b in fake_anthropic.batches] == [ITEMS, 1]
    assert fake_anthropic.paid == ITEMS + 1 and fake_anthropic.calls == 0
    owner = batched.client().hget(
        f"{batched.env['DIGEST_KEY_PREFIX']}:batches", fake_anthropic.batches[0].id
    )
    assert owner == f"digest:{RUN}".encode()
    assert len(batched.outbox()) == 1
    assert "WorkerLostError" in worker.text()


def test_a_crash_between_results_records_the_rest_from_the_same_batch(
    batched: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    third = WEEK[2]["id"]
    crashed = run_to_the_end(batched, env={"CRASH": f"after:summarize:{third}"})[-1]
    assert crashed.returncode == 137, crashed.stderr
    assert crashed.stdout.endswith(f"  ** simulated crash at after:summarize:{third} **\n")
    assert recorded(batched) == 3  # its results are recorded in item order: i1 to i3

    resumed = run_to_the_end(batched, ())

    assert resumed[-1].returncode == 0, resumed[-1].stderr
    first = resumed[0].stdout
    for item in WEEK[:3]:
        assert f"  replayed summarize:{item['id']}\n" in first
    for item in WEEK[3:]:
        assert f"  ran      summarize:{item['id']}\n" in first  # from the same batch's results
    assert [len(b.requests) for b in fake_anthropic.batches] == [ITEMS, 1]
    assert fake_anthropic.paid == ITEMS + 1 and fake_anthropic.calls == 0
    assert len(batched.outbox()) == 1 and seen(batched) == ITEMS


def test_errored_and_expired_items_are_skipped_or_asked_synchronously(
    batched: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    refused, expired = WEEK[2], WEEK[4]
    fake_anthropic.fail_when(f'title="{refused["title"]}"', 400, message=PROMPT_TOO_LONG)
    fake_anthropic.expire_when(expired["body"][:30])  # its summary's prompt alone

    runs = run_to_the_end(batched)

    last = runs[-1]
    assert last.returncode == 0, last.stderr
    assert f"  skipped  summarize:{refused['id']} (the model refused this item: the prompt is" in (
        last.stdout
    )
    assert last.stdout.splitlines()[-1].startswith(f"sent: {ITEMS - 1} items")
    assert fake_anthropic.calls == 1  # the expired one, asked synchronously once
    assert fake_anthropic.calls_for(expired["title"]) == 1
    assert [len(b.requests) for b in fake_anthropic.batches] == [ITEMS, 1]
    assert fake_anthropic.paid == ITEMS - 2 + 1  # neither the refused nor the expired one
    assert len(batched.outbox()) == 1 and seen(batched) == ITEMS - 1


def test_past_the_deadline_the_batches_are_cancelled_and_asked_synchronously(
    batched: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.batch_processing_time = 120.0  # far slower than the deadline
    batched.env["DIGEST_BATCH_DEADLINE"] = "3s"
    started = time.monotonic()

    runs = run_to_the_end(batched)

    assert runs[-1].returncode == 0, runs[-1].stderr
    assert runs[-1].stdout.splitlines()[-1].startswith(f"sent: {ITEMS} items")
    assert time.monotonic() - started < 60  # the email is not late for a slow batch
    assert [b.counts()["canceled"] for b in fake_anthropic.batches] == [ITEMS, 1]
    assert fake_anthropic.paid == 0
    assert fake_anthropic.calls == ITEMS + 1  # every summary and the opening, synchronously
    assert len(batched.outbox()) == 1
    shown = batched.cli("show", RUN).stdout
    batch = fake_anthropic.batches[0].id
    assert (
        f"\nbatch    summarize {batch} ended, {ITEMS} requests ({ITEMS} canceled); cancelled at "
        "its deadline; its answers recorded, the rest asked synchronously\n"
    ) in shown


def test_an_operators_cancel_cancels_the_runs_batch(
    batched: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    # Long enough that no request finishes during the test's four commands, however slow they run.
    fake_anthropic.batch_processing_time = 600.0
    started = batched.cli("run", "--batch", RUN)
    assert started.stdout.splitlines()[-1].startswith("waiting: batch summarize msgbatch_")
    batch = fake_anthropic.batches[0].id
    waiting = f"summarize {batch} in_progress, {ITEMS} requests ({ITEMS} processing); looks next"
    assert f"  batch {waiting}" in batched.cli("runs").stdout
    assert f"\nbatch    {waiting}" in batched.cli("show", RUN).stdout

    cancelled = batched.cli("cancel", RUN)

    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == (
        f"cancelled digest:{RUN}; its batch {batch} was cancelled; nothing more will run or be "
        "sent\n"
    )
    [only] = fake_anthropic.batches
    assert only.status == "ended" and only.counts()["canceled"] == ITEMS
    assert fake_anthropic.paid == 0
    again = batched.cli("run", RUN)
    assert again.stdout == f"cancelled: digest:{RUN} was cancelled; nothing more runs or is sent\n"
    assert len(fake_anthropic.batches) == 1 and fake_anthropic.calls == 0
    assert batched.outbox() == [] and seen(batched) == 0

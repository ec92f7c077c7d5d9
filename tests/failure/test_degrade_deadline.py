"""The model API down for everything until the week's deadline, on a real worker and beat.

Every call answers 529. The run fails its summaries and is scheduled to retry an hour later
(``DIGEST_RUN_RETRY_DELAY=3600``), past its deadline a few seconds ahead
(``DIGEST_DEGRADE_AT``); the retry is brought forward to the deadline, beat's due sweep hands
it to the worker then, and the email goes out at once, every summary offline and the email
saying so. The same week delivered again after the API is back sends nothing more. A batch
run's batch still processing at the deadline is cancelled there, its items written offline.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.failure.conftest import ITEMS, enqueue, log_problems, wait_for_status
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow

AHEAD = 20.0  # seconds to the deadline: a worker and beat start, the first delivery fails
SLACK = 6.0  # a sweep (1 s), a queued delivery and its replay on a busy two-core machine
# An id that names no week, so its deadline is the first after its first start: a week's id
# would take its week's, long past for the suite's usual week.
RUN = "release-notes"


def deliveries(log: str) -> int:
    """Deliveries of the digest task the worker finished (a retrying run's included)."""
    return log.count("] succeeded in ")


def test_the_api_down_until_the_deadline_sends_a_degraded_email_at_the_deadline_once(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    target = datetime.now(UTC) + timedelta(seconds=AHEAD)
    deadline = target.replace(microsecond=0).timestamp()
    live.env.update(
        DIGEST_DEGRADE_AT=target.strftime("%a %H:%M:%S").lower(),  # in DIGEST_TIMEZONE, UTC
        DIGEST_RUN_RETRY_DELAY="3600",
        DIGEST_RUN_RETRY_MAX_DELAY="3600",
    )
    fake_anthropic.fail_always(529)
    worker = live.worker("w1", concurrency=1)
    live.beat()

    enqueue(live, run_id=RUN)
    wait_for_status(live, "retrying", deadline - time.time(), RUN)
    view = live.view(RUN)
    assert int(view.meta["retry_at"]) == deadline * 1000  # not an hour later
    asked = fake_anthropic.calls
    assert asked > 0

    wait_for_status(live, "done", deadline - time.time() + SLACK, RUN)

    view = live.view(RUN)
    send = view.step("send")
    assert send is not None
    late = send.started_at / 1000 - deadline
    assert 0 <= late <= SLACK, late  # at the deadline: never before it, never an hour after
    assert fake_anthropic.calls == asked  # past the deadline nothing is asked of the model
    outcome = json.loads(view.meta["outcome"])
    assert outcome["degraded"] == {
        "offline": [f"i{n}" for n in range(1, ITEMS + 1)],
        "of": ITEMS,
        "opening": True,
        "deadline": deadline,
    }
    [sent] = live.outbox()
    body = json.loads(sent.read_text())["body"]
    assert "Summarized offline (each update's first sentence), because the model API" in body
    shown = live.cli("show", RUN).stdout
    assert f"sent (degraded: {ITEMS} of {ITEMS} offline): {ITEMS} items" in shown
    [listed] = live.cli("runs").stdout.splitlines()
    assert f"sent (degraded: {ITEMS} of {ITEMS} offline)" in listed
    assert f"answered by offline ({ITEMS + 1})" in listed

    # The API is back; the same week is delivered again, and run by hand: nothing is resent.
    fake_anthropic.clear_faults()
    before = deliveries(worker.text())
    enqueue(live, run_id=RUN)
    again = live.cli("run", RUN)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"already-done: ended earlier (sent (degraded: {ITEMS} of ")
    wait_until(lambda: deliveries(worker.text()) > before, 30, "the delivery again")
    assert len(live.outbox()) == 1
    assert fake_anthropic.calls == asked
    assert log_problems(worker) == []
    print(
        f"API down until the deadline: {fake_anthropic.calls_per_model()} calls, $0 spent, "
        f"email {late:.1f}s after the deadline"
    )


def test_a_batch_in_flight_at_the_deadline_is_cancelled_and_the_email_goes_out_at_it(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    target = datetime.now(UTC) + timedelta(seconds=AHEAD)
    deadline = target.replace(microsecond=0).timestamp()
    live.env.update(
        DIGEST_DEGRADE_AT=target.strftime("%a %H:%M:%S").lower(),
        DIGEST_BATCH="1",
        # Looks at 10 s, then 20 s later: the second would come after the deadline.
        DIGEST_BATCH_FIRST_LOOK="10",
        DIGEST_BATCH_MAX_LOOK="60",
    )
    fake_anthropic.batch_processing_time = 3600.0  # nothing of it finishes in this test
    worker = live.worker("w1", concurrency=1)
    live.beat()

    enqueue(live, run_id=RUN)
    cancel_look = 5.0  # min(5 s, the first look): the look that finds the cancelled batch ended
    wait_for_status(live, "done", deadline - time.time() + cancel_look + SLACK, RUN)

    view = live.view(RUN)
    send = view.step("send")
    assert send is not None
    late = send.started_at / 1000 - deadline
    assert 0 <= late <= cancel_look + SLACK, late  # one look after the deadline's cancel
    [batch] = fake_anthropic.batches  # none for the opening: created past the deadline
    assert batch.cancel_at is not None and batch.counts()["canceled"] == ITEMS
    assert fake_anthropic.calls == 0  # nothing asked synchronously past the deadline
    outcome = json.loads(view.meta["outcome"])
    assert outcome["degraded"] == {
        "offline": [f"i{n}" for n in range(1, ITEMS + 1)],
        "of": ITEMS,
        "opening": True,
        "deadline": deadline,
    }
    assert len(live.outbox()) == 1
    assert log_problems(worker) == []
    print(f"batch in flight at the deadline: cancelled, email {late:.1f}s after the deadline")

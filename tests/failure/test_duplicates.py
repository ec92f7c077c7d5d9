"""One run delivered ten times at once to two workers of four processes each.

At-least-once delivery means duplicates are normal. Exactly one delivery may hold the run;
every other one must find it busy, give its worker slot back and come back later (a Celery
retry after the lease's remaining time), then find the run done and do nothing.
"""

from __future__ import annotations

import re

import pytest

from tests.failure.conftest import (
    CALLS,
    JOURNAL,
    RUN,
    enqueue,
    fences,
    intro_calls,
    log_problems,
    summary_calls,
    task_returned,
    task_state,
    wait_for_status,
)
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment, Worker, wait_until

pytestmark = pytest.mark.slow

DELIVERIES = 10
PROCESSES = 4  # per worker; two workers


def states(deployment: Deployment, ids: list[str]) -> list[str]:
    """The Celery state of each task."""
    return [task_state(deployment, task_id) for task_id in ids]


def busy_retries(*workers: Worker) -> int:
    """Deliveries that found the run leased and scheduled themselves again."""
    return sum(len(re.findall(r"retrying this delivery in", w.text())) for w in workers)


def duplicate_deliveries(deployment: Deployment, fake: FakeAnthropic) -> dict[str, int]:
    """Scenario: ten deliveries of one run on 2x4 slots; what the run and the workers did."""
    workers = [deployment.worker(name, concurrency=PROCESSES) for name in ("a", "b")]
    fake.hold()  # the first delivery to take the lease stops at its first model call
    ids = enqueue(deployment, DELIVERIES)
    fake.wait_for_calls(1, timeout=30)

    # Seven slots are left beside the runner; nine duplicates can all have come and gone
    # through them only if a busy delivery gives its slot back instead of waiting in it.
    def all_busy() -> list[str] | None:
        seen = sorted(states(deployment, ids))
        return seen if seen.count("RETRY") == DELIVERIES - 1 else None

    seen = wait_until(all_busy, 15, "every duplicate to find the run busy and schedule a retry")
    assert seen == ["RETRY"] * (DELIVERIES - 1) + ["STARTED"]
    fake.release()
    wait_for_status(deployment, "done", 20)
    wait_until(
        lambda: states(deployment, ids) == ["SUCCESS"] * DELIVERIES,
        15,
        "every delivery to finish",
    )

    assert fake.calls == CALLS
    assert summary_calls(fake) == [1] * 8
    assert intro_calls(fake) == 1
    assert len(deployment.outbox()) == 1
    assert fences(deployment) == dict.fromkeys(JOURNAL, 1)
    results = [task_returned(deployment, task_id) for task_id in ids]
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["already-done"] * (DELIVERIES - 1) + ["done"]
    assert [r["ran"] for r in results if r["status"] == "done"] == [len(JOURNAL)]
    assert log_problems(*workers) == []
    retries = busy_retries(*workers)
    meta = deployment.view(RUN).meta
    assert meta["starts"] == "1"
    assert int(meta["deliveries"]) == DELIVERIES + retries
    return {"calls": fake.calls, "emails": len(deployment.outbox()), "retries": retries}


def test_ten_duplicates_send_one_email_and_compute_each_summary_once(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    seen = duplicate_deliveries(live, fake_anthropic)
    print(f"duplicates: {seen}")

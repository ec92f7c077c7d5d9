"""The failure suite's shared pieces: a deployment wired to the fake model API, and readers
of what a run left behind (journal, outbox, Celery results, worker logs).

Other failure tests import these names, and the constants re-exported (``name as name``)
from ``tests.support``; they stay stable.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import CALLS as CALLS
from tests.support import JOURNAL as JOURNAL
from tests.support import ROOT as ROOT
from tests.support import RUN as RUN
from tests.support import TITLES, Deployment, Worker
from tests.support import WEEK as WEEK
from tests.support import wait_until as wait_until

ITEMS = len(WEEK)

# Worker log lines that mean a delivery went wrong (a busy retry logs at INFO).
_PROBLEM = re.compile(r"ERROR/|CRITICAL/|raised unexpected|Traceback")

_ENQUEUE = """
import json, sys
from tasks import digest
for _ in range(int(sys.argv[2])):
    print(digest.delay(sys.argv[1], **json.loads(sys.argv[3])).id)
"""


@pytest.fixture
def live(deployment: Deployment, fake_anthropic: FakeAnthropic) -> Iterator[Deployment]:
    """A deployment whose workers send their model calls to the fake API."""
    deployment.env.update(fake_anthropic.env())
    yield deployment


def enqueue(deployment: Deployment, times: int = 1, run_id: str = RUN, **options: str) -> list[str]:
    """Deliver ``digest(run_id, **options)`` ``times`` times from one producer; the task ids."""
    done = subprocess.run(
        [sys.executable, "-c", _ENQUEUE, run_id, str(times), json.dumps(options)],
        cwd=ROOT,
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    assert len(ids) == times, done.stdout
    return ids


def wait_for_status(
    deployment: Deployment, status: str, timeout: float, run_id: str = RUN
) -> float:
    """Poll the run's meta until it reaches ``status``; the seconds it took."""
    started = time.monotonic()
    wait_until(
        lambda: deployment.view(run_id).status == status,
        timeout,
        f"run {run_id} to be {status}",
        every=0.02,
    )
    return time.monotonic() - started


def recorded(deployment: Deployment, prefix: str = "summarize:", run_id: str = RUN) -> int:
    """How many steps whose key starts with ``prefix`` the journal holds."""
    return sum(step.key.startswith(prefix) for step in deployment.view(run_id).steps)


def fences(deployment: Deployment, run_id: str = RUN) -> dict[str, int]:
    """Each recorded step's fence: which lease holder wrote it."""
    return {step.key: step.fence for step in deployment.view(run_id).steps}


def task_result(deployment: Deployment, task_id: str) -> dict[str, object]:
    """The Celery result a task left in the result backend (the deployment's store)."""
    raw = deployment.client().get(f"celery-task-meta-{task_id}")
    assert raw is not None, f"no result stored for task {task_id}"
    result: dict[str, object] = json.loads(raw)
    return result


def task_finished(deployment: Deployment, task_id: str) -> dict[str, object]:
    """The Celery result of a task that returned, once Celery has stored it.

    A run is closed in the journal a moment before Celery stores the task's return value; until
    then the stored result is the STARTED state's (a dict too: the worker's pid and host name).
    """
    wait_until(lambda: task_state(deployment, task_id) == "SUCCESS", 30, f"task {task_id}'s return")
    return task_result(deployment, task_id)


def task_returned(deployment: Deployment, task_id: str) -> dict[str, Any]:
    """What a digest task returned, from its stored result: its report, always a dict."""
    returned = task_finished(deployment, task_id)["result"]
    assert isinstance(returned, dict), f"task {task_id} returned {returned!r}"
    return returned


def task_state(deployment: Deployment, task_id: str) -> str:
    """A task's Celery state; PENDING until it first reports."""
    raw = deployment.client().get(f"celery-task-meta-{task_id}")
    return "PENDING" if raw is None else str(json.loads(raw)["status"])


def summary_calls(fake: FakeAnthropic) -> list[int]:
    """Summary requests per item, in item order (the intro's prompt lists every title too)."""
    asked = [r.text for r in fake.requests if "<updates>" not in r.text]
    return [sum(text.startswith(f'<update title="{title}">') for text in asked) for title in TITLES]


def intro_calls(fake: FakeAnthropic) -> int:
    """Requests for the opening paragraph."""
    return sum("<updates>" in request.text for request in fake.requests)


def log_problems(*workers: Worker) -> list[str]:
    """Error lines in the workers' logs."""
    return [line for w in workers for line in w.text().splitlines() if _PROBLEM.search(line)]

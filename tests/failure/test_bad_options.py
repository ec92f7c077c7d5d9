"""Workflow options refused before anything is sent, journaled or frozen.

``digest.delay(RUN, **options)`` with an option the task does not take (a dry run included:
a preview is a command-line thing, in a scratch journal) or of the wrong type raises at once,
in one line naming it, and sends nothing. A message carrying them anyway (sent by name, by an
older client) is refused by the worker: the delivery ends with one log line naming it, no key
of the run exists afterwards, and the same run delivered properly afterwards is a normal first
start.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.failure.conftest import RUN, task_finished, task_returned, wait_until
from tests.support import ROOT, Deployment

pytestmark = pytest.mark.slow

_ENQUEUE = """
import json, sys
from tasks import digest
print(digest.delay(sys.argv[1], **json.loads(sys.argv[2])).id)
"""

# What no client of this app sends, but a message by name can: the worker's own check.
_SEND_BY_NAME = """
import json, sys
from tasks import app
print(app.send_task("tasks.digest", args=[sys.argv[1]], kwargs=json.loads(sys.argv[2])).id)
"""

TAKES = "the workflow takes to, items, approval, batch, degrade_at"


def python(
    deployment: Deployment, program: str, options: dict[str, object]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program, RUN, json.dumps(options)],
        cwd=ROOT,
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def enqueue(deployment: Deployment, **options: object) -> str:
    done = python(deployment, _ENQUEUE, options)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CASES: dict[str, tuple[dict[str, object], str]] = {
    "dry_run": ({"dry_run": True}, "got an unexpected keyword argument 'dry_run'"),
    "unknown": ({"colour": "red"}, "got an unexpected keyword argument 'colour'"),
    "ill-typed": ({"approval": "yes"}, "approval='yes' is not bool | None"),
}


def test_bad_options_are_refused_at_delay_in_one_line_and_nothing_is_sent(
    deployment: Deployment,
) -> None:
    for options, problem in CASES.values():
        done = python(deployment, _ENQUEUE, options)
        assert done.returncode == 1
        assert done.stdout == ""
        assert done.stderr.splitlines()[-1] == (
            f"journal.errors.InvalidArguments: run digest:{RUN}: invalid arguments: {problem}; "
            f"nothing was started; {TAKES}"
        )
    assert deployment.client().llen("celery") == 0  # nothing reached the queue
    prefix = deployment.env["DIGEST_KEY_PREFIX"]
    assert deployment.client().keys(f"{prefix}:*") == []


def test_bad_options_sent_by_name_are_refused_by_the_worker_and_nothing_is_frozen(
    deployment: Deployment,
) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    worker = deployment.worker("a", concurrency=1)
    cases = CASES
    for options, problem in cases.values():
        sent = python(deployment, _SEND_BY_NAME, options)
        assert sent.returncode == 0, sent.stderr
        task = sent.stdout.strip()
        result = task_finished(deployment, task)
        assert result["status"] == "SUCCESS"
        refused = result["result"]
        assert isinstance(refused, dict) and refused["status"] == "invalid"
        assert refused["error"] == (
            f"run digest:{RUN}: invalid arguments: {problem}; nothing was started; {TAKES}"
        )
        prefix = deployment.env["DIGEST_KEY_PREFIX"]
        assert deployment.client().keys(f"{prefix}:{{digest:{RUN}}}:*") == []  # nothing frozen
    errors = [line for line in worker.text().splitlines() if "ERROR/" in line]
    assert len(errors) == len(cases) and all("invalid arguments" in line for line in errors)
    assert "Traceback" not in worker.text()

    good = enqueue(deployment)
    wait_until(lambda: deployment.view(RUN).status == "done", 30, "the proper delivery")
    assert task_returned(deployment, good)["status"] == "done"
    assert len(deployment.outbox()) == 1
    assert json.loads(deployment.view(RUN).meta["args"]) == {
        "to": "team@example.com",
        "approval": False,
    }

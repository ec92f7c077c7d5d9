"""Workflow options a worker refuses before anything is journaled or frozen.

``digest.delay(RUN, **options)`` with an option the task does not take (a dry run included:
a preview is a command-line thing, in a scratch journal) or of the wrong type: the delivery
ends with one log line naming it, no key of the run exists afterwards, and the same run
delivered properly afterwards is a normal first start.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.failure.conftest import RUN, task_result, task_returned, wait_until
from tests.support import ROOT, Deployment

pytestmark = pytest.mark.slow

_ENQUEUE = """
import json, sys
from tasks import digest
print(digest.delay(sys.argv[1], **json.loads(sys.argv[2])).id)
"""

TAKES = "the workflow takes to, items, approval"


def enqueue(deployment: Deployment, **options: object) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _ENQUEUE, RUN, json.dumps(options)],
        cwd=ROOT,
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_bad_options_are_refused_in_one_line_and_nothing_is_frozen(
    deployment: Deployment,
) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    worker = deployment.worker("a", concurrency=1)
    cases: dict[str, tuple[dict[str, object], str]] = {
        "dry_run": ({"dry_run": True}, "got an unexpected keyword argument 'dry_run'"),
        "unknown": ({"colour": "red"}, "got an unexpected keyword argument 'colour'"),
        "ill-typed": ({"approval": "yes"}, "approval='yes' is not bool | None"),
    }
    for options, problem in cases.values():
        task = enqueue(deployment, **options)
        wait_until(lambda: task_result(deployment, task), 30, f"the delivery of {options}")  # noqa: B023
        result = task_result(deployment, task)
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

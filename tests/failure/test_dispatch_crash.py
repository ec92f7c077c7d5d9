"""A dispatcher killed between claiming a week and publishing it loses no week.

``CRASH=dispatch:before-publish`` kills the dispatching process (exit 137) after it claimed
this week's marker and before the broker got the task. The next dispatch proves the claimant
gone (same host), takes the claim over and publishes: the week is sent once, never skipped.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tasks.keys import DigestKeys
from tasks.schedule import run_ids_due
from tests.support import ROOT, Deployment, as_bytes, wait_until

pytestmark = pytest.mark.slow

_DISPATCH = "from tasks.celery_app import dispatch_weekly; print(dispatch_weekly())"


def dispatch(deployment: Deployment, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _DISPATCH],
        cwd=ROOT,
        env={**deployment.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_dispatcher_killed_between_claim_and_publish_loses_no_week(
    deployment: Deployment,
) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    week = run_ids_due(datetime.now(UTC), ZoneInfo("UTC"), 4)[-1]
    marker = DigestKeys(deployment.env["DIGEST_KEY_PREFIX"]).dispatched(week)
    client = deployment.client()
    deployment.worker("a", concurrency=1)

    crashed = dispatch(deployment, CRASH="dispatch:before-publish")
    assert crashed.returncode == 137, crashed.stderr
    assert as_bytes(client.get(marker) or b"").startswith(b"claimed by ")
    time.sleep(2)
    assert deployment.view(week).status == "new"  # nothing was published

    again = dispatch(deployment)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"['{week}']"
    wait_until(lambda: deployment.view(week).status == "done", 30, "the week to be sent")
    assert not as_bytes(client.get(marker) or b"").startswith(b"claimed by ")

    third = dispatch(deployment)
    assert third.stdout.strip() == "[]"
    time.sleep(2)
    assert deployment.view(week).meta["deliveries"] == "1"
    assert len(deployment.outbox()) == 1

"""A dispatcher killed between claiming a week and publishing it loses no week.

``CRASH=dispatch:before-publish`` kills the dispatching process (exit 137) after it claimed
this week's marker and before the broker got the task. The next dispatch proves the claimant
gone (same host), takes the claim over and publishes: the week is sent once, never skipped.
From another pid namespace (another container) nothing is proved: the claim is left to expire,
and every later dispatch looks at the week again until one publishes it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tasks.job.weeks import run_ids_due
from tasks.keys import DigestKeys
from tests.support import ROOT, Deployment, as_bytes, wait_until

pytestmark = pytest.mark.slow

_DISPATCH = "from tasks.worker.app import dispatch_weekly; print(dispatch_weekly())"


def dispatch(deployment: Deployment, *within: str, **env: str) -> subprocess.CompletedProcess[str]:
    """One dispatch in a process of its own; ``within`` is a command that runs it elsewhere."""
    return subprocess.run(
        [*within, sys.executable, "-c", _DISPATCH],
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


def test_a_week_claimed_from_another_pid_namespace_is_dispatched_once_the_claim_expires(
    deployment: Deployment,
) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give each dispatcher its own pid namespace")
    container = ("unshare", "--pid", "--fork", "--mount-proc", "--")
    deployment.env.update(DIGEST_OFFLINE="1")
    due = run_ids_due(datetime.now(UTC), ZoneInfo("UTC"), 4)
    last, missed, week = due[-3:]
    keys = DigestKeys(deployment.env["DIGEST_KEY_PREFIX"])
    client = deployment.client()
    client.set(keys.dispatch_watermark, last)  # beat was down for the Monday of `missed`
    deployment.worker("a", concurrency=1)  # the embedded server starts out here, not inside

    crashed = dispatch(deployment, *container, CRASH="dispatch:before-publish")
    assert crashed.returncode == 137, crashed.stderr
    claim = as_bytes(client.get(keys.dispatched(missed)) or b"")
    assert claim.startswith(b"claimed by "), claim

    # Another container: the claimant's pid namespace is not its own, so nothing is proved.
    other = dispatch(deployment, *container)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == f"['{week}']"
    assert client.get(keys.dispatched(missed)) == claim

    client.pexpire(keys.dispatched(missed), 1)  # the claim's 60 s run out, without the wait
    wait_until(lambda: client.get(keys.dispatched(missed)) is None, 5, "the claim to expire")
    later = dispatch(deployment, *container)
    assert later.returncode == 0, later.stderr
    assert later.stdout.strip() == f"['{missed}']"
    for run_id in (missed, week):
        wait_until(functools.partial(is_done, deployment, run_id), 30, f"{run_id} to be sent")

    assert dispatch(deployment, *container).stdout.strip() == "[]"
    assert client.get(keys.dispatch_watermark) == week.encode()
    time.sleep(2)
    assert [deployment.view(r).meta["deliveries"] for r in (missed, week)] == ["1", "1"]
    assert len(deployment.outbox()) == 1  # the week sent first took the 8 items


def is_done(deployment: Deployment, run_id: str) -> bool:
    return deployment.view(run_id).status == "done"

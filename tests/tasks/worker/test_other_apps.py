"""The digest's worker signal handlers act for the digest's own worker, not another app's.

Celery's worker signals are process-wide: once ``tasks.worker.app`` is imported, every worker
started in the process (another application's, a test's in-memory one) sends them too, and
the digest's handlers would check the digest's store for it (starting an embedded Valkey
where no ``REDIS_URL`` is set), serve its metrics, or end the process for the digest's
clock. A fresh interpreter imports the app, then another app's worker starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from journal.contrib.embedded import stop_embedded
from tests.support import ROOT

pytestmark = pytest.mark.slow

ANOTHER_APPS_WORKER = """
from celery import Celery
from celery.signals import worker_init, worker_shutdown
import tasks.worker.app  # the digest's handlers connect, as any import of the app connects them
class AnotherWorker:
    app = Celery("another")
worker = AnotherWorker()
worker_init.send(sender=worker)
worker_shutdown.send(sender=worker)
print("done")
"""


def test_another_apps_worker_in_the_process_is_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIGEST_", "REDIS_URL"))}
    env |= {"DIGEST_STATE_DIR": str(state), "DIGEST_METRICS_PORT": "1"}
    try:
        ran = subprocess.run(
            [sys.executable, "-c", ANOTHER_APPS_WORKER],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0 and ran.stdout.strip() == "done", ran.stderr
        assert not state.exists(), "the digest's handlers acted for another app's worker"
    finally:
        stop_embedded(state)

"""A real worker's log lines name the run, the Celery task, the attempt and the fence.

An operator reads a worker's log long after the run: each line a delivery writes must say which
run and which holder wrote it, as text or (``DIGEST_LOG_FORMAT=json``) as one JSON object per
line, including the lines a map's calls log from their own threads; and the due sweep, every
second here, must not fill the log when it has nothing to do.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import JOURNAL, Deployment, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"


def enqueue(deployment: Deployment) -> str:
    """Enqueue the run through the CLI; the Celery task id it printed."""
    done = deployment.cli("enqueue", RUN)
    assert done.returncode == 0, done.stderr
    found = re.search(r"as task (\S+);", done.stdout)
    assert found, done.stdout
    return found.group(1)


def test_json_lines_carry_the_run_task_attempt_and_fence(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    worker = deployment.worker(
        "w1", concurrency=1, env={**fake_anthropic.env(), "DIGEST_LOG_FORMAT": "json"}
    )
    task_id = enqueue(deployment)
    wait_until(lambda: deployment.view(RUN).status == "done", 60, "the run to finish")

    lines = [line for line in worker.text().splitlines() if line.startswith("{")]
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]
    steps = [r for r in records if re.fullmatch(r"(ran|replayed) \S+", str(r["message"]))]
    assert [r["message"].split()[1] for r in steps] == JOURNAL
    for record in steps:  # summaries are reported from the map's threads
        assert record["run_id"] == f"digest:{RUN}"
        assert record["task_id"] == task_id
        assert record["attempt"] == 1
        assert record["fence"] == 1
        assert record["level"] == "INFO"
        assert record["time"].endswith("+00:00")
    outside = [r for r in records if "ready." in str(r["message"])]
    assert outside and all("run_id" not in r for r in outside)


def test_text_lines_end_with_the_run_and_the_sweep_stays_quiet(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    worker = deployment.worker(
        "w1",
        concurrency=1,
        env={**fake_anthropic.env(), "DIGEST_SWEEP_INTERVAL": "0.5"},
        extra=("--beat", f"--schedule={deployment.state_dir / 'beat-schedule'}"),
    )
    task_id = enqueue(deployment)
    wait_until(lambda: deployment.view(RUN).status == "done", 60, "the run to finish")
    time.sleep(3)  # six more sweeps with nothing to do

    text = worker.text()
    suffix = f" [run=digest:{RUN} task={task_id} attempt=1 fence=1]"
    assert f"ran summarize:i4{suffix}" in text
    assert f"ran send{suffix}" in text
    sweeps = [line for line in text.splitlines() if "journal.sweep[" in line]
    assert sweeps == [], sweeps[:4]

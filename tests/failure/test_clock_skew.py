"""One clock: a command or worker whose wall clock is off the store's is refused at start.

The skew is real: libfaketime (Debian's ``faketime``) moves the clock of the ``digest`` and
``celery`` processes alone, while the deployment's Valkey, started beforehand, keeps the true
time. Skipped, saying so, where ``faketime`` is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.failure.conftest import RUN, enqueue
from tests.support import BIN, ROOT, Deployment, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("faketime") is None,
        reason="needs Debian's faketime to skew a process's clock (apt-get install faketime)",
    ),
]

SKEWED = ("faketime", "-f", "+30s")


def test_a_command_whose_clock_is_ahead_is_refused_in_one_line_and_writes_nothing(
    deployment: Deployment,
) -> None:
    assert deployment.cli("runs").returncode == 0  # the store starts with the true time
    client = deployment.client()
    keys_before = sorted(client.scan_iter(match=f"{deployment.env['DIGEST_KEY_PREFIX']}:*"))

    done = subprocess.run(
        [*SKEWED, str(BIN / "digest"), "run", RUN],
        cwd=ROOT,
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "clock is 30." in line and "s ahead of the journal store" in line, line
    assert "synchronise it (NTP)" in line
    assert sorted(client.scan_iter(match=f"{deployment.env['DIGEST_KEY_PREFIX']}:*")) == keys_before
    assert deployment.outbox() == []


def test_a_worker_whose_clock_is_behind_exits_at_start_and_leaves_the_week_to_others(
    deployment: Deployment,
) -> None:
    assert deployment.cli("runs").returncode == 0
    log = deployment.state_dir / "worker-skewed.log"
    worker = subprocess.Popen(
        [
            *("faketime", "-f", "-30s"),
            str(BIN / "celery"),
            "-A",
            "tasks",
            "worker",
            "--concurrency=1",
            "--without-gossip",
            "--without-mingle",
            "--loglevel=INFO",
        ],
        cwd=ROOT,
        env=deployment.env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deployment.processes.append(worker)

    enqueue(deployment)
    assert worker.wait(timeout=60) == 2, log.read_text(errors="replace")
    [line] = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("digest:")]
    assert "clock is 30." in line and "behind the journal store" in line, line
    assert "Traceback" not in log.read_text(errors="replace")
    assert deployment.view(RUN).steps == []
    assert deployment.outbox() == []
    # The delivery was not taken: a worker with a good clock runs it.
    deployment.worker("good", concurrency=1, env={"DIGEST_OFFLINE": "1"})
    wait_until(lambda: deployment.view(RUN).status == "done", 60, "the good worker to run it")
    assert len(deployment.outbox()) == 1

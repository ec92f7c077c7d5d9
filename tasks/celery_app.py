"""The Celery app: at-least-once settings, the durable ``digest`` task, beat's schedule.

``celery -A tasks worker`` and ``celery -A tasks beat`` load this module through
``tasks/__init__.py``. Nothing here connects at import time: the broker URL of the embedded
server is a path, and the journal is built lazily in each pool child.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.schedules import crontab

from journal import StepEvent
from journal.durable import SWEEP_TASK, Durable, at_least_once_settings
from tasks.config import Config
from tasks.dispatch import dispatch_due
from tasks.runtime import broker_url, worker_runtime
from tasks.workflow import crash_point, run_digest

log = logging.getLogger("tasks.digest")

config = Config.from_env()

app = Celery("tasks", broker=broker_url(config))
app.conf.update(
    at_least_once_settings(
        visibility_timeout=config.visibility_timeout, task_time_limit=config.task_time_limit
    ),
    result_backend=config.redis_url or broker_url(config),
    result_expires=7 * 24 * 3600,
    timezone=config.timezone,
    beat_schedule={
        "digest-weekly": {
            "task": "tasks.dispatch_weekly",
            "schedule": crontab(minute="0", hour="8", day_of_week="mon"),
        },
        # The same idempotent dispatcher, hourly: catches up on Mondays beat was down for.
        "digest-catch-up": {"task": "tasks.dispatch_weekly", "schedule": crontab(minute="5")},
        "journal-sweep": {"task": SWEEP_TASK, "schedule": config.sweep_interval},
    },
)


def on_step(event: StepEvent) -> None:
    """Log each step, and honour ``CRASH=after:<step>`` on the worker too."""
    log.info("%s %s", "replayed" if event.replayed else "ran", event.key)
    if not event.replayed:
        crash_point(f"after:{event.key}")


durable = Durable(
    app, lambda: worker_runtime().journal, on_step=on_step, max_countdown=config.max_countdown
)


@durable.workflow("digest", task_name="tasks.digest")
def digest(run: Any, **options: Any) -> dict[str, Any]:
    """The weekly digest for one run id: ``digest.delay("2026-w42")``."""
    return run_digest(run, worker_runtime(), **options)


@app.task(name="tasks.dispatch_weekly", ignore_result=True)
def dispatch_weekly() -> list[str]:
    """Enqueue this week's digest (and any week missed while beat was down), once each."""
    runtime = worker_runtime()
    return dispatch_due(
        runtime.client,
        runtime.keys,
        datetime.now(UTC),
        zone=config.timezone,
        catch_up_weeks=config.catch_up_weeks,
        enqueue=lambda run_id: digest.apply_async(args=[run_id], task_id=f"digest-{run_id}"),
    )

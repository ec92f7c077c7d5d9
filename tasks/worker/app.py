"""The Celery app: the durable ``digest`` task and beat's two tasks.

Its configuration is ``tasks.worker.configuration``'s, read on first use; what a worker does
at Celery's signals is ``tasks.worker.signals``, connected by importing it here.

``celery -A tasks worker`` and ``celery -A tasks beat`` load this module through
``tasks/__init__.py``. Importing it reads nothing and starts nothing: the environment is read
when Celery first needs its configuration (a worker or beat starting, the first ``delay``),
and only then, with no ``REDIS_URL``, is the embedded server started, since it is the broker.
The journal itself is built lazily in each pool child, after the fork, so no connection is
shared between processes.
"""

from __future__ import annotations

from datetime import UTC, datetime

from celery import Celery

import tasks.worker.signals  # noqa: F401  (its handlers connect to Celery's signals on import)
from journal import StepEvent
from journal.integrations.celery import Durable
from journal.ops.actions import purge as purge_runs
from tasks.job import workflow
from tasks.runtime import process_runtime
from tasks.worker.configuration import APP_NAME, LazySettings, log, settings
from tasks.worker.dispatch import dispatch_due

app = Celery(APP_NAME)
app.config_from_object(LazySettings())


def on_step(event: StepEvent) -> None:
    """Log each step a delivery runs or replays (the journal counts them)."""
    log.info("%s %s", "replayed" if event.replayed else "ran", event.key)


durable = Durable(
    app,
    lambda: process_runtime().journal,
    on_step=on_step,
    max_countdown=lambda: settings().max_countdown,
)

# The workflow tasks.job.workflow defines (and the command line runs there), delivered as a task.
digest = durable.register(workflow.digest, task_name="tasks.digest")


@app.task(name="tasks.dispatch_weekly", ignore_result=True)
def dispatch_weekly() -> list[str]:
    """Enqueue this week's digest (and any week missed while beat was down), once each."""
    runtime = process_runtime()
    config = runtime.config
    return dispatch_due(
        runtime.client,
        runtime.keys,
        datetime.now(UTC),
        zone=config.timezone,
        schedule=config.parsed_schedule(),
        catch_up_weeks=config.catch_up_weeks,
        enqueue=lambda run_id: digest.apply_async(args=[run_id], task_id=f"digest-{run_id}"),
    )


@app.task(name="tasks.purge_old_runs", ignore_result=True)
def purge_old_runs() -> list[str]:
    """Remove the keys of runs that ended longer than ``DIGEST_RUN_RETENTION`` ago."""
    runtime = process_runtime()
    retention = runtime.config.run_retention
    if retention is None:  # a message left from when it was set
        return []
    purged = [run.run for run in purge_runs(runtime.journal, retention)]
    log.info("purged %d runs that ended over %gs ago", len(purged), retention)
    return purged

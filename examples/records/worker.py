"""The Celery app: ``celery -A examples.records worker --beat``.

The batch is registered as a durable task; ``--beat`` adds the due sweep, which re-enqueues
a run whose worker died once its lease has expired. Without beat, a run whose worker died is
resumed by the next delivery of it (``python -m examples.records run`` again).
"""

from __future__ import annotations

from celery import Celery

from examples.records.batch import batch
from examples.records.config import Config
from journal.integrations.celery import SWEEP_TASK, Durable, at_least_once_settings

config = Config.from_env()

app = Celery("examples.records", broker=config.broker_url, backend=config.broker_url)
# A batch of a few thousand records runs for minutes: a time limit well above that, and the
# broker's visibility timeout above the limit, so Redis never redelivers a running batch.
app.conf.update(at_least_once_settings(visibility_timeout=7200, task_time_limit=3600))
app.conf.beat_schedule = {
    "sweep": {"task": SWEEP_TASK, "schedule": config.sweep_interval},
}

# The journal is built in each pool child on first use, after the fork: no shared connection.
durable = Durable(app, lambda: config.runtime().journal)
records = durable.register(batch)

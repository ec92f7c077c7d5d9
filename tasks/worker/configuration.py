"""Celery's configuration for the digest: read from the settings when Celery first asks.

At-least-once delivery (``journal.integrations.celery``), the broker and the result backend
with their TLS verified, the queue, and beat's schedule: the weekly dispatch, its hourly
catch-up, the journal's due sweep and, with a retention set, the weekly purge.
"""

from __future__ import annotations

import functools
import logging
import ssl
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from celery.schedules import crontab

from journal.contrib.embedded import embedded_broker_url
from journal.integrations.celery import SWEEP_TASK, at_least_once_settings
from tasks.config import Config
from tasks.errors import BadInput
from tasks.runtime import (
    broker_url,
    process_config,
)

log = logging.getLogger("tasks.digest")
APP_NAME = "tasks"
"""The digest's Celery app's name: ``celery -A tasks``, and its tasks' names' first part."""


# Celery's names for a cron expression's five fields, in the expression's order.
CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


def settings() -> Config:
    """The settings, read on first use; a refused one ends ``celery -A tasks`` in one line.

    Raises:
        BadInput: a setting is refused, in a process other than the ``celery`` command (code
            that imported the app: its exception to handle).
    """
    try:
        config = process_config()
        config.parsed_schedule()  # only beat and workers read it: checked as they start
        return config
    except BadInput as bad:
        if Path(sys.argv[0]).name != "celery" and not sys.argv[0].endswith("celery/__main__.py"):
            raise
        # `celery -A tasks worker` or beat refusing a setting: one line and exit status 2, like
        # the CLI, instead of a traceback from inside Celery's configuration loading.
        print(f"digest: {bad}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def result_backend(config: Config) -> str:
    """Where Celery keeps task states: with a Redis broker, on the broker itself.

    Not on the journal store: a delivery that finds the journal down must still record its
    retry (and the next delivery its start), or Celery drops the retry before the body runs.
    """
    broker = broker_url(config)
    if broker.startswith(("redis://", "rediss://", "redis+socket://")):
        return broker
    # Celery has no AMQP result backend: use the journal's Redis, spelled as Celery reads a
    # unix socket (the embedded server's included).
    store = config.redis_url or embedded_broker_url(config.state_dir)
    return "redis+socket://" + store.removeprefix("unix://") if store.startswith("unix:") else store


def verified_tls(url: str) -> dict[str, Any] | None:
    """TLS options for a Celery connection to ``url``: verify the server unless told not to.

    redis-py verifies a ``rediss://`` server (certificate and host name) by default, but Celery
    does not pass that default on: kombu connects a ``rediss://`` broker with no
    ``ssl_cert_reqs`` unverified, and the Redis result backend refuses such a URL outright.
    Requiring the certificate here gives both redis-py's default; the URL's own options
    (``?ssl_cert_reqs=...&ssl_ca_certs=...``) still take precedence, as redis-py documents them.
    """
    if not url.startswith("rediss://"):
        return None
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED}


def celery_settings(config: Config) -> dict[str, Any]:
    """Celery's configuration for these settings: the at-least-once ones, broker, schedule."""
    broker = broker_url(config)
    backend = result_backend(config)
    schedule = config.parsed_schedule()
    return {
        **at_least_once_settings(
            visibility_timeout=config.visibility_timeout, task_time_limit=config.time_limit
        ),
        "broker_url": broker,
        "broker_use_ssl": verified_tls(broker),
        "result_backend": backend,
        "redis_backend_use_ssl": verified_tls(backend),
        "result_expires": 7 * 24 * 3600,
        "task_default_queue": config.queue,
        "worker_soft_shutdown_timeout": config.soft_shutdown_timeout,
        "timezone": config.timezone,
        # Beat's own record of when it last sent each entry: state, not source, so it goes
        # to the state dir (`--schedule` still overrides it), never into a checkout.
        "beat_schedule_filename": str(config.state_dir / "celerybeat-schedule"),
        "beat_schedule": {
            "digest-weekly": {
                "task": "tasks.dispatch_weekly",
                "schedule": crontab(**dict(zip(CRON_FIELDS, schedule.fields, strict=True))),
            },
            # The same idempotent dispatcher, hourly: catches up on Mondays beat was down for.
            "digest-catch-up": {"task": "tasks.dispatch_weekly", "schedule": crontab(minute="5")},
            "journal-sweep": {"task": SWEEP_TASK, "schedule": config.sweep_interval},
            **(
                {}
                if config.run_retention is None
                else {
                    "journal-purge": {
                        "task": "tasks.purge_old_runs",
                        "schedule": crontab(minute="30", hour="3", day_of_week="sun"),
                    }
                }
            ),
        },
    }


class LazySettings(Mapping[str, Any]):
    """Celery's configuration source, computed from the environment when Celery first reads it.

    Celery reads a configuration object when its configuration is first needed and, should
    reading it fail, reads it again on the next use; so a refused setting is refused at every
    use rather than leaving Celery on its defaults (a broker on localhost).
    """

    @functools.cached_property
    def _values(self) -> dict[str, Any]:
        return celery_settings(settings())

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

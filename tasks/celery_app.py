"""The Celery app: at-least-once settings, the durable ``digest`` task, beat's schedule.

``celery -A tasks worker`` and ``celery -A tasks beat`` load this module through
``tasks/__init__.py``. Importing it reads nothing and starts nothing: the environment is read
when Celery first needs its configuration (a worker or beat starting, the first ``delay``),
and only then, with no ``REDIS_URL``, is the embedded server started, since it is the broker.
The journal itself is built lazily in each pool child, after the fork, so no connection is
shared between processes.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import ssl
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.schedules import crontab
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
)

from journal import StepEvent, SystemClock
from journal.contrib.checks import check_persistence, check_skew
from journal.contrib.embedded import embedded_broker_url
from journal.errors import ClockSkewed, StoreEvicts
from journal.integrations.celery import SWEEP_TASK, Durable, at_least_once_settings
from journal.logs import log_with_run_context, redact_logging
from journal.ops.actions import purge as purge_runs
from tasks import workflow
from tasks.config import Config
from tasks.dispatch import dispatch_due
from tasks.errors import BadInput
from tasks.runtime import (
    broker_url,
    connect,
    metrics_dir,
    prepare_metrics,
    process_config,
    process_runtime,
    remove_dead_metrics,
    store_url,
)

log = logging.getLogger("tasks.digest")

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


app = Celery("tasks")
app.config_from_object(LazySettings())


@worker_init.connect
def import_model_sdk(**_: Any) -> None:
    """Import the Anthropic SDK in the worker's main process, before its pool forks.

    Every child then shares the imported modules instead of paying the import (seconds) on its
    first model call; a worker with no key never calls the model and skips it, saying once
    whether it summarizes offline.
    """
    if os.environ.get("ANTHROPIC_API_KEY"):
        import anthropic  # noqa: F401
    elif settings().offline_allowed:
        # Once, from the main process: the pool children summarize offline without a word.
        log.warning(
            "no ANTHROPIC_API_KEY: summarizing offline (first sentence of each update), as "
            "`digest run` does; set the key for real summaries%s",
            "" if settings().offline else " (with REDIS_URL set, a worker refuses instead)",
        )


@worker_init.connect
def refuse_a_bad_store_or_clock(**_: Any) -> None:
    """A worker whose clock is off the store's exits at start, in one line, status 2.

    So does one whose store evicts keys (``maxmemory-policy``), and one whose broker would be
    a Redis Cluster (no ``CELERY_BROKER_URL``). Refusing
    each delivery instead would fail and ack the week's message on this worker, when a worker
    with a good clock could have run it. A store that is down is not refused here: the
    deliveries wait for it, as they do for any outage.
    """
    url = store_url(settings())
    try:
        client = connect(url)
        settings().check_store(cluster=isinstance(client, redis.RedisCluster))
        check_persistence(client, logger=log)
        check_skew(client, SystemClock(), url)
    except (redis.ConnectionError, redis.TimeoutError):
        return
    except (ClockSkewed, StoreEvicts, BadInput) as refused:
        print(f"digest: {refused}", file=sys.stderr, flush=True)
        os._exit(2)  # Celery logs and swallows exceptions raised by signal handlers


@after_setup_logger.connect
@after_setup_task_logger.connect
def mask_secrets_in_logs(logger: logging.Logger, **_: Any) -> None:
    """Mask secrets in every line the worker or beat logs, and name the run in each.

    The task logger has handlers of its own and does not propagate, hence both signals. Every
    line a delivery writes, Celery's and the libraries' too, carries its run id, task id,
    attempt and fence, as text at the end of the line or as JSON keys (``DIGEST_LOG_FORMAT``).
    """
    redact_logging(logger)
    json = settings().log_format == "json"
    for handler in logger.handlers:
        log_with_run_context(handler, json=json)


@worker_init.connect
def serve_metrics(**_: Any) -> None:
    """With ``DIGEST_METRICS_PORT``, the main process serves every pool child's counters, summed.

    Set up before the pool forks, so each child counts into its own files in the shared
    multiprocess directory and a scrape here adds them up, dead children's included. What
    Redis holds (runs by state, the due lag) is exported once, by the console or ``digest
    metrics``, not by every worker.
    """
    config = settings()
    if config.metrics_port is None:
        return
    for removed in remove_dead_metrics(config.state_dir):
        log.info("removed %s: its worker is gone", removed)
    prepare_metrics(metrics_dir(config.state_dir, os.getpid()))
    from prometheus_client import start_http_server

    from tasks import metrics

    start_http_server(config.metrics_port, registry=metrics.worker_registry())
    log.info("metrics on :%d/metrics", config.metrics_port)


@worker_shutdown.connect
def remove_own_metrics(**_: Any) -> None:
    """A stopping worker's counters go with it: nothing scrapes them once it is gone."""
    own = metrics_dir(settings().state_dir, os.getpid())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") == str(own):  # not a directory it was given
        shutil.rmtree(own, ignore_errors=True)


@worker_process_shutdown.connect
def forget_child(pid: int | None = None, **_: Any) -> None:
    """A pool child's live gauges go with it; its counters stay in the sum."""
    if settings().metrics_port is not None:
        from tasks import metrics

        metrics.child_exited(pid or os.getpid())


def on_step(event: StepEvent) -> None:
    """Log each step a delivery runs or replays (the journal counts them)."""
    log.info("%s %s", "replayed" if event.replayed else "ran", event.key)


durable = Durable(
    app,
    lambda: process_runtime().journal,
    on_step=on_step,
    max_countdown=lambda: settings().max_countdown,
)

# The workflow tasks.workflow defines (and the command line runs there), delivered as a task.
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

"""What a worker or beat does at Celery's signals: refuse a bad start, mask logs, serve metrics.

Connected when ``tasks.worker.app`` imports this module; each handler reads the settings
through ``tasks.worker.configuration``, so the environment is still read on first use.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import Any

import redis
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
)

from journal.errors import ClockSkewed, StoreEvicts
from journal.logs import log_with_run_context, redact_logging
from tasks.errors import BadInput
from tasks.runtime import (
    checked_store,
    metrics_dir,
    prepare_metrics,
    remove_dead_metrics,
)
from tasks.worker.configuration import APP_NAME, log, settings


@worker_init.connect
def import_model_sdk(sender: object = None, **_: Any) -> None:
    """Import the Anthropic SDK in the worker's main process, before its pool forks.

    Every child then shares the imported modules instead of paying the import (seconds) on its
    first model call; a worker with no key never calls the model and skips it, saying once
    whether it summarizes offline.
    """
    if not _ours(sender):
        return
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
def refuse_a_bad_store_or_clock(sender: object = None, **_: Any) -> None:
    """A worker whose clock is off the store's exits at start, in one line, status 2.

    So does one whose store evicts keys (``maxmemory-policy``), and one whose broker would be
    a Redis Cluster (no ``CELERY_BROKER_URL``). Refusing
    each delivery instead would fail and ack the week's message on this worker, when a worker
    with a good clock could have run it. A store that is down is not refused here: the
    deliveries wait for it, as they do for any outage.
    """
    if not _ours(sender):
        return
    config = settings()
    try:
        checked_store(config, log)
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
def serve_metrics(sender: object = None, **_: Any) -> None:
    """With ``DIGEST_METRICS_PORT``, the main process serves every pool child's counters, summed.

    Set up before the pool forks, so each child counts into its own files in the shared
    multiprocess directory and a scrape here adds them up, dead children's included. What
    Redis holds (runs by state, the due lag) is exported once, by the console or ``digest
    metrics``, not by every worker.
    """
    if not _ours(sender):
        return
    config = settings()
    if config.metrics_port is None:
        return
    for removed in remove_dead_metrics(config.state_dir):
        log.info("removed %s: its worker is gone", removed)
    prepare_metrics(metrics_dir(config.state_dir, os.getpid()))
    from prometheus_client import start_http_server

    from tasks.worker import metrics

    # The loopback address unless told otherwise, as the console and `digest metrics` bind:
    # prometheus_client's own default is every interface.
    start_http_server(
        config.metrics_port, addr=config.metrics_host, registry=metrics.worker_registry()
    )
    log.info("metrics on %s:%d/metrics", config.metrics_host, config.metrics_port)


@worker_shutdown.connect
def remove_own_metrics(sender: object = None, **_: Any) -> None:
    """A stopping worker's counters go with it: nothing scrapes them once it is gone."""
    if not _ours(sender):
        return
    own = metrics_dir(settings().state_dir, os.getpid())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") == str(own):  # not a directory it was given
        shutil.rmtree(own, ignore_errors=True)


@worker_process_shutdown.connect
def forget_child(pid: int | None = None, **_: Any) -> None:
    """A pool child's live gauges go with it; its counters stay in the sum."""
    if settings().metrics_port is not None:
        from tasks.worker import metrics

        metrics.child_exited(pid or os.getpid())


def _ours(sender: object) -> bool:
    """Whether a worker signal comes from the digest's own worker.

    Celery's signals are process-wide: another app's worker in the same process (an embedding
    application's, a test's) sends them too, and must not be checked, served or ended for the
    digest's settings.
    """
    return getattr(getattr(sender, "app", None), "main", None) == APP_NAME

"""How long one delivery may run, next to how long the broker waits before redelivering it.

Pure arithmetic, with no Celery import, so an application's configuration can refuse a bad
pair of settings at start as cheaply as ``at_least_once_settings`` (in
``journal.integrations.celery``) does when it builds Celery's settings: one rule, one
place. And what a soft time limit that ended a delivery means for the run: it is retried
(``stopped_by_time_limit``).
"""

from __future__ import annotations

import sys

# A delivery's hard time limit stays below this share of the broker's redelivery timeout (Redis's
# visibility timeout, RabbitMQ's consumer timeout): the margin covers the prefetch wait, the
# clock and the time a killed child takes to be noticed.
REDELIVERY_MARGIN = 0.9


def redelivers_running(task_time_limit: float, redelivery_timeout: float) -> bool:
    """True when the broker could redeliver a task that is still running.

    That is, when ``task_time_limit`` is not safely below ``redelivery_timeout``: a second worker
    would then run the same delivery beside the first (the lease keeps them apart, but the
    second only waits and retries, and a RabbitMQ channel closed under the first loses its ack).
    """
    return task_time_limit >= redelivery_timeout * REDELIVERY_MARGIN


def safe_time_limit(redelivery_timeout: float) -> int:
    """A whole number of seconds safely below ``redelivery_timeout``: what to lower a limit to."""
    return int(redelivery_timeout * REDELIVERY_MARGIN) - 1


def stopped_by_time_limit(error: BaseException) -> bool:
    """Whether ``error`` is Celery's soft time limit ending a delivery (``SoftTimeLimitExceeded``).

    It stops the delivery, not the run: what the run recorded stands, and another delivery
    resumes it, so the run is retried like a transient failure, never failed for good. Read
    from the modules already loaded, without importing Celery: where billiard, which raises it,
    was never imported, no error can be one.
    """
    exceptions = sys.modules.get("billiard.exceptions")
    limit = getattr(exceptions, "SoftTimeLimitExceeded", None)
    return limit is not None and isinstance(error, limit)

"""How long one delivery may run, next to how long the broker waits before redelivering it.

Pure arithmetic, with no Celery import, so an application's configuration can refuse a bad
pair of settings at start as cheaply as ``journal.durable.at_least_once_settings`` does when it
builds Celery's settings: one rule, one place.
"""

from __future__ import annotations

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

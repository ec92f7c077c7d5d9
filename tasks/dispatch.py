"""Beat's weekly dispatcher: enqueue each Monday's digest exactly once, and catch up.

Beat may be down over a Monday, restarted, or (by mistake) run twice. The dispatcher runs
often and is idempotent: every scheduled occurrence since the last one dispatched (at most
``catch_up_weeks`` back) is enqueued once, guarded by a ``SET NX`` marker per run id, with the
Celery task id ``digest-<run>``. On a first deployment only the latest occurrence is sent,
so installing the app never mails a month of old digests.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from zoneinfo import ZoneInfo

import redis

from tasks.keys import DigestKeys, text
from tasks.schedule import run_ids_due

MARKER_TTL_S = 400 * 24 * 3600  # longer than any look-back, short enough to expire


def dispatch_due(
    client: redis.Redis,
    keys: DigestKeys,
    now: datetime,
    *,
    zone: str,
    catch_up_weeks: int,
    enqueue: Callable[[str], None],
) -> list[str]:
    """Enqueue every due, not yet dispatched run id, oldest first; returns those enqueued."""
    due = run_ids_due(now, ZoneInfo(zone), catch_up_weeks)
    raw = client.get(keys.dispatch_watermark)
    watermark = text(raw) if raw else None
    candidates = due[-1:] if watermark is None else [r for r in due if r > watermark]
    enqueued: list[str] = []
    for run_id in candidates:
        if client.set(keys.dispatched(run_id), now.isoformat(), nx=True, ex=MARKER_TTL_S):
            try:
                enqueue(run_id)
            except BaseException:
                # The broker did not take it: drop the marker so the next dispatch tries again,
                # or this week's digest would never be sent.
                client.delete(keys.dispatched(run_id))
                raise
            enqueued.append(run_id)
    if candidates:
        # Markers already make every enqueue unique; the watermark only bounds the catch-up,
        # so a race between two dispatchers setting the same value is harmless.
        client.set(keys.dispatch_watermark, candidates[-1])
    return enqueued

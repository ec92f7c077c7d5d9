"""Beat's weekly dispatcher: enqueue each Monday's digest exactly once, and catch up.

Beat may be down over a Monday, restarted, or (by mistake) run twice. The dispatcher runs
often and is idempotent: every scheduled occurrence since the last one dispatched (at most
``catch_up_weeks`` back) is enqueued once, guarded by a ``SET NX`` marker per run id, with the
Celery task id ``digest-<run>``. On a first deployment only the latest occurrence is sent,
so installing the app never mails a month of old digests.

The marker is taken in two steps so a crash between it and the publish cannot lose a week: a
short *claim* naming the dispatcher's process (``CLAIM_TTL_S``), the publish, then the
long-lived marker. A dispatcher that died holding a claim is proved gone on its host
(``journal.holder``) and its claim taken over at once; anywhere else the claim expires within
a minute and the hourly catch-up dispatches the week. A publish that happens twice (a claim
taken over from a dispatcher that had published but not yet marked) is two deliveries of one
run: the run's journal and lease make that one email.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from zoneinfo import ZoneInfo

from journal.holder import ProcessIdentity
from journal.scripts import Client
from tasks.faults import before_publishing
from tasks.keys import DigestKeys, text
from tasks.schedule import Schedule, run_ids_due

MARKER_TTL_S = 400 * 24 * 3600  # longer than any look-back, short enough to expire
CLAIM_TTL_S = 60  # a publish takes milliseconds; well inside the hourly catch-up
CLAIM = "claimed by "


def dispatch_due(
    client: Client,
    keys: DigestKeys,
    now: datetime,
    *,
    zone: str,
    catch_up_weeks: int,
    schedule: Schedule | None = None,
    enqueue: Callable[[str], None],
) -> list[str]:
    """Enqueue every due, not yet dispatched run id, oldest first; returns those enqueued."""
    due = run_ids_due(now, ZoneInfo(zone), catch_up_weeks, schedule)
    raw = client.get(keys.dispatch_watermark)
    watermark = text(raw) if raw else None
    candidates = due[-1:] if watermark is None else [r for r in due if r > watermark]
    enqueued: list[str] = []
    for run_id in candidates:
        marker = keys.dispatched(run_id)
        if _claim(client, marker):
            before_publishing()
            try:
                enqueue(run_id)
            except BaseException:
                # The broker did not take it: drop the claim so the next dispatch tries again,
                # or this week's digest would never be sent.
                client.delete(marker)
                raise
            client.set(marker, now.isoformat(), ex=MARKER_TTL_S)
            enqueued.append(run_id)
    if candidates:
        # Markers already make every enqueue unique; the watermark only bounds the catch-up,
        # so a race between two dispatchers setting the same value is harmless.
        client.set(keys.dispatch_watermark, candidates[-1])
    return enqueued


def _claim(client: Client, marker: str) -> bool:
    """Claim the right to publish one run id: free, or held by a provably dead dispatcher."""
    claim = CLAIM + ProcessIdentity.current().encode()
    if client.set(marker, claim, nx=True, ex=CLAIM_TTL_S):
        return True
    held = client.get(marker)
    if held is None or not text(held).startswith(CLAIM):
        return False  # published already
    claimant = ProcessIdentity.decode(text(held).removeprefix(CLAIM))
    if claimant is None or not claimant.provably_gone():
        return False  # a live dispatcher is publishing it now, or its claim will expire
    return bool(client.set(marker, claim, xx=True, ex=CLAIM_TTL_S))

"""Beat's weekly dispatcher: enqueue each Monday's digest exactly once, and catch up.

Beat may be down over a Monday, restarted, or (by mistake) run twice. The dispatcher runs
often and is idempotent: every scheduled occurrence since the last one dispatched (at most
``catch_up_weeks`` back) is enqueued once, guarded by a ``SET NX`` marker per run id, with the
Celery task id ``digest-<run>``. On a first deployment only the latest occurrence is sent,
so installing the app never mails a month of old digests; its watermark is written before that
week is claimed, so a first dispatch that dies does not make the next one a first deployment.

The marker is taken in two steps so a crash between it and the publish cannot lose a week: a
short *claim* naming the dispatcher's process (``CLAIM_TTL_S``), the publish, then the
long-lived marker. A dispatcher that died holding a claim is proved gone on its host
(``journal._holder``) and its claim taken over at once; anywhere else the claim expires within
a minute and the hourly catch-up dispatches the week. The watermark (where the next dispatch
starts looking) moves only over weeks already published, so a week claimed elsewhere is
looked at again by every dispatch until it is. A publish that happens twice (a claim
taken over from a dispatcher that had published but not yet marked) is two deliveries of one
run: the run's journal and lease make that one email.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import Enum
from zoneinfo import ZoneInfo

from journal import Client, ProcessIdentity
from tasks.config.schedule import Schedule
from tasks.job.faults import before_publishing
from tasks.job.weeks import run_ids_due
from tasks.keys import DigestKeys, text

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
    """Enqueue every due, not yet dispatched run id, oldest first; returns those enqueued.

    The watermark moves only over weeks that are published, from the oldest on: a week that
    another dispatcher claimed and has not published (it may have died where its death cannot
    be proved) stops it there, so every later dispatch looks at that week again until it is
    published, by its claimant or, once the claim expires, by a later dispatch.
    """
    tz = ZoneInfo(zone)
    due = run_ids_due(now, tz, catch_up_weeks, schedule)
    raw = client.get(keys.dispatch_watermark)
    if raw is None:
        # A first deployment sends only the latest week: as if the one before had been
        # dispatched. Written before anything is claimed, so a first dispatch that dies before
        # publishing leaves a watermark that makes the next dispatch look at its week again.
        first = run_ids_due(now, tz, 1, schedule)[0]
        client.set(keys.dispatch_watermark, first, nx=True)
        raw = client.get(keys.dispatch_watermark) or first  # another first dispatch's, if it won
    watermark = text(raw)
    enqueued: list[str] = []
    published, gap = watermark, False
    for run_id in (r for r in due if r > watermark):
        marker = keys.dispatched(run_id)
        held = _claim(client, marker)
        if held is Held.OURS:
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
        gap = gap or held is Held.ELSEWHERE
        if not gap:
            published = run_id  # this week and every one before it are published
    if published != watermark:
        # Two dispatchers may race here. Either value is a week up to which every week is
        # published; the lower one only makes the next dispatch look at a few again.
        client.set(keys.dispatch_watermark, published)
    return enqueued


class Held(Enum):
    """Who holds a week's marker, as one dispatch found it."""

    OURS = "claimed by this dispatch, to publish now"
    PUBLISHED = "published already"
    ELSEWHERE = "claimed by a dispatcher that may still publish it, or let go a moment ago"


def _claim(client: Client, marker: str) -> Held:
    """Claim the right to publish one run id: free, or held by a provably dead dispatcher."""
    claim = CLAIM + ProcessIdentity.current().encode()
    if client.set(marker, claim, nx=True, ex=CLAIM_TTL_S):
        return Held.OURS
    held = client.get(marker)
    if held is None:
        return Held.ELSEWHERE  # the claim expired or was dropped since the SET: look again
    if not text(held).startswith(CLAIM):
        return Held.PUBLISHED
    claimant = ProcessIdentity.decode(text(held).removeprefix(CLAIM))
    if claimant is None or not claimant.provably_gone():
        return Held.ELSEWHERE  # a live dispatcher is publishing it now, or its claim will expire
    if client.set(marker, claim, xx=True, ex=CLAIM_TTL_S):
        return Held.OURS
    return Held.ELSEWHERE

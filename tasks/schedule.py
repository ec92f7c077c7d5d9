"""When digests are due, and the run id each one gets.

A digest goes out every Monday at 08:00 in the configured time zone. The beat dispatcher asks
for every occurrence in a lookback window rather than only the latest one, so a beat that was
down over a Monday catches up; an occurrence dispatched twice is harmless, because the run id
names the ISO week and a finished run is not repeated.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

SEND_WEEKDAY = 0  # Monday, as date.weekday() counts
SEND_TIME = time(8, 0)
# Every id ``iso_week_run_id`` gives, and nothing else: four digits of year, two of week.
_WEEK_ID = re.compile(r"\d{4}-w\d{2}")


def iso_week_run_id(moment: datetime) -> str:
    """The run id of the ISO week ``moment`` falls in, e.g. ``2026-w42``.

    The ISO year is used, not the calendar year, so the days around New Year keep the id of
    the week they belong to (2027-01-01 is in ``2026-w53``, 2024-12-30 in ``2025-w01``). The
    date is the one ``moment`` shows on its own clock: pass the occurrence in the schedule's
    time zone, not in UTC.
    """
    year, week, _ = moment.isocalendar()
    return f"{year}-w{week:02d}"


def is_week_id(run_id: str) -> bool:
    """Whether ``run_id`` has the form of a week's id (``2026-w43``): the schedule's to take."""
    return _WEEK_ID.fullmatch(run_id) is not None


def scheduled_occurrences(now: datetime, tz: ZoneInfo, lookback_weeks: int) -> list[datetime]:
    """The Monday 08:00 occurrences in ``tz`` up to ``now``, oldest first.

    Args:
        now: The current time; must carry a time zone so it names one instant.
        tz: The zone whose Monday 08:00 is meant, so the send time follows its daylight saving.
        lookback_weeks: How many weeks before the latest occurrence to include as well; 0
            gives only the latest.

    Returns:
        ``lookback_weeks + 1`` aware datetimes in ``tz``.

    Raises:
        ValueError: ``now`` is naive or ``lookback_weeks`` is negative.
    """
    if now.utcoffset() is None:
        raise ValueError(f"now must carry a time zone, got the naive {now.isoformat()}")
    if lookback_weeks < 0:
        raise ValueError(f"lookback_weeks must be 0 or more, got {lookback_weeks}")

    local_day = now.astimezone(tz).date()
    monday = local_day - timedelta(days=(local_day.weekday() - SEND_WEEKDAY) % 7)
    # Compare instants in UTC: aware datetimes sharing a tzinfo compare by wall clock, which
    # is wrong inside a daylight-saving fold.
    if _at_send_time(monday, tz).astimezone(UTC) > now.astimezone(UTC):
        monday -= timedelta(weeks=1)
    return [_at_send_time(monday - timedelta(weeks=k), tz) for k in range(lookback_weeks, -1, -1)]


def run_ids_due(now: datetime, tz: ZoneInfo, lookback_weeks: int) -> list[str]:
    """The run ids of :func:`scheduled_occurrences`, oldest first."""
    return [iso_week_run_id(moment) for moment in scheduled_occurrences(now, tz, lookback_weeks)]


def _at_send_time(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, SEND_TIME, tzinfo=tz)

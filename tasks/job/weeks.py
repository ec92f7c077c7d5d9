"""Which weekly runs are due: each ISO week's run id, and the occurrences a schedule had.

The run id names the ISO week (``2026-w42``), so every occurrence of one week names the same
run, and an occurrence dispatched twice is one run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from tasks.config.schedule import DEFAULT_SCHEDULE, WEEK_ID, Schedule

# How far back the latest occurrence is looked for: a yearly schedule (29 February) included.
_SEARCH_DAYS = 4 * 366


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
    return WEEK_ID.fullmatch(run_id) is not None


def scheduled_occurrences(
    now: datetime, tz: ZoneInfo, lookback_weeks: int, schedule: Schedule | None = None
) -> list[datetime]:
    """The schedule's occurrences in ``tz`` up to ``now``, oldest first.

    Args:
        now: The current time; must carry a time zone so it names one instant.
        tz: The zone whose wall clock the schedule means, so it follows its daylight saving.
        lookback_weeks: How many weeks before the latest occurrence to include as well; 0
            gives only the latest.
        schedule: ``DIGEST_SCHEDULE``, parsed; None for the default, Monday 08:00.

    Returns:
        Aware datetimes in ``tz``: for the weekly default, ``lookback_weeks + 1`` of them.

    Raises:
        ValueError: ``now`` is naive or ``lookback_weeks`` is negative.
    """
    if now.utcoffset() is None:
        raise ValueError(f"now must carry a time zone, got the naive {now.isoformat()}")
    if lookback_weeks < 0:
        raise ValueError(f"lookback_weeks must be 0 or more, got {lookback_weeks}")

    # Compare instants in UTC: aware datetimes sharing a tzinfo compare by wall clock, which
    # is wrong inside a daylight-saving fold.
    schedule = schedule or Schedule.parse(DEFAULT_SCHEDULE)
    instant = now.astimezone(UTC)
    today = now.astimezone(tz).date()
    latest = next(
        (
            moment
            for back in range(_SEARCH_DAYS)
            for moment in reversed(schedule.times_on(today - timedelta(days=back), tz))
            if moment.astimezone(UTC) <= instant
        ),
        None,
    )
    if latest is None:
        return []
    first = latest - timedelta(weeks=lookback_weeks)  # the same wall clock, weeks before
    days = (latest.date() - first.date()).days
    return [
        moment
        for offset in range(days + 1)
        for moment in schedule.times_on(first.date() + timedelta(days=offset), tz)
        if moment.replace(tzinfo=None) >= first.replace(tzinfo=None)
        and moment.astimezone(UTC) <= latest.astimezone(UTC)
    ]


def run_ids_due(
    now: datetime, tz: ZoneInfo, lookback_weeks: int, schedule: Schedule | None = None
) -> list[str]:
    """The run ids of :func:`scheduled_occurrences`, oldest first, each week once."""
    ids = [iso_week_run_id(m) for m in scheduled_occurrences(now, tz, lookback_weeks, schedule)]
    return list(dict.fromkeys(ids))

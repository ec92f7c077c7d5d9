"""When digests are due (``DIGEST_SCHEDULE``), and the run id each one gets.

By default a digest goes out every Monday at 08:00 in the configured time zone. The beat
dispatcher asks for every occurrence in a lookback window rather than only the latest one, so
a beat that was down when one fell catches up; an occurrence dispatched twice is harmless,
because the run id names the ISO week and a finished run is not repeated. A schedule with
several occurrences a week (a cron expression may say so) still sends one digest a week: every
occurrence of a week names the same run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

DEFAULT_SCHEDULE = "mon 08:00"
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_AND_TIME = re.compile(r"([a-z]{3})[a-z]*\s+(\d{1,2}):(\d{2})")
# How far back the latest occurrence is looked for: a yearly schedule (29 February) included.
_SEARCH_DAYS = 4 * 366


@dataclass(frozen=True)
class Schedule:
    """A parsed ``DIGEST_SCHEDULE``: the five fields of a cron expression, and their values.

    Attributes:
        fields: minute, hour, day of month, month, day of week, as cron writes them; Celery's
            beat entry is built from these very strings.
        minutes, hours, days, months: the values each field allows.
        weekdays: the days of the week allowed, Monday 0 as ``date.weekday()`` counts.
    """

    fields: tuple[str, str, str, str, str]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """A day and a time (``mon 08:00``, ``friday 17:30``) or a cron expression.

        The cron fields are read by Celery's own parser (``celery.schedules.crontab_parser``),
        the one its beat uses, so the dispatcher and beat agree on every occurrence. Imported
        here: only beat and the worker read the schedule, and the command line, which never
        does, would pay 0.1-0.2 s for Celery on every call.

        Raises:
            ValueError: ``text`` is neither, in one line saying what is expected.
        """
        from celery.schedules import ParseException, crontab_parser

        spoken = _DAY_AND_TIME.fullmatch(text.strip().lower())
        if spoken:
            day, hour, minute = spoken.group(1), int(spoken.group(2)), int(spoken.group(3))
            if day not in _DAYS or hour > 23 or minute > 59:
                raise ValueError(f"{text!r}: not a day and a time such as mon 08:00")
            fields = (str(minute), str(hour), "*", "*", day)
        else:
            parts = text.split()
            if len(parts) != 5:
                raise ValueError(
                    f"{text!r}: use a day and a time (mon 08:00) or a cron expression of five "
                    "fields (0 8 * * mon)"
                )
            fields = (parts[0], parts[1], parts[2], parts[3], parts[4])
        try:
            minutes = crontab_parser(60).parse(fields[0])
            hours = crontab_parser(24).parse(fields[1])
            days = crontab_parser(31, 1).parse(fields[2])
            months = crontab_parser(12, 1).parse(fields[3])
            cron_weekdays = crontab_parser(7).parse(fields[4])
        except (ParseException, ValueError) as bad:
            raise ValueError(f"{text!r}: not a cron expression Celery reads ({bad})") from None
        return cls(
            fields=fields,
            minutes=frozenset(minutes),
            hours=frozenset(hours),
            days=frozenset(days),
            months=frozenset(months),
            weekdays=frozenset((d - 1) % 7 for d in cron_weekdays),  # cron's 0 is Sunday
        )

    def on(self, day: date) -> bool:
        """Whether the schedule falls on ``day`` (cron's rule: either day field, if both set)."""
        by_date, by_weekday = day.day in self.days, day.weekday() in self.weekdays
        either = "*" not in (self.fields[2], self.fields[4])
        wanted = (by_date or by_weekday) if either else (by_date and by_weekday)
        return wanted and day.month in self.months

    def times_on(self, day: date, tz: ZoneInfo) -> list[datetime]:
        """The schedule's occurrences on ``day`` in ``tz``, earliest first."""
        if not self.on(day):
            return []
        return [
            datetime.combine(day, time(hour, minute), tzinfo=tz)
            for hour in sorted(self.hours)
            for minute in sorted(self.minutes)
        ]


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

"""When digests are due (``DIGEST_SCHEDULE``): a day and a time, or a cron expression.

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
_DAY_AND_TIME_SECONDS = re.compile(r"([a-z]{3})[a-z]*\s+(\d{1,2}):(\d{2})(?::(\d{2}))?")
# A week's run id (``2026-w42``): four digits of ISO year, two of ISO week.
WEEK_ID = re.compile(r"(\d{4})-w(\d{2})")


def week_monday(run_id: str) -> date | None:
    """The Monday of the ISO week a week's run id names; None for any other id.

    ``2025-w53`` has the form of a week's id but names no week (2025 has 52): None too.
    """
    found = WEEK_ID.fullmatch(run_id)
    if found is None:
        return None
    try:
        return date.fromisocalendar(int(found.group(1)), int(found.group(2)), 1)
    except ValueError:
        return None


@dataclass(frozen=True)
class Weekly:
    """A day of the week and a time of day, in a zone: ``DIGEST_DEGRADE_AT``'s ``mon 11:00``.

    Read like ``DIGEST_SCHEDULE``'s day-and-time form, seconds allowed (``mon 11:00:30``),
    so an operator writes the deadline the way they wrote the schedule.

    Attributes:
        weekday: Monday 0, as ``date.weekday()`` counts.
        at: the time of day.
    """

    weekday: int
    at: time

    @classmethod
    def parse(cls, text: str) -> Weekly:
        """``mon 11:00``, ``monday 11:00``, ``fri 17:30:15``.

        Raises:
            ValueError: anything else, or a day or time that does not exist.
        """
        found = _DAY_AND_TIME_SECONDS.fullmatch(text.strip().lower())
        if not found or found.group(1) not in _DAYS:
            raise ValueError(text)
        hour, minute, second = (int(found.group(n) or 0) for n in (2, 3, 4))
        if hour > 23 or minute > 59 or second > 59:
            raise ValueError(text)
        return cls(_DAYS.index(found.group(1)), time(hour, minute, second))

    def next_at(self, moment: datetime, tz: ZoneInfo) -> datetime:
        """The first occurrence at or after ``moment`` (aware), on ``tz``'s wall clock."""
        local = moment.astimezone(tz)
        day = local.date() + timedelta(days=(self.weekday - local.weekday()) % 7)
        found = datetime.combine(day, self.at, tzinfo=tz)
        if found.astimezone(UTC) < moment.astimezone(UTC):  # instants, not wall clocks
            found = datetime.combine(day + timedelta(days=7), self.at, tzinfo=tz)
        return found


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

    def first_in_week(self, monday: date, tz: ZoneInfo) -> datetime:
        """The week's first occurrence; its Monday's midnight for a week the schedule skips."""
        for day in (monday + timedelta(days=n) for n in range(7)):
            if found := self.times_on(day, tz):
                return found[0]
        return datetime.combine(monday, time(0), tzinfo=tz)

    def times_on(self, day: date, tz: ZoneInfo) -> list[datetime]:
        """The schedule's occurrences on ``day`` in ``tz``, earliest first."""
        if not self.on(day):
            return []
        return [
            datetime.combine(day, time(hour, minute), tzinfo=tz)
            for hour in sorted(self.hours)
            for minute in sorted(self.minutes)
        ]

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tasks.config.schedule import Schedule
from tasks.job.weeks import iso_week_run_id, run_ids_due, scheduled_occurrences

AUCKLAND = ZoneInfo("Pacific/Auckland")
LOS_ANGELES = ZoneInfo("America/Los_Angeles")


@pytest.mark.parametrize(
    ("moment", "run_id"),
    [
        (datetime(2026, 10, 12, 8, 0), "2026-w42"),
        (datetime(2026, 10, 18, 23, 59), "2026-w42"),
        (datetime(2027, 1, 1), "2026-w53"),
        (datetime(2024, 12, 30), "2025-w01"),
        (datetime(2026, 1, 5), "2026-w02"),
        (datetime(2021, 1, 3), "2020-w53"),
    ],
)
def test_the_run_id_is_the_iso_year_and_padded_week(moment: datetime, run_id: str) -> None:
    assert iso_week_run_id(moment) == run_id


def test_the_run_id_uses_the_wall_clock_date_of_the_moment() -> None:
    sunday_utc = datetime(2026, 10, 18, 19, 0, tzinfo=UTC)
    assert iso_week_run_id(sunday_utc) == "2026-w42"
    assert iso_week_run_id(sunday_utc.astimezone(AUCKLAND)) == "2026-w43"


def test_utc_occurrences_are_mondays_at_eight_oldest_first() -> None:
    now = datetime(2026, 10, 21, 12, 0, tzinfo=UTC)  # a Wednesday
    assert scheduled_occurrences(now, ZoneInfo("UTC"), 2) == [
        datetime(2026, 10, 5, 8, 0, tzinfo=ZoneInfo("UTC")),
        datetime(2026, 10, 12, 8, 0, tzinfo=ZoneInfo("UTC")),
        datetime(2026, 10, 19, 8, 0, tzinfo=ZoneInfo("UTC")),
    ]
    assert run_ids_due(now, ZoneInfo("UTC"), 2) == ["2026-w41", "2026-w42", "2026-w43"]


def test_lookback_zero_gives_only_the_latest_occurrence() -> None:
    now = datetime(2026, 10, 21, 12, 0, tzinfo=UTC)
    assert run_ids_due(now, ZoneInfo("UTC"), 0) == ["2026-w43"]


def test_an_occurrence_exactly_at_now_is_due_and_one_second_before_is_not() -> None:
    monday_eight = datetime(2026, 10, 19, 8, 0, tzinfo=UTC)
    assert run_ids_due(monday_eight, ZoneInfo("UTC"), 0) == ["2026-w43"]
    assert run_ids_due(monday_eight - timedelta(seconds=1), ZoneInfo("UTC"), 0) == ["2026-w42"]


def test_auckland_monday_eight_is_sunday_evening_utc() -> None:
    # 08:00 NZDT (+13) on Monday 19 October is 19:00 UTC on Sunday 18 October.
    assert run_ids_due(datetime(2026, 10, 18, 19, 0, tzinfo=UTC), AUCKLAND, 1) == [
        "2026-w42",
        "2026-w43",
    ]
    assert run_ids_due(datetime(2026, 10, 18, 18, 59, tzinfo=UTC), AUCKLAND, 1) == [
        "2026-w41",
        "2026-w42",
    ]
    latest = scheduled_occurrences(datetime(2026, 10, 18, 19, 0, tzinfo=UTC), AUCKLAND, 0)[0]
    assert latest.tzinfo is AUCKLAND
    assert latest.astimezone(UTC) == datetime(2026, 10, 18, 19, 0, tzinfo=UTC)


def test_los_angeles_keeps_eight_local_across_the_daylight_saving_change() -> None:
    # PDT ends on Sunday 1 November 2026: 08:00 moves from 15:00 UTC to 16:00 UTC.
    now = datetime(2026, 11, 9, 16, 0, tzinfo=UTC)
    occurrences = scheduled_occurrences(now, LOS_ANGELES, 3)
    assert [moment.astimezone(UTC) for moment in occurrences] == [
        datetime(2026, 10, 19, 15, 0, tzinfo=UTC),
        datetime(2026, 10, 26, 15, 0, tzinfo=UTC),
        datetime(2026, 11, 2, 16, 0, tzinfo=UTC),
        datetime(2026, 11, 9, 16, 0, tzinfo=UTC),
    ]
    assert all((m.weekday(), m.hour, m.minute) == (0, 8, 0) for m in occurrences)
    assert [iso_week_run_id(m) for m in occurrences] == [
        "2026-w43",
        "2026-w44",
        "2026-w45",
        "2026-w46",
    ]
    # One minute before 08:00 PST the latest occurrence is still the previous Monday.
    assert run_ids_due(datetime(2026, 11, 9, 15, 59, tzinfo=UTC), LOS_ANGELES, 0) == ["2026-w45"]


def test_now_in_any_zone_names_the_same_instant() -> None:
    # 04:00 in Tokyo (+9) on Monday 19 October is 08:00 in Auckland (+13) that day.
    tokyo = ZoneInfo("Asia/Tokyo")
    now = datetime(2026, 10, 19, 4, 0, tzinfo=tokyo)
    assert run_ids_due(now, AUCKLAND, 0) == ["2026-w43"]
    assert run_ids_due(now - timedelta(minutes=1), AUCKLAND, 0) == ["2026-w42"]
    assert run_ids_due(now.astimezone(AUCKLAND), AUCKLAND, 0) == ["2026-w43"]


def test_catching_up_across_new_year_uses_iso_years() -> None:
    now = datetime(2027, 1, 12, 9, 0, tzinfo=UTC)
    assert run_ids_due(now, ZoneInfo("UTC"), 3) == ["2026-w52", "2026-w53", "2027-w01", "2027-w02"]


def test_a_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="now must carry a time zone"):
        scheduled_occurrences(datetime(2026, 10, 19, 9, 0), ZoneInfo("UTC"), 0)


def test_a_negative_lookback_is_refused() -> None:
    with pytest.raises(ValueError, match="lookback_weeks must be 0 or more, got -1"):
        run_ids_due(datetime(2026, 10, 19, 9, 0, tzinfo=UTC), ZoneInfo("UTC"), -1)


def test_a_cron_schedule_with_several_occurrences_a_week_still_names_one_run_per_week() -> None:
    weekdays = Schedule.parse("0 8 * * 1-5")
    now = datetime(2026, 10, 21, 9, 0, tzinfo=UTC)  # a Wednesday
    assert [m.day for m in scheduled_occurrences(now, ZoneInfo("UTC"), 1, weekdays)] == [
        14,
        15,
        16,
        19,
        20,
        21,
    ]
    assert run_ids_due(now, ZoneInfo("UTC"), 1, weekdays) == ["2026-w42", "2026-w43"]
    assert Schedule.parse("monday 8:00").fields == ("0", "8", "*", "*", "mon")


@pytest.mark.parametrize("text", ["every monday", "mon 25:00", "0 8 * *", "61 8 * * mon"])
def test_a_schedule_neither_a_day_and_time_nor_cron_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        Schedule.parse(text)

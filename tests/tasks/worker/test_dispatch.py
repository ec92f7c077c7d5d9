"""Beat's weekly dispatcher on real Redis: each Monday's digest enqueued once, outages caught up."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
import redis

from tasks.keys import DigestKeys
from tasks.worker.dispatch import dispatch_due

W40_MONDAY = datetime(2026, 9, 28, 8, 0, tzinfo=UTC)
W42_WEDNESDAY = datetime(2026, 10, 14, 12, 0, tzinfo=UTC)
W43_TUESDAY = datetime(2026, 10, 20, 12, 0, tzinfo=UTC)


class Queue:
    """The enqueue callback: what a dispatcher handed to Celery, in order."""

    def __init__(self) -> None:
        self.run_ids: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, run_id: str) -> None:
        with self._lock:
            self.run_ids.append(run_id)


def dispatch(
    client: redis.Redis, keys: DigestKeys, now: datetime, queue: Queue, zone: str = "UTC"
) -> list[str]:
    return dispatch_due(client, keys, now, zone=zone, catch_up_weeks=4, enqueue=queue)


@pytest.fixture
def keys(prefix: str) -> DigestKeys:
    return DigestKeys(prefix)


def test_a_first_deployment_enqueues_only_the_latest_week(
    real_redis: redis.Redis, keys: DigestKeys
) -> None:
    queue = Queue()
    assert dispatch(real_redis, keys, W42_WEDNESDAY, queue) == ["2026-w42"]
    assert queue.run_ids == ["2026-w42"]
    assert real_redis.get(keys.dispatch_watermark) == b"2026-w42"


def test_dispatching_again_enqueues_nothing_more(real_redis: redis.Redis, keys: DigestKeys) -> None:
    queue = Queue()
    dispatch(real_redis, keys, W42_WEDNESDAY, queue)
    assert dispatch(real_redis, keys, W42_WEDNESDAY, queue) == []
    before_next_send = datetime(2026, 10, 19, 7, 59, 59, tzinfo=UTC)
    assert dispatch(real_redis, keys, before_next_send, queue) == []
    assert queue.run_ids == ["2026-w42"]
    assert dispatch(real_redis, keys, datetime(2026, 10, 19, 8, 0, tzinfo=UTC), queue) == [
        "2026-w43"
    ]


def test_after_a_two_week_outage_the_missed_weeks_are_enqueued_once_oldest_first(
    real_redis: redis.Redis, keys: DigestKeys
) -> None:
    queue = Queue()
    assert dispatch(real_redis, keys, W40_MONDAY, queue) == ["2026-w40"]
    assert dispatch(real_redis, keys, W43_TUESDAY, queue) == ["2026-w41", "2026-w42", "2026-w43"]
    assert dispatch(real_redis, keys, W43_TUESDAY, queue) == []
    assert queue.run_ids == ["2026-w40", "2026-w41", "2026-w42", "2026-w43"]
    assert real_redis.get(keys.dispatch_watermark) == b"2026-w43"


def race(client: redis.Redis, keys: DigestKeys, now: datetime, dispatchers: int) -> Queue:
    """Start ``dispatchers`` threads at one barrier, each dispatching with its own connection."""
    queue = Queue()
    barrier = threading.Barrier(dispatchers)

    def dispatcher() -> None:
        own = redis.Redis(connection_pool=client.connection_pool)
        barrier.wait(timeout=10)
        dispatch(own, keys, now, queue)

    threads = [threading.Thread(target=dispatcher) for _ in range(dispatchers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return queue


def test_racing_dispatchers_enqueue_each_run_once(real_redis: redis.Redis, prefix: str) -> None:
    for round_number in range(5):
        first = DigestKeys(f"{prefix}:first{round_number}")
        assert race(real_redis, first, W42_WEDNESDAY, 8).run_ids == ["2026-w42"]
        caught_up = DigestKeys(f"{prefix}:outage{round_number}")
        dispatch(real_redis, caught_up, W40_MONDAY, Queue())
        queue = race(real_redis, caught_up, W43_TUESDAY, 8)
        assert sorted(queue.run_ids) == ["2026-w41", "2026-w42", "2026-w43"]


def test_a_week_whose_enqueue_failed_is_enqueued_by_the_next_dispatch(
    real_redis: redis.Redis, keys: DigestKeys
) -> None:
    dispatch(real_redis, keys, W40_MONDAY, Queue())
    delivered = Queue()

    def broker_down_for_w42(run_id: str) -> None:
        if run_id == "2026-w42":
            raise ConnectionError("broker unreachable")
        delivered(run_id)

    with pytest.raises(ConnectionError):
        dispatch_due(
            real_redis,
            keys,
            W43_TUESDAY,
            zone="UTC",
            catch_up_weeks=4,
            enqueue=broker_down_for_w42,
        )
    assert dispatch(real_redis, keys, W43_TUESDAY, delivered) == ["2026-w42", "2026-w43"]
    assert delivered.run_ids == ["2026-w41", "2026-w42", "2026-w43"]


def test_a_first_deployments_first_week_outlives_its_dispatch_dying(
    real_redis: redis.Redis, keys: DigestKeys
) -> None:
    """Found by the fault campaign (seed 1, first-dispatch): the first dispatch ever claimed
    its week and died before publishing; a week later the next one, finding no watermark,
    took itself for a first deployment too and sent only its own week."""

    def died_before_publishing(run_id: str) -> None:
        raise KeyboardInterrupt  # gone mid-dispatch; its claim is dropped or expires

    with pytest.raises(KeyboardInterrupt):
        dispatch_due(
            real_redis,
            keys,
            W42_WEDNESDAY,
            zone="UTC",
            catch_up_weeks=4,
            enqueue=died_before_publishing,
        )
    queue = Queue()
    assert dispatch(real_redis, keys, W43_TUESDAY, queue) == ["2026-w42", "2026-w43"]
    assert real_redis.get(keys.dispatch_watermark) == b"2026-w43"


@pytest.mark.parametrize(
    ("now", "run_id"),
    [
        (datetime(2027, 1, 4, 8, 0, tzinfo=UTC), "2027-w01"),
        (datetime(2027, 1, 4, 7, 59, 59, tzinfo=UTC), "2026-w53"),
        (datetime(2026, 12, 28, 8, 0, tzinfo=UTC), "2026-w53"),
        (datetime(2027, 1, 1, 12, 0, tzinfo=UTC), "2026-w53"),
    ],
)
def test_run_ids_at_the_year_edge_follow_the_iso_week(
    real_redis: redis.Redis, keys: DigestKeys, now: datetime, run_id: str
) -> None:
    assert dispatch(real_redis, keys, now, Queue()) == [run_id]


def test_the_year_edge_hands_over_from_w53_to_w01(
    real_redis: redis.Redis, keys: DigestKeys
) -> None:
    queue = Queue()
    dispatch(real_redis, keys, datetime(2026, 12, 28, 9, 0, tzinfo=UTC), queue)
    dispatch(real_redis, keys, datetime(2027, 1, 4, 9, 0, tzinfo=UTC), queue)
    assert queue.run_ids == ["2026-w53", "2027-w01"]


def test_a_zone_ahead_of_utc_sends_on_its_own_monday(real_redis: redis.Redis, prefix: str) -> None:
    # Monday 2026-10-12 08:00 in Auckland (NZDT, UTC+13) is Sunday 19:00 UTC.
    sunday_evening_utc = datetime(2026, 10, 11, 19, 0, tzinfo=UTC)
    assert sunday_evening_utc.weekday() == 6
    one_second_before = datetime(2026, 10, 11, 18, 59, 59, tzinfo=UTC)
    zone = "Pacific/Auckland"
    assert dispatch(real_redis, DigestKeys(f"{prefix}:nz1"), sunday_evening_utc, Queue(), zone) == [
        "2026-w42"
    ]
    assert dispatch(real_redis, DigestKeys(f"{prefix}:nz2"), one_second_before, Queue(), zone) == [
        "2026-w41"
    ]
    assert dispatch(real_redis, DigestKeys(f"{prefix}:utc"), sunday_evening_utc, Queue()) == [
        "2026-w41"
    ]

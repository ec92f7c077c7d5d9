"""``Settings(wait_replicas=N)``: what each record sends and checks, and the refusal at start.

Records that reach a replica, and a failover that keeps them, are in ``test_failover.py`` on a
real cluster; these need no replica.
"""

from __future__ import annotations

import fakeredis
import pytest
import redis

from journal import Journal, Keyspace, Settings
from journal._redis.backend import NO_WAIT, RecordWait
from journal.errors import StoreUnsupported


def test_each_setting_sends_its_waits_after_the_record_in_order() -> None:
    assert not NO_WAIT.waits and NO_WAIT.commands() == []
    assert RecordWait(replicas=2).commands() == [("WAIT", 2, 1000)]
    assert RecordWait(local_fsync=True).commands() == [("WAITAOF", 1, 0, 1000)]
    both = RecordWait(replicas=1, local_fsync=True, timeout_ms=50)
    assert both.commands() == [("WAIT", 1, 50), ("WAITAOF", 1, 0, 50)]
    assert Settings(wait_replicas=1, fsync_records=True).record_wait == RecordWait(1, True)


def test_a_record_is_trusted_only_when_every_wait_confirmed_it() -> None:
    both = RecordWait(replicas=2, local_fsync=True)
    assert both.shortfall([2, [1, 0]]) is None
    assert both.shortfall([3, [1, 2]]) is None
    assert both.shortfall([1, [1, 0]]) == "1 of 2 replicas acknowledged it"
    assert both.shortfall([2, [0, 0]]) == "[0, 0]"
    refused = redis.ResponseError("ERR WAIT cannot be used with replica instances")
    assert RecordWait(replicas=1).shortfall([refused]) == repr(refused)


def test_a_negative_replica_count_is_refused() -> None:
    with pytest.raises(ValueError, match="wait_replicas"):
        Settings(wait_replicas=-1)


def test_a_master_without_enough_replicas_is_refused_at_start(
    real_redis: redis.Redis, prefix: str
) -> None:
    with pytest.raises(StoreUnsupported) as caught:
        Journal(real_redis, Keyspace(prefix), Settings(wait_replicas=1), url="redis://store")
    assert caught.value.url == "redis://store"
    assert caught.value.detail.startswith("wait_replicas=1 but the master at ")
    assert caught.value.detail.endswith(
        " has 0 connected replica(s): every record would wait out its timeout"
    )


def test_a_server_that_cannot_count_its_replicas_is_refused_with_its_own_words() -> None:
    with pytest.raises(StoreUnsupported) as caught:
        Journal(fakeredis.FakeRedis(), Keyspace("j"), Settings(wait_replicas=1), url="redis://x")
    assert caught.value.detail.startswith(
        "wait_replicas needs INFO replication to count replicas: unknown command 'info'"
    )

"""The suite's round-trip counter counts what it is shown, or fails: never a partial count.

Every round-trip test rests on ``round_trips``: a count cut short by a dead watcher would let a
regression pass, or turn a target the code misses into a pass.
"""

from __future__ import annotations

import time

import pytest
import redis

from tests.support import round_trips


def test_the_counter_counts_through_a_silence_longer_than_the_clients_read_timeout(
    own_redis_url: str,
) -> None:
    # A worker starting up says nothing for seconds; the watcher must not time out meanwhile.
    client = redis.Redis.from_url(own_redis_url, socket_timeout=0.2)

    def quiet_then_one_command() -> None:
        time.sleep(0.6)
        client.ping()

    try:
        assert round_trips(client, quiet_then_one_command) == ["PING"]
    finally:
        client.close()


def test_the_counter_fails_when_its_watcher_dies(own_redis_url: str) -> None:
    client = redis.Redis.from_url(own_redis_url)

    def kill_the_watcher() -> None:
        (watcher,) = [entry for entry in client.client_list() if entry.get("cmd") == "monitor"]
        client.client_kill_filter(_id=watcher["id"])
        client.ping()

    try:
        with pytest.raises(AssertionError, match="MONITOR"):
            round_trips(client, kill_the_watcher)
    finally:
        client.close()

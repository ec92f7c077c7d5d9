"""The scripts' direct path down a pooled connection: released, retried, and EVAL on NOSCRIPT.

``journal._redis.scripts.evalsha`` skips redis-py's command wrapper on a one-server client, so what
that wrapper did for every command must still hold: the connection goes back to the pool
whatever the reply, a connection the server dropped is replaced, a reply that times out is sent
again under the client's retry policy, and an error reply reaches the caller as redis-py's typed
exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from journal._redis.scripts import Script, evalsha

ECHO = "return {KEYS[1], ARGV[1]}"
FAIL = "return redis.error_reply('ERR refused on purpose')"


def single(url: str, **options: object) -> redis.Redis:
    """A client of one pooled connection: a call that kept it would starve the next, and the
    connection the server drops is the one the next call uses."""
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=1, timeout=0.5, **options)
    return redis.Redis(connection_pool=pool)


@pytest.fixture
def one_connection(own_redis_url: str) -> Iterator[redis.Redis]:
    client = single(own_redis_url)
    yield client
    client.close()


def test_every_call_gives_its_connection_back(one_connection: redis.Redis) -> None:
    script = Script(one_connection, ECHO)
    for i in range(5):
        assert script(keys=[f"k{i}"], args=["v"]) == [f"k{i}".encode(), b"v"]
    with pytest.raises(redis.ResponseError, match="refused on purpose"):
        Script(one_connection, FAIL)()
    assert script(keys=["after"], args=["an error"]) == [b"after", b"an error"]


def test_an_unknown_script_raises_noscript_and_the_script_sends_its_source(
    one_connection: redis.Redis,
) -> None:
    script = Script(one_connection, ECHO + " -- " + "unknown")
    one_connection.script_flush()
    with pytest.raises(redis.exceptions.NoScriptError):
        evalsha(one_connection, script.sha, ["k"], ["v"])
    assert script(keys=["k"], args=["v"]) == [b"k", b"v"]  # EVAL, which caches it
    assert evalsha(one_connection, script.sha, ["k"], ["w"]) == [b"k", b"w"]


def drop(client: redis.Redis, admin: redis.Redis) -> None:
    """The server closes ``client``'s connection, as a restart or a proxy's idle cut would."""
    assert admin.client_kill_filter(_id=str(client.client_id())) == 1


def test_a_connection_the_server_dropped_is_replaced(
    own_redis_url: str,
) -> None:
    client, admin = single(own_redis_url), redis.Redis.from_url(own_redis_url)
    script = Script(client, ECHO)
    try:
        assert script(keys=["k"], args=["before"]) == [b"k", b"before"]
        drop(client, admin)
        assert script(keys=["k"], args=["after"]) == [b"k", b"after"]
    finally:
        client.close()
        admin.close()


@contextmanager
def paused_server(url: str, retry: redis.retry.Retry) -> Iterator[Script]:
    """A script whose client waits 0.1 s per reply, sent once, then the server held 0.3 s."""
    client, admin = single(url, retry=retry, socket_timeout=0.1), redis.Redis.from_url(url)
    script = Script(client, ECHO)
    try:
        script(keys=["k"], args=["before"])
        admin.client_pause(300, all=True)
        yield script
    finally:
        admin.client_unpause()
        client.close()
        admin.close()


def test_a_reply_that_times_out_is_sent_again_under_the_retry_policy(
    own_redis_url: str,
) -> None:
    retry = redis.retry.Retry(redis.backoff.ConstantBackoff(0.1), 8)
    with paused_server(own_redis_url, retry) as script:
        assert script(keys=["k"], args=["after"]) == [b"k", b"after"]


def test_without_retries_the_timeout_reaches_the_caller(own_redis_url: str) -> None:
    with (
        paused_server(own_redis_url, redis.retry.Retry(redis.backoff.NoBackoff(), 0)) as script,
        pytest.raises(redis.TimeoutError),
    ):
        script(keys=["k"], args=["after"])

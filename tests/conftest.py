"""Shared fixtures: an isolated journal on real Redis (own DB, own prefix) and on fakeredis."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
import redis

from journal import Journal, Keyspace, Settings

pytest_plugins = ["tests.fakes.anthropic_server", "tests.fakes.gated"]

# The machine's shared Redis: never flushed; every test uses its own prefix on this DB.
SHARED_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")


def _drop_prefix(client: redis.Redis, prefix: str) -> None:
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def real_redis(prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(SHARED_REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.fail(f"the test Redis at {SHARED_REDIS_URL} is not running")
    yield client
    _drop_prefix(client, prefix)
    client.close()


@pytest.fixture(params=["redis", "fakeredis"])
def store(request: pytest.FixtureRequest, prefix: str) -> Iterator[redis.Redis]:
    """The contract suite's backend: every journal test runs on both."""
    if request.param == "redis":
        yield request.getfixturevalue("real_redis")
    else:
        yield fakeredis.FakeRedis(server=fakeredis.FakeServer())


@pytest.fixture
def make_journal(store: redis.Redis, prefix: str):  # type: ignore[no-untyped-def]
    def make(**settings: object) -> Journal:
        clock = settings.pop("clock", None)
        kwargs = {"clock": clock} if clock is not None else {}
        return Journal(
            store,
            keyspace=Keyspace(prefix),
            settings=Settings(**settings),
            **kwargs,  # type: ignore[arg-type]
        )

    return make


@pytest.fixture
def deployment(tmp_path):  # type: ignore[no-untyped-def]
    """An isolated deployment (own embedded server, own prefix), torn down after the test."""
    from tests.support import Deployment

    deployed = Deployment(tmp_path / "state")
    yield deployed
    deployed.close()


@pytest.fixture
def throwaway_valkeys(tmp_path):  # type: ignore[no-untyped-def]
    """Valkey servers configured by the test, killed after it."""
    from tests.support import ThrowawayValkeys

    servers = ThrowawayValkeys(tmp_path)
    yield servers
    servers.close()

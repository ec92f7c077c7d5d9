"""check_persistence reads what the store keeps, warns once per lost guarantee and refuses
an evicting store."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from journal.contrib.checks import Persistence, check_persistence, wait_for_local_fsync
from journal.contrib.embedded import embedded_url, stop_embedded
from journal.errors import StoreEvicts
from tests.support import ThrowawayValkeys

StartServer = Callable[..., redis.Redis]


@pytest.fixture
def throwaway(throwaway_valkeys: ThrowawayValkeys) -> StartServer:
    """Start Valkey servers with given options, each on its own socket; killed after."""

    def start(*options: str) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(throwaway_valkeys.start(*options)))

    return start


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[redis.Redis]:
    state = tmp_path / "state"
    yield redis.Redis.from_url(embedded_url(state))
    stop_embedded(state)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.slow
def test_embedded_server_is_durable_and_quiet(
    embedded: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    found = check_persistence(embedded)

    version = embedded.info("server")["valkey_version"]
    assert found == Persistence(
        appendonly=True,
        appendfsync="always",
        maxmemory_policy="noeviction",
        supports_waitaof=True,
        server=f"valkey {version}",
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert warnings_of(caplog) == []
    embedded.set("k", "v")
    assert wait_for_local_fsync(embedded) == 1


@pytest.mark.slow
def test_appendonly_off_is_one_warning_naming_the_loss_and_the_fix(
    throwaway: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = throwaway("--appendonly", "no")

    found = check_persistence(client)

    assert found.appendonly is False
    assert found.appendfsync == "everysec"
    assert found.maxmemory_policy == "noeviction"
    assert found.supports_waitaof is True
    [warning] = warnings_of(caplog)
    assert "appendonly off" in warning
    assert "paid for again" in warning
    assert "re-sent" in warning
    assert "`appendonly yes` and `appendfsync always`" in warning
    assert "WAITAOF" in warning
    assert client.connection_pool.connection_kwargs["path"] in warning
    # Nothing to wait for without an append-only file: the server says so.
    with pytest.raises(redis.ResponseError, match="appendonly is disabled"):
        wait_for_local_fsync(client)


@pytest.mark.slow
def test_an_evicting_policy_is_refused_and_info_tells_it_too(throwaway: StartServer) -> None:
    client = throwaway("--appendonly", "yes", "--maxmemory-policy", "allkeys-lru")
    with pytest.raises(StoreEvicts, match=r"has maxmemory-policy allkeys-lru: .*noeviction"):
        check_persistence(client)
    hidden = throwaway("--maxmemory-policy", "volatile-lru", "--rename-command", "CONFIG", "")
    with pytest.raises(StoreEvicts, match="maxmemory-policy volatile-lru"):
        check_persistence(hidden)  # read from INFO when CONFIG is disabled


@pytest.mark.slow
def test_disabled_config_falls_back_to_info(
    throwaway: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = throwaway("--appendonly", "no", "--rename-command", "CONFIG", "")
    with pytest.raises(redis.ResponseError):
        client.config_get("appendonly")

    found = check_persistence(client)

    assert found.appendonly is False
    assert found.appendfsync == "unknown"
    assert found.maxmemory_policy == "noeviction"
    assert found.server.startswith("valkey ")
    assert len(warnings_of(caplog)) == 1
    assert "appendonly off" in warnings_of(caplog)[0]


def test_server_that_refuses_config_and_info_is_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # fakeredis implements neither CONFIG, INFO nor WAITAOF.
    found = check_persistence(fakeredis.FakeRedis())

    assert found == Persistence(
        appendonly=None,
        appendfsync="unknown",
        maxmemory_policy="unknown",
        supports_waitaof=False,
        server="unknown",
    )
    [warning] = warnings_of(caplog)
    assert "durability is unknown" in warning
    assert "`maxmemory-policy noeviction`" in warning

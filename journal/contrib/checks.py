"""What the journal's server promises to keep, and how far its clock is, read once at start.

The journal is only as durable as Redis is. A step recorded in memory but not yet in the
append-only file disappears when Redis restarts, and the run then does that step again:
a model call is paid for twice, an email goes out twice unless the mail side has its own
idempotency key. :func:`check_persistence` reads the settings that decide this and says,
once and plainly, which guarantee a misconfigured server loses. A server that evicts keys
when its memory fills (any ``maxmemory-policy`` but ``noeviction``) is refused outright: it
would delete leases, records and markers without a word, so no warning could make it safe.

``appendfsync everysec`` is a fair trade when each recorded step is followed by
:func:`wait_for_local_fsync` (``WAITAOF``, Redis 7.2 and later, every Valkey); ``appendfsync
always`` needs nothing more. ``appendfsync no`` survives a Redis crash but not an OS crash;
that is not warned about, as it is a deliberate choice rather than a forgotten default.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

from journal._clock import Clock
from journal._redis.scripts import Client
from journal.errors import ClockSkewed, StoreEvicts

__all__ = ["MAX_SKEW_S", "Persistence", "check_persistence", "check_skew", "wait_for_local_fsync"]

UNKNOWN = "unknown"

_LOG = logging.getLogger(__name__)

_SAFE_AOF = (
    "`appendonly yes` and `appendfsync always` (or `appendfsync everysec` and WAITAOF after "
    "each recorded step)"
)


@dataclass(frozen=True)
class Persistence:
    """The journal store's persistence settings, as far as the server would tell.

    Attributes:
        appendonly: Whether the append-only file is on; None when the server would not say
            (CONFIG and INFO both refused), which callers should treat as off.
        appendfsync: ``always``, ``everysec``, ``no``, or ``unknown``.
        maxmemory_policy: ``noeviction`` (the only safe one), another policy, or ``unknown``.
        supports_waitaof: Whether the server accepts ``WAITAOF``.
        server: Product and version, e.g. ``valkey 9.1.2`` or ``redis 7.0.15``, or ``unknown``.
    """

    appendonly: bool | None
    appendfsync: str
    maxmemory_policy: str
    supports_waitaof: bool
    server: str


def check_persistence(client: Client, *, logger: logging.Logger | None = None) -> Persistence:
    """Read the store's persistence settings: refuse an evicting one, warn about the rest.

    Reads CONFIG GET first; managed services often disable CONFIG, so INFO is the fallback,
    and a server that refuses both is reported as unknown rather than failing the start.
    Connection errors are not caught: an unreachable store is the caller's error to report.
    On a Redis Cluster every master is read and warned about; the first one's settings are
    returned.

    Args:
        client: A client for the journal store.
        logger: Where warnings go; this module's logger by default.

    Returns:
        The settings found.

    Raises:
        StoreEvicts: a ``maxmemory-policy`` other than ``noeviction``. A policy the server
            would not tell is warned about instead.
    """
    if isinstance(client, redis.RedisCluster):
        masters = [client.get_redis_connection(node) for node in client.get_primaries()]  # type: ignore[no-untyped-call]
        checked = [check_persistence(master, logger=logger) for master in masters]  # all warn
        return checked[0]
    log = logger or _LOG
    found = _from_config(client) or _from_info(client)
    appendonly, appendfsync, policy = found or (None, UNKNOWN, UNKNOWN)
    persistence = Persistence(
        appendonly=appendonly,
        appendfsync=appendfsync,
        maxmemory_policy=policy,
        supports_waitaof=_supports_waitaof(client),
        server=_server(client),
    )
    address = _address(client)
    if persistence.server != UNKNOWN:
        address += f" ({persistence.server})"
    if policy not in (UNKNOWN, "noeviction"):
        raise StoreEvicts(address, policy)
    where = f"the journal store at {address}"
    if appendonly is None:
        log.warning(
            "%s refused CONFIG GET and INFO, so its durability is unknown: if it runs without "
            "an append-only file, a recorded step can vanish when it restarts; make sure it "
            "runs with %s, and `maxmemory-policy noeviction`",
            where,
            _SAFE_AOF,
        )
    elif not appendonly:
        log.warning(
            "%s has appendonly off: a recorded step can vanish if it restarts, so a finished "
            "model call may be paid for again and a sent email re-sent unless the mail side "
            "has its own idempotency key; set %s in its configuration",
            where,
            _SAFE_AOF,
        )
    return persistence


def wait_for_local_fsync(client: redis.Redis, timeout_ms: int = 1000) -> int:
    """Block until this connection's writes are in the server's append-only file on disk.

    Needed after a recorded step only with ``appendfsync everysec``; with ``always`` it
    returns at once. The caller decides what a zero means (not confirmed within
    ``timeout_ms``): retry, fail the step, or accept the risk.

    Args:
        client: The client that made the writes. WAITAOF covers only the writes of the
            connection it runs on, and a connection that wrote nothing is acknowledged at
            once, so under threads give it a client with its own single connection.
        timeout_ms: Most milliseconds to wait; 0 waits forever.

    Returns:
        The number of local fsyncs acknowledged: 1, or 0 if the timeout passed first.

    Raises:
        redis.ResponseError: The server lacks WAITAOF or has appendonly off.
    """
    local, _replicas = client.waitaof(1, 0, timeout_ms)
    return int(local)


def _from_config(client: redis.Redis) -> tuple[bool, str, str] | None:
    try:
        values: dict[Any, Any] = {}
        for name in ("appendonly", "appendfsync", "maxmemory-policy"):
            values.update(client.config_get(name))
    except redis.ResponseError:
        return None
    text = {_text(k): _text(v) for k, v in values.items()}
    return (
        text.get("appendonly") == "yes",
        text.get("appendfsync", UNKNOWN),
        text.get("maxmemory-policy", UNKNOWN),
    )


def _from_info(client: redis.Redis) -> tuple[bool, str, str] | None:
    try:
        persistence: dict[str, Any] = client.info("persistence")
        memory: dict[str, Any] = client.info("memory")
    except redis.ResponseError:
        return None
    if "aof_enabled" not in persistence:
        return None
    # INFO does not report appendfsync.
    return (
        int(persistence["aof_enabled"]) == 1,
        UNKNOWN,
        _text(memory.get("maxmemory_policy", UNKNOWN)),
    )


def _supports_waitaof(client: redis.Redis) -> bool:
    # Probed rather than inferred from the version: managed services rename or disable
    # commands. With no fsyncs asked for, this returns at once.
    try:
        client.waitaof(0, 0, 0)
    except redis.ResponseError:
        return False
    return True


def _server(client: redis.Redis) -> str:
    try:
        info: dict[str, Any] = client.info("server")
    except redis.ResponseError:
        return UNKNOWN
    # Valkey still reports redis_version (7.2.4, for client compatibility) beside its own.
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    if "redis_version" in info:
        return f"redis {info['redis_version']}"
    return UNKNOWN


def _address(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


MAX_SKEW_S = 2.0


def check_skew(client: Client, clock: Clock, url: str, bound: float = MAX_SKEW_S) -> float:
    """Refuse to work with a clock too far from the Redis server's; returns the skew.

    Due times, wake-ups and lease deadlines are written by every worker from its own clock and
    compared by others: one clock off by minutes would wake runs early or sweep them again and
    again. The server's ``TIME`` is the reference every process shares; a skew within
    ``bound`` (2 s by default) is far below every lease, sweep and back-off this library uses.

    Raises:
        ClockSkewed: the skew, measured against the middle of the round trip, exceeds ``bound``.
    """
    before = clock.now()
    seconds, micros = client.time()
    after = clock.now()
    skew = (before + after) / 2 - (int(seconds) + int(micros) / 1e6)
    if abs(skew) > bound:
        raise ClockSkewed(url, skew, bound)
    return skew

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from journal._clock import Clock
from journal._redis.backend import Snapshot, cluster_client, plain_client
from journal._redis.backend import connect as journal_connect
from journal._redis.scripts import Client, all_sources
from journal.errors import ClockSkewed, StoreEvicts
from journal.ops.views import Prefetch

__all__ = [
    "MAX_SKEW_S",
    "Persistence",
    "check_persistence",
    "check_skew",
    "connect_checked",
    "wait_for_local_fsync",
]

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
    found = _from_config(client) or _from_info(client)
    return _judge(client, found, _supports_waitaof(client), _server(client), logger)


def _judge(
    client: redis.Redis,
    found: tuple[bool, str, str] | None,
    supports_waitaof: bool,
    server: str,
    logger: logging.Logger | None,
) -> Persistence:
    """Refuse an evicting store, warn about what the rest risks; the settings found."""
    log = logger or _LOG
    appendonly, appendfsync, policy = found or (None, UNKNOWN, UNKNOWN)
    persistence = Persistence(
        appendonly=appendonly,
        appendfsync=appendfsync,
        maxmemory_policy=policy,
        supports_waitaof=supports_waitaof,
        server=server,
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


def connect_checked(
    url: str,
    clock: Clock,
    *,
    logger: logging.Logger | None = None,
    accept: Callable[[bool], None] | None = None,
    prefetch: Prefetch | None = None,
    **options: Any,
) -> Client:
    """Connect to the store at ``url`` and check it, asking everything in one round trip.

    What ``journal.connect``, :func:`check_persistence` and :func:`check_skew` ask one by one
    (whether the node is in a cluster, its persistence settings, WAITAOF, its version, its
    clock), one pipeline asks of a single server at once: a command line pays for its start-up
    checks once, not six times. A cluster node is then connected to as a cluster, and every
    master is checked as :func:`check_persistence` does.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.
        clock: this process's clock, held against the server's.
        logger: where warnings go; this module's logger by default.
        accept: told whether the store is a cluster, before anything is judged; it raises to
            refuse a store its caller cannot use.
        prefetch: a run to read in the same transaction, on a single server (its snapshot is
            left unread on a cluster, whose run may live on another node).
        options: client options (timeouts), passed to whichever client is built.

    Raises:
        StoreEvicts: the store may evict keys.
        ClockSkewed: ``clock`` is off the server's by more than ``MAX_SKEW_S``.
        redis.ConnectionError: the store did not answer.
    """
    plain = plain_client(url, options)
    replies, asked_at = _asked_at_once(plain, clock, prefetch)
    if not replies and prefetch is not None:  # a cluster node refuses other slots' keys in it
        replies, asked_at = _asked_at_once(plain, clock, None)
    if not replies:  # a command refused outright: asked one at a time, as check_persistence
        plain.close()
        return _checked_apart(journal_connect(url, **options), url, clock, logger, accept)
    *configs, info, waitaof, server_time = replies
    info = info if isinstance(info, dict) else {}
    if info.get("cluster_enabled") in (1, "1"):
        plain.close()
        cluster = cluster_client(url, options)
        return _checked_apart(cluster, url, clock, logger, accept)
    if accept is not None:
        accept(False)
    found = _settings_found(configs, info)
    _judge(plain, found, not isinstance(waitaof, Exception), _server_of(info), logger)
    if isinstance(server_time, Exception):
        raise server_time
    _judge_skew(url, asked_at, server_time, MAX_SKEW_S)
    return plain


def _asked_at_once(
    plain: redis.Redis, clock: Clock, prefetch: Prefetch | None
) -> tuple[list[Any], float]:
    """The start-up questions' replies, in one transaction (none if one is refused outright).

    One transaction, so that it is one round trip to count as well as to wait for; the time
    returned is the middle of it on ``clock``, what the server's TIME is held against. Every
    script registered so far is loaded in it too, so that a process never meets NOSCRIPT on a
    server that has not restarted since: a cold start costs no round trip more than a warm one.
    A ``prefetch`` is read in it too (the replies exclude it).
    """
    pipe = plain.pipeline(transaction=True)
    for name in ("appendonly", "appendfsync", "maxmemory-policy"):
        pipe.config_get(name)
    pipe.info()  # the default sections: server, persistence, memory, cluster
    pipe.waitaof(0, 0, 0)
    pipe.time()
    if prefetch is not None:
        Snapshot.ask(pipe, prefetch.keys)
    sources = all_sources()
    for source in sources:  # a new server misses none, and a known script is only hashed
        pipe.script_load(source)
    before = clock.now()
    try:
        replies = pipe.execute(raise_on_error=False)
    except redis.ResponseError:
        replies = []
    except BaseException:
        plain.close()
        raise
    asked_at = (before + clock.now()) / 2
    replies = replies[: len(replies) - len(sources)]
    if prefetch is not None and replies:
        read = replies[-Snapshot.READS :]
        del replies[-Snapshot.READS :]
        if not any(isinstance(reply, Exception) for reply in read):
            prefetch.snapshot = Snapshot.of(read)
    return replies, asked_at


def _checked_apart(
    client: Client,
    url: str,
    clock: Clock,
    logger: logging.Logger | None,
    accept: Callable[[bool], None] | None,
) -> Client:
    """A store checked one question at a time: a cluster, or a server that refused one."""
    if accept is not None:
        accept(isinstance(client, redis.RedisCluster))
    check_persistence(client, logger=logger)
    check_skew(client, clock, url)
    return client


def _settings_found(configs: list[Any], info: dict[str, Any]) -> tuple[bool, str, str] | None:
    """Persistence settings from CONFIG GET, else from INFO (where CONFIG is disabled)."""
    if not any(isinstance(reply, Exception) for reply in configs):
        text = {_text(k): _text(v) for reply in configs for k, v in reply.items()}
        return (
            text.get("appendonly") == "yes",
            text.get("appendfsync", UNKNOWN),
            text.get("maxmemory-policy", UNKNOWN),
        )
    if "aof_enabled" in info:  # CONFIG disabled, as managed services often do
        return (
            int(info["aof_enabled"]) == 1,
            UNKNOWN,
            _text(info.get("maxmemory_policy", UNKNOWN)),
        )
    return None


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
    return _server_of(info)


def _server_of(info: dict[str, Any]) -> str:
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
    server_time = client.time()
    after = clock.now()
    return _judge_skew(url, (before + after) / 2, server_time, bound)


def _judge_skew(url: str, here: float, server_time: Any, bound: float) -> float:
    """The skew of ``here`` against the server's ``TIME`` reply; refused beyond ``bound``."""
    seconds, micros = server_time
    skew = here - (int(seconds) + int(micros) / 1e6)
    if abs(skew) > bound:
        raise ClockSkewed(url, skew, bound)
    return skew

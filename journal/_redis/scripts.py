"""The journal's Lua scripts, loaded from ``journal/lua`` and registered once per client.

A script is sent as EVALSHA; when the server does not know it (a ``SCRIPT FLUSH``, a restart,
a failover to a replica), as EVAL with its source, which also caches it. redis-py's own
``Script`` answers NOSCRIPT with SCRIPT LOAD and EVALSHA instead: two round trips, and a server
restarted between the two fails the call, where EVAL cannot miss.

On one server, EVALSHA goes straight down a pooled connection, under the connection's own
retry policy: redis-py's command path adds event dispatch and metrics recording around every
command, about a third of the client's time per script (49 against 36 us of CPU here), and a
run sends one script per step. A cluster client, or a client of one fixed connection, keeps
redis-py's path, which routes and locks. The scripts are then missing from redis-py's own
command metrics (its OpenTelemetry recorder); the server's command statistics still count them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis

SCRIPT_NAMES = (
    "open",
    "renew",
    "release",
    "record",
    "close",
    "claim_due",
    "effect_claim",
    "effect_confirm",
    "effect_settle",
    "effect_decide",
    "cancel",
    "purge",
    "purge_index",
)


def _source(name: str) -> str:
    return resources.files("journal").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


KeyOrArg = bytes | str | int | float

Client = redis.Redis | redis.RedisCluster
"""A client of one server, or of a Redis Cluster: every script touches keys of one slot."""


class Script:
    """One Lua script bound to a client: EVALSHA, and EVAL with the source on NOSCRIPT."""

    def __init__(self, client: Client, source: str) -> None:
        self.client = client
        self.script = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def __call__(
        self,
        keys: Sequence[KeyOrArg] = (),
        args: Sequence[KeyOrArg] = (),
        client: Client | None = None,
    ) -> Any:
        """The script's reply; ``client`` sends it on another connection than the bound one."""
        target = self.client if client is None else client
        try:
            return evalsha(target, self.sha, keys, args)
        except redis.exceptions.NoScriptError:
            return target.eval(self.script, len(keys), *keys, *args)


def evalsha(client: Client, sha: str, keys: Sequence[KeyOrArg], args: Sequence[KeyOrArg]) -> Any:
    """EVALSHA, straight down a pooled connection of a one-server client (see the module).

    Raises:
        redis.exceptions.NoScriptError: the server does not have the script.
    """
    if type(client) is not redis.Redis or client.connection is not None:
        return client.evalsha(sha, len(keys), *keys, *args)
    pool = client.connection_pool
    connection = pool.get_connection()
    command = ("EVALSHA", sha, len(keys), *keys, *args)

    def send() -> Any:
        connection.send_command(*command)  # type: ignore[no-untyped-call]
        return connection.read_response()

    try:
        return connection.retry.call_with_retry(send, lambda _: connection.disconnect())  # type: ignore[no-untyped-call]
    finally:
        pool.release(connection)


@dataclass(frozen=True)
class Scripts:
    """Every script of the journal, bound to one client."""

    open: Script
    renew: Script
    release: Script
    record: Script
    close: Script
    claim_due: Script
    effect_claim: Script
    effect_confirm: Script
    effect_settle: Script
    effect_decide: Script
    cancel: Script
    purge: Script
    purge_index: Script

    @classmethod
    def register(cls, client: Client) -> Scripts:
        """Register every script on ``client``; call once per client, not per call."""
        return cls(**{name: Script(client, _source(name)) for name in SCRIPT_NAMES})

"""The journal's Lua scripts, loaded from ``journal/lua`` and registered once per client.

A script is sent as EVALSHA. A process that connects with ``journal.contrib.checks`` loads
every script in its start-up transaction. When a server does not know one anyway (a ``SCRIPT
FLUSH``, a restart, a failover to a replica), it knows none of the others either: the first
miss loads every script in one transaction and sends the EVALSHA again, so a process pays two
round trips once rather than a miss and an EVAL for each script it meets. A server restarted
between the load and the call is answered with EVAL and the source, which cannot miss. On a
cluster, whose nodes each keep their own scripts, a miss is answered with EVAL alone.

On one server, EVALSHA goes straight down a pooled connection, under the connection's own
retry policy: redis-py's command path adds event dispatch and metrics recording around every
command, about a third of the client's time per script (49 against 36 us of CPU here), and a
run sends one script per step. A cluster client, or a client of one fixed connection, keeps
redis-py's path, which routes and locks. The scripts are then missing from redis-py's own
command metrics (its OpenTelemetry recorder); the server's command statistics still count them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Sequence
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
    "expect",
    "effect_claim",
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
    """One Lua script bound to a client: EVALSHA; on NOSCRIPT, every script loaded, or EVAL.

    Args:
        client: the client it is sent with unless a call names another.
        source: the Lua source.
        load_all: loads every script of its set on a client that missed one; True if it did.
    """

    def __init__(
        self, client: Client, source: str, load_all: Callable[[Client], bool] | None = None
    ) -> None:
        self.client = client
        self.script = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self._load_all = load_all

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
            if self._load_all is not None and self._load_all(target):
                with contextlib.suppress(redis.exceptions.NoScriptError):
                    return evalsha(target, self.sha, keys, args)
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
    expect: Script
    effect_claim: Script
    effect_settle: Script
    effect_decide: Script
    cancel: Script
    purge: Script
    purge_index: Script

    @classmethod
    def register(cls, client: Client) -> Scripts:
        """Register every script on ``client``; call once per client, not per call."""
        sources = _journal_sources()
        return cls(**{name: Script(client, source, load_all) for name, source in sources.items()})


@functools.cache
def _journal_sources() -> dict[str, str]:
    return {name: _source(name) for name in SCRIPT_NAMES}


# An application's own scripts (``register_scripts``), loaded with the journal's.
_companions: dict[str, str] = {}


def register_scripts(sources: Sequence[str]) -> Callable[[Client], bool]:
    """Load ``sources`` with the journal's own scripts at the first NOSCRIPT of either.

    An application's scripts run on the same server as the journal's, and a server that lost
    one lost them all: loaded together, a cold process pays one transaction for every script
    it will send, where each of its own would otherwise miss and be sent again as EVAL.

    Returns:
        The load-all callback to build the application's ``Script`` with.
    """
    for source in sources:
        _companions[hashlib.sha1(source.encode("utf-8")).hexdigest()] = source
    return load_all


def all_sources() -> tuple[str, ...]:
    """The journal's scripts and every one registered with them, as a first miss loads them."""
    return (*_journal_sources().values(), *_companions.values())


def load_all(client: Client) -> bool:
    """Load the journal's scripts and every registered one on ``client``; False on a cluster."""
    return load_scripts(client, all_sources())


def load_scripts(client: Client, sources: Sequence[str]) -> bool:
    """Load ``sources`` on a one-server client in one transaction; False on a cluster.

    A cluster's nodes each keep their own scripts, and a script runs on its keys' node: there
    a miss is answered with EVAL, which loads the script on that node.
    """
    if not isinstance(client, redis.Redis):
        return False
    pipe = client.pipeline(transaction=True)
    for source in sources:
        pipe.script_load(source)
    pipe.execute()
    return True

"""The journal's Lua scripts, loaded from ``journal/lua`` and registered once per client.

``register_script`` sends EVALSHA and reloads the script by itself after a ``SCRIPT FLUSH``
or a server restart, so a flushed script cache costs one extra round trip, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import redis
from redis.commands.core import Script

from journal.errors import UnknownScriptStatus

SCRIPT_NAMES = (
    "open",
    "renew",
    "release",
    "record",
    "close",
    "claim_due",
    "effect_claim",
    "effect_settle",
    "cancel",
)


def _source(name: str) -> str:
    return resources.files("journal").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


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
    effect_settle: Script
    cancel: Script

    @classmethod
    def register(cls, client: redis.Redis) -> Scripts:
        """Register every script on ``client``; call once per client, not per call."""
        return cls(**{name: client.register_script(_source(name)) for name in SCRIPT_NAMES})


def status_of(script: str, reply: object, known: tuple[int, ...]) -> int:
    """The status code at the head of a script's reply, refusing codes we do not know.

    Raises:
        UnknownScriptStatus: the script and this code disagree; that is a bug, not a retry.
    """
    code = reply[0] if isinstance(reply, list) and reply else reply
    if isinstance(code, int) and code in known:
        return code
    raise UnknownScriptStatus(script, reply)

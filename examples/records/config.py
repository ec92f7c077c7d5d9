"""The batch's settings, read from the environment once, and the process's connections.

One Redis (or Valkey) serves as the journal's store, the Celery broker and the sink the
records are written to: the smallest deployment there is.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import journal
from examples.records.source import Sink
from journal import Journal, Keyspace, Settings


@dataclass(frozen=True)
class Config:
    """What a worker and the command line read from ``RECORDS_*`` variables.

    Attributes:
        redis_url: the store, broker and sink (``RECORDS_REDIS_URL``): ``redis://``,
            ``rediss://`` or ``unix://``.
        prefix: the journal's key prefix (``RECORDS_PREFIX``); the sink's keys start with it.
        lease_ttl: seconds a dead worker's run stays held before the sweep may resume it.
        recovery_grace: seconds after that expiry before the sweep re-enqueues the run.
        sweep_interval: seconds between two due sweeps of a worker started with ``--beat``.
        work_ms: milliseconds each record's processing takes, standing for the real work (a
            request to a service, a document rendered); 0 by default.
    """

    redis_url: str = "redis://localhost:6379/0"
    prefix: str = "records"
    lease_ttl: float = 30.0
    recovery_grace: float = 5.0
    sweep_interval: float = 5.0
    work_ms: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """The settings in ``env`` (the process's environment by default), defaults elsewhere.

        Raises:
            ValueError: a number that does not parse, named with its variable.
        """
        env = os.environ if env is None else env
        default = cls()

        def number(name: str, fallback: float) -> float:
            raw = env.get(f"RECORDS_{name}")
            try:
                return fallback if raw is None else float(raw)
            except ValueError:
                raise ValueError(f"RECORDS_{name}={raw!r} is not a number") from None

        return cls(
            redis_url=env.get("RECORDS_REDIS_URL", default.redis_url),
            prefix=env.get("RECORDS_PREFIX", default.prefix),
            lease_ttl=number("LEASE_TTL", default.lease_ttl),
            recovery_grace=number("RECOVERY_GRACE", default.recovery_grace),
            sweep_interval=number("SWEEP_INTERVAL", default.sweep_interval),
            work_ms=int(number("WORK_MS", default.work_ms)),
        )

    @property
    def broker_url(self) -> str:
        """The store's URL as kombu spells it: a unix socket is ``redis+socket://``."""
        parts = urlsplit(self.redis_url)
        return f"redis+socket://{parts.path}" if parts.scheme == "unix" else self.redis_url

    def runtime(self) -> Runtime:
        """This process's connections, made once (after a worker's fork, in its child)."""
        return _runtime(self)


@dataclass(frozen=True)
class Runtime:
    """The journal and the sink of one process, on one client."""

    config: Config
    journal: Journal

    def sink(self, batch: str) -> Sink:
        """Where the records of ``batch`` (its first run's id) are written."""
        return Sink(self.journal.client, self.config.prefix, batch)


@functools.cache
def _runtime(config: Config) -> Runtime:
    # Bounded timeouts: a store that is gone shows as an error within seconds, not a hang.
    client = journal.connect(config.redis_url, socket_timeout=5, socket_connect_timeout=3)
    settings = Settings(lease_ttl=config.lease_ttl, recovery_grace=config.recovery_grace)
    store = Journal(client, keyspace=Keyspace(config.prefix), settings=settings)
    return Runtime(config, store)

"""What a process needs to run digests, built lazily and once per process.

Lazily, because Celery's prefork pool forks after import: a Redis connection or HTTP client
made before the fork would be shared by every child.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import redis

from journal import Client, Hints, Journal, Keyspace, RunRetry, Settings, SystemClock
from journal import connect as journal_connect
from journal.contrib.checks import connect_checked
from journal.contrib.embedded import embedded_broker_url, embedded_url
from journal.errors import StoreUnavailable
from journal.ops.views import Prefetch
from tasks.config import Config
from tasks.errors import ModelNotConfigured, is_transient_failure
from tasks.keys import DigestKeys

if TYPE_CHECKING:  # the adapters' modules, imported when one is chosen: reading needs none
    from tasks.llm.batches import AnthropicBatches, NoBatches
    from tasks.llm.budget import Budget, Tally
    from tasks.llm.client import Completion, Summarizer
    from tasks.llm.prompts import Update
    from tasks.llm.ratelimit import LimitState, RateLimiter
    from tasks.mail.smtp import Mailer

log = logging.getLogger(__name__)

# The SDK's own default, for naming the API a key belongs to when ANTHROPIC_BASE_URL is unset.
DEFAULT_BASE_URL = "https://api.anthropic.com"

# What the journal's errors tell a digest operator to do.
HINTS = Hints(
    parked="fix the cause, then reset it deliberately (digest run RUN --retry)",
    store_down="check that Redis is running and REDIS_URL is right",
)


def prepare_metrics(directory: Path) -> None:
    """Give ``prometheus_client``'s multiprocess mode a fresh directory, before it is imported.

    Its value class is chosen at import from ``PROMETHEUS_MULTIPROC_DIR``; set later, pool
    children would count in memory and their counts would never reach a scrape. A directory
    already named in the environment is kept (several processes may share one).
    """
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):  # an earlier process's counts are not ours
            stale.unlink()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)


def metrics_dir(state_dir: Path, pid: int) -> Path:
    """The multiprocess directory of the worker whose main process is ``pid``."""
    return state_dir / f"metrics-{pid}"


def remove_dead_metrics(state_dir: Path) -> list[Path]:
    """Remove the metrics directories of workers that are gone; the ones removed.

    A worker removes its own when it stops; one killed (kill -9, an OOM) cannot, and its
    directory would stay forever. A pid that names a live process keeps its directory, even
    if that process is not the worker that wrote it (a reused pid): a stale directory kept is
    harmless, a live worker's removed would lose its counts.
    """
    removed = []
    for directory in state_dir.glob("metrics-*"):
        pid = directory.name.removeprefix("metrics-")
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        except PermissionError:  # alive, another user's
            continue
    return removed


def store_url(config: Config) -> str:
    """The journal store's URL: ``REDIS_URL``, or the embedded server (started on demand)."""
    return config.redis_url or embedded_url(config.state_dir)


def broker_url(config: Config) -> str:
    """Celery's broker: ``CELERY_BROKER_URL``, else ``REDIS_URL``, else the embedded server."""
    return config.broker_url or config.redis_url or embedded_broker_url(config.state_dir)


# A client that fails fast: a dead store surfaces as an error within seconds, not hangs.
# No health-check PING, no CLIENT SETINFO and no HELLO (RESP2 needs no handshake): each cost
# a round trip on every new connection (a run's model calls in flight open one each), and a
# connection the server dropped is reconnected by the client's retry on the command that
# finds it gone. A cluster client speaks RESP3 all the same (``journal.connect``).
CLIENT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 5,
    "socket_connect_timeout": 3,
    "driver_info": None,
    "protocol": 2,
}


def connect(url: str) -> Client:
    """A client that fails fast; a cluster client when ``url`` names a cluster node."""
    return journal_connect(url, **CLIENT_OPTIONS)


def keyspace(config: Config) -> Keyspace:
    """Where the journal's runs live in the store, known before connecting."""
    return Keyspace(config.key_prefix, shards=config.journal_shards)


def checked_store(
    config: Config, logger: logging.Logger, prefetch: Prefetch | None = None
) -> Client:
    """Connect to the journal store and refuse one the digest cannot rely on.

    The one connect-and-check of every process: a command line building its runtime and a
    worker starting alike refuse a store that evicts keys, a Redis Cluster serving as the
    broker, and a clock off the store's (one clock for every process's deadlines).
    ``logger`` says once what the store's persistence settings risk.

    Raises:
        redis.ConnectionError: the store did not answer (``redis.TimeoutError`` alike); each
            caller decides what an outage means for it.
        BadInput: the settings do not fit this store (``Config.check_store``).
        StoreEvicts: the store may evict the journal's keys.
        ClockSkewed: this machine's clock is off the store's.
    """
    url = store_url(config)
    # One round trip asks whether it is a cluster node, what it keeps, and its clock, and
    # reads ``prefetch``'s run.
    return connect_checked(
        url,
        SystemClock(),
        logger=logger,
        accept=lambda cluster: config.check_store(cluster=cluster),
        prefetch=prefetch,
        **CLIENT_OPTIONS,
    )


@dataclass
class Store:
    """The process's journal, its store client and the shared rate limits: what reading needs.

    ``digest show`` and ``digest runs`` read runs and never call the model or send mail;
    choosing those adapters (``Runtime``) imports the model's client and the mail transports,
    a cost that a command which only reads has no use for.
    """

    config: Config
    client: Client
    journal: Journal
    keys: DigestKeys
    limiter: RateLimiter | None = field(default=None, kw_only=True)

    def limit_states(self) -> list[LimitState]:
        """What the shared rate limiter knows of each model of both chains (none without a key)."""
        if self.limiter is None:
            return []
        config = self.config
        return self.limiter.states(
            tuple(dict.fromkeys(config.summary_models + config.intro_models))
        )

    @classmethod
    def open(cls, config: Config, prefetch: Prefetch | None = None) -> Store:
        """Connect to the store and check it (``checked_store``), its journal and keys named.

        ``prefetch``: a run to read in the start-up checks' transaction (``inspect_run``).

        Raises:
            StoreUnavailable: the store did not answer.
        """
        url = store_url(config)
        try:
            client = checked_store(config, log, prefetch)
        except (redis.ConnectionError, redis.TimeoutError) as down:
            raise StoreUnavailable(
                url, str(down) or type(down).__name__, HINTS.store_down
            ) from None
        cluster = isinstance(client, redis.RedisCluster)
        journal = Journal(
            client,
            keyspace=keyspace(config),
            hints=HINTS,
            settings=Settings(
                lease_ttl=config.lease_ttl,
                rearm_after=config.redeliver_after,
                fsync_records=config.wait_aof,
                wait_replicas=config.wait_replicas,
                run_retry=RunRetry(
                    retryable=is_transient_failure,
                    first_delay=config.run_retry_delay,
                    max_delay=config.run_retry_max_delay,
                    give_up_after=config.give_up_after,
                ),
            ),
            url=url,
        )
        keys = DigestKeys(config.key_prefix, cluster=cluster)
        return cls(config, client, journal, keys, limiter=rate_limiter(client, keys, config))


@dataclass
class Runtime(Store):
    """The process's store (``Store``) with its summarizer and mailer: what running needs."""

    summarizer: Summarizer
    mailer: Mailer
    replaying: bool = False
    """A replay's runtime (``storeless``): it has no store, so no other run's state either."""
    tally: Tally | None = None
    """A rehearsal's runtime (``rehearsing``): its calls are counted here, not in the store."""

    @functools.cached_property
    def batches(self) -> AnthropicBatches | NoBatches:
        """The Message Batches API of the summarizer's key; a refusal without a key."""
        from tasks.llm.batches import AnthropicBatches, NoBatches
        from tasks.llm.client import AnthropicSummarizer

        if not isinstance(self.summarizer, AnthropicSummarizer):
            return NoBatches()
        return AnthropicBatches(self.summarizer.client)

    @functools.cached_property
    def budget(self) -> Budget:
        """Every run's ``DIGEST_MAX_COST_USD``, reserved in this store before each call."""
        from tasks.llm.budget import Budget, StoreLedger

        config = self.config
        # A call may first wait up to the back-off threshold for rate-limit room, then run.
        longest = config.long_backoff + config.model_timeout
        ledger = StoreLedger(self.client) if self.tally is None else self.tally
        return Budget(ledger, config.max_cost_usd, config.prices, longest)

    @classmethod
    def build(
        cls, config: Config, *, allow_offline: bool, prefetch: Prefetch | None = None
    ) -> Runtime:
        """Connect (``Store.open``) and choose the adapters.

        Args:
            config: the settings.
            allow_offline: use the offline summarizer when no API key is set (the CLI);
                a worker passes ``config.offline_allowed`` so that a deployment with its own
                Redis refuses to fake summaries silently.
            prefetch: a run to read in the start-up checks' transaction (``inspect_run``).
        """
        store = Store.open(config, prefetch)
        return cls(
            config,
            store.client,
            store.journal,
            store.keys,
            limiter=store.limiter,
            summarizer=choose_summarizer(
                config, allow_offline=allow_offline, limiter=store.limiter
            ),
            mailer=choose_mailer(config),
        )


def rate_limiter(client: Client, keys: DigestKeys, config: Config) -> RateLimiter | None:
    """The rate limits shared on the store by every process on this API key; None without one.

    Named by the API's URL and key (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``), hashed.
    """
    key = os.environ.get("ANTHROPIC_API_KEY")
    if not key:
        return None
    from tasks.llm.ratelimit import RateLimiter, account_of  # without a key, no limits to share

    base_url = os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
    account = account_of(base_url, key)
    return RateLimiter(
        client, keys, account, wait_over=config.long_backoff, overrides=config.rate_limits
    )


def choose_summarizer(
    config: Config, *, allow_offline: bool, limiter: RateLimiter | None = None
) -> Summarizer:
    """The Anthropic summarizer when a key is set; otherwise offline, where allowed.

    Args:
        config: the settings.
        allow_offline: whether no key means the offline summarizer.
        limiter: the rate limits shared with every process on the key (``rate_limiter``).
    """
    from tasks.llm.client import AnthropicSummarizer, OfflineSummarizer

    if os.environ.get("ANTHROPIC_API_KEY"):
        return AnthropicSummarizer.from_env(
            config.model_timeout,
            config.summary_models[0],
            config.intro_models[0],
            limiter=limiter,
        )
    if allow_offline:
        return OfflineSummarizer()
    return MissingKey()


def choose_mailer(config: Config) -> Mailer:
    """Resend, SMTP, or else the file outbox in the state dir.

    Resend with ``DIGEST_MAIL_URL=resend://``, SMTP with ``DIGEST_SMTP_URL``.
    """
    from tasks.mail.smtp import FileOutbox, SmtpMailer

    if config.mail_url is not None and config.resend_api_key:
        # Imported here: its HTTP client is a tenth of a second that only Resend needs.
        from tasks.mail.resend import ResendMailer

        return ResendMailer(
            config.resend_api_key, config.sender, config.resend_base_url, config.smtp_timeout
        )
    if config.smtp_url:
        return SmtpMailer(
            config.smtp_url,
            config.sender,
            config.smtp_timeout,
            require_tls=config.smtp_require_tls,
            idempotency_header=config.smtp_idempotency_header,
        )
    return FileOutbox(config.state_dir / "outbox")


class MissingKey:
    """Stands in for a summarizer on a worker with no API key, ``REDIS_URL`` set, no offline."""

    name = "none (ANTHROPIC_API_KEY is not set)"
    remote = False

    def summarize(self, item: Update, model: str | None = None) -> Completion:
        """Refuse: a worker must not send offline summaries unless told to."""
        raise ModelNotConfigured()

    def compose(self, pairs: Sequence[tuple[Update, str]], model: str | None = None) -> Completion:
        """Refuse, as ``summarize`` does."""
        raise ModelNotConfigured()


@functools.cache
def process_config() -> Config:
    """This process's settings, read from the environment on first use, once.

    Raises:
        BadInput: a setting is refused (read again on the next call).
    """
    return Config.from_env()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def process_runtime() -> Runtime:
    """The runtime workflows in this process run with, built on first use.

    A worker's is built on its first delivery, after the pool forks, and summarizes offline
    only where ``Config.offline_allowed``; a command line installs its own first
    (``use_runtime``).
    """
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            config = process_config()
            _runtime = Runtime.build(config, allow_offline=config.offline_allowed)
        return _runtime


def use_runtime(runtime: Runtime) -> None:
    """Run this process's workflows with ``runtime`` from now on (the command line's)."""
    global _runtime
    with _runtime_lock:
        _runtime = runtime


@contextlib.contextmanager
def rehearsing(runtime: Runtime, tally: Tally) -> Iterator[Runtime]:
    """Run this process's workflows with ``runtime`` counting its calls in ``tally``.

    For a rehearsal that makes model calls (``digest fork --dry-run``): the budget is checked
    as the fork would be, and what the calls cost is counted in memory, not in the run's usage
    hash, which lasts and which the run's own calls draw on. The runtime installed before is
    put back afterwards.
    """
    global _runtime
    counted = replace(runtime, tally=tally)
    with _runtime_lock:
        before, _runtime = _runtime, counted
    try:
        yield counted
    finally:
        with _runtime_lock:
            _runtime = before


class _NoStore(redis.ConnectionPool):
    """A pool that never connects: the store of a runtime that has none (``storeless``)."""

    def get_connection(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refuse, in one line that says why."""
        raise StoreUnavailable(
            "no store",
            "this runtime replays recorded runs and has no store",
            "let only steps that need no store (the model's) run live in a replay",
        )


@contextlib.contextmanager
def storeless(config: Config | None = None) -> Iterator[Runtime]:
    """Run this process's workflows with a runtime that has no store, for the duration.

    For replaying recorded runs in memory (``journal.testing.replay``): a replayed step needs
    nothing, a model step let run live needs only the summarizer (an API key: the SDK's own
    variables; none: the offline summarizer), and a step that would touch Redis raises
    ``StoreUnavailable`` instead of connecting, let alone starting the embedded server.
    The runtime installed before is put back afterwards.
    """
    global _runtime
    config = config if config is not None else Config.from_env()
    client = redis.Redis(connection_pool=_NoStore())
    runtime = Runtime(
        config=config,
        client=client,
        journal=Journal(client, keyspace=Keyspace(config.key_prefix), hints=HINTS),
        keys=DigestKeys(config.key_prefix, cluster=False),
        summarizer=choose_summarizer(config, allow_offline=True),
        mailer=choose_mailer(config),
        replaying=True,
    )
    with _runtime_lock:
        before, _runtime = _runtime, runtime
    try:
        yield runtime
    finally:
        with _runtime_lock:
            _runtime = before

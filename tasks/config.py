"""The digest's configuration: read once from the environment, typed, checked at start.

Conflicting settings are refused when a process starts, not discovered at 3 a.m.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from journal.redact import add_secret, add_url_secrets, redact
from tasks.cost import PriceTable
from tasks.errors import BadInput

# Variables whose values are secrets as a whole, and those that are URLs that may carry one.
SECRET_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
URL_VARIABLES = ("REDIS_URL", "CELERY_BROKER_URL", "DIGEST_SMTP_URL", "ANTHROPIC_BASE_URL")


def _register_secrets(env: Mapping[str, str]) -> None:
    """Tell the masking function every secret this process was configured with.

    First, before any setting is checked: an error about a bad setting must not show them.
    """
    for name in SECRET_VARIABLES:
        add_secret(env.get(name))
    for name in URL_VARIABLES:
        add_url_secrets(env.get(name))


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(
            f"{name}={raw!r}: not a number; use a value from {low:g} to {high:g}"
        ) from None
    if not low <= value <= high:
        raise BadInput(f"{name}={raw!r}: out of range; use a value from {low:g} to {high:g}")
    return value


def _count(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = _number(env, name, default, low, high)
    if value != int(value):  # 2.5 workers would silently become 2
        raise BadInput(
            f"{name}={env[name]!r}: not a whole number; use a value from {low} to {high}"
        )
    return int(value)


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise BadInput(f"{name}={raw!r}: not a flag; use 1 or 0")


AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def _check_url(name: str, url: str | None, schemes: tuple[str, ...] | None) -> None:
    """Refuse a URL its client would reject with a traceback; the password shown masked."""
    if url is None:
        return
    parts = urlsplit(url)
    shown = redact(url)
    if schemes is not None and parts.scheme not in schemes:
        raise BadInput(
            f"{name}={shown!r}: the scheme must be {', '.join(schemes[:-1])} or {schemes[-1]}; "
            "for example redis://localhost:6379/0 or rediss://cache.example.com:6380/0"
        )
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise BadInput(f"{name}={shown!r}: the port must be a number from 1 to 65535") from None


@dataclass(frozen=True)
class Config:
    """Every setting of the digest, with the defaults the README documents.

    Attributes:
        redis_url: the journal store; None means the embedded Valkey in ``state_dir``.
        broker_url: Celery's broker; None means the journal store.
        state_dir: embedded server data and the file outbox.
        items_path: this week's updates.
        key_prefix: the prefix of every Redis key the project writes.
        summary_model, intro_model: model ids.
        concurrency: summaries in flight at once.
        lease_ttl: seconds a run's lease lives without renewal.
        model_timeout: seconds one model call may take: inside the lease, far inside the time
            limit, so a hung call fails as a retryable error instead of holding the run.
        retry_base_delay: the first back-off of a failed model call, in seconds.
        long_backoff: back-offs longer than this become a durable sleep, in seconds.
        max_retry_after: the longest ``retry-after`` from the model API that is honoured, in
            seconds; a longer one (a misbehaving proxy, a date years ahead) waits this long.
        smtp_url: real SMTP delivery; None means the file outbox.
        smtp_timeout: seconds for each SMTP operation; also how long after claiming the send a
            worker may still start DATA, and so how long a later holder waits for a claimant
            that may be alive.
        smtp_require_tls: refuse an ``smtp://`` server that offers no STARTTLS, even when
            the URL carries no credentials (credentials are never sent in clear anyway).
        sender, recipient: the email's From and To.
        timezone: the zone of the Monday 08:00 schedule.
        offline: allow the worker to summarize without an API key.
        approval: wait for a human approval before sending.
        approval_timeout: seconds to wait for it.
        sweep_interval: seconds between due sweeps (wake-ups and crash recovery).
        wait_aof: wait for the local AOF fsync of every record (WAITAOF; Redis 7.2+, Valkey),
            for servers on ``appendfsync everysec``.
        catch_up_weeks: how many missed weeks the dispatcher enqueues after an outage.
        visibility_timeout: the Redis broker's redelivery timeout, in seconds.
        task_time_limit: the hard limit of one delivery, in seconds.
        queue: the Celery queue digests are sent to and workers consume; one per deployment
            sharing a broker.
        run_retry_delay: seconds before the due sweep retries a run that failed for a
            transient cause; doubles on each failure of a streak.
        run_retry_max_delay: the cap of that doubling delay, in seconds.
        give_up_after: seconds from a streak's first transient failure to failing the run for
            good; 0 turns automatic retries off.
        metrics_port: the port a worker serves Prometheus metrics on; None for none.
        max_cost_usd: a run's model budget in dollars; None for no limit.
        prices: the per-model price table a call's cost is computed with.
        consumer_timeout: RabbitMQ's delivery acknowledgement timeout (its ``consumer_timeout``,
            30 minutes unless the broker's configuration or a queue policy says otherwise),
            in seconds. A delivery still running then has its channel closed and its message
            redelivered, so with an AMQP broker the task time limit must stay below it.
        soft_shutdown_timeout: seconds a worker stopping cold (SIGQUIT, or SIGTERM with
            ``REMAP_SIGTERM=SIGQUIT``) lets running deliveries finish before it stops them and
            hands their messages back to the broker.
    """

    redis_url: str | None = None
    broker_url: str | None = None
    state_dir: Path = Path(".digest")
    items_path: Path = Path("data/items.json")
    key_prefix: str = "journal"
    summary_model: str = "claude-haiku-5-5"
    intro_model: str = "claude-sonnet-5-5"
    concurrency: int = 3
    lease_ttl: float = 30.0
    model_timeout: float = 20.0
    retry_base_delay: float = 1.0
    long_backoff: float = 30.0
    max_retry_after: float = 3600.0
    smtp_url: str | None = None
    smtp_timeout: float = 30.0
    smtp_require_tls: bool = False
    sender: str = "digest@example.com"
    recipient: str = "team@example.com"
    timezone: str = "UTC"
    offline: bool = False
    approval: bool = False
    approval_timeout: float = 24 * 3600.0
    sweep_interval: float = 15.0
    wait_aof: bool = False
    catch_up_weeks: int = 4
    visibility_timeout: float = 3600.0
    task_time_limit: float = 1800.0
    queue: str = "celery"
    run_retry_delay: float = 60.0
    run_retry_max_delay: float = 3600.0
    give_up_after: float = 86400.0
    consumer_timeout: float = 1800.0
    soft_shutdown_timeout: float = 0.0
    max_cost_usd: float | None = None
    metrics_port: int | None = None
    prices: PriceTable = field(default_factory=PriceTable)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read and check every variable.

        Raises:
            BadInput: one line naming the variable, what is wrong and what to use.
        """
        env = os.environ if env is None else env
        _register_secrets(env)
        config = cls(
            redis_url=env.get("REDIS_URL") or None,
            broker_url=env.get("CELERY_BROKER_URL") or None,
            state_dir=Path(env.get("DIGEST_STATE_DIR") or ".digest"),
            items_path=Path(env.get("DIGEST_ITEMS") or "data/items.json"),
            key_prefix=env.get("DIGEST_KEY_PREFIX") or "journal",
            summary_model=env.get("DIGEST_SUMMARY_MODEL") or "claude-haiku-5-5",
            intro_model=env.get("DIGEST_INTRO_MODEL") or "claude-sonnet-5-5",
            concurrency=_count(env, "DIGEST_CONCURRENCY", 3, 1, 64),
            lease_ttl=_number(env, "DIGEST_LEASE_TTL", 30, 0.5, 3600),
            model_timeout=_number(env, "DIGEST_MODEL_TIMEOUT", 20, 1, 600),
            retry_base_delay=_number(env, "DIGEST_RETRY_BASE_DELAY", 1.0, 0, 60),
            long_backoff=_number(env, "DIGEST_LONG_BACKOFF", 30, 0, 3600),
            max_retry_after=_number(env, "DIGEST_MAX_RETRY_AFTER", 3600, 1, 86400),
            smtp_url=env.get("DIGEST_SMTP_URL") or None,
            smtp_timeout=_number(env, "DIGEST_SMTP_TIMEOUT", 30, 1, 600),
            smtp_require_tls=_flag(env, "DIGEST_SMTP_REQUIRE_TLS"),
            sender=env.get("DIGEST_FROM") or "digest@example.com",
            recipient=env.get("DIGEST_TO") or "team@example.com",
            timezone=env.get("DIGEST_TIMEZONE") or "UTC",
            offline=_flag(env, "DIGEST_OFFLINE"),
            approval=_flag(env, "DIGEST_APPROVAL"),
            approval_timeout=_number(env, "DIGEST_APPROVAL_TIMEOUT", 86400, 1, 30 * 86400),
            sweep_interval=_number(env, "DIGEST_SWEEP_INTERVAL", 15, 0.5, 3600),
            wait_aof=_flag(env, "DIGEST_WAITAOF"),
            catch_up_weeks=_count(env, "DIGEST_CATCH_UP_WEEKS", 4, 0, 52),
            visibility_timeout=_number(env, "DIGEST_VISIBILITY_TIMEOUT", 3600, 60, 43200),
            task_time_limit=_number(env, "DIGEST_TASK_TIME_LIMIT", 1800, 30, 43200),
            queue=env.get("DIGEST_QUEUE") or "celery",
            run_retry_delay=_number(env, "DIGEST_RUN_RETRY_DELAY", 60, 0.1, 86400),
            run_retry_max_delay=_number(env, "DIGEST_RUN_RETRY_MAX_DELAY", 3600, 0.1, 86400),
            give_up_after=_number(env, "DIGEST_GIVE_UP_AFTER", 86400, 0, 30 * 86400),
            consumer_timeout=_number(env, "DIGEST_CONSUMER_TIMEOUT", 1800, 60, 7 * 86400),
            soft_shutdown_timeout=_number(env, "DIGEST_SOFT_SHUTDOWN_TIMEOUT", 0, 0, 3600),
            max_cost_usd=_number(env, "DIGEST_MAX_COST_USD", 0, 0, 1e6) or None,
            metrics_port=_count(env, "DIGEST_METRICS_PORT", 0, 0, 65535) or None,
            prices=PriceTable.from_env(env),
        )
        config.check()
        return config

    def check(self) -> None:
        """Refuse combinations that would break a guarantee.

        Raises:
            BadInput: naming the settings that conflict.
        """
        _check_url("REDIS_URL", self.redis_url, ("redis", "rediss", "unix"))
        _check_url("CELERY_BROKER_URL", self.broker_url, None)
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadInput(
                f"DIGEST_TIMEZONE={self.timezone!r}: unknown time zone; use an IANA name such "
                "as Europe/Berlin"
            ) from None
        if self.task_time_limit >= self.visibility_timeout * 0.9:
            raise BadInput(
                f"DIGEST_TASK_TIME_LIMIT={self.task_time_limit:g} must stay below 90% of "
                f"DIGEST_VISIBILITY_TIMEOUT={self.visibility_timeout:g}, or the broker "
                "redelivers tasks that are still running"
            )
        # Checked, not set: an x-consumer-timeout argument is ignored before RabbitMQ 3.12 (its
        # 30 minutes still apply), and as a queue argument it makes every later declaration of
        # an existing queue fail (PRECONDITION_FAILED). The broker's operator owns the timeout.
        amqp = self.broker_url is not None and urlsplit(self.broker_url).scheme in AMQP_SCHEMES
        if amqp and self.task_time_limit >= self.consumer_timeout * 0.9:
            raise BadInput(
                f"DIGEST_TASK_TIME_LIMIT={self.task_time_limit:g} must stay below 90% of "
                f"RabbitMQ's consumer timeout (DIGEST_CONSUMER_TIMEOUT={self.consumer_timeout:g}"
                "), or RabbitMQ closes the channel of a delivery still running and redelivers "
                f"it; lower DIGEST_TASK_TIME_LIMIT to {int(self.consumer_timeout * 0.9) - 1} or "
                "less, or raise consumer_timeout on the broker and DIGEST_CONSUMER_TIMEOUT to match"
            )
        if self.model_timeout >= self.task_time_limit:
            raise BadInput(
                f"DIGEST_MODEL_TIMEOUT={self.model_timeout:g} must be shorter than "
                f"DIGEST_TASK_TIME_LIMIT={self.task_time_limit:g}"
            )
        unpriced = [
            m for m in (self.summary_model, self.intro_model) if m not in self.prices.prices
        ]
        if self.max_cost_usd is not None and unpriced:
            raise BadInput(
                f"DIGEST_MAX_COST_USD is set but {', '.join(unpriced)} has no price, so its "
                "calls could not count against it; add it to DIGEST_PRICES or DIGEST_PRICES_FILE"
            )
        if self.run_retry_delay > self.run_retry_max_delay:
            raise BadInput(
                f"DIGEST_RUN_RETRY_DELAY={self.run_retry_delay:g} must not exceed "
                f"DIGEST_RUN_RETRY_MAX_DELAY={self.run_retry_max_delay:g}: the first retry "
                "delay doubles up to that cap"
            )
        if self.lease_ttl * 2 > self.visibility_timeout * 0.25:
            raise BadInput(
                f"DIGEST_LEASE_TTL={self.lease_ttl:g} is too long for "
                f"DIGEST_VISIBILITY_TIMEOUT={self.visibility_timeout:g}: a busy delivery waits "
                "up to the lease's remaining time, which must stay a fraction of it"
            )

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone."""
        return ZoneInfo(self.timezone)

    @property
    def max_countdown(self) -> float:
        """The longest broker countdown allowed: a quarter of the visibility timeout."""
        return self.visibility_timeout * 0.25

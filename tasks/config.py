"""The digest's configuration: read once from the environment, typed, checked at start.

Conflicting settings are refused when a process starts, not discovered at 3 a.m.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from journal import redelivers_running, safe_time_limit
from journal.logs import add_secret, add_url_secrets, redact
from tasks.errors import BadInput
from tasks.job.schedule import DEFAULT_SCHEDULE, Schedule
from tasks.llm.client import DEFAULT_INTRO_MODEL, DEFAULT_SUMMARY_MODEL
from tasks.llm.cost import PriceTable
from tasks.llm.ratelimit import Overrides

# Variables whose values are secrets as a whole, and those that are URLs that may carry one.
SECRET_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "RESEND_API_KEY")
URL_VARIABLES = (
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "DIGEST_SMTP_URL",
    "DIGEST_MAIL_URL",
    "ANTHROPIC_BASE_URL",
    "RESEND_BASE_URL",
)
# What a run does with a send that may have happened: wait for an operator, or repeat it.
AMBIGUOUS_SEND = ("wait", "resend")


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


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(name: str, raw: str) -> float:
    """Seconds from ``90m``, ``36h``, ``30d``, ``8w`` (a number and its unit).

    Raises:
        BadInput: ``raw`` is not a duration; ``name`` is the option or variable it came from.
    """
    found = _DURATION.fullmatch(raw.strip())
    if not found:
        raise BadInput(
            f"{name}={raw!r}: not a duration; use a number and a unit, s, m, h, d or w, such as 30d"
        )
    return float(found.group(1)) * _UNITS[found.group(2)]


AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
LOG_FORMATS = ("text", "json")
# A delivery's hard limit unless the broker needs a shorter one (``Config.time_limit``).
DEFAULT_TIME_LIMIT = 1800


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
    """Every setting of the digest, with the defaults docs/configuration.md documents.

    Attributes:
        redis_url: the journal store; None means the embedded Valkey in ``state_dir``.
        broker_url: Celery's broker; None means the journal store.
        state_dir: embedded server data and the file outbox.
        items_path: this week's updates: a file, or an https:// URL (``tasks.job.feeds``).
        items_timeout: seconds a URL of updates may take to answer.
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
        smtp_idempotency_header: a header the SMTP relay deduplicates on (Resend's relay:
            ``Resend-Idempotency-Key``), set to the send's key; None for a plain relay.
        mail_url: ``resend://`` sends through Resend's HTTP API instead of SMTP.
        resend_api_key, resend_base_url: Resend's API key and address.
        ambiguous_send: ``wait`` (a send that may have happened waits for an operator's
            ``mark-sent`` or ``resend``) or ``resend`` (repeat it at once with the same
            ``Message-ID``); a transport that deduplicates repeats it either way.
        sender, recipient: the email's From and To.
        timezone: the zone of the schedule.
        schedule: when beat sends a digest: a day and a time, or a cron expression.
        offline: allow the worker to summarize without an API key.
        approval: wait for a human approval before sending.
        approval_timeout: seconds to wait for it.
        sweep_interval: seconds between due sweeps (wake-ups and crash recovery).
        wait_aof: wait for the local AOF fsync of every record (WAITAOF; Redis 7.2+, Valkey),
            for servers on ``appendfsync everysec``.
        wait_replicas: replicas every record must reach before the run goes on (WAIT), so a
            failover to one of them loses no recorded step.
        catch_up_weeks: how many missed weeks the dispatcher enqueues after an outage.
        journal_shards: how many index shards the journal spreads runs over (see
            ``journal._schema.keys``); on a Redis Cluster, more than the masters spreads the sweep's
            and the listing's load over them. Part of the key layout: set it once.
        visibility_timeout: the Redis broker's redelivery timeout, in seconds.
        task_time_limit: the hard limit of one delivery, in seconds; None derives it from the
            broker in use (``time_limit``).
        queue: the Celery queue digests are sent to and workers consume; one per deployment
            sharing a broker.
        run_retry_delay: seconds before the due sweep retries a run that failed for a
            transient cause; doubles on each failure of a streak.
        run_retry_max_delay: the cap of that doubling delay, in seconds.
        give_up_after: seconds from a streak's first transient failure to failing the run for
            good; 0 turns automatic retries off.
        metrics_port: the port a worker serves Prometheus metrics on; None for none.
        log_format: ``text`` (Celery's lines, the run's fields at the end) or ``json`` (one
            object per line, for log shippers).
        run_retention: seconds after its last update an ended run's keys are purged by beat,
            weekly; None keeps every run.
        max_cost_usd: a run's model budget in dollars; None for no limit.
        prices: the per-model price table a call's cost is computed with.
        rate_limits: model API rate limits set over what the API's headers say.
        batch: new runs send their model requests as Message Batches (half the price, within
            hours) instead of one call at a time; frozen with each run at its first start.
        batch_deadline: seconds from a batch step's start after which what its batch has not
            answered is cancelled and asked synchronously.
        batch_first_look: seconds from a batch's creation to the run's first look at it; the
            wait doubles after each look, up to ``batch_max_look``.
        batch_max_look: the longest wait between two looks, in seconds.
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
    items_path: str = "data/items.json"
    items_timeout: float = 10.0
    key_prefix: str = "journal"
    summary_model: str = DEFAULT_SUMMARY_MODEL
    intro_model: str = DEFAULT_INTRO_MODEL
    concurrency: int = 3
    lease_ttl: float = 30.0
    model_timeout: float = 20.0
    retry_base_delay: float = 1.0
    long_backoff: float = 30.0
    max_retry_after: float = 3600.0
    smtp_url: str | None = None
    smtp_timeout: float = 30.0
    smtp_require_tls: bool = False
    smtp_idempotency_header: str | None = None
    mail_url: str | None = None
    resend_api_key: str | None = None
    resend_base_url: str = "https://api.resend.com"
    ambiguous_send: str = "wait"
    sender: str = "digest@example.com"
    recipient: str = "team@example.com"
    timezone: str = "UTC"
    schedule: str = DEFAULT_SCHEDULE
    offline: bool = False
    approval: bool = False
    approval_timeout: float = 24 * 3600.0
    sweep_interval: float = 15.0
    wait_aof: bool = False
    wait_replicas: int = 0
    catch_up_weeks: int = 4
    journal_shards: int = 1
    visibility_timeout: float = 3600.0
    task_time_limit: float | None = None
    queue: str = "celery"
    run_retry_delay: float = 60.0
    run_retry_max_delay: float = 3600.0
    give_up_after: float = 86400.0
    consumer_timeout: float = 1800.0
    soft_shutdown_timeout: float = 0.0
    max_cost_usd: float | None = None
    metrics_port: int | None = None
    log_format: str = "text"
    run_retention: float | None = None
    batch: bool = False
    batch_deadline: float = 4 * 3600.0
    batch_first_look: float = 30.0
    batch_max_look: float = 300.0
    prices: PriceTable = field(default_factory=PriceTable)
    rate_limits: Overrides = field(default_factory=Overrides)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read and check every variable of ``SETTINGS``.

        Raises:
            BadInput: one line naming the variable, what is wrong and what to use.
        """
        env = os.environ if env is None else env
        _register_secrets(env)
        values = {s.field: s.read(env) for s in SETTINGS if s.field is not None}
        config = cls(**values, prices=PriceTable.from_env(env), rate_limits=Overrides.from_env(env))
        config.check()
        return config

    def check(self) -> None:
        """Refuse combinations that would break a guarantee.

        Raises:
            BadInput: naming the settings that conflict.
        """
        _check_url("REDIS_URL", self.redis_url, ("redis", "rediss", "unix"))
        if self.log_format not in LOG_FORMATS:
            raise BadInput(
                f"DIGEST_LOG_FORMAT={self.log_format!r}: unknown log format; use "
                + " or ".join(LOG_FORMATS)
            )
        _check_url("CELERY_BROKER_URL", self.broker_url, None)
        self._check_mail()
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadInput(
                f"DIGEST_TIMEZONE={self.timezone!r}: unknown time zone; use an IANA name such "
                "as Europe/Berlin"
            ) from None
        if redelivers_running(self.time_limit, self.visibility_timeout):
            raise BadInput(
                f"DIGEST_TASK_TIME_LIMIT={self.time_limit:g} must stay below 90% of "
                f"DIGEST_VISIBILITY_TIMEOUT={self.visibility_timeout:g}, or the broker "
                "redelivers tasks that are still running"
            )
        # Checked, not set: an x-consumer-timeout argument is ignored before RabbitMQ 3.12 (its
        # 30 minutes still apply), and as a queue argument it makes every later declaration of
        # an existing queue fail (PRECONDITION_FAILED). The broker's operator owns the timeout.
        if self.amqp and redelivers_running(self.time_limit, self.consumer_timeout):
            raise BadInput(
                f"DIGEST_TASK_TIME_LIMIT={self.time_limit:g} must stay below 90% of "
                f"RabbitMQ's consumer timeout (DIGEST_CONSUMER_TIMEOUT={self.consumer_timeout:g}"
                "), or RabbitMQ closes the channel of a delivery still running and redelivers "
                f"it; lower DIGEST_TASK_TIME_LIMIT to {safe_time_limit(self.consumer_timeout)} or "
                "less, or raise consumer_timeout on the broker and DIGEST_CONSUMER_TIMEOUT to match"
            )
        if self.model_timeout >= self.time_limit:
            raise BadInput(
                f"DIGEST_MODEL_TIMEOUT={self.model_timeout:g} must be shorter than "
                f"DIGEST_TASK_TIME_LIMIT={self.time_limit:g}"
            )
        unpriced = [
            m for m in (self.summary_model, self.intro_model) if self.prices.price(m) is None
        ]
        if self.max_cost_usd is not None and unpriced:
            raise BadInput(
                f"DIGEST_MAX_COST_USD is set but {', '.join(unpriced)} has no price, so its "
                "calls could not count against it; add it to DIGEST_PRICES or DIGEST_PRICES_FILE"
            )
        if self.batch_first_look > self.batch_max_look:
            raise BadInput(
                f"DIGEST_BATCH_FIRST_LOOK={self.batch_first_look:g} must not exceed "
                f"DIGEST_BATCH_MAX_LOOK={self.batch_max_look:g}: the wait between looks "
                "doubles from the first up to the longest"
            )
        if not 0 < self.batch_deadline < 24 * 3600:
            raise BadInput(
                f"DIGEST_BATCH_DEADLINE={self.batch_deadline:g}s must be more than 0 and less "
                "than 24h, when the API expires a batch by itself; use 4h, say"
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

    def _check_mail(self) -> None:
        """One transport, fully named; a policy for a send that may have happened."""
        if self.ambiguous_send not in AMBIGUOUS_SEND:
            raise BadInput(
                f"DIGEST_AMBIGUOUS_SEND={self.ambiguous_send!r}: unknown; use wait (an operator "
                "decides with digest mark-sent or digest resend) or resend (a second copy with "
                "the same Message-ID)"
            )
        if self.mail_url is None:
            return
        if self.mail_url != "resend://":
            raise BadInput(
                f"DIGEST_MAIL_URL={redact(self.mail_url)!r}: unknown transport; use resend:// "
                "(Resend's HTTP API), or DIGEST_SMTP_URL for SMTP"
            )
        if self.smtp_url is not None:
            raise BadInput(
                "DIGEST_MAIL_URL and DIGEST_SMTP_URL are both set; set one: resend:// sends "
                "through Resend's HTTP API, DIGEST_SMTP_URL through an SMTP server"
            )
        if not self.resend_api_key:
            raise BadInput(
                "DIGEST_MAIL_URL=resend:// needs RESEND_API_KEY, an API key with sending "
                "access from Resend's dashboard"
            )

    def check_store(self, *, cluster: bool) -> None:
        """Refuse a Redis Cluster where Celery would need it, once connecting has told.

        Raises:
            BadInput: the store is a cluster and no separate broker is set, or the broker is
                RabbitMQ, which leaves Celery's result backend on the cluster.
        """
        if not cluster:
            return
        if self.broker_url is None:
            raise BadInput(
                f"REDIS_URL={redact(self.redis_url or '')!r} is a Redis Cluster node, which "
                "Celery's Redis transport cannot use as its broker; set CELERY_BROKER_URL to a "
                "standalone Redis"
            )
        if self.amqp:
            # With RabbitMQ, task states go to the journal's Redis (see result_backend), and
            # Celery's Redis result backend has no cluster client either.
            raise BadInput(
                f"REDIS_URL={redact(self.redis_url or '')!r} is a Redis Cluster node and "
                "CELERY_BROKER_URL is RabbitMQ, so Celery's task states would go to the cluster, "
                "which its Redis result backend cannot use; use a standalone Redis broker"
            )

    @property
    def amqp(self) -> bool:
        """Whether Celery's broker is RabbitMQ (or another AMQP broker)."""
        return self.broker_url is not None and urlsplit(self.broker_url).scheme in AMQP_SCHEMES

    @property
    def time_limit(self) -> float:
        """One delivery's hard limit: ``DIGEST_TASK_TIME_LIMIT``, else derived from the broker.

        30 minutes, or less where the broker would redeliver a running task sooner: safely
        below RabbitMQ's consumer timeout, or the Redis broker's visibility timeout. So the
        defaults work with either broker, and only a limit set by hand can be refused.
        """
        if self.task_time_limit is not None:
            return self.task_time_limit
        redelivery = self.consumer_timeout if self.amqp else self.visibility_timeout
        return float(min(DEFAULT_TIME_LIMIT, safe_time_limit(redelivery)))

    @property
    def offline_allowed(self) -> bool:
        """Whether a worker with no API key summarizes offline, as ``digest run`` does.

        On the embedded default (no ``REDIS_URL``: one machine, trying things out) it does;
        a deployment that names its Redis refuses unless ``DIGEST_OFFLINE=1`` says so, rather
        than send offline summaries because a secret went missing.
        """
        return self.offline or self.redis_url is None

    def parsed_schedule(self) -> Schedule:
        """``DIGEST_SCHEDULE``, read by beat's entry and the dispatcher alike.

        Checked where it is used, when a worker or beat starts, not by every command line
        (see ``Schedule.parse``).

        Raises:
            BadInput: it is neither a day and a time nor a cron expression.
        """
        try:
            return Schedule.parse(self.schedule)
        except ValueError as bad:
            raise BadInput(f"DIGEST_SCHEDULE={bad}") from None

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone."""
        return ZoneInfo(self.timezone)

    @property
    def max_countdown(self) -> float:
        """The longest broker countdown allowed: a quarter of the visibility timeout."""
        return self.visibility_timeout * 0.25


Kind = Literal[
    "text",
    "optional",
    "path",
    "number",
    "count",
    "flag",
    "optional_number",
    "optional_count",
    "optional_duration",
    "duration",
]


@dataclass(frozen=True)
class Setting:
    """One environment variable: the field it sets, how it is read, and its line of docs.

    The default is the ``Config`` field's own, so it lives in one place; ``SETTINGS`` drives
    ``Config.from_env`` and the table of docs/configuration.md (``python -m tasks.config``
    prints it; a test keeps the two equal).

    Attributes:
        env: the variable.
        field: the ``Config`` field it sets; None for a variable another library reads.
        kind: how its text becomes a value (``optional``: unset is None; ``optional_number``
            and ``optional_count``: unset or 0 is None; ``optional_duration``: ``30d``, unset
            is None).
        low, high: the range of a number or a count.
        doc: the table's meaning column.
        unit: shown after a numeric default.
        shown: the table's default column, where the default alone would not say it.
    """

    env: str
    field: str | None
    kind: Kind
    doc: str
    low: float = 0
    high: float = 0
    unit: str = ""
    shown: str | None = None

    @property
    def default(self) -> Any:
        """The ``Config`` field's default: the one place it is written."""
        assert self.field is not None, f"{self.env} sets no field"
        return Config.__dataclass_fields__[self.field].default

    def read(self, env: Mapping[str, str]) -> Any:
        """This variable's value from ``env``, or the default when it is unset or empty."""
        low, high = self.low, self.high
        if self.kind == "flag":
            return _flag(env, self.env)
        if self.kind == "count":
            return _count(env, self.env, self.default, int(low), int(high))
        if self.kind == "optional_count":
            return _count(env, self.env, 0, int(low), int(high)) or None
        if self.kind == "number":
            return _number(env, self.env, self.default, low, high)
        if self.kind == "optional_number":
            return _number(env, self.env, 0, low, high) or None
        raw = env.get(self.env) or None
        if self.kind == "optional_duration":
            return None if raw is None else parse_duration(self.env, raw)
        if self.kind == "duration":
            return self.default if raw is None else parse_duration(self.env, raw)
        if self.kind == "optional":
            return raw
        if raw is None:
            return self.default
        return Path(raw) if self.kind == "path" else raw

    def shown_default(self) -> str:
        """The default as the configuration table shows it."""
        if self.shown is not None:
            return self.shown
        value = self.default
        if self.kind == "flag":
            return "1" if value else "0"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return f"{value:g}" + (f" ({self.unit})" if self.unit else "")
        return f"`{value}`"


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "REDIS_URL",
        "redis_url",
        "optional",
        "journal store (any node of a Redis Cluster will do), and broker unless "
        "`CELERY_BROKER_URL`; `rediss://` verifies the "
        "certificate and host name, for the journal, the broker and the result backend alike; "
        "redis-py's options go in the query (`?ssl_ca_certs=/etc/ssl/private-ca.pem`, "
        "`ssl_cert_reqs`, `ssl_check_hostname`, `ssl_certfile`, `ssl_keyfile`)",
        shown="unset: embedded Valkey in the state dir",
    ),
    Setting(
        "CELERY_BROKER_URL",
        "broker_url",
        "optional",
        "Celery broker (Redis or RabbitMQ); a standalone Redis when `REDIS_URL` is a Redis Cluster",
        shown="`REDIS_URL`",
    ),
    Setting(
        "DIGEST_STATE_DIR",
        "state_dir",
        "path",
        "embedded server data, file outbox; made 0700 and the server's files 0600 at its start "
        "(they hold model output and drafts)",
    ),
    Setting(
        "DIGEST_ITEMS",
        "items_path",
        "text",
        "this week's updates: a JSON file, or an `https://` URL of a JSON list or an Atom/RSS "
        "feed, fetched once by the `select` step (at most 5 MB) and frozen with the run",
    ),
    Setting(
        "DIGEST_ITEMS_TIMEOUT",
        "items_timeout",
        "number",
        "how long a `DIGEST_ITEMS` URL may take to answer",
        1,
        300,
        "s",
    ),
    Setting(
        "DIGEST_KEY_PREFIX", "key_prefix", "text", "prefix of every Redis key the project writes"
    ),
    Setting(
        "ANTHROPIC_API_KEY",
        None,
        "text",
        "the SDK's own; no key: the CLI summarizes offline and says so",
        shown="unset",
    ),
    Setting("ANTHROPIC_BASE_URL", None, "text", "the SDK's own: the API's address", shown="unset"),
    Setting("DIGEST_SUMMARY_MODEL", "summary_model", "text", "the model of each summary"),
    Setting("DIGEST_INTRO_MODEL", "intro_model", "text", "the model of the opening paragraph"),
    Setting("DIGEST_CONCURRENCY", "concurrency", "count", "summaries in flight at once", 1, 64),
    Setting(
        "DIGEST_MODEL_TIMEOUT",
        "model_timeout",
        "number",
        "one model call's timeout: inside the lease, far inside the time limit",
        1,
        600,
        "s",
    ),
    Setting(
        "DIGEST_RETRY_BASE_DELAY",
        "retry_base_delay",
        "number",
        "first back-off of a failed model call (doubles, capped at 30 s)",
        0,
        60,
        "s",
    ),
    Setting(
        "DIGEST_LONG_BACKOFF",
        "long_backoff",
        "number",
        "longer back-offs and waits for rate-limit room become a durable sleep",
        0,
        3600,
        "s",
    ),
    Setting(
        "DIGEST_MAX_RETRY_AFTER",
        "max_retry_after",
        "number",
        "the longest `retry-after` from the model API that is honoured; a longer one (a date "
        "years ahead, `999999999`) waits this long",
        1,
        86400,
        "s",
    ),
    Setting(
        "DIGEST_LEASE_TTL",
        "lease_ttl",
        "number",
        "lease expiry; renewed every TTL/3",
        0.5,
        3600,
        "s",
    ),
    Setting(
        "DIGEST_SMTP_URL",
        "smtp_url",
        "optional",
        "`smtps://[user:pass@]host:port` (TLS from the first byte) or `smtp://...` (STARTTLS "
        "whenever the server offers it); the certificate is verified and must name the host; a "
        "password is never sent in clear",
        shown="unset: file outbox",
    ),
    Setting(
        "DIGEST_SMTP_REQUIRE_TLS",
        "smtp_require_tls",
        "flag",
        "1: refuse an `smtp://` server that offers no STARTTLS even without a password",
    ),
    Setting(
        "SSL_CERT_FILE",
        None,
        "text",
        "OpenSSL's own: a PEM bundle to trust instead of the default bundle (a private CA); "
        "`SSL_CERT_DIR` likewise for a directory",
        shown="the system's trust store",
    ),
    Setting(
        "DIGEST_SMTP_TIMEOUT",
        "smtp_timeout",
        "number",
        "each SMTP operation; also how long after claiming the send a worker may still start "
        "DATA, so how long a later holder waits for a claimant that may be alive",
        1,
        600,
        "s",
    ),
    Setting(
        "DIGEST_SMTP_IDEMPOTENCY_HEADER",
        "smtp_idempotency_header",
        "optional",
        "a header the SMTP relay drops repeats of, set to the send's key "
        "(`Resend-Idempotency-Key` for Resend's relay): a send that may have happened is then "
        "repeated under it, never delivered twice",
        shown="unset: a plain relay",
    ),
    Setting(
        "DIGEST_MAIL_URL",
        "mail_url",
        "optional",
        "`resend://`: send through Resend's HTTP API with an `Idempotency-Key` (Resend "
        "delivers one email per key within 24 h); instead of `DIGEST_SMTP_URL`",
        shown="unset: `DIGEST_SMTP_URL`, else the file outbox",
    ),
    Setting(
        "RESEND_API_KEY",
        "resend_api_key",
        "optional",
        "Resend's API key, with `DIGEST_MAIL_URL=resend://`; never printed",
        shown="unset",
    ),
    Setting(
        "RESEND_BASE_URL",
        "resend_base_url",
        "text",
        "Resend's API address, as Resend's own SDKs take it; `http://` only on loopback",
    ),
    Setting(
        "DIGEST_AMBIGUOUS_SEND",
        "ambiguous_send",
        "text",
        "a send that may have happened (the SMTP server did not answer the end of the message, "
        "a worker died after it): `wait` for `digest mark-sent` or `digest resend`; `resend` "
        "sends it again at once, with the same `Message-ID`; a transport that deduplicates "
        "repeats it under its key either way",
    ),
    Setting("DIGEST_FROM", "sender", "text", "the email's sender"),
    Setting("DIGEST_TO", "recipient", "text", "the email's recipient"),
    Setting("DIGEST_TIMEZONE", "timezone", "text", "the schedule's time zone"),
    Setting(
        "DIGEST_SCHEDULE",
        "schedule",
        "text",
        "when beat sends the week's digest: a day and a time (`fri 17:30`) or a cron expression "
        "read by Celery's parser (`0 8 * * 1-5`: one digest a week all the same, the run id is "
        "the ISO week); refused at a worker's or beat's start",
    ),
    Setting(
        "DIGEST_OFFLINE",
        "offline",
        "flag",
        "1: a worker with no API key summarizes offline; without `REDIS_URL` (the embedded "
        "default) it does so anyway and logs it once, with `REDIS_URL` it refuses every run",
    ),
    Setting("DIGEST_APPROVAL", "approval", "flag", "the approval gate: 1 waits for a decision"),
    Setting(
        "DIGEST_APPROVAL_TIMEOUT",
        "approval_timeout",
        "number",
        "how long the approval gate waits",
        1,
        30 * 86400,
        "s",
    ),
    Setting(
        "DIGEST_SWEEP_INTERVAL",
        "sweep_interval",
        "number",
        "due sweep: wake-ups and crash recovery",
        0.5,
        3600,
        "s",
    ),
    Setting(
        "DIGEST_WAITAOF",
        "wait_aof",
        "flag",
        "wait for the local AOF fsync of every record (WAITAOF, Redis 7.2+/Valkey)",
    ),
    Setting(
        "DIGEST_WAIT_REPLICAS",
        "wait_replicas",
        "count",
        "replicas every record must reach before the run goes on (WAIT, in the record's round "
        "trip): a failover to one of them loses no recorded step; refused at start when a "
        "master has fewer",
        0,
        5,
    ),
    Setting(
        "DIGEST_JOURNAL_SHARDS",
        "journal_shards",
        "count",
        "index shards runs are spread over (a Redis Cluster: more than its masters); part of "
        "the key layout, so set it once",
        1,
        1024,
    ),
    Setting(
        "DIGEST_CATCH_UP_WEEKS",
        "catch_up_weeks",
        "count",
        "missed weeks the dispatcher enqueues after an outage",
        0,
        52,
    ),
    Setting(
        "DIGEST_VISIBILITY_TIMEOUT",
        "visibility_timeout",
        "number",
        "the Redis broker's redelivery timeout",
        60,
        43200,
        "s",
    ),
    Setting(
        "DIGEST_TASK_TIME_LIMIT",
        "task_time_limit",
        "optional_number",
        "hard limit of one delivery; one set here must stay below 90% of the broker's "
        "redelivery timeout (the visibility timeout, or RabbitMQ's consumer timeout)",
        30,
        43200,
        shown="1800 (s), or 90% of the broker's redelivery timeout less 1 s where that is "
        "shorter (1619 with RabbitMQ's default)",
    ),
    Setting(
        "DIGEST_CONSUMER_TIMEOUT",
        "consumer_timeout",
        "number",
        "RabbitMQ's `consumer_timeout` (its default: 30 min); with an AMQP broker the time limit "
        "stays below 90% of it (the default is derived from it; one set by hand is refused "
        "above)",
        60,
        7 * 86400,
        "s",
    ),
    Setting(
        "DIGEST_QUEUE",
        "queue",
        "text",
        "the queue digests go to; one per deployment sharing a broker",
    ),
    Setting(
        "DIGEST_SOFT_SHUTDOWN_TIMEOUT",
        "soft_shutdown_timeout",
        "number",
        "Celery's soft shutdown window (see Guarantees)",
        0,
        3600,
        "s",
    ),
    Setting(
        "DIGEST_RUN_RETRY_DELAY",
        "run_retry_delay",
        "number",
        "a run failed for a transient cause is retried after this, doubling up to "
        "`DIGEST_RUN_RETRY_MAX_DELAY` (up to 10% sooner at random)",
        0.1,
        86400,
        "s",
    ),
    Setting(
        "DIGEST_RUN_RETRY_MAX_DELAY",
        "run_retry_max_delay",
        "number",
        "the cap of that doubling delay",
        0.1,
        86400,
        "s",
    ),
    Setting(
        "DIGEST_GIVE_UP_AFTER",
        "give_up_after",
        "number",
        "from a run's first transient failure to failing it for good; 0 turns automatic "
        "retries off",
        0,
        30 * 86400,
        "s",
    ),
    Setting(
        "DIGEST_METRICS_PORT",
        "metrics_port",
        "optional_count",
        "a worker serves Prometheus metrics on this port",
        0,
        65535,
        shown="unset",
    ),
    Setting(
        "DIGEST_LOG_FORMAT",
        "log_format",
        "text",
        "`text`, or `json` for one JSON object per line; either way every line a run writes "
        "names its run, Celery task, attempt and fence",
    ),
    Setting(
        "DIGEST_RUN_RETENTION",
        "run_retention",
        "optional_duration",
        "beat purges, every Sunday at 03:30, the runs that ended (done, cancelled, failed) "
        "longer ago than this (`90d`; see `digest purge`)",
        shown="unset: runs are kept",
    ),
    Setting(
        "PROMETHEUS_MULTIPROC_DIR",
        None,
        "text",
        "where pool children's counters are summed (`prometheus_client`'s own)",
        shown="`<state dir>/metrics-<pid>`",
    ),
    Setting(
        "DIGEST_CONSOLE_TOKEN",
        None,
        "text",
        "required by `digest console --host` other than loopback",
        shown="unset",
    ),
    Setting(
        "DIGEST_CONSOLE_ORIGIN",
        None,
        "text",
        "the origin browsers reach `digest console` by, besides the address it is bound to "
        "(a public name or a proxy: `https://digest.example.com`); required with `--host 0.0.0.0`",
        shown="unset",
    ),
    Setting(
        "DIGEST_MAX_COST_USD",
        "max_cost_usd",
        "optional_number",
        "a run's model budget in dollars: each call reserves its estimate first; it stops "
        "before one that does not fit",
        0,
        1e6,
        shown="unset: no limit",
    ),
    Setting(
        "DIGEST_BATCH",
        "batch",
        "flag",
        "1: new runs ask the model by Message Batches (`digest run --batch` for one run): the "
        "summaries as one batch, then the opening as a second, at half the price; each run "
        "waits without a worker, looking at its batch now and then",
    ),
    Setting(
        "DIGEST_BATCH_DEADLINE",
        "batch_deadline",
        "duration",
        "from a batch step's start: what its batch has not answered by then is cancelled and "
        "asked synchronously, so a slow batch never makes the email late (schedule batch "
        "weeks this much earlier than the email must arrive)",
        shown="`4h`",
    ),
    Setting(
        "DIGEST_BATCH_FIRST_LOOK",
        "batch_first_look",
        "number",
        "from a batch's creation to the run's first look at it; doubles after each look",
        0.1,
        3600,
        "s",
    ),
    Setting(
        "DIGEST_BATCH_MAX_LOOK",
        "batch_max_look",
        "number",
        "the longest wait between two looks at a batch (a `retry-after` may ask longer)",
        0.1,
        86400,
        "s",
    ),
    Setting(
        "DIGEST_PRICES_FILE",
        None,
        "text",
        "per-model prices, a JSON file then inline JSON (`DIGEST_PRICES`): "
        '`{"<model>": {"input": 1.0, "output": 5.0}}` in USD per million tokens (optionally '
        "`cache_write`, `cache_read`)",
        shown="the defaults below",
    ),
    Setting(
        "DIGEST_RATE_LIMITS",
        None,
        "text",
        "model API rate limits per minute over what its headers say: "
        '`{"<model>": {"requests": 50, "input_tokens": 50000, "output_tokens": 10000}}`',
        shown="unset: learned from the API",
    ),
    Setting("CRASH", None, "text", "fault injection point (see above)", shown="unset"),
)


def settings_table() -> str:
    """The configuration table of docs/configuration.md, one row per variable."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.env}` | {s.shown_default()} | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(settings_table())

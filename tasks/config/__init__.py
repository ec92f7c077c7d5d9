"""The digest's configuration: read once from the environment, typed, checked at start.

Conflicting settings are refused when a process starts, not discovered at 3 a.m. This room
holds ``Config`` here, how each variable is read (``variables``), the values that are parsed
settings (``prices``, ``limits``, ``schedule``) and the documentation table (``table``). It
imports nothing else of the app but its errors (a contract in pyproject.toml), so every other
room may read the settings and none is pulled in by them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from journal import redelivers_running, safe_time_limit
from journal.logs import add_secret, add_url_secrets, redact
from tasks.config.limits import Overrides
from tasks.config.prices import PriceTable
from tasks.config.schedule import DEFAULT_SCHEDULE, Schedule, Weekly, week_monday
from tasks.config.variables import SETTINGS
from tasks.errors import BadInput

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

# The models asked when the settings name none: the summaries' and the opening's.
DEFAULT_SUMMARY_MODEL = "claude-haiku-5-5"
DEFAULT_INTRO_MODEL = "claude-sonnet-5-5"


def model_chain(raw: str) -> tuple[str, ...]:
    """A model setting's ids, in order: ``a,b`` asks ``a`` first and ``b`` when ``a`` is down."""
    return tuple(part.strip() for part in raw.split(","))


def _register_secrets(env: Mapping[str, str]) -> None:
    """Tell the masking function every secret this process was configured with.

    First, before any setting is checked: an error about a bad setting must not show them.
    """
    for name in SECRET_VARIABLES:
        add_secret(env.get(name))
    for name in URL_VARIABLES:
        add_url_secrets(env.get(name))


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


WEB = ("http", "https")


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
        summary_model, intro_model: each a comma list of model ids, the primary first, then
            the fallbacks in the order they are asked (``summary_models``, ``intro_models``).
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
        degrade_at: a week's deadline, a day and a time: what has no model summary by then is
            summarized offline (``degrade_deadline``); None, never.
        offline: allow the worker to summarize without an API key.
        approval: wait for a human approval before sending.
        approval_timeout: seconds to wait for it.
        sweep_interval: seconds between due sweeps (wake-ups and crash recovery).
        redeliver_after: seconds a sent run may go unopened before the due sweep sends it
            again, or a run the sweep sent goes unopened before it sends it again.
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
        metrics_host: the address it listens on: this host alone unless told otherwise.
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
        flower_url: the deployment's Flower, linked from the console's runs page: the
            workers and their tasks, which the journal does not show.
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
    degrade_at: str | None = None
    offline: bool = False
    approval: bool = False
    approval_timeout: float = 24 * 3600.0
    sweep_interval: float = 15.0
    redeliver_after: float = 300.0
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
    metrics_host: str = "127.0.0.1"
    flower_url: str | None = None
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
        defaults = {f.name: f.default for f in fields(cls)}
        values = {s.field: s.read(env, defaults[s.field]) for s in SETTINGS if s.field is not None}
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
        if self.flower_url is not None and urlsplit(self.flower_url).scheme not in WEB:
            # Shown as a link: any other scheme (javascript:) would make it a script.
            raise BadInput(
                f"DIGEST_FLOWER_URL={self.flower_url!r}: not a web address; use http:// or "
                "https://, such as http://flower:5555"
            )
        self._check_mail()
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadInput(
                f"DIGEST_TIMEZONE={self.timezone!r}: unknown time zone; use an IANA name such "
                "as Europe/Berlin"
            ) from None
        self.parsed_degrade_at()
        self._check_time_limits()
        self._check_models()
        self._check_spending()
        self._check_retries()

    def _check_time_limits(self) -> None:
        """A delivery's time limit below every redelivery timeout, the model's below it."""
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

    def _check_models(self) -> None:
        """Each chain a list of distinct ids; every fallback priced, so its cost is counted."""
        for name, raw in (
            ("DIGEST_SUMMARY_MODEL", self.summary_model),
            ("DIGEST_INTRO_MODEL", self.intro_model),
        ):
            chain = model_chain(raw)
            if "" in chain:
                raise BadInput(
                    f"{name}={raw!r}: an empty model id; list ids separated by commas, the "
                    "primary first, such as claude-haiku-5-5,claude-sonnet-5-5"
                )
            twice = sorted({m for m in chain if chain.count(m) > 1})
            if twice:
                raise BadInput(
                    f"{name}={raw!r}: {', '.join(twice)} is listed twice; list each model once, "
                    "in the order to ask them"
                )
            unpriced = [m for m in chain if self.prices.price(m) is None]
            if len(chain) > 1 and unpriced:
                raise BadInput(
                    f"{name}={raw!r}: {', '.join(unpriced)} has no price, so a call it answers "
                    "could not be costed; add it to DIGEST_PRICES or DIGEST_PRICES_FILE"
                )

    @property
    def summary_models(self) -> tuple[str, ...]:
        """The summaries' models: the primary, then each fallback in order."""
        return model_chain(self.summary_model)

    @property
    def intro_models(self) -> tuple[str, ...]:
        """The opening paragraph's models: the primary, then each fallback in order."""
        return model_chain(self.intro_model)

    def _check_spending(self) -> None:
        """A budget only over priced models, and batch waits that fit a batch's life."""
        models = dict.fromkeys((*self.summary_models, *self.intro_models))
        unpriced = [m for m in models if self.prices.price(m) is None]
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

    def _check_retries(self) -> None:
        """A retry delay within its cap, and a lease short beside the redelivery timeout."""
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

    def parsed_degrade_at(self) -> Weekly | None:
        """``DIGEST_DEGRADE_AT``, parsed; None when unset. Checked at every start.

        Raises:
            BadInput: it is not a day and a time.
        """
        if self.degrade_at is None:
            return None
        try:
            return Weekly.parse(self.degrade_at)
        except ValueError:
            raise BadInput(
                f"DIGEST_DEGRADE_AT={self.degrade_at!r}: not a day and a time; use a weekday "
                "and a time in DIGEST_TIMEZONE, such as mon 11:00 (or mon 11:00:30)"
            ) from None

    def degrade_deadline(self, run_id: str, start: float) -> float | None:
        """A run's deadline in epoch seconds, or None if ``DIGEST_DEGRADE_AT`` is unset.

        For a week's run id, the first ``DIGEST_DEGRADE_AT`` at or after the week's scheduled
        time, however late the run first starts (a week first started past its deadline
        degrades at once, rather than waiting for next week's); for any other id, the first
        at or after ``start``, its first start. A run freezes it then
        (``tasks.job.workflow.frozen_settings``), so a change of the setting never moves it.
        """
        weekly = self.parsed_degrade_at()
        if weekly is None:
            return None
        monday = week_monday(run_id)
        since = (
            datetime.fromtimestamp(start, UTC)
            if monday is None
            else self.parsed_schedule().first_in_week(monday, self.zone)
        )
        return weekly.next_at(since, self.zone).timestamp()

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone."""
        return ZoneInfo(self.timezone)

    @property
    def max_countdown(self) -> float:
        """The longest broker countdown allowed: a quarter of the visibility timeout."""
        return self.visibility_timeout * 0.25

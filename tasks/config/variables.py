"""Every environment variable the digest reads: the field it sets, how, and its line of docs.

Knows nothing of ``Config`` itself, which reads through this table: each field's default is
written once, on the field, and handed to ``Setting.read`` and ``Setting.shown_default``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tasks.errors import BadInput


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

    The default is the ``Config`` field's own, so it lives in one place, and is handed in by
    whoever reads or shows it; ``SETTINGS`` drives ``Config.from_env`` and the table of
    docs/configuration.md (``python -m tasks.config`` prints it; a test keeps the two equal).

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

    def read(self, env: Mapping[str, str], default: Any) -> Any:
        """This variable's value from ``env``, or ``default`` (its field's) when unset or empty."""
        low, high = self.low, self.high
        if self.kind == "flag":
            return _flag(env, self.env)
        if self.kind == "count":
            return _count(env, self.env, default, int(low), int(high))
        if self.kind == "optional_count":
            return _count(env, self.env, 0, int(low), int(high)) or None
        if self.kind == "number":
            return _number(env, self.env, default, low, high)
        if self.kind == "optional_number":
            return _number(env, self.env, 0, low, high) or None
        raw = env.get(self.env) or None
        if self.kind == "optional_duration":
            return None if raw is None else parse_duration(self.env, raw)
        if self.kind == "duration":
            return default if raw is None else parse_duration(self.env, raw)
        if self.kind == "optional":
            return raw
        if raw is None:
            return default
        return Path(raw) if self.kind == "path" else raw

    def shown_default(self, value: Any) -> str:
        """The default, ``value``, as the configuration table shows it."""
        if self.shown is not None:
            return self.shown
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
    Setting(
        "DIGEST_SUMMARY_MODEL",
        "summary_model",
        "text",
        "the model of each summary; a comma list is a fallback chain, the primary first "
        "(docs/operations.md)",
    ),
    Setting(
        "DIGEST_INTRO_MODEL",
        "intro_model",
        "text",
        "the model of the opening paragraph; a comma list as for the summaries",
    ),
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
        "DIGEST_DEGRADE_AT",
        "degrade_at",
        "optional",
        "the deadline of a week's digest, a day and a time in `DIGEST_TIMEZONE` (`mon 11:00`, "
        "seconds allowed): the first one after the week's scheduled time is frozen with a "
        "run (after its first start, for a run id that names no week), so a week first "
        "started past it degrades at once; items still without a model summary then get "
        "the offline summary (never a refused one) and the email says so",
        shown="unset: never",
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
        "DIGEST_REDELIVER_AFTER",
        "redeliver_after",
        "number",
        "how long a sent run may go unopened (its message lost, or stranded with a killed "
        "worker until the broker's visibility timeout) before the due sweep sends it again",
        1,
        86400,
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
        "DIGEST_METRICS_HOST",
        "metrics_host",
        "text",
        "the address a worker's metrics listen on; `0.0.0.0` for every interface, where a "
        "scraper on another host must reach them",
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
        "DIGEST_FLOWER_URL",
        "flower_url",
        "optional",
        "where the deployment's Flower answers (`http://flower:5555`); the console's runs page "
        "links to it",
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
        "weeks this much earlier than the email must arrive); the run's own deadline "
        "(DIGEST_DEGRADE_AT) ends it sooner when it comes first",
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

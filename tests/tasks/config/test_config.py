"""Every setting read from the environment: its default, its range, and the conflicts refused."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from journal.integrations.celery import at_least_once_settings
from tasks.config import Config
from tasks.config.table import settings_table
from tasks.config.variables import SETTINGS
from tasks.errors import BadInput
from tests.support import ROOT, Deployment


def test_an_empty_environment_gives_the_documented_defaults() -> None:
    config = Config.from_env({})
    assert config == Config()
    assert (config.redis_url, config.broker_url, config.smtp_url) == (None, None, None)
    assert config.state_dir == Path(".digest")
    assert config.items_path == "data/items.json"
    assert config.key_prefix == "journal"
    assert (config.summary_model, config.intro_model) == ("claude-haiku-5-5", "claude-sonnet-5-5")
    assert (config.concurrency, config.lease_ttl, config.model_timeout) == (3, 30.0, 20.0)
    assert (config.retry_base_delay, config.long_backoff) == (1.0, 30.0)
    assert (config.sender, config.recipient) == ("digest@example.com", "team@example.com")
    assert (config.timezone, config.zone.key) == ("UTC", "UTC")
    assert (config.offline, config.approval, config.wait_aof) == (False, False, False)
    assert (config.approval_timeout, config.sweep_interval, config.catch_up_weeks) == (
        86400.0,
        15.0,
        4,
    )
    assert (config.visibility_timeout, config.time_limit) == (3600.0, 1800.0)
    assert config.max_countdown == 900.0
    assert (config.run_retry_delay, config.run_retry_max_delay, config.give_up_after) == (
        60.0,
        3600.0,
        86400.0,
    )


def test_empty_values_count_as_unset() -> None:
    blank = {"REDIS_URL": "", "DIGEST_CONCURRENCY": "", "DIGEST_TIMEZONE": "", "DIGEST_OFFLINE": ""}
    assert Config.from_env(blank) == Config()


def test_every_variable_is_read() -> None:
    config = Config.from_env(
        {
            "REDIS_URL": "redis://store:6379/2",
            "CELERY_BROKER_URL": "amqp://broker//",
            "DIGEST_STATE_DIR": "/var/lib/digest",
            "DIGEST_ITEMS": "/srv/items.json",
            "DIGEST_KEY_PREFIX": "acme",
            "DIGEST_SUMMARY_MODEL": "claude-haiku-x",
            "DIGEST_INTRO_MODEL": "claude-sonnet-x",
            "DIGEST_CONCURRENCY": "8",
            "DIGEST_LEASE_TTL": "12.5",
            "DIGEST_MODEL_TIMEOUT": "20",
            "DIGEST_RETRY_BASE_DELAY": "0.5",
            "DIGEST_LONG_BACKOFF": "10",
            "DIGEST_MAX_RETRY_AFTER": "600",
            "DIGEST_SMTP_URL": "smtp://mail:25",
            "DIGEST_SMTP_REQUIRE_TLS": "1",
            "DIGEST_FROM": "news@acme.test",
            "DIGEST_TO": "all@acme.test",
            "DIGEST_TIMEZONE": "Europe/Berlin",
            "DIGEST_OFFLINE": "yes",
            "DIGEST_APPROVAL": "on",
            "DIGEST_APPROVAL_TIMEOUT": "3600",
            "DIGEST_SWEEP_INTERVAL": "5",
            "DIGEST_WAITAOF": "1",
            "DIGEST_CATCH_UP_WEEKS": "0",
            "DIGEST_VISIBILITY_TIMEOUT": "7200",
            "DIGEST_TASK_TIME_LIMIT": "600",
            "DIGEST_RUN_RETRY_DELAY": "30",
            "DIGEST_RUN_RETRY_MAX_DELAY": "900",
            "DIGEST_GIVE_UP_AFTER": "0",
            "DIGEST_CONSUMER_TIMEOUT": "3000",
            "DIGEST_FLOWER_URL": "https://flower.example.com/",
        }
    )
    assert config == Config(
        redis_url="redis://store:6379/2",
        broker_url="amqp://broker//",
        state_dir=Path("/var/lib/digest"),
        items_path="/srv/items.json",
        key_prefix="acme",
        summary_model="claude-haiku-x",
        intro_model="claude-sonnet-x",
        concurrency=8,
        lease_ttl=12.5,
        model_timeout=20.0,
        retry_base_delay=0.5,
        long_backoff=10.0,
        max_retry_after=600.0,
        smtp_url="smtp://mail:25",
        smtp_require_tls=True,
        sender="news@acme.test",
        recipient="all@acme.test",
        timezone="Europe/Berlin",
        offline=True,
        approval=True,
        approval_timeout=3600.0,
        sweep_interval=5.0,
        wait_aof=True,
        catch_up_weeks=0,
        visibility_timeout=7200.0,
        task_time_limit=600.0,
        run_retry_delay=30.0,
        run_retry_max_delay=900.0,
        give_up_after=0.0,
        consumer_timeout=3000.0,
        flower_url="https://flower.example.com/",
    )


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("DIGEST_CONCURRENCY", "lots", "not a number; use a value from 1 to 64"),
        ("DIGEST_CONCURRENCY", "0", "out of range; use a value from 1 to 64"),
        ("DIGEST_CONCURRENCY", "65", "out of range; use a value from 1 to 64"),
        ("DIGEST_CONCURRENCY", "nan", "out of range; use a value from 1 to 64"),
        ("DIGEST_CONCURRENCY", "2.5", "not a whole number; use a value from 1 to 64"),
        ("DIGEST_LEASE_TTL", "0.1", "out of range; use a value from 0.5 to 3600"),
        ("DIGEST_LEASE_TTL", "inf", "out of range; use a value from 0.5 to 3600"),
        ("DIGEST_MODEL_TIMEOUT", "0", "out of range; use a value from 1 to 600"),
        ("DIGEST_RETRY_BASE_DELAY", "-1", "out of range; use a value from 0 to 60"),
        ("DIGEST_LONG_BACKOFF", "1e9", "out of range; use a value from 0 to 3600"),
        ("DIGEST_APPROVAL_TIMEOUT", "0", "out of range; use a value from 1 to 2.592e+06"),
        ("DIGEST_SWEEP_INTERVAL", "0.1", "out of range; use a value from 0.5 to 3600"),
        ("DIGEST_CATCH_UP_WEEKS", "53", "out of range; use a value from 0 to 52"),
        ("DIGEST_CATCH_UP_WEEKS", "1.5", "not a whole number; use a value from 0 to 52"),
        ("DIGEST_VISIBILITY_TIMEOUT", "10", "out of range; use a value from 60 to 43200"),
        ("DIGEST_TASK_TIME_LIMIT", "10", "out of range; use a value from 30 to 43200"),
        ("DIGEST_RUN_RETRY_DELAY", "0", "out of range; use a value from 0.1 to 86400"),
        ("DIGEST_RUN_RETRY_MAX_DELAY", "1e6", "out of range; use a value from 0.1 to 86400"),
        ("DIGEST_GIVE_UP_AFTER", "-1", "out of range; use a value from 0 to 2.592e+06"),
        ("DIGEST_OFFLINE", "maybe", "not a flag; use 1 or 0"),
        ("DIGEST_APPROVAL", "2", "not a flag; use 1 or 0"),
        ("DIGEST_WAITAOF", "sometimes", "not a flag; use 1 or 0"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(name: str, value: str, problem: str) -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({name: value})
    assert str(caught.value) == f"{name}={value!r}: {problem}"


@pytest.mark.parametrize("url", ["javascript:alert(1)", "flower:5555", "ftp://flower/"])
def test_a_flower_url_that_is_not_a_web_address_is_refused(url: str) -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({"DIGEST_FLOWER_URL": url}).check()
    assert str(caught.value) == (
        f"DIGEST_FLOWER_URL={url!r}: not a web address; use http:// or https://, "
        "such as http://flower:5555"
    )


@pytest.mark.parametrize(
    ("name", "url", "problem"),
    [
        (
            "REDIS_URL",
            "http://:cfg-pw-1@cache:6379/0",
            "'http://:***@cache:6379/0': the scheme must be redis, rediss or unix; "
            "for example redis://localhost:6379/0 or rediss://cache.example.com:6380/0",
        ),
        (
            "REDIS_URL",
            "redis://:cfg-pw-2@cache:99999/0",
            "'redis://:***@cache:99999/0': the port must be a number from 1 to 65535",
        ),
        (
            "CELERY_BROKER_URL",
            "amqp://digest:cfg-pw-3@rabbit:port//",
            "'amqp://digest:***@rabbit:port//': the port must be a number from 1 to 65535",
        ),
    ],
)
def test_a_bad_store_or_broker_url_is_one_line_with_its_password_masked(
    name: str, url: str, problem: str
) -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({name: url})
    assert str(caught.value) == f"{name}={problem}"


def test_a_first_retry_delay_above_its_cap_is_refused() -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({"DIGEST_RUN_RETRY_DELAY": "600", "DIGEST_RUN_RETRY_MAX_DELAY": "60"})
    assert str(caught.value) == (
        "DIGEST_RUN_RETRY_DELAY=600 must not exceed DIGEST_RUN_RETRY_MAX_DELAY=60: the first "
        "retry delay doubles up to that cap"
    )


def test_a_model_setting_is_read_as_a_chain_the_primary_first() -> None:
    config = Config.from_env({"DIGEST_SUMMARY_MODEL": "claude-haiku-5-5, claude-sonnet-5-5"})
    assert config.summary_models == ("claude-haiku-5-5", "claude-sonnet-5-5")
    assert config.intro_models == ("claude-sonnet-5-5",)  # the default: one model, no fallback


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (
            "claude-haiku-5-5,",
            "DIGEST_SUMMARY_MODEL='claude-haiku-5-5,': an empty model id; list ids separated by "
            "commas, the primary first, such as claude-haiku-5-5,claude-sonnet-5-5",
        ),
        (
            "claude-haiku-5-5,claude-haiku-5-5",
            "DIGEST_SUMMARY_MODEL='claude-haiku-5-5,claude-haiku-5-5': claude-haiku-5-5 is "
            "listed twice; list each model once, in the order to ask them",
        ),
        (
            "claude-haiku-5-5,claude-unpriced-1",
            "DIGEST_SUMMARY_MODEL='claude-haiku-5-5,claude-unpriced-1': claude-unpriced-1 has no "
            "price, so a call it answers could not be costed; add it to DIGEST_PRICES or "
            "DIGEST_PRICES_FILE",
        ),
    ],
    ids=["empty", "twice", "unpriced"],
)
def test_a_bad_fallback_chain_is_refused_in_one_line(value: str, problem: str) -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({"DIGEST_SUMMARY_MODEL": value})
    assert str(caught.value) == problem


def test_an_unknown_time_zone_is_refused() -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({"DIGEST_TIMEZONE": "Mars/Olympus"})
    assert str(caught.value) == (
        "DIGEST_TIMEZONE='Mars/Olympus': unknown time zone; use an IANA name such as Europe/Berlin"
    )


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({"DIGEST_LOG_FORMAT": "xml"})
    assert str(caught.value) == "DIGEST_LOG_FORMAT='xml': unknown log format; use text or json"
    assert Config.from_env({"DIGEST_LOG_FORMAT": "json"}).log_format == "json"


@pytest.mark.parametrize(
    ("limit", "refused"), [("3240", True), ("3300", True), ("3239", False), ("1800", False)]
)
def test_the_task_time_limit_must_stay_below_90_percent_of_the_visibility_timeout(
    limit: str, refused: bool
) -> None:
    env = {"DIGEST_VISIBILITY_TIMEOUT": "3600", "DIGEST_TASK_TIME_LIMIT": limit}
    if not refused:
        assert Config.from_env(env).task_time_limit == float(limit)
        return
    with pytest.raises(BadInput) as caught:
        Config.from_env(env)
    message = str(caught.value)
    assert message.startswith(f"DIGEST_TASK_TIME_LIMIT={limit} must stay below 90% of ")
    assert "DIGEST_VISIBILITY_TIMEOUT=3600" in message


@pytest.mark.parametrize("limit", [899.0, 899.99, 900.0, 1000.0])
def test_the_app_and_the_library_refuse_the_same_time_limits(limit: float) -> None:
    # One rule (journal.limits), so a setting the app accepts never fails in Celery's settings.
    env = {"DIGEST_VISIBILITY_TIMEOUT": "1000", "DIGEST_TASK_TIME_LIMIT": f"{limit:g}"}
    try:
        Config.from_env(env)
        app_refused = False
    except BadInput:
        app_refused = True
    try:
        at_least_once_settings(visibility_timeout=1000, task_time_limit=limit)
        library_refused = False
    except ValueError:
        library_refused = True
    assert app_refused == library_refused == (limit >= 900)


@pytest.mark.parametrize(
    ("broker", "env", "refused"),
    [
        ("amqp://mq//", {"DIGEST_TASK_TIME_LIMIT": "1800"}, True),  # its 30 min default
        ("pyamqp://mq//", {"DIGEST_TASK_TIME_LIMIT": "1620"}, True),
        ("amqps://mq//", {"DIGEST_TASK_TIME_LIMIT": "1619"}, False),
        ("amqp://mq//", {"DIGEST_CONSUMER_TIMEOUT": "3600"}, False),  # raised on the broker too
        ("redis://mq:6379/0", {}, False),  # Redis has no consumer timeout, only visibility
        (None, {}, False),
    ],
)
def test_with_rabbitmq_the_time_limit_must_stay_below_its_consumer_timeout(
    broker: str | None, env: dict[str, str], refused: bool
) -> None:
    env = {**env, **({"CELERY_BROKER_URL": broker} if broker else {})}
    if not refused:
        Config.from_env(env)
        return
    with pytest.raises(BadInput) as caught:
        Config.from_env(env)
    limit = env["DIGEST_TASK_TIME_LIMIT"]
    assert str(caught.value) == (
        f"DIGEST_TASK_TIME_LIMIT={limit} must stay below 90% of RabbitMQ's consumer timeout "
        "(DIGEST_CONSUMER_TIMEOUT=1800), or RabbitMQ closes the channel of a delivery still "
        "running and redelivers it; lower DIGEST_TASK_TIME_LIMIT to 1619 or less, or raise "
        "consumer_timeout on the broker and DIGEST_CONSUMER_TIMEOUT to match"
    )


@pytest.mark.parametrize(
    ("env", "limit"),
    [
        ({}, 1800),  # the embedded Redis: 30 min, far below its visibility timeout
        ({"CELERY_BROKER_URL": "amqp://mq//"}, 1619),  # below RabbitMQ's 30 min
        ({"CELERY_BROKER_URL": "pyamqp://mq//", "DIGEST_CONSUMER_TIMEOUT": "7200"}, 1800),
        ({"REDIS_URL": "redis://r:6379/0", "DIGEST_VISIBILITY_TIMEOUT": "600"}, 539),
    ],
)
def test_the_default_time_limit_is_derived_from_the_broker_in_use(
    env: dict[str, str], limit: int
) -> None:
    assert Config.from_env(env).time_limit == limit


def test_the_model_timeout_must_be_shorter_than_the_task_time_limit() -> None:
    env = {"DIGEST_TASK_TIME_LIMIT": "60", "DIGEST_MODEL_TIMEOUT": "60"}
    with pytest.raises(BadInput) as caught:
        Config.from_env(env)
    assert str(caught.value) == (
        "DIGEST_MODEL_TIMEOUT=60 must be shorter than DIGEST_TASK_TIME_LIMIT=60"
    )
    assert Config.from_env(env | {"DIGEST_MODEL_TIMEOUT": "59"}).model_timeout == 59.0


@pytest.mark.parametrize(("ttl", "refused"), [("7.6", True), ("450", True), ("7.5", False)])
def test_a_lease_ttl_too_long_for_the_visibility_timeout_is_refused(
    ttl: str, refused: bool
) -> None:
    # A busy delivery retries after the lease's remaining time: twice the TTL must stay within
    # a quarter of the visibility timeout (here 60 s, so 7.5 s at most).
    env = {
        "DIGEST_VISIBILITY_TIMEOUT": "60",
        "DIGEST_TASK_TIME_LIMIT": "50",
        "DIGEST_MODEL_TIMEOUT": "10",
        "DIGEST_LEASE_TTL": ttl,
    }
    if not refused:
        assert Config.from_env(env).lease_ttl == float(ttl)
        return
    with pytest.raises(BadInput) as caught:
        Config.from_env(env)
    assert str(caught.value).startswith(
        f"DIGEST_LEASE_TTL={ttl} is too long for DIGEST_VISIBILITY_TIMEOUT=60: "
    )


@pytest.mark.slow
def test_the_cli_reports_a_bad_setting_in_one_line_and_exits_2(deployment: Deployment) -> None:
    refused = deployment.cli("run", "2026-w42", env={"DIGEST_CONCURRENCY": "lots"})
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "digest: DIGEST_CONCURRENCY='lots': not a number; use a value from 1 to 64\n"
    )
    assert not (deployment.state_dir / "valkey").exists()  # refused before starting a server


def test_the_documented_configuration_table_is_the_settings_table() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "\n## Settings\n\n" in page, "docs/configuration.md has no Settings section"
    section = page.split("\n## Settings\n\n", 1)[1]
    table = section.split("\n\n", 1)[0]
    assert table == settings_table(), (
        "docs/configuration.md out of date: python -m tasks.config prints its table"
    )


def test_every_field_is_set_by_exactly_one_variable() -> None:
    fields = [s.field for s in SETTINGS if s.field is not None]
    assert len(fields) == len(set(fields))
    # Read from JSON by their own classes: the price table and the rate-limit overrides.
    assert set(fields) == set(Config.__dataclass_fields__) - {"prices", "rate_limits"}
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)


def test_a_cluster_store_is_refused_where_celery_would_need_it() -> None:
    store = {"REDIS_URL": "redis://:hunter2@node-1:7000/0"}
    alone = Config.from_env(store)
    alone.check_store(cluster=False)  # one server: the broker by default, as always
    with pytest.raises(BadInput) as caught:
        alone.check_store(cluster=True)
    assert str(caught.value) == (
        "REDIS_URL='redis://:***@node-1:7000/0' is a Redis Cluster node, which Celery's Redis "
        "transport cannot use as its broker; set CELERY_BROKER_URL to a standalone Redis"
    )
    amqp = {"CELERY_BROKER_URL": "amqp://guest@rabbit//", "DIGEST_TASK_TIME_LIMIT": "1500"}
    rabbit = Config.from_env({**store, **amqp})
    with pytest.raises(BadInput, match="RabbitMQ, so Celery's task states would go to the"):
        rabbit.check_store(cluster=True)
    Config.from_env({**store, "CELERY_BROKER_URL": "redis://broker:6379/0"}).check_store(
        cluster=True
    )


ADHOC = "release-notes"  # a run id that names no week


def test_the_degrade_deadline_is_the_next_day_and_time_in_the_zone() -> None:
    config = Config.from_env(
        {"DIGEST_DEGRADE_AT": "Monday 11:00", "DIGEST_TIMEZONE": "Europe/Berlin"}
    )
    monday_eight = datetime(2026, 10, 12, 8, 0, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    eleven = datetime(2026, 10, 12, 11, 0, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    assert config.degrade_deadline(ADHOC, monday_eight) == eleven
    assert config.degrade_deadline(ADHOC, eleven) == eleven  # at the deadline: the deadline
    assert config.degrade_deadline(ADHOC, eleven + 1) == eleven + 7 * 86400  # past: next week's
    seconds = Config.from_env({"DIGEST_DEGRADE_AT": "mon 11:00:30"})
    at_eleven = datetime(2026, 10, 12, 11, 0, tzinfo=UTC).timestamp()
    assert seconds.degrade_deadline(ADHOC, at_eleven) == (
        datetime(2026, 10, 12, 11, 0, 30, tzinfo=UTC).timestamp()
    )
    assert Config().degrade_deadline(ADHOC, monday_eight) is None  # off by default


def test_a_weeks_deadline_follows_its_scheduled_time_not_its_first_start() -> None:
    """A week's run first started late (a worker down over Monday) is already past its
    deadline and degrades at once; one started early keeps its week's deadline."""
    config = Config.from_env({"DIGEST_DEGRADE_AT": "mon 11:00"})
    deadline = datetime(2026, 10, 12, 11, 0, tzinfo=UTC).timestamp()  # w42's Monday
    tuesday = datetime(2026, 10, 13, 9, 0, tzinfo=UTC).timestamp()
    assert config.degrade_deadline("2026-w42", tuesday) == deadline
    assert config.degrade_deadline("2026-w42", deadline - 30 * 86400) == deadline
    assert config.degrade_deadline(ADHOC, tuesday) == deadline + 7 * 86400
    # A week the schedule reaches on its Sunday evening is due by the Monday after it.
    sunday = Config.from_env({"DIGEST_DEGRADE_AT": "mon 11:00", "DIGEST_SCHEDULE": "sun 20:00"})
    assert sunday.degrade_deadline("2026-w42", tuesday) == deadline + 7 * 86400
    # A week no year has is no week: its deadline follows the first start.
    assert config.degrade_deadline("2025-w53", tuesday) == deadline + 7 * 86400


@pytest.mark.parametrize("value", ["monday", "mon 25:00", "11:00", "someday 11:00", "mon 11:00:61"])
def test_a_bad_degrade_deadline_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(BadInput) as caught:
        Config.from_env({"DIGEST_DEGRADE_AT": value})
    assert str(caught.value) == (
        f"DIGEST_DEGRADE_AT={value!r}: not a day and a time; use a weekday and a time in "
        "DIGEST_TIMEZONE, such as mon 11:00 (or mon 11:00:30)"
    )

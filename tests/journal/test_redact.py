import io
import logging
import pickle

import pytest

import journal._redact
from journal._redact import (
    RedactingFilter,
    add_secret,
    add_url_secrets,
    redact,
    redact_exception,
)
from journal.errors import StoreUnavailable


@pytest.fixture(autouse=True)
def no_registered_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case starts with no secret registered: the registry is the process's, and other
    tests register theirs (the broker's password ``guest`` with TEST_AMQP_URL, say)."""
    monkeypatch.setattr(journal._redact, "_secrets", ())


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("rediss://app:s3cret@cache.example.com:6380", "rediss://app:***@cache.example.com:6380"),
        ("unix://:s3cret@/run/valkey.sock?db=2", "unix://:***@/run/valkey.sock?db=2"),
        ("smtps://digest:p%40ss%3Aw@mail:465", "smtps://digest:***@mail:465"),
        ("amqp://guest:guest@rabbit:5672//", "amqp://guest:***@rabbit:5672//"),
        # An unencoded '@' in the password: urlsplit splits at the last one, and so do we.
        ("redis://:p@ss@cache:6379", "redis://:***@cache:6379"),
        ("redis://cache:6379?password=s3cret&db=1", "redis://cache:6379?password=***&db=1"),
        ("https://api.test/v1?api_key=k-123&x=1", "https://api.test/v1?api_key=***&x=1"),
        (
            "cannot reach redis://:a1@h1:1 or redis://:b2@h2:2 (Error 111)",
            "cannot reach redis://:***@h1:1 or redis://:***@h2:2 (Error 111)",
        ),
    ],
)
def test_every_url_password_is_masked(text: str, masked: str) -> None:
    assert redact(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "redis://cache:6379/0",
        "redis://user@cache:6379/0",
        "unix:///run/valkey.sock",
        "check that Redis is running at cache:6379",
        "run digest:2026-w42 is leased by another worker (fence 3)",
    ],
)
def test_text_without_a_password_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_registered_secrets_are_masked_anywhere_even_url_encoded() -> None:
    add_secret("sk-ant-registered-Q7vX")
    add_secret("pa ss/w@rd-Registered")
    assert redact("401: invalid x-api-key sk-ant-registered-Q7vX") == "401: invalid x-api-key ***"
    assert redact("login pa ss/w@rd-Registered refused") == "login *** refused"
    assert redact("url pa%20ss%2Fw%40rd-Registered") == "url ***"


def test_a_secret_too_short_to_mask_everywhere_is_masked_in_urls_only() -> None:
    add_secret("ab")
    assert redact("about a tab") == "about a tab"
    assert redact("redis://:ab@h") == "redis://:***@h"


def test_passwords_of_configured_urls_are_registered() -> None:
    add_url_secrets("redis://:url-pw-Registered%21@cache:6379/0")
    add_url_secrets("redis://cache?password=query-pw-Registered")
    add_url_secrets("not a url ::: [")
    assert redact("AUTH url-pw-Registered! failed") == "AUTH *** failed"
    assert redact("echoed query-pw-Registered") == "echoed ***"


def test_an_exception_and_its_causes_are_masked_in_place() -> None:
    add_secret("sk-ant-chained-Q7vX")
    try:
        try:
            raise ValueError("server said: bad key sk-ant-chained-Q7vX")
        except ValueError as cause:
            raise RuntimeError("redis://:pw@h refused sk-ant-chained-Q7vX", 42) from cause
    except RuntimeError as error:
        redact_exception(error)
        assert error.args == ("redis://:***@h refused ***", 42)
        assert error.__cause__ is not None
        assert error.__cause__.args == ("server said: bad key ***",)


def test_store_errors_hold_no_password_even_pickled() -> None:
    error = StoreUnavailable("redis://:store-pw@cache:6379/0", "Error 111 connecting")
    assert "store-pw" not in str(error)
    assert "store-pw" not in repr(error)
    assert "store-pw" not in repr(pickle.loads(pickle.dumps(error)).args)
    assert str(error).startswith("cannot reach the journal store at redis://:***@cache:6379/0 ")


def test_the_log_filter_masks_messages_arguments_and_tracebacks() -> None:
    add_secret("sk-ant-logged-Q7vX")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test_redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("store %s down", "redis://:logged-pw@cache:6379")
        try:
            raise ValueError("echoed sk-ant-logged-Q7vX")
        except ValueError:
            logger.exception("model call failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "store redis://:***@cache:6379 down" in text
    assert "ValueError: echoed ***" in text
    assert "logged-pw" not in text and "sk-ant-logged-Q7vX" not in text

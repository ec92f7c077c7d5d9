"""Keeping secrets out of everything that leaves the process.

A password reaches text in two ways: inside a URL (``redis://:pw@host``), which any error that
names its server may repeat, and as a value a library echoes (an API key in an error body, a
password in a server's reply). ``redact`` masks both: the password of every URL it finds,
every password-like query parameter, and every value registered with ``add_secret``. It is
the one masking function; the rest of this module applies it where text leaves the process:

- ``redact_exception``: the messages of an exception and of its causes, before Celery stores
  them (its result backend keeps the exception's arguments and the formatted traceback).
- ``RedactingFilter`` / ``redact_logging``: every log record that reaches a handler, its
  traceback included, whichever library logged it.

Errors that carry a URL redact it when they are built (``StoreUnavailable``), so even a pickled
copy holds none; the filters are the second line, for text this code did not build.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"

# Shorter values would mask ordinary words all over the logs; a URL's password is masked by
# position whatever its length.
MIN_SECRET_LENGTH = 4

# scheme://user:PASSWORD@ - greedy up to the netloc's last '@', as urlsplit reads it.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:@\s/?#]*:)(?P<password>[^\s/?#]*)@"
)
_SECRET_NAME = r"[^=&;\s#]*(?:password|passwd|secret|token)[^=&;\s#]*|api_?key|key"
_QUERY_SECRET = re.compile(
    rf"(?P<head>[?&;](?:{_SECRET_NAME})=)(?P<value>[^&;\s#]*)", re.IGNORECASE
)

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()


def add_secret(value: str | None) -> None:
    """Mask ``value`` (and its URL-encoded form) in everything ``redact`` sees from now on."""
    if value is None or len(value) < MIN_SECRET_LENGTH:
        return
    global _secrets
    with _lock:
        known = set(_secrets) | {value, quote(value, safe="")}
        # Longest first, so a secret that contains another is masked whole.
        _secrets = tuple(sorted(known, key=len, reverse=True))


def add_url_secrets(url: str | None) -> None:
    """Register the password a URL carries, in its user info or a password-like parameter."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed URL: mask by position only
        return
    if password:
        add_secret(unquote(password))
        add_secret(password)
    for name, value in parse_qsl(parts.query):
        if re.fullmatch(_SECRET_NAME, name, re.IGNORECASE):
            add_secret(value)


def redact(text: str) -> str:
    """``text`` with every URL password, password-like parameter and registered secret masked."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_exception(error: BaseException) -> None:
    """Mask the string arguments of ``error`` and of every exception in its cause chain.

    In place, and before the exception is formatted: Celery stores ``args`` and the formatted
    traceback (causes included) in its result backend, and logs both.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
        current = current.__cause__ or current.__context__


class RedactingFilter(logging.Filter):
    """Masks a record's message and traceback before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops it."""
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redact_logging(logger: logging.Logger | None = None) -> None:
    """Put a ``RedactingFilter`` on every handler of ``logger`` (the root logger by default).

    On handlers, not loggers: a logger's filters see only records logged to it directly,
    while a handler's see every record that propagates to it. The last-resort handler, which
    prints warnings when nothing is configured (a command line), gets one too.
    """
    target = logging.getLogger() if logger is None else logger
    handlers = list(target.handlers)
    if logger is None and logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())

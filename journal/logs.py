"""Every log line a delivery writes names its run, Celery task, attempt and fence.

And none carries a secret: the redaction that masks them (``redact``, ``redact_logging``) is
part of this module's face.

An operator paged for ``lease on ... lost`` or a worker's ``ran summarize:n1`` needs to know
which run, which delivery of it and which holder wrote the line, without matching timestamps
across processes. A delivery binds its context once (``bound``); the lease fills in the fence
when it is granted (``set_fence``); ``RunContextFilter`` copies the context onto every record
that reaches a handler, whichever library logged it, so a format can name the fields and the
JSON formatter writes them as keys.

The context is a ``ContextVar`` holding one mutable value per delivery: threads a delivery
starts with a copy of its context (a map's calls) see the same value, so the fence granted
after they were submitted still reaches their lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from journal._redact import (
    MASK,
    RedactingFilter,
    add_secret,
    add_url_secrets,
    redact,
    redact_exception,
    redact_logging,
)

__all__ = [
    "FIELDS",
    "MASK",
    "DeliveryContext",
    "JsonFormatter",
    "RedactingFilter",
    "RunContextFilter",
    "add_secret",
    "add_url_secrets",
    "bound",
    "current",
    "log_with_run_context",
    "redact",
    "redact_exception",
    "redact_logging",
    "set_fence",
]

FIELDS = ("run_id", "task_id", "attempt", "fence")
"""The attributes ``RunContextFilter`` sets on every record: ``None`` outside a delivery."""


@dataclass
class DeliveryContext:
    """What identifies one delivery of a run in its log lines."""

    run_id: str
    task_id: str | None = None
    attempt: int | None = None
    fence: int | None = None

    def describe(self) -> str:
        """The text suffix for plain-text log lines: ``run=... task=... attempt=... fence=...``."""
        parts = [f"run={self.run_id}"]
        if self.task_id is not None:
            parts.append(f"task={self.task_id}")
        if self.attempt is not None:
            parts.append(f"attempt={self.attempt}")
        if self.fence is not None:
            parts.append(f"fence={self.fence}")
        return " ".join(parts)


_current: contextvars.ContextVar[DeliveryContext | None] = contextvars.ContextVar(
    "journal_delivery", default=None
)


def current() -> DeliveryContext | None:
    """The delivery this thread's code runs for, if any."""
    return _current.get()


@contextlib.contextmanager
def bound(
    run_id: str, *, task_id: str | None = None, attempt: int | None = None
) -> Iterator[DeliveryContext]:
    """Name ``run_id``'s delivery in every line logged inside the block."""
    context = DeliveryContext(run_id, task_id, attempt)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def set_fence(fence: int) -> None:
    """Record the fence the lease was granted under, for the rest of the delivery's lines."""
    context = _current.get()
    if context is not None:
        context.fence = fence


class RunContextFilter(logging.Filter):
    """Copies the current delivery's fields onto each record; never drops one.

    Sets ``run_id``, ``task_id``, ``attempt`` and ``fence`` (``None`` outside a delivery) and
    ``run_context``, the same as text with a leading space (empty outside a delivery), so a
    plain format can end with ``%(run_context)s``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate the record in place."""
        context = _current.get()
        for name in FIELDS:
            setattr(record, name, getattr(context, name) if context is not None else None)
        record.run_context = f" [{context.describe()}]" if context is not None else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the run's fields.

    Log shippers (Loki, Elasticsearch, CloudWatch) index the fields without a parsing rule; a
    traceback goes in ``exc_info`` as one string, so a line is always one record.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, object] = {
            "time": stamp.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        return orjson.dumps(line, default=str).decode()


def log_with_run_context(handler: logging.Handler, *, json: bool) -> None:
    """Give ``handler`` the run's fields, as JSON lines or at the end of its text lines.

    The filter goes on the handler, not a logger, so records of every logger that propagate
    to it are annotated (a logger's filters see only records logged to it directly).
    """
    if not any(isinstance(f, RunContextFilter) for f in handler.filters):
        handler.addFilter(RunContextFilter())
    if json:
        handler.setFormatter(JsonFormatter())
    elif not isinstance(handler.formatter, _WithRunContext):
        handler.setFormatter(_WithRunContext(handler.formatter or logging.Formatter()))


class _WithRunContext(logging.Formatter):
    """Another formatter's text, the run's fields at the end of its first line.

    Wrapping rather than rewriting the format keeps Celery's own formatter (its colours, its
    task name and id) whatever its constructor takes; the first line, so a traceback that
    follows still ends the record.
    """

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        """The inner formatter's text, with ``run_context`` after its first line."""
        text = self._inner.format(record)
        suffix = getattr(record, "run_context", "")
        if not suffix:
            return text
        first, newline, rest = text.partition("\n")
        return first + suffix + newline + rest

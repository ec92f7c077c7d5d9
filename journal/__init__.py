"""Durable keyed steps for Celery tasks, journaled in Redis under a fenced lease.

The public face; everything not listed in ``__all__`` may change.
"""

from journal.backend import connect
from journal.cancel import Cancelled
from journal.clock import Clock, ManualClock, SystemClock
from journal.effects import Effect
from journal.errors import (
    ClockSkewed,
    ControlRefused,
    CorruptJournal,
    EmbeddedServerError,
    Fenced,
    GaveUp,
    Hints,
    InvalidRunId,
    JournalError,
    LeaseBusy,
    LeaseLost,
    NotDurable,
    ReplayMismatch,
    RetryScheduled,
    RunParked,
    StoreUnavailable,
    StoreUnsupported,
    UnknownScriptStatus,
    UnserializableResult,
)
from journal.keys import Keyspace, RunKeys, validate_run_id
from journal.records import Record
from journal.retry import RetryPolicy, RunRetry
from journal.steps import Run, StepEvent
from journal.store import Journal, Outcome, Settings
from journal.waits import SignalResult, Suspend, Wait

__all__ = [
    "Cancelled",
    "Clock",
    "ClockSkewed",
    "ControlRefused",
    "CorruptJournal",
    "Effect",
    "EmbeddedServerError",
    "Fenced",
    "GaveUp",
    "Hints",
    "InvalidRunId",
    "Journal",
    "JournalError",
    "Keyspace",
    "LeaseBusy",
    "LeaseLost",
    "ManualClock",
    "NotDurable",
    "Outcome",
    "Record",
    "ReplayMismatch",
    "RetryPolicy",
    "RetryScheduled",
    "Run",
    "RunKeys",
    "RunParked",
    "RunRetry",
    "Settings",
    "SignalResult",
    "StepEvent",
    "StoreUnavailable",
    "StoreUnsupported",
    "Suspend",
    "SystemClock",
    "UnknownScriptStatus",
    "UnserializableResult",
    "Wait",
    "connect",
    "validate_run_id",
]

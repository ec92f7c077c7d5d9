"""Durable keyed steps for Celery tasks, journaled in Redis under a fenced lease.

The public face: the names below, and these modules: ``journal.errors`` (every exception,
one root), ``journal.durable`` (the Celery integration), ``journal.batch`` (a provider
batch as a step: the adapter it calls, its policy, what operators read of it and undo),
``journal.inspect`` and ``journal.control`` (what operators read and do), ``journal.fixture``,
``journal.testing``
(with ``journal.pytest_plugin``) and ``journal.preflight`` (a recorded run as a document,
replayed in tests and checked before a deploy), ``journal.contrib`` (the embedded server
and start-up checks, kept apart from the core). Every other module is internal and may
change.
"""

from journal import errors
from journal.backend import connect
from journal.clock import ManualClock
from journal.effects import Effect
from journal.errors import Hints
from journal.fixture import Fixture
from journal.keys import Keyspace
from journal.retry import RetryPolicy, RunRetry
from journal.runner import Outcome, Settings
from journal.steps import Run, StepEvent
from journal.store import Journal
from journal.waits import SignalResult

__all__ = [
    "Effect",
    "Fixture",
    "Hints",
    "Journal",
    "Keyspace",
    "ManualClock",
    "Outcome",
    "RetryPolicy",
    "Run",
    "RunRetry",
    "Settings",
    "SignalResult",
    "StepEvent",
    "connect",
    "errors",
]

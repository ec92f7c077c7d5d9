"""Durable keyed steps for Celery tasks, journaled in Redis under a fenced lease.

The public face is the names below and these modules, each named by its role:

- ``journal.errors``: every exception, under one root (``JournalError``);
- ``journal.events``: what a run reports as it goes (for logs and metrics);
- ``journal.logs``: run context on log records, and the redaction of secrets;
- ``journal.tracing``: OpenTelemetry spans of deliveries and steps, when configured;
- ``journal.batch``: a provider batch as a step (its adapter, its policy, its views);
- ``journal.integrations.celery``: deliveries through Celery, at least once;
- ``journal.ops``: what operators read (``views``) and do (``actions``);
- ``journal.testing``: recorded runs replayed in tests and checked before a deploy;
- ``journal.contrib``: the embedded server and start-up checks.

Every module whose name starts with an underscore is internal and may change; the import
contract in ``pyproject.toml`` keeps applications off them.
"""

from journal import errors
from journal._clock import Clock, ManualClock, SystemClock
from journal._delivery import Outcome, Settings
from journal._effects import Effect
from journal._holder import ProcessIdentity
from journal._journal import Journal
from journal._limits import redelivers_running, safe_time_limit
from journal._redis.backend import connect
from journal._redis.scripts import Client, Script, register_scripts
from journal._retry import RetryPolicy, RunRetry
from journal._riders import send_with_record
from journal._run import Run, StepEvent
from journal._schema.keys import Keyspace, RunKeys, validate_run_id
from journal._schema.meta import RunMeta, Wait
from journal._schema.records import Record
from journal._schema.steps import StepKey
from journal._waits import SignalResult
from journal._workflow import Workflow, workflow
from journal.errors import Hints

__all__ = [
    "Client",
    "Clock",
    "Effect",
    "Hints",
    "Journal",
    "Keyspace",
    "ManualClock",
    "Outcome",
    "ProcessIdentity",
    "Record",
    "RetryPolicy",
    "Run",
    "RunKeys",
    "RunMeta",
    "RunRetry",
    "Script",
    "Settings",
    "SignalResult",
    "StepEvent",
    "StepKey",
    "SystemClock",
    "Wait",
    "Workflow",
    "connect",
    "errors",
    "redelivers_running",
    "register_scripts",
    "safe_time_limit",
    "send_with_record",
    "validate_run_id",
    "workflow",
]

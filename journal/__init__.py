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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from journal import errors
    from journal._clock import Clock, ManualClock, SystemClock
    from journal._delivery import Outcome
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
    from journal._settings import Settings
    from journal._waits import SignalResult
    from journal._workflow import Workflow, workflow
    from journal.errors import Hints

# Each name's module, imported on first use: a command line that only validates a run id
# must not pay for the lease, the runner and the store client it never touches.
_HOMES = {
    "errors": "journal.errors",
    "Clock": "journal._clock",
    "ManualClock": "journal._clock",
    "SystemClock": "journal._clock",
    "Outcome": "journal._delivery",
    "Settings": "journal._settings",
    "Effect": "journal._effects",
    "ProcessIdentity": "journal._holder",
    "Journal": "journal._journal",
    "redelivers_running": "journal._limits",
    "safe_time_limit": "journal._limits",
    "connect": "journal._redis.backend",
    "Client": "journal._redis.scripts",
    "Script": "journal._redis.scripts",
    "register_scripts": "journal._redis.scripts",
    "RetryPolicy": "journal._retry",
    "RunRetry": "journal._retry",
    "send_with_record": "journal._riders",
    "Run": "journal._run",
    "StepEvent": "journal._run",
    "Keyspace": "journal._schema.keys",
    "RunKeys": "journal._schema.keys",
    "validate_run_id": "journal._schema.keys",
    "RunMeta": "journal._schema.meta",
    "Wait": "journal._schema.meta",
    "Record": "journal._schema.records",
    "StepKey": "journal._schema.steps",
    "SignalResult": "journal._waits",
    "Workflow": "journal._workflow",
    "workflow": "journal._workflow",
    "Hints": "journal.errors",
}

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


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` the first time it is asked for.

    Raises:
        AttributeError: the journal has no such public name.
    """
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'journal' has no attribute {name!r}")
    # The import statement's own machinery (importlib.import_module bypasses ``-X importtime``,
    # and with it the record of what a command imports).
    module = __import__(home, fromlist=[name])
    value = module if name == "errors" else getattr(module, name)  # a module, or one of its names
    globals()[name] = value  # the next lookup finds it without coming here
    return value

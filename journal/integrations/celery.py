"""Celery integration: a durable workflow is a Celery task that replays its journal.

The queue gives at-least-once delivery; this module turns each delivery into at-least-once
progress. A delivery opens the run under its lease and replays; a delivery that finds the
lease held retries itself after the holder's remaining time plus jitter (it never waits in a
worker slot and never runs concurrently); a run that suspends returns at once and is woken
later by the due sweep, a beat task that also re-enqueues runs whose worker died, and runs
that failed for a transient cause once their back-off has passed (``Settings.run_retry``).

Settings this relies on (see ``at_least_once_settings``): late acks and reject-on-worker-lost
so a killed child's message is redelivered, prefetch 1 so a dead worker strands one message at
most, JSON only, and no countdown longer than a fraction of the broker's visibility timeout:
long waits go to the due index instead of the broker.

Traces (``journal.tracing``, when on): every message this module publishes carries the
publisher's trace context in its headers (``traceparent``), and a worker continues it, so a
delivery's span is the child of whatever sent it: ``start``, ``delay``, ``apply_async``, the
sweep, a signal's wake, a delivery's own retry or wake-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from celery import Celery, Task
from celery.exceptions import Reject, Retry

from journal import logs, tracing
from journal._clock import SystemClock
from journal._delivery import Outcome
from journal._journal import Journal, jitter
from journal._limits import redelivers_running
from journal._redact import redact_exception
from journal._run import StepEvent
from journal._schema.keys import RunKeys
from journal._workflow import Workflow
from journal.errors import (
    CorruptJournal,
    GaveUp,
    InvalidArguments,
    InvalidRunId,
    JournalError,
    LeaseBusy,
    LeaseLost,
    ReceiptUnsaved,
    RetryScheduled,
    RunParked,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

__all__ = [
    "SWEEP_TASK",
    "Durable",
    "DurableWorkflow",
    "at_least_once_settings",
]

SWEEP_TASK = "journal.sweep"
# kombu's publish retries for a delivery's own retry: 0.5 s apart, growing to 5 s, ~10 minutes.
_OUTLIVE_THE_BROKER = {
    "max_retries": 120,
    "interval_start": 0.5,
    "interval_step": 0.5,
    "interval_max": 5,
}

Opts = TypeVar("Opts")
R = TypeVar("R")


def at_least_once_settings(*, visibility_timeout: float, task_time_limit: float) -> dict[str, Any]:
    """The Celery settings durable workflows need (each one's reason: docs/operations.md).

    Raises:
        ValueError: the time limit is not safely below the visibility timeout, which would let
            the broker redeliver a task that is still running.
    """
    if redelivers_running(task_time_limit, visibility_timeout):
        raise ValueError(
            f"task_time_limit={task_time_limit:g}s must stay below 90% of the broker's "
            f"visibility_timeout={visibility_timeout:g}s, or Redis redelivers running tasks"
        )
    return {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "broker_transport_options": {"visibility_timeout": int(visibility_timeout)},
        "task_time_limit": int(task_time_limit),
        "task_soft_time_limit": int(task_time_limit * 0.9),
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "task_track_started": True,
        # With the store as result backend (one Valkey for all, the usual small deployment),
        # a delivery that meets it down would fail storing STARTED, outside the body, and be
        # acked: a run not yet opened would have no journal for a sweep to find. Waiting for
        # the backend keeps the message, the run's only record then.
        "result_backend_always_retry": True,
    }


class _QuietRoutine(logging.Filter):
    """A worker's "received" and "succeeded" lines of routine tasks, demoted to DEBUG.

    The due sweep runs every few seconds; at INFO its two lines a run would bury the lines of
    the runs themselves. The sweep logs at INFO itself when it enqueued something. Beat's own
    "Sending due task" line stays: beat's log is where an operator checks that it runs.
    """

    LOGGERS = ("celery.worker.strategy", "celery.app.trace")

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    @classmethod
    def install(cls, name: str) -> None:
        """Quiet the routine task ``name`` on Celery's loggers (once per logger)."""
        for logger_name in cls.LOGGERS:
            logger = logging.getLogger(logger_name)
            quiet = next((f for f in logger.filters if isinstance(f, cls)), None)
            if quiet is None:
                quiet = cls()
                logger.addFilter(quiet)
            quiet.names.add(name)

    def filter(self, record: logging.LogRecord) -> bool:
        """Demote a routine task's INFO line; drop it unless its logger shows DEBUG."""
        if record.levelno != logging.INFO or self._task(record) not in self.names:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    @staticmethod
    def _task(record: logging.LogRecord) -> object:
        """The task a worker's line is about, named in the record's ``data``."""
        data = getattr(record, "data", None)
        return data.get("name") if isinstance(data, dict) else None


class Durable:
    """Registers durable workflows as Celery tasks and runs the due sweep.

    Args:
        app: the Celery app.
        journal: returns this process's Journal; called lazily, after the pool forks, so no
            Redis connection is shared between parent and child.
        on_step: told of every step each delivery runs or replays (logging, fault injection).
        max_countdown: the longest countdown this module will ever ask the broker for; keep it
            a fraction of the visibility timeout. A function is called when a countdown is
            first needed, so an app configured lazily can pass one of its settings.
        store_backoff_cap: the longest wait between deliveries retried while Redis is down.
    """

    def __init__(
        self,
        app: Celery,
        journal: Callable[[], Journal],
        *,
        on_step: Callable[[StepEvent], None] | None = None,
        max_countdown: float | Callable[[], float] = 300.0,
        store_backoff_cap: float = 60.0,
    ) -> None:
        self.app = app
        self._journal = journal
        self._on_step = on_step
        self._max_countdown = max_countdown
        self.store_backoff_cap = store_backoff_cap
        self.tasks: dict[str, Task] = {}

        # A plain function, not the bound method: Celery checks call arguments against the
        # function's argspec, which for a bound method still lists ``self``, so every
        # ``apply_async`` of the sweep (beat's included) would be refused.
        def sweep(limit: int = 100) -> int:
            return self.sweep(limit)

        sweep.__doc__ = self.sweep.__doc__
        _QuietRoutine.install(SWEEP_TASK)
        # Not shared: a shared task is added to every app the process creates later, so a
        # second app's sweep would run the first app's journal.
        app.task(name=SWEEP_TASK, ignore_result=True, shared=False)(sweep)

    @property
    def max_countdown(self) -> float:
        """The longest countdown asked of the broker, read once it is needed."""
        if callable(self._max_countdown):
            self._max_countdown = self._max_countdown()
        return self._max_countdown

    def register(
        self, workflow: Workflow[Opts, R], *, task_name: str | None = None, **celery_options: Any
    ) -> DurableWorkflow[Opts, R]:
        """Make ``workflow`` a Celery task delivered with this journal; once per workflow.

        The workflow is defined where Celery is not imported (``journal.workflow``), so a
        command line that runs it in process stays light; this is what a worker adds.

        Args:
            workflow: the workflow, as ``@journal.workflow`` defined it.
            task_name: the Celery task's name; the workflow's own by default.
            celery_options: passed to ``app.task``.
        """

        def deliver(task: Task, run_id: str, **kwargs: Any) -> dict[str, Any]:
            request = task.request
            with (
                logs.bound(
                    f"{workflow.name}:{run_id}", task_id=request.id, attempt=request.retries + 1
                ),
                tracing.extracted(_carried(request)),
            ):
                return self._deliver(task, workflow, run_id, kwargs)

        deliver.__doc__ = workflow.__doc__
        task: Task = self.app.task(
            name=task_name or workflow.name,
            bind=True,
            acks_late=True,
            reject_on_worker_lost=True,
            # No ceiling of its own: Celery reads retry(max_retries=None) as "the task's
            # default" (3 unless set here), and neither a busy run nor a store outage may
            # run out of retries.
            max_retries=None,
            shared=False,
            **celery_options,
        )(deliver)
        self.tasks[workflow.name] = task
        return DurableWorkflow(workflow, task, self._journal)

    def _deliver(
        self, task: Task, workflow: Workflow[Any, Any], run_id: str, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        name = workflow.name
        try:
            outcome = workflow._start(
                run_id, kwargs, journal=self._journal(), on_step=self._on_step, delivered=True
            )
        except (InvalidRunId, InvalidArguments) as invalid:
            log.error("%s", invalid)  # one line; redelivering cannot fix it
            return {"run": f"{name}:{run_id!r}", "status": "invalid", "error": str(invalid)}
        except CorruptJournal as corrupt:
            # Redelivering would only meet the same field: a person has to look at it.
            log.error("%s", corrupt)
            return {"run": f"{name}:{run_id}", "status": "corrupt", "error": str(corrupt)}
        except LeaseBusy as busy:
            countdown = min(jitter(busy.remaining_ms / 1000), self.max_countdown)
            log.info("%s; retrying this delivery in %.1fs", busy, countdown)
            raise task.retry(countdown=countdown, max_retries=None, **_traced()) from None
        except StoreUnavailable as down:
            raise self._retry_outliving_the_store(task, down) from None
        except RunParked as parked:
            log.error("%s", parked)
            return {"run": f"{name}:{run_id}", "status": "parked", "error": str(parked)}
        except LeaseLost as lost:
            log.warning("%s", lost)
            return {"run": f"{name}:{run_id}", "status": "lease-lost", "error": str(lost)}
        except ReceiptUnsaved as unsaved:
            # It happened: no retry of this delivery may repeat it. The run stays due, and its
            # next delivery, once the store takes writes, waits for a decision.
            log.error("%s", unsaved)
            return {"run": unsaved.run, "status": "receipt-unsaved", "error": str(unsaved)}
        except GaveUp as gave_up:
            redact_exception(gave_up)  # Celery stores it and its cause, as below
            log.error("%s", gave_up)  # the run's id and its last error, for whoever is paged
            raise
        except RetryScheduled as scheduled:
            # Not a lost run: it stays due and the sweep delivers it again. Raising would log
            # a traceback at ERROR for it; GaveUp, which is lost, propagates.
            log.warning("%s", scheduled)
            return {
                "run": scheduled.run,
                "status": "retrying",
                "error": scheduled.error,
                "retry_at": scheduled.retry_at,
            }
        except Exception as failure:
            # Celery stores the exception's arguments and its formatted traceback, causes
            # included, in the result backend: mask them before it formats anything.
            redact_exception(failure)
            raise
        self._wake_soon(task, outcome, run_id, kwargs)
        return {
            "run": outcome.run,
            "status": outcome.status,
            "result": outcome.result,
            "ran": outcome.ran,
            "replayed": outcome.replayed,
        }

    def _retry_outliving_the_store(self, task: Task, down: StoreUnavailable) -> Retry:
        """Never given up: a run must outlive a Redis outage.

        The retry count is shared with busy-lease retries, so the back-off is capped rather
        than counted down.
        """
        attempt = min(task.request.retries, 16)
        cap = min(self.store_backoff_cap, self.max_countdown)
        countdown = min(jitter(2.0**attempt), cap)
        log.warning("%s; retrying this delivery in %.1fs", down, countdown)
        return self._retry_outliving_the_broker(task, down, countdown)

    @staticmethod
    def _retry_outliving_the_broker(task: Task, down: StoreUnavailable, countdown: float) -> Retry:
        """Publish the delivery's retry, waiting out a broker that is down with the store.

        Celery rejects a message whose retry cannot be published without requeueing it, so a
        store that is also the broker, down before the run opened, would lose the week: the
        message is then its only record. The publish waits for the broker (about ten minutes
        at most); past that the message goes back to the queue rather than being dropped.
        """
        try:
            return task.retry(
                exc=down,
                countdown=countdown,
                max_retries=None,
                retry=True,
                retry_policy=_OUTLIVE_THE_BROKER,
                **_traced(),
            )
        except Reject as unpublished:
            raise Reject(unpublished.reason, requeue=True) from None

    def _wake_soon(self, task: Task, outcome: Outcome, run_id: str, kwargs: dict[str, Any]) -> None:
        """A short wait is cheaper as a countdown than as a trip through the due sweep."""
        if outcome.wait is None or outcome.wait.until is None:
            return
        delay = outcome.wait.until - SystemClock().now()
        if 0 < delay <= self.max_countdown:
            task.apply_async(args=[run_id], kwargs=kwargs, countdown=delay, **_traced())

    def send_signal(
        self, workflow: str, run_id: str, name: str, payload: Any, journal: Journal | None = None
    ) -> bool:
        """Deliver a signal and, when the run waits for it, enqueue the run at once.

        No sweep is needed to resume it (a worker and no beat is enough); the due index still
        holds it as the safety net should this message be lost. ``journal`` defaults to the
        workers' own, for callers outside a worker (a command line) that have one already.

        Returns:
            True if this payload was stored; False if a signal of that name was already there.
        """
        journal = journal or self._journal()
        task = self.tasks[workflow]

        def enqueue(keys: RunKeys) -> None:
            try:
                task.apply_async(args=[keys.run_id], kwargs=journal.run_args(keys), **_traced())
            except Exception as down:  # the broker: the signal is stored, the sweep wakes it
                log.warning(
                    "%s woken but not enqueued (%s); the due sweep resumes it", keys.run, down
                )

        return journal.send_signal(workflow, run_id, name, payload, on_wake=enqueue)

    def sweep(self, limit: int = 100) -> int:
        """Enqueue the runs whose wake-up or lease-expiry time has come.

        The claim is one script, so two beats never both enqueue a run; a claimed run is
        re-armed rather than removed, so a lost message is found again by a later sweep. A run
        whose stored state cannot be read is logged and skipped, never allowed to stop the
        batch: it stays in the index, so every later sweep names it again until it is repaired.

        Returns:
            How many runs were enqueued.
        """
        journal = self._journal()
        enqueued = 0
        for keys in journal.claim_due(limit):
            task = self.tasks.get(keys.workflow)
            if task is None:
                log.warning("due run %s has no workflow registered in this app", keys.run)
                continue
            try:
                args = journal.run_args(keys)
            except StoreUnavailable:
                raise
            except JournalError as unreadable:
                log.error("due sweep skipped run %s: %s", keys.run, unreadable)
                continue
            task.apply_async(args=[keys.run_id], kwargs=args, **_traced())
            enqueued += 1
        if enqueued:
            log.info("due sweep enqueued %d run(s)", enqueued)
        return enqueued


class DurableWorkflow(Generic[Opts, R]):
    """A workflow and the Celery task that delivers it: one object, registered once.

    ``start`` sends a run to a worker with typed options, as ``Workflow.start`` runs one here;
    ``delay`` and ``apply_async`` are Celery's own verbs, with the options as keywords. Each
    checks the options before the message is sent, so a bad one is refused to the caller in
    one line (``InvalidArguments``) instead of in a worker's log; a worker still checks what it
    is delivered (a message from elsewhere, an older client).

    Every send first arms a run that has never opened (``Journal.expect``, one script), so
    a message lost before any worker opens the run is sent again by the due sweep.

    Attributes:
        workflow: the definition (``journal._workflow.Workflow``).
        task: the Celery task, for what Celery offers beyond sending (``AsyncResult``, ...).
    """

    def __init__(
        self, workflow: Workflow[Opts, R], task: Task, journal: Callable[[], Journal]
    ) -> None:
        self.workflow = workflow
        self.task = task
        self._journal = journal
        self.__doc__ = workflow.__doc__

    def __repr__(self) -> str:
        return f"<DurableWorkflow {self.workflow.name} as {self.task.name}>"

    @property
    def name(self) -> str:
        """The Celery task's name, as a task's ``name`` is (the workflow's: ``workflow.name``)."""
        return str(self.task.name)

    def delay(self, run_id: str | None = None, **options: Any) -> Any:
        """Send one delivery of ``run_id``, like Celery's ``delay``, once its options pass.

        Raises:
            InvalidRunId, InvalidArguments: nothing was sent (no run id included).
        """
        return self.apply_async(args=[] if run_id is None else [run_id], kwargs=options)

    def apply_async(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None = None,
        **celery_options: Any,
    ) -> Any:
        """Celery's ``apply_async`` (``args`` is ``[run_id]``), once the options pass.

        Raises:
            InvalidRunId, InvalidArguments: nothing was sent.
        """
        if len(args) != 1:  # the run id alone: Celery would refuse it only in the worker
            given = "none was given" if not args else f"{len(args)} arguments were given"
            raise InvalidRunId("", f'{given} ({self.name.split(".")[-1]}.delay("2026-w42"))')
        (run_id,) = args
        checked = self.workflow.check(run_id, kwargs or {})
        self._expect(run_id, checked)
        options = _traced(celery_options)
        return self.task.apply_async(args=[run_id], kwargs=checked, **options)

    def _expect(self, run_id: str, args: dict[str, Any]) -> None:
        """Arm the run before its message leaves; with the store down, send it unarmed.

        The store being down must not stop a send (the broker may be up): that delivery then
        relies on the broker alone, as every delivery did before runs were armed.
        """
        run = f"{self.workflow.name}:{run_id}"
        try:
            journal = self._journal()
            journal.expect(journal.keys(self.workflow.name, run_id), args)
        except StoreUnavailable as down:
            log.warning("%s; %s sent unarmed: a lost message waits for the broker", down, run)

    def start(self, run_id: str, options: Opts | None = None, **celery_options: Any) -> Any:
        """Send one delivery of ``run_id`` with typed options; Celery's ``AsyncResult`` back.

        Raises:
            InvalidRunId, InvalidArguments: nothing was sent.
        """
        kwargs = self.workflow.encode(options)
        return self.apply_async(args=[run_id], kwargs=kwargs, **celery_options)


def _traced(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Celery's publishing options with the current trace context added to the headers.

    Unchanged when tracing is off: no ``headers`` option is added to a message that had none.
    """
    traced = dict(options or {})
    headers = tracing.inject(dict(traced.get("headers") or {}))
    if headers:
        traced["headers"] = headers
    return traced


def _carried(request: Any) -> dict[str, Any]:
    """The trace context a delivery's message carried: its custom headers, as Celery gives them.

    Celery puts a message's headers on the task's request, each an attribute of its own.
    """
    return {
        name: value
        for name in ("traceparent", "tracestate")
        if isinstance(value := getattr(request, name, None), str)
    }

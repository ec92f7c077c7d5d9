"""A durable workflow defined once: its name, its body and the type of its options.

``@journal.workflow`` is the one way to define a workflow, and ``start`` the one verb to start a
run: ``wf.start(run_id, options)`` runs it in this process under its lease (what a command line
does), and ``durable.register(wf).start(run_id, options)`` (``journal.integrations.celery``)
sends it to a worker, which takes the same path. The name, the options and their defaults are
written once. This module does not import
Celery: a command line that only runs workflows here stays light.

The options are either a frozen dataclass (``options=InvoiceOptions``; the body is typed
``fn(run, options: InvoiceOptions)``) or, with no ``options``, the body's keyword arguments
(``fn(run, customer="c1")``). Either way they are checked (``journal._arguments``) before
anything is sent or written, and travel and are frozen as a JSON object: the options given,
a dataclass's fields left at their default omitted. ``defaults(run_id)`` fills the ones left
out at the run's first start (a setting read from the environment, say), so they are frozen with the
others and a later change of the environment cannot change a started run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast, overload

from journal._arguments import check_arguments
from journal._delivery import Outcome
from journal._journal import Journal
from journal._run import Run, StepEvent
from journal._schema.keys import Keyspace

Opts = TypeVar("Opts")
R = TypeVar("R")

Defaults = Callable[[str], Mapping[str, Any]]
Observer = Callable[[StepEvent], None]


class Workflow(Generic[Opts, R]):
    """One workflow, defined by ``@journal.workflow``: ``start`` runs a run of it here.

    Args:
        name: the workflow's name, the first half of every run's full id (``name:run_id``).
        body: ``body(run, options)`` with an ``options`` type, else ``body(run, **options)``.
        journal: the journal ``start`` uses unless given one.
        options: the frozen dataclass of the options; None for keyword options.
        defaults: ``defaults(run_id)``, the options a run's first start fills in when they
            were left out; given the run id, so a default may follow from it (the deadline of
            the week a run id names, say).
        on_step: told of every step after the caller's own observer (fault injection, say),
            however the run is started.
    """

    def __init__(
        self,
        name: str,
        body: Callable[..., R],
        *,
        journal: Callable[[], Journal] | None = None,
        options: type[Opts] | None = None,
        defaults: Defaults | None = None,
        on_step: Observer | None = None,
    ) -> None:
        if options is not None and not dataclasses.is_dataclass(options):
            raise TypeError(f"options={options!r}: must be a dataclass")
        self.name = name
        self.body = body
        self.options = options
        self._journal = journal
        self._defaults = defaults
        self._on_step = on_step
        self.__doc__ = body.__doc__

    def __repr__(self) -> str:
        return f"<Workflow {self.name}>"

    def check(self, run_id: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` as they travel, once checked: refused here rather than in a worker.

        Raises:
            InvalidRunId: the run id is not one the journal accepts.
            InvalidArguments: an option the workflow does not take, or of the wrong type.
        """
        run = Keyspace().run(self.name, run_id).run
        given = dict(options)
        check_arguments(run, self._signature(), given)
        return given

    def encode(self, options: Opts | None) -> dict[str, Any]:
        """Typed options as they travel: a dataclass's fields that differ from their default."""
        if options is None:
            return {}
        if self.options is None:
            return dict(cast(Mapping[str, Any], options))
        return {
            field.name: getattr(options, field.name)
            for field in dataclasses.fields(self.options)  # type: ignore[arg-type]
            if getattr(options, field.name) != _default(field)
        }

    def decode(self, run: str, args: Mapping[str, Any]) -> Opts:
        """Options read back from a run's meta, checked again: a journal may outlive the code.

        Raises:
            InvalidArguments: frozen options this workflow no longer takes.
        """
        check_arguments(run, self._signature(), args)
        if self.options is None:
            return dict(args)  # type: ignore[return-value]
        return self.options(**args)

    def start(
        self,
        run_id: str,
        options: Opts | None = None,
        *,
        on_step: Observer | None = None,
        journal: Journal | None = None,
    ) -> Outcome:
        """Run (or resume) one run in this process under its lease; a worker's delivery is the same.

        ``options`` are the run's inputs. The first start freezes them in the run's meta; every
        later start (a redelivery, the due sweep, a command line) gets the frozen ones, so a
        resumed run takes the same path as its first attempt.

        Raises:
            InvalidRunId, InvalidArguments: before anything is written.
            LeaseBusy: another live holder has the run.
            RunParked: the run kept dying at start and was set aside.
            LeaseLost: the lease was lost mid-run; nothing more was written.
            StoreUnavailable: Redis could not be reached.
            RetryScheduled: the body raised an error ``Settings.run_retry`` calls transient;
                the run stays due and the sweep starts it again (the error is the cause).
            GaveUp: the same, once the retry deadline has passed: the run is failed for good.
            Exception: whatever else the body raised, after the run was marked failed.
        """
        return self._start(run_id, self.encode(options), journal=journal, on_step=on_step)

    def _start(
        self,
        run_id: str,
        args: Mapping[str, Any],
        *,
        journal: Journal | None = None,
        on_step: Observer | None = None,
        delivered: bool = False,
    ) -> Outcome:
        """``start`` with the options as they travel (a delivery's), ``defaults()`` filled in.

        ``delivered`` counts the start in the run's ``deliveries`` (a queue delivered it), in
        the same round trip as the opening.
        """
        if journal is None:
            if self._journal is None:
                raise TypeError(f"workflow {self.name!r} has no journal: pass one")
            journal = self._journal()
        keys = journal.keys(self.name, run_id)
        merged = {**self._defaults(run_id), **args} if self._defaults is not None else dict(args)
        check_arguments(keys.run, self._signature(), merged)
        return journal._deliver(
            keys, self.invoke, args=merged, on_step=self._observers(on_step), delivered=delivered
        )

    def invoke(self, run: Run) -> R:
        """The body, with the options the run froze at its first start (``run.args``).

        What ``start`` runs under the lease, and what a replay in memory runs
        (``journal.testing``), so both decode the frozen options alike.
        """
        options = self.decode(run.keys.run, run.args)
        if self.options is None:
            return self.body(run, **options)  # type: ignore[arg-type]
        return self.body(run, options)

    def _signature(self) -> Callable[..., Any]:
        """What options are checked against: a dataclass's ``__init__``, else the body.

        Checking skips the first parameter: ``self`` of an ``__init__``, a body's run.
        """
        return self.body if self.options is None else self.options.__init__

    def _observers(self, on_step: Observer | None) -> Observer | None:
        own = self._on_step
        if on_step is None or own is None:
            return on_step or own

        def both(event: StepEvent) -> None:
            on_step(event)
            own(event)

        return both


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@overload
def workflow(
    name: str,
    *,
    options: type[Opts],
    journal: Callable[[], Journal] | None = None,
    defaults: Defaults | None = None,
    on_step: Observer | None = None,
) -> Callable[[Callable[[Run, Opts], R]], Workflow[Opts, R]]: ...


@overload
def workflow(
    name: str,
    *,
    options: None = None,
    journal: Callable[[], Journal] | None = None,
    defaults: Defaults | None = None,
    on_step: Observer | None = None,
) -> Callable[[Callable[..., R]], Workflow[dict[str, Any], R]]: ...


def workflow(
    name: str,
    *,
    options: type[Any] | None = None,
    journal: Callable[[], Journal] | None = None,
    defaults: Defaults | None = None,
    on_step: Observer | None = None,
) -> Callable[[Callable[..., Any]], Workflow[Any, Any]]:
    """Define ``fn`` as the workflow ``name``: the one way to define one (see ``Workflow``).

    Example::

        @journal.workflow("invoice", options=InvoiceOptions)
        def invoice(run: journal.Run, o: InvoiceOptions) -> dict: ...

        invoice.start("A-1001", InvoiceOptions(customer="c1"), journal=j)  # here -> Outcome
        durable.register(invoice).start("A-1001", InvoiceOptions(customer="c1"))  # a worker
    """

    def decorate(fn: Callable[..., Any]) -> Workflow[Any, Any]:
        return Workflow(
            name, fn, journal=journal, options=options, defaults=defaults, on_step=on_step
        )

    return decorate

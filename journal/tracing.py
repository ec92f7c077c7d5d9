"""Traces of runs through OpenTelemetry: off, and never imported, unless configured.

Tracing is the optional extra ``durable-digest[otel]``. It is on when the standard
variables configure an exporter: ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``; ``none``
turns it off) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and ``OTEL_SDK_DISABLED`` is not ``true``. The
decision is taken once per process, at the first span, so a worker's pool child decides
after the fork. Off, every function here is a no-op and ``opentelemetry`` is never imported:
a command line stays light. A process that sets up OpenTelemetry itself (a global tracer
provider) keeps its own provider; ``configure`` gives one explicitly (tests, an application
that exports elsewhere).

What a run traces:
    ``journal.delivery <workflow>``  one per delivery (a worker's or a command line's start),
        a child of the publisher's span when the message carried its context; attributes
        ``journal.run``, ``journal.workflow``, ``journal.run_id``, ``journal.fence``,
        ``journal.attempt`` (this start's number), ``journal.delivery`` (a queue's delivery
        number), ``journal.first_delivery``, ``journal.outcome`` (``done``, ``waiting``,
        ``already-done``, ``cancelled``, or the error's type), ``journal.result_status`` (a
        finished run's outcome, ``events.outcome_of``), ``journal.steps.ran`` and
        ``journal.steps.replayed``. Every delivery but the first traced one carries a link to
        the first's span, whose context the opening script keeps in ``meta.trace`` (HSETNX, in
        the opening's own round trip): a run's deliveries may lie days apart, each in its own
        trace, and the link joins them.
    ``journal.step <key>``  one per step the delivery ran or replayed, a child of its
        delivery, drawn from the step's start to its record; attributes ``journal.step``,
        ``journal.step.kind``, ``journal.step.replayed``, ``journal.step.attempt``.
    whatever the application opens with ``span`` (a model call, with its model, tokens and
        cost), a child of the current span.

A step's span is made when the step is reported, not opened around its body: the step's
record is what says whether it ran or was found recorded by another holder, and a map's
items report in item order from their own threads. So an application's span inside a step
is a sibling of the step's span, under the delivery, not its child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from journal.errors import LeaseBusy, RetryScheduled

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider

log = logging.getLogger(__name__)

__all__ = ["SpanHandle", "configure", "enabled", "extracted", "inject", "span"]

Attributes = Mapping[str, str | bool | int | float]

# The module's one piece of state: None until decided, then the tracer or False (off).
_tracer: Tracer | Literal[False] | None = None
_deciding = threading.Lock()


class SpanHandle(Protocol):
    """What ``span`` yields: an OpenTelemetry span, or a stand-in that records nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        """Add an attribute (tokens and cost are known only once the call answered)."""
        ...


class _Nothing:
    """The span of a process that does not trace."""

    def set_attribute(self, key: str, value: Any) -> None:
        """Record nothing."""


_NOTHING = _Nothing()


def configure(provider: TracerProvider | None) -> None:
    """Trace through ``provider`` from now on, whatever the environment says; None: stop.

    For tests (the SDK's in-memory exporter) and for a process that builds its provider
    itself and wants the journal's spans in it without the ``OTEL_*`` variables.
    """
    global _tracer
    with _deciding:
        _tracer = False if provider is None else provider.get_tracer("journal")


def enabled() -> bool:
    """Whether this process traces (decided at the first call, from the environment)."""
    return _active() is not None


@contextlib.contextmanager
def span(name: str, attributes: Attributes | None = None) -> Iterator[SpanHandle]:
    """A span around a block, a child of the current one; a no-op when tracing is off.

    The hook an application puts around what it wants seen inside a delivery, a model call
    above all::

        with journal.tracing.span("model.call", {"llm.model": model}) as traced:
            answer = client.messages.create(...)
            traced.set_attribute("llm.tokens.output", answer.usage.output_tokens)

    An exception leaving the block is recorded on the span and marks it failed.
    """
    tracer = _active()
    if tracer is None:
        yield _NOTHING
        return
    with tracer.start_as_current_span(name, attributes=dict(attributes or {})) as opened:
        yield opened


def inject(carrier: dict[str, Any] | None = None) -> dict[str, Any]:
    """The current trace context added to ``carrier`` (``traceparent``) for a message to carry.

    Returns:
        ``carrier`` (a new dict when None), unchanged when tracing is off or no span is current.
    """
    carrier = {} if carrier is None else carrier
    if _active() is not None:
        from opentelemetry import propagate

        propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def extracted(carrier: Mapping[str, Any]) -> Iterator[None]:
    """The trace context a message carried made current for the block, so spans continue it."""
    if _active() is None:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        context.detach(token)


# -- what the journal itself reports ----------------------------------------------------------


class Delivery:
    """The span of one delivery, filled in as the delivery learns about its run.

    ``context`` is the span's own context as a W3C ``traceparent``, for the opening script to
    keep as the run's first; "" when the delivery is not traced.
    """

    def __init__(self, opened: Span | None = None) -> None:
        self._span = opened
        self.context = "" if opened is None else _traceparent(opened)

    def opened(self, *, fence: int, attempt: int, delivery: int, first: str | None) -> None:
        """The run is held: its fence and counts, and a link to the first traced delivery."""
        if self._span is None:
            return
        self._span.set_attributes(
            {
                "journal.fence": fence,
                "journal.attempt": attempt,
                "journal.first_delivery": not first,
            }
        )
        if delivery:
            self._span.set_attribute("journal.delivery", delivery)
        linked = _span_context(first) if first else None
        if linked is not None:
            self._span.add_link(linked, {"journal.link": "first delivery"})

    def ended(self, outcome: str, result_status: str = "", ran: int = 0, replayed: int = 0) -> None:
        """How the delivery ended, and what it did."""
        if self._span is None:
            return
        self._span.set_attributes(
            {
                "journal.outcome": outcome,
                "journal.steps.ran": ran,
                "journal.steps.replayed": replayed,
            }
        )
        if result_status:
            self._span.set_attribute("journal.result_status", result_status)


@contextlib.contextmanager
def delivery(workflow: str, run_id: str) -> Iterator[Delivery]:
    """The span of one delivery of ``workflow:run_id`` (the journal's own; see the module)."""
    tracer = _active()
    if tracer is None:
        yield Delivery()
        return
    attributes = {
        "journal.run": f"{workflow}:{run_id}",
        "journal.workflow": workflow,
        "journal.run_id": run_id,
    }
    with tracer.start_as_current_span(
        f"journal.delivery {workflow}",
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as opened:
        handle = Delivery(opened)
        try:
            yield handle
        except BaseException as error:
            # An exception is how a delivery retries or fails: its type is the outcome, and
            # only a failure marks the span failed (a busy lease or a scheduled retry is not).
            opened.set_attribute("journal.outcome", type(error).__name__)
            if isinstance(error, Exception) and not isinstance(error, LeaseBusy | RetryScheduled):
                from opentelemetry.trace import Status, StatusCode

                opened.record_exception(error)
                opened.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise


def step(key: str, *, kind: str, replayed: bool, attempt: int, seconds: float = 0.0) -> None:
    """The span of a step just reported, ending now and ``seconds`` long (the journal's own)."""
    tracer = _active()
    if tracer is None:
        return
    end = time.time_ns()
    opened = tracer.start_span(
        f"journal.step {key}",
        start_time=end - int(seconds * 1e9),
        attributes={
            "journal.step": key,
            "journal.step.kind": kind,
            "journal.step.replayed": replayed,
            "journal.step.attempt": attempt,
        },
    )
    opened.end(end_time=end)


# -- internals ---------------------------------------------------------------------------------


def _active() -> Tracer | None:
    """The tracer, decided from the environment at the first call; None when off."""
    global _tracer
    if _tracer is None:
        with _deciding:
            if _tracer is None:
                _tracer = _from_environment() or False
    return _tracer or None


def _from_environment() -> Tracer | None:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = [
        name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",") if name
    ]
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporters == ["none"] or not (exporters or endpoint):
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    except ImportError:
        log.warning(
            "OTEL_* asks for traces, but OpenTelemetry is not installed: pip install "
            "durable-digest[otel]; tracing stays off"
        )
        return None
    current = trace.get_tracer_provider()
    if isinstance(current, trace.ProxyTracerProvider):  # nobody set one up: ours, from OTEL_*
        built = SdkProvider()
        for name in exporters or ["otlp"]:
            _export(built, name)
        trace.set_tracer_provider(built)
    return trace.get_tracer("journal")


def _export(provider: Any, name: str) -> None:
    """Add the exporter ``name`` to ``provider`` (the SDK reads its own OTEL_* settings)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif name == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif name != "none":
        log.warning("OTEL_TRACES_EXPORTER=%s is not one the journal builds (otlp, console)", name)


def _traceparent(opened: Span) -> str:
    """A span's own context in W3C form, as it is kept in a run's meta."""
    ctx = opened.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _span_context(traceparent: str) -> SpanContext | None:
    """The span context a ``traceparent`` names; None when it is not one (a link is optional)."""
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    found = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    linked = get_current_span(found).get_span_context()
    return linked if linked.is_valid else None

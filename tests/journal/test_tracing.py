"""Traces: a span per delivery, a child per step, deliveries of one run linked to the first.

Spans go to the SDK's in-memory exporter, so the worker that makes them runs in this process:
Celery's own test worker in a thread (solo pool), consuming from a real broker on the test's
Valkey, never eager. Tracing off is checked in a fresh interpreter, whose imports are its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from journal import Journal, Keyspace, Run, Settings, tracing, workflow
from journal.integrations.celery import Durable, at_least_once_settings

DELIVERY = "journal.delivery wf"


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield provider, exporter
    tracing.configure(None)


def napping(run: Run) -> dict[str, str]:
    """A step, a short durable sleep (the first delivery suspends there), a step."""
    run.step("a", lambda: 1)
    run.sleep("nap", 0.3)
    run.step("b", lambda: 2)
    return {"status": "sent"}


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def children(spans: tuple[ReadableSpan, ...], parent: ReadableSpan) -> dict[str, bool]:
    """The steps under ``parent``: key -> replayed."""
    return {
        str(s.attributes["journal.step"]): bool(s.attributes["journal.step.replayed"])
        for s in spans
        if s.attributes and "journal.step" in s.attributes
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    }


def broker_url(store_url: str) -> str:
    """The test's Valkey as Celery's broker (kombu names a Unix socket its own way)."""
    if store_url.startswith("unix://"):
        return "redis+socket://" + store_url.removeprefix("unix://")
    return store_url


@pytest.mark.slow
def test_two_deliveries_of_one_run_from_a_real_worker_are_linked_to_the_first(
    exported: tuple[TracerProvider, InMemorySpanExporter],
    shared_redis_url: str,
    real_redis: redis.Redis,
    prefix: str,
) -> None:
    provider, exporter = exported
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker=broker_url(shared_redis_url))
    app.conf.update(
        at_least_once_settings(visibility_timeout=3600, task_time_limit=1800),
        task_default_queue=f"{prefix}-q",
        task_track_started=False,
    )
    journal = Journal(real_redis, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=5.0))
    durable = Durable(app, lambda: journal)
    wf = durable.register(workflow("wf")(napping), task_name=f"{app.main}.wf")
    keys = journal.keys("wf", "r1")

    # Celery's test worker sets the process's root logger to its log level (ERROR unless told):
    # WARNING, the default, leaves the warnings of the tests that run after this one alone.
    with start_worker(
        app, pool="solo", perform_ping_check=False, shutdown_timeout=10, loglevel="WARNING"
    ):
        with provider.get_tracer("test").start_as_current_span("publish") as publisher:
            wf.start("r1")
        deadline = time.monotonic() + 20
        while journal.meta(keys).status != "done":
            assert time.monotonic() < deadline, f"the run did not finish: {journal.meta(keys)!r}"
            time.sleep(0.05)

    spans = exporter.get_finished_spans()
    first, second = by_name(spans, DELIVERY)  # exactly two deliveries
    # The publisher's context travelled in the message: the first delivery is its child.
    assert first.parent is not None
    assert first.parent.span_id == publisher.get_span_context().span_id
    assert first.context.trace_id == publisher.get_span_context().trace_id
    # Every later delivery links to the first, whose context the run's meta keeps.
    assert first.links == ()
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    ctx = first.context
    meta = journal.meta(keys)
    assert meta["trace"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["journal.run"] == "wf:r1"
    assert (first.attributes["journal.delivery"], second.attributes["journal.delivery"]) == (1, 2)
    assert first.attributes["journal.first_delivery"] is True
    assert second.attributes["journal.first_delivery"] is False
    assert int(str(first.attributes["journal.fence"])) < int(
        str(second.attributes["journal.fence"])
    )
    assert (first.attributes["journal.outcome"], second.attributes["journal.outcome"]) == (
        "waiting",
        "done",
    )
    assert second.attributes["journal.result_status"] == "sent"

    # The step spans are children of their own delivery: ran in one, replayed in the next.
    ran_first = children(spans, first)
    ran_second = children(spans, second)
    assert ran_first["a"] is False and "b" not in ran_first
    assert ran_second["a"] is True and ran_second["b"] is False
    assert len([s for s in spans if s.name.startswith("journal.step ")]) == len(ran_first) + len(
        ran_second
    )


def test_starts_in_process_are_traced_and_linked_alike(
    exported: tuple[TracerProvider, InMemorySpanExporter], prefix: str
) -> None:
    _, exporter = exported
    journal = Journal(fakeredis.FakeRedis(), keyspace=Keyspace(prefix))
    wf = workflow("wf")(napping)
    assert wf.start("r1", journal=journal).status == "waiting"
    time.sleep(0.35)
    assert wf.start("r1", journal=journal).status == "done"

    spans = exporter.get_finished_spans()
    first, second = by_name(spans, DELIVERY)
    assert first.parent is None  # no publisher: a root
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert second.attributes is not None and second.attributes["journal.attempt"] == 2
    assert "journal.delivery" not in second.attributes  # not a queue's delivery
    steps = children(spans, second)
    assert steps["a"] is True and steps["b"] is False


def test_the_hooks_span_carries_the_attributes_given_and_set(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = exported
    with (
        provider.get_tracer("test").start_as_current_span("around") as around,
        tracing.span("model.call", {"llm.model": "claude-x", "llm.batch": False}) as call,
    ):
        call.set_attribute("llm.tokens.output", 812)
        call.set_attribute("llm.cost_usd", 0.0123)

    (span,) = by_name(exporter.get_finished_spans(), "model.call")
    assert dict(span.attributes or {}) == {
        "llm.model": "claude-x",
        "llm.batch": False,
        "llm.tokens.output": 812,
        "llm.cost_usd": 0.0123,
    }
    assert span.parent is not None and span.parent.span_id == around.get_span_context().span_id


def test_the_hook_records_nothing_when_tracing_is_off(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = exported
    tracing.configure(None)
    with tracing.span("model.call", {"llm.model": "claude-x"}) as call:
        call.set_attribute("llm.cost_usd", 0.0123)
    assert not tracing.enabled()
    assert tracing.inject() == {}
    assert exporter.get_finished_spans() == ()


def test_a_run_not_traced_keeps_no_trace_context(
    exported: tuple[TracerProvider, InMemorySpanExporter], prefix: str
) -> None:
    tracing.configure(None)
    journal = Journal(fakeredis.FakeRedis(), keyspace=Keyspace(prefix))
    wf = workflow("wf")(napping)
    wf.start("r1", journal=journal)
    assert "trace" not in journal.meta(journal.keys("wf", "r1"))
    assert exported[1].get_finished_spans() == ()


# redis-py (7+) imports the OpenTelemetry SDK's metrics itself whenever the SDK is installed,
# as the otel extra installs it: what is measured is what importing and running the journal
# adds to what its dependencies import.
OFF = """
import json, sys
import celery, fakeredis, redis
before = set(sys.modules)
import journal, journal.tracing, journal.integrations.celery
from journal import Journal, workflow

wf = workflow("wf")(lambda run: run.step("a", lambda: 1))
j = Journal(fakeredis.FakeRedis())
wf.start("r1", journal=j)
print(json.dumps({
    "enabled": journal.tracing.enabled(),
    "added": sorted(m for m in set(sys.modules) - before if m.startswith("opentelemetry")),
    "meta": sorted(j.meta(j.keys("wf", "r1"))),
}))
"""


@pytest.mark.slow
def test_off_without_otel_variables_imports_nothing_and_writes_no_meta_field() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", OFF],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen: dict[str, Any] = json.loads(done.stdout)
    assert seen["enabled"] is False
    assert seen["added"] == []
    assert "trace" not in seen["meta"] and "status" in seen["meta"]

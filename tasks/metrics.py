"""Prometheus metrics of the digest, correct under Celery's prefork pool.

Counters live in ``prometheus_client``'s multiprocess mode: each pool child writes its own
files under ``PROMETHEUS_MULTIPROC_DIR`` and a scrape sums them, so a child's counts are
neither lost at fork nor when it exits. The worker sets that directory up before anything
imports ``prometheus_client`` (``tasks.runtime.prepare_metrics``); the command line never
imports this module, only the worker with ``DIGEST_METRICS_PORT`` and the console do.

Counted where they happen, through ``journal.events`` (the journal knows nothing of
Prometheus): steps ran and replayed, model calls, tokens and dollars by model, step retries by
cause, lease takeovers, fenced writes refused, renewals failed, seconds waited for room in
the shared rate limits and calls refused for them (429). Read from Redis at scrape time: the
due index's lag (age of its oldest overdue entry), runs by state, and each model's rate limits
as the API last stated them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from journal import Journal
from journal.events import listen
from journal.inspect import STATES, list_runs
from tasks.ratelimit import LimitState

STEPS = Counter("digest_steps_total", "Steps passed, by outcome: ran or replayed.", ["outcome"])
CALLS = Counter("digest_model_calls_total", "Model calls made, by model.", ["model"])
TOKENS = Counter("digest_model_tokens_total", "Model tokens, by model and kind.", ["model", "kind"])
COST = Counter("digest_model_cost_usd_total", "Dollars spent on model calls, by model.", ["model"])
RETRIES = Counter("digest_step_retries_total", "Step attempts retried, by cause.", ["cause"])
TAKEOVERS = Counter("digest_lease_takeovers_total", "Leases of provably dead holders taken over.")
FENCED = Counter("digest_fenced_writes_refused_total", "Writes refused by the fence.")
CAPACITY_WAIT = Counter(
    "digest_model_capacity_wait_seconds_total",
    "Seconds model calls waited for room in the rate limits shared on the API key, by model.",
    ["model"],
)
RATE_LIMITED = Counter(
    "digest_model_rate_limited_total",
    "Model calls the API refused for its rate limits (429), by model.",
    ["model"],
)
RENEWALS_FAILED = Counter(
    "digest_lease_renewals_failed_total", "Lease renewals that found it lost."
)


def count(event: str, label: str, amount: float) -> None:
    """The ``journal.events`` listener: one event, one counter."""
    if event == "step":
        STEPS.labels(label).inc(amount)
    elif event == "model_call":
        CALLS.labels(label).inc(amount)
    elif event in ("input_tokens", "output_tokens"):
        TOKENS.labels(label, event.removesuffix("_tokens")).inc(amount)
    elif event == "cost_usd":
        COST.labels(label).inc(amount)
    elif event == "retry":
        RETRIES.labels(label).inc(amount)
    elif event == "takeover":
        TAKEOVERS.inc(amount)
    elif event == "fenced":
        FENCED.inc(amount)
    elif event == "renewal_failed":
        RENEWALS_FAILED.inc(amount)
    elif event == "capacity_wait_seconds":
        CAPACITY_WAIT.labels(label).inc(amount)
    elif event == "rate_limited":
        RATE_LIMITED.labels(label).inc(amount)


listen(count)


class JournalCollector(Collector):
    """What only Redis knows, read at scrape time: due-index lag and runs by state.

    The journal comes from a factory called at each scrape, so a worker whose store was down
    when it started still serves its counters, and the gauges once the store is back
    (connecting asks the server whether it is a cluster node, which needs it up).
    """

    def __init__(self, journal: Callable[[], Journal], limit: int = 1000) -> None:
        self.journal = journal
        self.limit = limit

    def collect(self) -> Iterator[Any]:
        """Yield the two gauges."""
        journal = self.journal()
        lag = GaugeMetricFamily(
            "digest_due_lag_seconds", "Age of the oldest overdue entry of the due index (0: none)."
        )
        oldest = journal.call(journal.backend.oldest_due)
        overdue = 0.0 if oldest is None else time.time() - oldest / 1000
        lag.add_metric([], max(overdue, 0.0))
        yield lag
        states = GaugeMetricFamily(
            "digest_runs", "Runs in the runs index by state (the newest 1000).", labels=["state"]
        )
        counts = dict.fromkeys(STATES, 0)
        for row in list_runs(journal, limit=self.limit):
            counts[row.state] = counts.get(row.state, 0) + 1
        for state, n in counts.items():
            states.add_metric([state], n)
        yield states


class LimitsCollector(Collector):
    """Each model's shared rate limits as the API last stated them, read at scrape time.

    Args:
        states: reads them (``RateLimiter.states``), at each scrape.
    """

    def __init__(self, states: Callable[[], list[LimitState]]) -> None:
        self.states = states

    def collect(self) -> Iterator[Any]:
        """Yield the limit, the burst and what remained, by model and kind."""
        labels = ["model", "kind"]
        limit = GaugeMetricFamily(
            "digest_model_limit_per_minute", "The API's rate limit, per minute.", labels=labels
        )
        burst = GaugeMetricFamily(
            "digest_model_limit_burst", "The rate limit's bucket as learned.", labels=labels
        )
        remaining = GaugeMetricFamily(
            "digest_model_limit_remaining",
            "What the API said remained of the limit at its last answer.",
            labels=labels,
        )
        for state in self.states():
            for kind, known in state.kinds.items():
                limit.add_metric([state.model, kind], known.per_minute)
                burst.add_metric([state.model, kind], known.burst)
                remaining.add_metric([state.model, kind], known.remaining)
        yield from (limit, burst, remaining)


def registry(
    journal: Callable[[], Journal], limits: Callable[[], list[LimitState]] | None = None
) -> CollectorRegistry:
    """A registry summing every process's counters, plus the gauges of ``journal()``.

    Args:
        journal: the journal the gauges read.
        limits: the shared rate limits' states, for their gauges (none without it).
    """
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    collected.register(JournalCollector(journal))
    if limits is not None:
        collected.register(LimitsCollector(limits))
    return collected


def child_exited(pid: int) -> None:
    """Forget a dead child's live gauges; its counters stay counted."""
    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]

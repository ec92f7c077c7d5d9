"""Prometheus metrics of the journal and the digest, correct under Celery's prefork pool.

Two prefixes, two owners: ``journal_*`` is what any durable workflow has (steps, runs, leases,
the due index), labelled by ``workflow`` and, per step, by the step's name (``summarize``, not
``summarize:i4``: one series per kind of step, not per item); ``digest_*`` is this app's (model
calls, tokens, dollars, waits for rate-limit room and 429s, the send).

Counted where they happen, through ``journal.events`` (the journal knows nothing of
Prometheus), in ``prometheus_client``'s multiprocess mode: each pool child writes its own files
under ``PROMETHEUS_MULTIPROC_DIR`` and a scrape of the worker sums them, so a child's counts
are neither lost at fork nor when it exits. The worker sets that directory up before anything
imports ``prometheus_client`` (``tasks.runtime.prepare_metrics``). A ``digest run`` in a shell
serves nothing: its runs are counted by the gauges read from Redis.

Read from Redis at scrape time, by ONE exporter (the console's ``/metrics`` or ``digest
metrics``), never by every worker: runs by workflow and state over the whole runs index, and
the due index's lag, and each model's rate limits as the API last stated them. Every registry
also carries ``process_*`` of the serving process and ``digest_build_info``.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from journal import Journal
from journal.events import listen, outcome_of
from journal.ops.views import STATES, RunRow, inspect_run, list_runs
from tasks.llm.cost import usage_of
from tasks.llm.ratelimit import LimitState

LIVE = ("running", "waiting", "retrying")
DONE_WEEK = ("sent", "nothing-new")

# Seconds: a step is a model call or a Redis write; a run includes its waits (up to days).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RUN_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
CALL_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)

STEPS = Counter(
    "journal_steps_total",
    "Steps passed, by workflow, step name and outcome: ran or replayed.",
    ["workflow", "step", "outcome"],
)
STEP_SECONDS = Histogram(
    "journal_step_duration_seconds",
    "Seconds from a step's start to its record, retries included, by workflow and step name.",
    ["workflow", "step"],
    buckets=STEP_BUCKETS,
)
RUNS_FINISHED = Counter(
    "journal_runs_finished_total",
    "Runs ended, by workflow and outcome (the result's status, failed or cancelled).",
    ["workflow", "outcome"],
)
RUN_SECONDS = Histogram(
    "journal_run_duration_seconds",
    "Seconds from a run's creation to its end, waits and retry back-offs included.",
    ["workflow", "outcome"],
    buckets=RUN_BUCKETS,
)
RETRIES = Counter("journal_step_retries_total", "Step attempts retried, by cause.", ["cause"])
TAKEOVERS = Counter(
    "journal_lease_takeovers_total", "Leases of provably dead holders taken over.", ["workflow"]
)
FENCED = Counter(
    "journal_fenced_writes_refused_total", "Writes refused by the fence.", ["workflow"]
)
RENEWALS_FAILED = Counter(
    "journal_lease_renewals_failed_total", "Lease renewals that found it lost.", ["workflow"]
)
AMBIGUOUS = Counter(
    "journal_effects_ambiguous_total",
    "Effects that may have happened, whose runs wait for an operator's decision, by step.",
    ["workflow", "step"],
)
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
CALLS = Counter("digest_model_calls_total", "Model calls made, by model.", ["model"])
CALL_SECONDS = Histogram(
    "digest_model_call_duration_seconds",
    "Seconds one model request took, by requested model (refused ones included).",
    ["model"],
    buckets=CALL_BUCKETS,
)
TOKENS = Counter(
    "digest_model_tokens_total",
    "Model tokens, by model and kind (input, output, cache_write, cache_read).",
    ["model", "kind"],
)
BATCH_REQUESTS = Counter(
    "digest_batch_requests_total",
    "Requests a Message Batch answered and a run recorded, by model (at half the price).",
    ["model"],
)
COST = Counter("digest_model_cost_usd_total", "Dollars spent on model calls, by model.", ["model"])
FALLBACKS = Counter(
    "digest_model_fallbacks_total",
    "Steps that gave up on a model of their fallback chain for the next, by the model given up.",
    ["model"],
)
DEGRADED = Counter(
    "digest_degraded_items_total",
    "Summaries (and openings) written offline because a run's deadline passed, by kind.",
    ["kind"],
)
SEND_SECONDS = Histogram(
    "digest_send_duration_seconds",
    "Seconds the email's send took, by transport (failed sends included).",
    ["transport"],
    buckets=CALL_BUCKETS,
)


# What one event moves, given its label, its amount and its run's workflow.
Measure = Callable[[str, float, str], None]


def _step_ran(step: str, seconds: float, workflow: str) -> None:
    STEPS.labels(workflow, step, "ran").inc()
    STEP_SECONDS.labels(workflow, step).observe(seconds)


def _run_finished(outcome: str, seconds: float, workflow: str) -> None:
    RUNS_FINISHED.labels(workflow, outcome).inc()
    RUN_SECONDS.labels(workflow, outcome).observe(seconds)


def _tokens(kind: str) -> Measure:
    return lambda model, amount, _: TOKENS.labels(model, kind).inc(amount)


# The table from event (``journal.events``) to metric: an event not in it is counted nowhere.
EVENTS: dict[str, Measure] = {
    "step_ran": _step_ran,
    "step_replayed": lambda step, n, workflow: STEPS.labels(workflow, step, "replayed").inc(n),
    "run_finished": _run_finished,
    "model_call": lambda model, n, _: CALLS.labels(model).inc(n),
    "model_call_seconds": lambda model, seconds, _: CALL_SECONDS.labels(model).observe(seconds),
    "batch_request": lambda model, n, _: BATCH_REQUESTS.labels(model).inc(n),
    "input_tokens": _tokens("input"),
    "output_tokens": _tokens("output"),
    "cache_write_tokens": _tokens("cache_write"),
    "cache_read_tokens": _tokens("cache_read"),
    "cost_usd": lambda model, usd, _: COST.labels(model).inc(usd),
    "send_seconds": lambda transport, seconds, _: SEND_SECONDS.labels(transport).observe(seconds),
    "retry": lambda cause, n, _: RETRIES.labels(cause).inc(n),
    "takeover": lambda _, n, workflow: TAKEOVERS.labels(workflow).inc(n),
    "fenced": lambda _, n, workflow: FENCED.labels(workflow).inc(n),
    "renewal_failed": lambda _, n, workflow: RENEWALS_FAILED.labels(workflow).inc(n),
    "effect_ambiguous": lambda step, n, workflow: AMBIGUOUS.labels(workflow, step).inc(n),
    "capacity_wait_seconds": lambda model, seconds, _: CAPACITY_WAIT.labels(model).inc(seconds),
    "rate_limited": lambda model, n, _: RATE_LIMITED.labels(model).inc(n),
    "model_fallback": lambda model, n, _: FALLBACKS.labels(model).inc(n),
    "degraded": lambda kind, n, _: DEGRADED.labels(kind).inc(n),
}


def count(event: str, label: str, amount: float, workflow: str) -> None:
    """The ``journal.events`` listener: one event, the metrics ``EVENTS`` says it moves."""
    measure = EVENTS.get(event)
    if measure is not None:
        measure(label, amount, workflow)


listen(count)


class BuildInfo(Collector):
    """``digest_build_info{version,python}`` 1: which code a process runs, for dashboards."""

    def collect(self) -> Iterator[Any]:
        """Yield the one gauge."""
        try:
            installed = version("durable-digest")
        except PackageNotFoundError:
            installed = "unknown"
        info = GaugeMetricFamily(
            "digest_build_info", "The running code's version.", labels=["version", "python"]
        )
        info.add_metric([installed, platform.python_version()], 1)
        yield info


class JournalCollector(Collector):
    """What only Redis knows, read at scrape time: runs by workflow and state, due-index lag.

    Every run of the runs index is counted, a page of 100 metas per round trip, so a scrape
    costs one round trip per 100 runs: keep old runs purged. The journal comes from a factory
    called at each scrape, so an exporter whose store was down when it started still serves,
    and the gauges once the store is back.
    """

    def __init__(self, journal: Callable[[], Journal]) -> None:
        self.journal = journal

    def collect(self) -> Iterator[Any]:
        """Yield the two gauges."""
        journal = self.journal()
        lag = GaugeMetricFamily(
            "journal_due_lag_seconds", "Age of the oldest overdue entry of the due index (0: none)."
        )
        oldest = journal.oldest_due()
        overdue = 0.0 if oldest is None else time.time() - oldest / 1000
        lag.add_metric([], max(overdue, 0.0))
        yield lag
        states = GaugeMetricFamily(
            "journal_runs",
            "Runs in the runs index, by workflow and state.",
            labels=["workflow", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for row in list_runs(journal, limit=sys.maxsize):
            workflow = row.run.split(":", 1)[0]
            counts[workflow, row.state] = counts.get((workflow, row.state), 0) + 1
        for workflow in sorted({w for w, _ in counts} or {"digest"}):
            for state in STATES:
                states.add_metric([workflow, state], counts.get((workflow, state), 0))
        yield states


class DigestCollector(Collector):
    """The digest's own gauges read from Redis, for the alert rules in ``deploy/prometheus``.

    ``digest_last_week_done_timestamp_seconds``: when the newest run that ended sent or
    nothing-new ended (a week not done by Monday noon is alerted on), and
    ``digest_last_week_cache_hit_ratio``, the share of that run's prompt tokens read from the
    prompt cache (the per-run ratio ``digest show`` prints); with a budget set,
    ``digest_budget_used_ratio``: the largest share of ``DIGEST_MAX_COST_USD`` any run not yet
    ended has spent (alerted on near its cap).
    """

    def __init__(self, journal: Callable[[], Journal], budget_usd: float | None) -> None:
        self.journal = journal
        self.budget_usd = budget_usd

    def collect(self) -> Iterator[Any]:
        """Yield the gauges."""
        journal = self.journal()
        last_done = GaugeMetricFamily(
            "digest_last_week_done_timestamp_seconds",
            "When the newest digest that ended sent or nothing-new ended (0: none yet).",
        )
        ended_at = 0.0
        cached = 0.0
        live: list[RunRow] = []
        for row in list_runs(journal, limit=sys.maxsize):
            if row.state in LIVE:
                live.append(row)
            elif not ended_at and row.state == "done" and _outcome(row) in DONE_WEEK:
                ended_at = int(row.meta.get("finished_at", row.updated_ms)) / 1000
                steps = inspect_run(journal, *row.run.split(":", 1)).steps  # that run's alone
                cached = usage_of(r.result for r in steps).cache_hit_ratio
        last_done.add_metric([], ended_at)
        yield last_done
        ratio = GaugeMetricFamily(
            "digest_last_week_cache_hit_ratio",
            "The share of prompt tokens the newest digest that ended read from the prompt cache.",
        )
        ratio.add_metric([], cached)
        yield ratio
        if self.budget_usd:
            used = GaugeMetricFamily(
                "digest_budget_used_ratio",
                "The largest share of DIGEST_MAX_COST_USD spent by a run not yet ended.",
            )
            spent = [
                usage_of(r.result for r in inspect_run(journal, *row.run.split(":", 1)).steps)
                for row in live
            ]
            used.add_metric([], max((u.cost_usd for u in spent), default=0.0) / self.budget_usd)
            yield used


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


def _outcome(row: RunRow) -> object:
    """A finished run's outcome as its result named it (``sent``, ``nothing-new``, ...)."""
    return None if row.result is None else outcome_of(row.result)


def _common(collected: CollectorRegistry) -> CollectorRegistry:
    ProcessCollector(registry=collected)
    collected.register(BuildInfo())
    return collected


def worker_registry() -> CollectorRegistry:
    """A worker's: every pool child's counters and histograms, summed; nothing read from Redis."""
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return _common(collected)


def store_registry(
    journal: Callable[[], Journal],
    budget_usd: float | None = None,
    limits: Callable[[], list[LimitState]] | None = None,
) -> CollectorRegistry:
    """The one exporter's: the gauges read from ``journal()``'s store.

    Args:
        journal: the journal the gauges read.
        budget_usd: ``DIGEST_MAX_COST_USD``, for the budget's gauge.
        limits: the shared rate limits' states, for their gauges (none without it).
    """
    collected = CollectorRegistry()
    collected.register(JournalCollector(journal))
    collected.register(DigestCollector(journal, budget_usd))
    if limits is not None:
        collected.register(LimitsCollector(limits))
    return _common(collected)


def child_exited(pid: int) -> None:
    """Forget a dead child's live gauges; its counters stay counted."""
    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]

"""A fake Anthropic Messages API served over real HTTP on 127.0.0.1 (or an address given).

Tests point the real SDK at it (``base_url=server.url``, or ``ANTHROPIC_BASE_URL`` for a CLI or a
Celery worker in another process), so the SDK's own request building, error mapping and timeouts
are what gets exercised, and every call is counted where the test can see it.

Faults are scripted per server:

- ``fail_next(status, times=, contains=)``: the next matching calls fail, then calls succeed.
- ``fail_when(contains, status)`` and ``fail_always(status)``: matching calls keep failing.
- ``model`` on any of them: only calls for that model match, so one model of a fallback chain
  can be overloaded while the next answers.
- ``error_type`` and ``error_code`` on any fault: the body's ``error.type`` and
  ``error.details.error_code``, for answers the status alone does not name (a spend limit is a 429).
- ``known_models``: when set, a request for any other model gets the real API's 404
  ``not_found_error`` ``model: <id>``.
- ``refuse_when(contains)``: a 200 whose ``stop_reason`` is ``refusal``, as the real API answers
  when the model declines.
- ``delay_when(contains, seconds)``: matching calls answer later than the others, so calls
  finish in another order than they were made.
- ``delay`` (seconds before answering) and ``hold()`` / ``release()``: keep a call open so a
  client can time out or a worker can be killed in the middle of it; ``wait_for_calls(n)``
  tells the test the call has arrived.
- ``limit(requests=, input_tokens=, output_tokens=, per=)``: rate limits enforced as the real
  API enforces them, per model (see ``RateLimits``): every answer carries the
  ``anthropic-ratelimit-*`` headers, and a call over a limit gets a 429 ``rate_limit_error``
  with ``retry-after``; ``refused`` counts those.
- ``dated_models``: the model id an answer names for an alias asked for, as the real API
  answers ``claude-haiku-5-5`` with ``claude-haiku-5-5-20261001``.
- ``cache_tokens``: the ``cache_creation_input_tokens`` and ``cache_read_input_tokens`` every
  answer's usage reports. Left at (0, 0), a system prompt marked with ``cache_control`` is
  cached as the real API caches it: written by the first request whose marked prefix reaches
  ``cache_min_tokens``, read by every later one with the same model and prefix.

The Message Batches API (``client.messages.batches``) behaves as the real one does: create,
retrieve, list (newest first, ``before_id`` / ``after_id``), cancel, and the results as JSONL
once the batch has ended, with every result type. A batch takes ``batch_processing_time``
seconds; its requests finish evenly over that time, so a cancel ends those not finished yet as
``canceled`` (those finished stay ``succeeded``, and are paid for); the counts stay at
``processing`` until the whole batch has ended, as the API's do. Each request meets the same
faults as a synchronous call (``fail_when``, ``fail_always``, ``fail_next``, ``refuse_when``),
as an ``errored`` result with the same body; ``expire_when(contains)`` ends matching requests
``expired``. ``fail_batch_next(status)`` refuses the next creations, ``hold_batch_creates()``
creates the batch and holds its answer until ``release_batch_creates()`` (a worker can be killed
after the creation reached the API and before it heard back), ``queue_limit`` refuses a
creation that would put more requests in processing than it allows (429, ``retry-after``).
``batches`` lists what was created; ``paid`` counts the requests billed (``succeeded``) across
batches.

Error answers use the API's shape,
``{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}``, with the
``error.type`` the real API gives that status (``overloaded_error`` for 529); the messages below
(``CREDIT_TOO_LOW``, ``PROMPT_TOO_LONG``, ...) are the real API's words.

Run on its own for manual runs; it serves until killed::

    python -m tests.fakes.anthropic_server --port 8787
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import anthropic

API_KEY = "test-key"
MESSAGES_PATH = "/v1/messages"
BATCHES_PATH = "/v1/messages/batches"
# The API's limit of requests in one batch, and the form of a custom_id.
MAX_BATCH_REQUESTS = 100_000
_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_BATCH_PATH = re.compile(r"/v1/messages/batches/(?P<id>[^/?]+)(?P<rest>/cancel|/results)?")

# The `error.type` and a message like the real API's, for each status.
ERRORS = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Your credit balance is too low"),
    403: ("permission_error", "Your API key does not have permission to use this resource"),
    404: ("not_found_error", "Not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes"),
    429: ("rate_limit_error", "This request would exceed your rate limit"),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}

# The real API's messages for answers whose meaning is in the message, not the status.
CREDIT_TOO_LOW = (
    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing "
    "to upgrade or purchase credits."
)
PROMPT_TOO_LONG = "prompt is too long: 215000 tokens > 200000 maximum"
CONTENT_FILTERED = "Output blocked by content filtering policy"

PEER_HEADER = "x-fake-peer"
_TITLE = re.compile(r'<update title="([^"]*)"')


@dataclass(frozen=True)
class Fault:
    """An error answer, given to calls whose prompt text contains ``contains`` (any, if None)
    and that ask for ``model`` (any, if None)."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    contains: str | None = None
    error_type: str | None = None
    error_code: str | None = None
    model: str | None = None

    def matches(self, text: str, model: str = "") -> bool:
        return (self.contains is None or self.contains in text) and (
            self.model is None or self.model == model
        )


@dataclass(frozen=True)
class Received:
    """One ``POST /v1/messages`` as the server saw it, with the status it answered."""

    number: int
    body: dict[str, Any]
    headers: dict[str, str]
    status: int

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def peer(self) -> str:
        """The address the call came from."""
        return self.headers.get(PEER_HEADER, "")

    @property
    def text(self) -> str:
        """The text of every message, joined by newlines: what ``contains`` matches against."""
        return message_text(self.body)


def message_text(body: Mapping[str, Any]) -> str:
    parts: list[str] = []
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(block.get("text", ""))
                for block in content
                if isinstance(block, dict) and block.get("type") == "text"
            )
    return "\n".join(parts)


def default_reply(request: Received) -> str:
    """``summary of <title>`` for one update, ``opening for <title>, ...`` for the intro."""
    titles = [html.unescape(title) for title in _TITLE.findall(request.text)]
    if "<updates>" in request.text:
        return "opening for " + ", ".join(titles)
    if titles:
        return f"summary of {titles[0]}"
    return f"reply to {len(request.text)} characters"


def error_body(
    status: int,
    message: str = "",
    *,
    error_type: str | None = None,
    error_code: str | None = None,
    request_id: str = "req_fake",
) -> dict[str, Any]:
    fallback = (
        ("api_error", "Internal server error")
        if status >= 500
        else ("invalid_request_error", "Invalid request")
    )
    kind, default = ERRORS.get(status, fallback)
    error: dict[str, Any] = {"type": error_type or kind, "message": message or default}
    if error_code is not None:
        error["details"] = {"error_code": error_code}
    return {"type": "error", "error": error, "request_id": request_id}


LIMIT_KINDS = ("requests", "input-tokens", "output-tokens")


class Bucket:
    """One limit as the real API describes it: ``limit`` units, replenished evenly over ``per``.

    A token bucket of capacity ``limit`` refilled at ``limit / per`` a second, so a full bucket
    allows a burst of ``limit`` and then ``limit`` per ``per`` seconds. ``level`` may go below
    zero: output tokens are only known once the answer is written, and are taken then.
    """

    def __init__(self, limit: float, per: float, now: float) -> None:
        self.limit = limit
        self.rate = limit / per
        self.level = limit
        self.at = now

    def refill(self, now: float) -> None:
        self.level = min(self.limit, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 if it is now); after ``refill``."""
        return max(0.0, (min(amount, self.limit) - self.level) / self.rate)

    def headers(self, kind: str, now: float) -> dict[str, str]:
        full = now + max(0.0, self.limit - self.level) / self.rate
        reset = datetime.fromtimestamp(full, UTC).isoformat(timespec="milliseconds")
        return {
            # Stated per minute, as the real API states it, whatever span it is enforced over.
            f"anthropic-ratelimit-{kind}-limit": str(round(self.rate * 60)),
            f"anthropic-ratelimit-{kind}-remaining": str(max(0, math.floor(self.level))),
            f"anthropic-ratelimit-{kind}-reset": reset.replace("+00:00", "Z"),
        }


@dataclass(frozen=True)
class RateLimits:
    """The limits of one model: requests, input and output tokens per ``per`` seconds.

    The real API states them per minute; a test states them per second (``per=1``) to run fast.
    A limit left None is not enforced and not reported.
    """

    requests: float | None = None
    input_tokens: float | None = None
    output_tokens: float | None = None
    per: float = 60.0

    def buckets(self, now: float) -> dict[str, Bucket]:
        limits = zip(
            LIMIT_KINDS, (self.requests, self.input_tokens, self.output_tokens), strict=True
        )
        return {kind: Bucket(limit, self.per, now) for kind, limit in limits if limit is not None}


class FakeAnthropic:
    """A running fake API; thread-safe counters of what it received.

    Args:
        port: 0 picks a free port.
        host: the address served: loopback, or a test network's address for workers on
            other hosts (``tests/hosts.py``).
        delay: Seconds every call waits before it is answered (settable later).
        reply: The text of a successful answer, from the request.
        log: Receives one line per call (the CLI prints them).
    """

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        delay: float = 0.0,
        reply: Callable[[Received], str] = default_reply,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.delay = delay
        self._port = port
        self._host = host
        self._reply = reply
        self._log = log
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._received: list[Received] = []
        self._rules: list[Fault] = []
        self._queue: list[tuple[Fault, int]] = []
        self._refusals: list[str] = []
        self._delays: list[tuple[str, float]] = []
        self.known_models: set[str] | None = None
        self.dated_models: dict[str, str] = {}
        self.cache_tokens = (0, 0)
        self._limits: RateLimits | None = None
        self._buckets: dict[str, dict[str, Bucket]] = {}
        self._refused = 0
        self._released = threading.Event()
        self._released.set()
        self.cache_min_tokens = 1024
        self._cached: set[tuple[str, str]] = set()
        self.batch_processing_time = 1.0
        self.batch_cancel_delay = 0.0
        self.queue_limit: int | None = None
        self._batches: list[FakeBatch] = []
        self._batch_items = 0
        self._batch_faults: list[tuple[Fault, int]] = []
        self._expiring: list[str] = []
        self._creates_released = threading.Event()
        self._creates_released.set()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle

    def start(self) -> FakeAnthropic:
        httpd = _Server((self._host, self._port), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; held or delayed calls are let go first so their threads can end."""
        self._stopping.set()
        self._released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the fake Anthropic server is not started; call start() first")
        return f"http://{self._host}:{self._httpd.server_address[1]}"

    def env(self) -> dict[str, str]:
        """The variables that send the SDK, in this process or a child, to this server."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": API_KEY}

    def client(self, **options: Any) -> anthropic.Anthropic:
        """A real SDK client on this server; no SDK retries unless ``max_retries`` is given."""
        import anthropic  # seconds to import: only the tests that talk to the SDK pay for it

        settings: dict[str, Any] = {"api_key": API_KEY, "base_url": self.url, "max_retries": 0}
        return anthropic.Anthropic(**(settings | options))

    # --- what was received

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self._received)

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    @property
    def models(self) -> list[str]:
        return [request.model for request in self.requests]

    def calls_per_model(self) -> dict[str, int]:
        """Calls received for each model, answered or not."""
        counts: dict[str, int] = {}
        for model in self.models:
            counts[model] = counts.get(model, 0) + 1
        return counts

    def calls_for(self, substring: str) -> int:
        """Calls whose prompt text contains ``substring``, such as one item's title."""
        return sum(substring in request.text for request in self.requests)

    @property
    def refused(self) -> int:
        """Calls answered 429 because they were over a rate limit (``limit``)."""
        with self._lock:
            return self._refused

    def answered(self) -> int:
        """Calls answered 200."""
        return sum(request.status == 200 for request in self.requests)

    def wait_for_calls(self, count: int, timeout: float = 5.0) -> None:
        """Block until ``count`` calls have arrived (answered or not)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._received) >= count, timeout):
                raise TimeoutError(
                    f"expected {count} calls at the fake Anthropic API within {timeout} s, "
                    f"got {len(self._received)}"
                )

    # --- scripting

    def fail_next(
        self,
        status: int = 429,
        *,
        times: int = 1,
        headers: Mapping[str, str] | None = None,
        contains: str | None = None,
        message: str = "",
        error_type: str | None = None,
        error_code: str | None = None,
        model: str | None = None,
    ) -> None:
        """Answer the next ``times`` matching calls with ``status``; later ones succeed."""
        fault = Fault(status, dict(headers or {}), message, contains, error_type, error_code, model)
        with self._lock:
            self._queue.append((fault, times))

    def fail_when(
        self,
        contains: str,
        status: int = 400,
        *,
        headers: Mapping[str, str] | None = None,
        message: str = "",
        error_type: str | None = None,
        error_code: str | None = None,
        model: str | None = None,
    ) -> None:
        """Answer every call whose prompt contains ``contains`` with ``status``."""
        fault = Fault(status, dict(headers or {}), message, contains, error_type, error_code, model)
        with self._lock:
            self._rules.append(fault)

    def fail_always(
        self,
        status: int = 401,
        *,
        headers: Mapping[str, str] | None = None,
        message: str = "",
        error_type: str | None = None,
        error_code: str | None = None,
        model: str | None = None,
    ) -> None:
        """Answer every call (every call for ``model``, if given) with ``status``."""
        fault = Fault(status, dict(headers or {}), message, None, error_type, error_code, model)
        with self._lock:
            self._rules.append(fault)

    def refuse_when(self, contains: str) -> None:
        """Answer calls whose prompt contains ``contains`` with a model refusal (a 200)."""
        with self._lock:
            self._refusals.append(contains)

    def delay_when(self, contains: str, seconds: float) -> None:
        """Answer calls whose prompt contains ``contains`` after ``seconds`` (the longest wins)."""
        with self._lock:
            self._delays.append((contains, seconds))

    def limit(
        self,
        requests: float | None = None,
        input_tokens: float | None = None,
        output_tokens: float | None = None,
        *,
        per: float = 60.0,
    ) -> None:
        """Enforce these limits on every model, each model its own buckets, starting full."""
        with self._lock:
            self._limits = RateLimits(requests, input_tokens, output_tokens, per)
            self._buckets.clear()

    def clear_faults(self) -> None:
        with self._lock:
            self._rules.clear()
            self._queue.clear()
            self._refusals.clear()
            self._expiring.clear()
            self._batch_faults.clear()

    # --- the Message Batches API

    @property
    def batches(self) -> list[FakeBatch]:
        """Every batch created, oldest first, brought up to date."""
        with self._lock:
            now = time.time()
            for batch in self._batches:
                self._advance(batch, now)
            return list(self._batches)

    @property
    def paid(self) -> int:
        """Batch requests billed: those that ended ``succeeded``, over every batch."""
        return sum(batch.counts()["succeeded"] for batch in self.batches)

    def wait_for_batches(self, count: int, timeout: float = 10.0) -> None:
        """Block until ``count`` batches have been created (answered or not)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._batches) >= count, timeout):
                raise TimeoutError(
                    f"expected {count} batches at the fake Anthropic API within {timeout} s, "
                    f"got {len(self._batches)}"
                )

    def expire_when(self, contains: str) -> None:
        """Batch requests whose prompt contains ``contains`` end ``expired``."""
        with self._lock:
            self._expiring.append(contains)

    def fail_batch_next(
        self,
        status: int = 529,
        *,
        times: int = 1,
        headers: Mapping[str, str] | None = None,
        message: str = "",
        error_type: str | None = None,
    ) -> None:
        """Answer the next ``times`` batch creations with ``status``; nothing is created."""
        fault = Fault(status, dict(headers or {}), message, None, error_type)
        with self._lock:
            self._batch_faults.append((fault, times))

    def hold_batch_creates(self) -> None:
        """Create each batch, then keep its answer until ``release_batch_creates()``."""
        self._creates_released.clear()

    def release_batch_creates(self) -> None:
        self._creates_released.set()

    def end_batches_now(self) -> None:
        """Let every batch in progress finish at once, as if its processing time had passed."""
        with self._lock:
            now = time.time()
            for batch in self._batches:
                if batch.status == "in_progress":
                    batch.processing = max(0.0, now - batch.created_at)
                self._advance(batch, now)

    def _batch_route(
        self, method: str, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """One request to the Message Batches API, answered as the real API answers it."""
        bare, _, query = path.partition("?")
        lowered = {name.lower(): value for name, value in headers.items()}
        problem = _invalid_headers(lowered)
        if problem is not None:
            return _json(problem[0], {}, error_body(*problem))
        if bare == BATCHES_PATH and method == "POST":
            return self._create_batch(raw)
        if bare == BATCHES_PATH and method == "GET":
            return self._list_batches(query)
        found = _BATCH_PATH.fullmatch(bare)
        if found is None:
            return _json(404, {}, error_body(404, f"no route for {method} {bare}"))
        with self._lock:
            batch = next((b for b in self._batches if b.id == found["id"]), None)
            if batch is not None:
                self._advance(batch, time.time())
        if batch is None:
            return _json(404, {}, error_body(404, f"message_batch {found['id']} not found"))
        rest = found["rest"] or ""
        if rest == "/cancel" and method == "POST":
            with self._lock:
                if batch.ended_at is None and batch.cancel_at is None:
                    batch.cancel_at = time.time()
                    self._advance(batch, batch.cancel_at)
            return _json(200, {}, batch.to_json(self.url))
        if rest == "/results" and method == "GET":
            if batch.ended_at is None:
                return _json(
                    400,
                    {},
                    error_body(
                        400, f"message_batch {batch.id} is still processing: no results yet"
                    ),
                )
            lines = "".join(json.dumps(entry) + "\n" for entry in batch.results)
            return 200, {"content-type": "application/binary"}, lines.encode()
        if rest == "" and method == "GET":
            return _json(200, {}, batch.to_json(self.url))
        return _json(404, {}, error_body(404, f"no route for {method} {bare}"))

    def _create_batch(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = None
        requests = decoded.get("requests") if isinstance(decoded, dict) else None
        problem = _invalid_batch(requests)
        if problem is not None:
            return _json(400, {}, error_body(400, problem))
        assert isinstance(requests, list)
        with self._arrived:
            fault = None
            if self._batch_faults:
                fault, left = self._batch_faults[0]
                if left <= 1:
                    self._batch_faults.pop(0)
                else:
                    self._batch_faults[0] = (fault, left - 1)
            if fault is None and self.queue_limit is not None:
                now = time.time()
                queued = 0
                for each in self._batches:
                    self._advance(each, now)
                    queued += each.counts()["processing"]
                if queued + len(requests) > self.queue_limit:
                    fault = Fault(
                        429,
                        {"retry-after": "1"},
                        "Number of batch requests in the "
                        f"processing queue would exceed {self.queue_limit}",
                    )
            if fault is None:
                batch = FakeBatch(
                    f"msgbatch_fake{len(self._batches) + 1:04d}",
                    list(requests),
                    time.time(),
                    self.batch_processing_time,
                )
                self._batches.append(batch)
                self._arrived.notify_all()
        if fault is not None:
            body = error_body(fault.status, fault.message, error_type=fault.error_type)
            return _json(fault.status, dict(fault.headers), body)
        if self._log is not None:
            self._log(f"batch {batch.id}: {len(requests)} requests")
        self._creates_released.wait()
        return _json(200, {}, batch.to_json(self.url))

    def _list_batches(self, query: str) -> tuple[int, dict[str, str], bytes]:
        params = dict(part.partition("=")[::2] for part in query.split("&") if part)
        try:
            limit = int(params.get("limit") or 20)
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return _json(400, {}, error_body(400, "limit: must be from 1 to 1000"))
        newest = list(reversed(self.batches))
        ids = [batch.id for batch in newest]
        if params.get("after_id") in ids:
            newest = newest[ids.index(params["after_id"]) + 1 :]
        elif params.get("before_id") in ids:
            newest = newest[: ids.index(params["before_id"])]
            newest = newest[-limit:]
        page = newest[:limit]
        return _json(
            200,
            {},
            {
                "data": [batch.to_json(self.url) for batch in page],
                "has_more": len(newest) > len(page),
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            },
        )

    def _advance(self, batch: FakeBatch, now: float) -> None:
        """End ``batch`` if its time has come (lock held): its results, by what each met."""
        if batch.ended_at is not None:
            return
        if batch.cancel_at is not None and now >= batch.cancel_at + self.batch_cancel_delay:
            cut, ended = batch.cancel_at, batch.cancel_at + self.batch_cancel_delay
        elif now >= batch.created_at + batch.processing:
            cut, ended = math.inf, batch.created_at + batch.processing
        else:
            return
        results = []
        for index, request in enumerate(batch.requests):
            if batch.finishes(index) > cut:
                result: dict[str, Any] = {"type": "canceled"}
            else:
                result = self._batch_result(request.get("params") or {})
            results.append({"custom_id": request["custom_id"], "result": result})
        # The API does not keep the requests' order: neither does the fake.
        batch.results = results[::-1]
        batch.ended_at = ended

    def _batch_result(self, params: dict[str, Any]) -> dict[str, Any]:
        """What one batch request ends as (lock held): expired, errored, or its message."""
        self._batch_items += 1
        request = Received(-self._batch_items, params, {}, 200)
        text = request.text
        if any(needle in text for needle in self._expiring):
            return {"type": "expired"}
        fault = self._pick_fault(text, request.model)
        if fault is not None:
            body = error_body(
                fault.status,
                fault.message,
                error_type=fault.error_type,
                error_code=fault.error_code,
                request_id=f"req_fake_batch_{self._batch_items}",
            )
            return {"type": "errored", "error": body}
        message = self._message_locked(request)
        message["id"] = f"msg_fake_batch_{self._batch_items}"
        return {"type": "succeeded", "message": message}

    def _cache_usage(self, request: Received) -> tuple[int, int, int]:
        """Input, cache-write and cache-read tokens of one answer (lock held)."""
        total = prompt_tokens(request.body)
        if self.cache_tokens != (0, 0):
            return total, *self.cache_tokens
        prefix = cached_prefix(request.body)
        cached = len(prefix.split())
        if cached < self.cache_min_tokens:
            return total, 0, 0
        key = (request.model, prefix)
        hit = key in self._cached
        self._cached.add(key)
        return total - cached, 0 if hit else cached, cached if hit else 0

    def forget_cache(self) -> None:
        """Empty the prompt cache, as five idle minutes would."""
        with self._lock:
            self._cached.clear()

    def hold(self) -> None:
        """Keep every call open, unanswered, until ``release()``."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    # --- serving

    def respond(
        self, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """Record one request and build its answer; the handler thread waits, then writes it."""
        if path.startswith(BATCHES_PATH):
            return self._batch_route("POST", path, headers, raw)
        if path.partition("?")[0] != MESSAGES_PATH:
            return _json(404, {}, error_body(404, f"no route for POST {path}"))
        lowered = {name.lower(): value for name, value in headers.items()}
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = None
        body: dict[str, Any] = decoded if isinstance(decoded, dict) else {}
        problem = _invalid(body if decoded is not None else None, lowered)
        known = self.known_models
        model = body.get("model")
        if problem is None and known is not None and isinstance(model, str) and model not in known:
            problem = 404, f"model: {model}"
        text = message_text(body)

        with self._arrived:
            fault = None if problem else self._pick_fault(text, str(model))
            if problem is None and fault is None:
                fault = self._take_capacity(str(model), prompt_tokens(body))
            status = problem[0] if problem else fault.status if fault else 200
            request = Received(len(self._received) + 1, body, lowered, status)
            self._received.append(request)
            self._arrived.notify_all()
            delay = max([self.delay, *(s for needle, s in self._delays if needle in text)])
            limit_headers = self._limit_headers(str(model))
        if self._log is not None:
            self._log(f"call {request.number}: model={request.model or '-'} -> {status}")

        if delay > 0:
            self._stopping.wait(delay)
        self._released.wait()

        request_id = f"req_fake_{request.number}"
        ids = {"request-id": request_id, **limit_headers}
        if problem:
            return _json(problem[0], ids, error_body(*problem, request_id=request_id))
        if fault:
            answer = error_body(
                fault.status,
                fault.message,
                error_type=fault.error_type,
                error_code=fault.error_code,
                request_id=request_id,
            )
            return _json(fault.status, ids | dict(fault.headers), answer)
        message = self._message(request)
        with self._lock:
            self._take_output(request.model, message["usage"]["output_tokens"])
        return _json(200, ids, message)

    def _take_capacity(self, model: str, input_tokens: int) -> Fault | None:
        """Take one request and the prompt's tokens from the model's buckets, or refuse.

        Refused when any bucket lacks what the call needs (an output bucket, anything at all):
        a 429 whose ``retry-after`` is whole seconds, rounded up, as the real API gives it.
        """
        if self._limits is None:
            return None
        now = time.time()
        buckets = self._buckets.setdefault(model, self._limits.buckets(now))
        needs = {"requests": 1.0, "input-tokens": float(input_tokens), "output-tokens": 1.0}
        wait = 0.0
        for kind, bucket in buckets.items():
            bucket.refill(now)
            wait = max(wait, bucket.wait_for(needs[kind]))
        if wait > 0:
            self._refused += 1
            return Fault(429, {"retry-after": str(max(1, math.ceil(wait)))})
        for kind in ("requests", "input-tokens"):
            if kind in buckets:
                buckets[kind].level -= needs[kind]
        return None

    def _take_output(self, model: str, output_tokens: int) -> None:
        bucket = self._buckets.get(model, {}).get("output-tokens")
        if bucket is not None:
            bucket.refill(time.time())
            bucket.level -= output_tokens

    def _limit_headers(self, model: str) -> dict[str, str]:
        now = time.time()
        headers: dict[str, str] = {}
        for kind, bucket in self._buckets.get(model, {}).items():
            bucket.refill(now)
            headers |= bucket.headers(kind, now)
        return headers

    def _pick_fault(self, text: str, model: str) -> Fault | None:
        for rule in self._rules:
            if rule.matches(text, model):
                return rule
        for index, (fault, left) in enumerate(self._queue):
            if fault.matches(text, model):
                if left <= 1:
                    del self._queue[index]
                else:
                    self._queue[index] = (fault, left - 1)
                return fault
        return None

    def _message(self, request: Received) -> dict[str, Any]:
        with self._lock:
            return self._message_locked(request)

    def _message_locked(self, request: Received) -> dict[str, Any]:
        """A successful answer to ``request`` (lock held)."""
        refused = any(needle in request.text for needle in self._refusals)
        text = "" if refused else self._reply(request)
        input_tokens, creation, read = self._cache_usage(request)
        return {
            "id": f"msg_fake_{request.number}",
            "type": "message",
            "role": "assistant",
            "model": self.dated_models.get(request.model, request.model),
            "content": [] if refused else [{"type": "text", "text": text}],
            "stop_reason": "refusal" if refused else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": len(text.split()),
                "cache_creation_input_tokens": creation,
                "cache_read_input_tokens": read,
            },
        }


def system_text(body: Mapping[str, Any]) -> str:
    """The system prompt, a string or the text of its blocks."""
    system = body.get("system")
    if isinstance(system, list):
        return "\n".join(str(block.get("text", "")) for block in system if isinstance(block, dict))
    return str(system or "")


def cached_prefix(body: Mapping[str, Any]) -> str:
    """The system text up to its last block marked ``cache_control``, or "" when none is."""
    system = body.get("system")
    if not isinstance(system, list):
        return ""
    marked = [
        index
        for index, block in enumerate(system)
        if isinstance(block, dict) and block.get("cache_control")
    ]
    if not marked:
        return ""
    blocks = system[: marked[-1] + 1]
    return "\n".join(str(block.get("text", "")) for block in blocks if isinstance(block, dict))


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


@dataclass
class FakeBatch:
    """One Message Batch as the fake keeps it.

    Its requests finish evenly over ``processing`` seconds from ``created_at``: request ``i``
    of ``n`` at ``created_at + processing * (i + 1) / n``. ``results`` is filled when it ends.
    """

    id: str
    requests: list[dict[str, Any]]
    created_at: float
    processing: float
    cancel_at: float | None = None
    ended_at: float | None = None
    results: list[dict[str, Any]] = field(default_factory=list)

    def finishes(self, index: int) -> float:
        return self.created_at + self.processing * (index + 1) / len(self.requests)

    @property
    def status(self) -> str:
        if self.ended_at is not None:
            return "ended"
        return "canceling" if self.cancel_at is not None else "in_progress"

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        if self.ended_at is None:
            counts["processing"] = len(self.requests)
            return counts
        for entry in self.results:
            counts[entry["result"]["type"]] += 1
        return counts

    def to_json(self, base_url: str) -> dict[str, Any]:
        ended = self.ended_at is not None
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": self.counts(),
            "created_at": _iso(self.created_at),
            "expires_at": _iso(self.created_at + 86400),
            "ended_at": _iso(self.ended_at),
            "cancel_initiated_at": _iso(self.cancel_at),
            "archived_at": None,
            "results_url": f"{base_url}{BATCHES_PATH}/{self.id}/results" if ended else None,
        }


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The fake's token count of a prompt: its words, the system prompt's included."""
    return len(message_text(body).split()) + len(system_text(body).split())


def _invalid_headers(headers: Mapping[str, str]) -> tuple[int, str] | None:
    if not headers.get("x-api-key") and not headers.get("authorization"):
        return 401, "x-api-key header is required"
    if not headers.get("anthropic-version"):
        return 400, "anthropic-version: header is required"
    return None


def _invalid_batch(requests: object) -> str | None:
    """Why the real API would refuse a batch of these requests, if it would."""
    if not isinstance(requests, list) or not requests:
        return "requests: at least one request is required"
    if len(requests) > MAX_BATCH_REQUESTS:
        return f"requests: a batch holds at most {MAX_BATCH_REQUESTS} requests"
    seen: set[str] = set()
    for index, request in enumerate(requests):
        custom_id = request.get("custom_id") if isinstance(request, dict) else None
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            return (
                f"requests.{index}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        if custom_id in seen:
            return f"requests.{index}.custom_id: custom_id {custom_id!r} is not unique"
        seen.add(custom_id)
        params = request.get("params")
        problem = _invalid(
            params if isinstance(params, dict) else None,
            {"x-api-key": "batch", "anthropic-version": "batch"},
        )
        if problem is not None:
            return f"requests.{index}.params.{problem[1]}"
    return None


def _invalid(body: dict[str, Any] | None, headers: Mapping[str, str]) -> tuple[int, str] | None:
    """The status and message the real API would refuse this request with, if any."""
    missing = _invalid_headers(headers)
    if missing is not None:
        return missing
    if body is None:
        return 400, "request body is not valid JSON"
    if not isinstance(body.get("model"), str):
        return 400, "model: Field required"
    if not isinstance(body.get("max_tokens"), int):
        return 400, "max_tokens: Field required"
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return 400, "messages: at least one message is required"
    return None


def _json(
    status: int, headers: dict[str, str], payload: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json", **headers}, json.dumps(payload).encode()


class _Server(ThreadingHTTPServer):
    fake: FakeAnthropic


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that connects and sends nothing must not pin a thread forever

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        # Who called, for tests of several hosts: kept with the request's headers, as a proxy's
        # X-Forwarded-For would be.
        headers = dict(self.headers) | {PEER_HEADER: self.client_address[0]}
        status, headers, payload = self.server.fake.respond(self.path, headers, raw)
        self._send(status, headers, payload)

    def do_GET(self) -> None:
        if self.path.startswith(BATCHES_PATH):
            self._send(*self.server.fake._batch_route("GET", self.path, dict(self.headers), b""))
            return
        self._send(*_json(404, {}, error_body(404, f"no route for GET {self.path}")))

    def _send(self, status: int, headers: Mapping[str, str], payload: bytes) -> None:
        # One request per connection: stop() then never waits on an idle keep-alive socket.
        self.close_connection = True
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out or was killed mid-call: nobody is left to answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the fake's own log, if any, has one line per call


@pytest.fixture
def fake_anthropic(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    """A started server, with this process's environment (and so its children's) pointed at it.

    Share it with ``pytest_plugins = ["tests.fakes.anthropic_server"]`` in the root conftest.
    """
    with FakeAnthropic() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.anthropic_server",
        description="Serve a fake Anthropic Messages API on 127.0.0.1 until killed.",
    )
    parser.add_argument("--port", type=int, default=8787, help="0 picks a free port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args(argv)

    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with FakeAnthropic(
        args.port, delay=args.delay, log=lambda line: print(line, flush=True)
    ) as server:
        for name, value in server.env().items():
            print(f"export {name}={value}", flush=True)
        stopped.wait()


if __name__ == "__main__":
    main()

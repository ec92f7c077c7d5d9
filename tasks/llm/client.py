"""The model side of the digest: one call per summary, one for the opening paragraph.

The SDK's own retries are switched off (``max_retries=0``): the journal's step retry policy owns
the attempts and the back-off, so every attempt is counted, bounded and visible in the journal,
and a ``retry-after`` hint can become a durable sleep instead of a blocked worker. The functions
at the bottom are the plain callables that policy takes:

- ``is_transient``: worth another attempt (408, 409, 429, 529 and other 5xx, timeouts,
  connection errors), unless the server said ``x-should-retry: false``.
- ``retry_after_seconds``: the server's ``retry-after-ms`` / ``retry-after`` hint.

An error that is not worth another attempt is classified by what it means, not by its status
(``REFUSALS``): the API answers *every* request with 400 once the account is out of credit, so
"400 means this item" would turn such a week into a quiet "nothing new". A refusal of the
account or the request (credit, billing, key, permission, unknown model, malformed request,
and any other error nobody called transient) becomes ``ModelRefused`` and fails the run at
once; only a refusal of this item's prompt (too long, filtered, declined by the model)
becomes ``ItemRefused``, which skips the item.

The same table reads the error of an ``errored`` entry of a Message Batch (``ApiError``), so
an item refused in a batch is skipped, and an account refused there fails the run, alike.

The shared system prompt is marked for prompt caching (``cache_control``) where it reaches the
model's minimum cacheable length (``CACHE_MIN_TOKENS``), in both modes: below it the API would
ignore the mark, so none is sent. The shipped prompts are far shorter: their runs cache nothing.

The SDK is imported by the first model call, not with this module: importing it takes seconds,
and ``digest --help``, ``show``, ``runs`` and the offline summarizer never call the model. A
worker imports it once before forking its pool (``tasks.worker.app``), so children share it.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from datetime import UTC
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from journal.events import emit
from tasks.config import DEFAULT_INTRO_MODEL, DEFAULT_SUMMARY_MODEL
from tasks.errors import DigestError, ItemRefused, ModelAuthFailed, ModelRefused
from tasks.llm.cost import OFFLINE_MODEL
from tasks.llm.prompts import (
    INTRO_SYSTEM,
    SUMMARY_SYSTEM,
    Update,
    estimated_tokens,
    intro_prompt,
    summary_prompt,
)
from tasks.llm.ratelimit import CapacityWait, RateLimiter

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message, OutputConfigParam

MAX_TOKENS = 1024
# Connecting is quick or not happening; a slow connect should not eat the whole budget.
CONNECT_TIMEOUT_S = 5.0

# The shortest prompt prefix each model family caches, in tokens (the API's documentation); a
# model not listed is taken at the largest, so a mark is never sent in vain.
CACHE_MIN_TOKENS = {"claude-haiku": 4096, "claude-opus": 4096, "claude-sonnet": 1024}
CACHE_MIN_DEFAULT = 4096

# A sentence ends at . ! or ? then space and a capital or digit; "Press ? anywhere" does not.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


@dataclass(frozen=True)
class Completion:
    """One model answer as a step records it: the text plus what it cost.

    ``waited_ms`` is how long the call waited for room in the shared rate limits before it
    went out: recorded with the step, in the write the step makes anyway, so a run's page can
    draw the wait without asking the limiter.
    """

    text: str
    input_tokens: int
    output_tokens: int
    model: str
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    waited_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        """The step result: plain JSON, so a journal outlives this class's code.

        A call that did not wait is recorded as before waits were.
        """
        result = asdict(self)
        if not self.waited_ms:
            del result["waited_ms"]
        return result

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Completion:
        """Rebuild a recorded completion, refusing a record of another shape.

        Raises:
            ValueError: A field is missing or has the wrong type.
        """
        text, model = data.get("text"), data.get("model")
        input_tokens, output_tokens = data.get("input_tokens"), data.get("output_tokens")
        # Recorded before cache tokens were: none.
        cache_write = data.get("cache_creation_input_tokens", 0)
        cache_read = data.get("cache_read_input_tokens", 0)
        waited = data.get("waited_ms", 0)  # recorded before waits were: none
        if not (
            isinstance(text, str)
            and isinstance(model, str)
            and _is_count(input_tokens)
            and _is_count(output_tokens)
            and _is_count(cache_write)
            and _is_count(cache_read)
            and _is_count(waited)
        ):
            raise ValueError(
                "a recorded completion needs text and model (strings) and input_tokens, "
                f"output_tokens and waited_ms (counts), got {dict(data)!r:.200}"
            )
        return cls(text, input_tokens, output_tokens, model, cache_write, cache_read, waited)


def cache_min_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches (``CACHE_MIN_TOKENS``, by family)."""
    for family, tokens in CACHE_MIN_TOKENS.items():
        if model.startswith(family):
            return tokens
    return CACHE_MIN_DEFAULT


def system_blocks(model: str, system: str) -> str | list[dict[str, Any]]:
    """The ``system`` parameter: marked ``cache_control`` where it is long enough to cache.

    Every summary of a week shares it, so from the second call on it is read from the cache
    (a tenth of the input price) instead of being paid for again.
    """
    if estimated_tokens(system, "") < cache_min_tokens(model):
        return system
    return [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]


def request_params(
    model: str, system: str, prompt: str, output_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One request's parameters, the same synchronously and in a batch (a batch's ``params``)."""
    params: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "system": system_blocks(model, system),
        "messages": [{"role": "user", "content": prompt}],
    }
    if output_config is not None:
        params["output_config"] = dict(output_config)
    return params


def completion_of(message: Mapping[str, Any], model: str) -> Completion:
    """A batch entry's message (JSON, as the results file holds it) as a completion.

    Raises:
        ItemRefused: the model declined to answer (``stop_reason`` refusal).
    """
    if message.get("stop_reason") == "refusal":
        raise ItemRefused(
            f"model {model} declined to answer (stop_reason refusal); the item stays unseen "
            "for next week: reword or remove it"
        )
    blocks = message.get("content") or []
    text = "".join(str(block.get("text", "")) for block in blocks if block.get("type") == "text")
    usage = message.get("usage") or {}
    return Completion(
        text=text.strip(),
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        model=str(message.get("model") or model),
        cache_creation_input_tokens=int(usage.get("cache_creation_input_tokens") or 0),
        cache_read_input_tokens=int(usage.get("cache_read_input_tokens") or 0),
    )


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# The check a step makes before each call it pays for: its run's lease (``Run.check_lease``).
# A wait for the shared rate limits' room is slept inside the step, like a back-off, and may
# outlast the lease (a stopped worker); the call then goes out only if the run is still ours.
_BEFORE_CALL: ContextVar[Callable[[], None] | None] = ContextVar("before_call", default=None)
# The run's deadline, if it has one: a wait for room ends at it (``RateLimiter.take``).
_WAIT_UNTIL: ContextVar[float | None] = ContextVar("wait_until", default=None)


@contextlib.contextmanager
def checked_calls(check: Callable[[], None], until: float | None = None) -> Iterator[None]:
    """Model calls made in this block each run ``check`` first, after any wait for room.

    A wait for room ends at ``until`` (the run's deadline), with ``NoRoomByDeadline``.
    """
    token, deadline = _BEFORE_CALL.set(check), _WAIT_UNTIL.set(until)
    try:
        yield
    finally:
        _WAIT_UNTIL.reset(deadline)
        _BEFORE_CALL.reset(token)


class Summarizer(Protocol):
    """What the digest needs from a model; ``name`` is shown to the operator.

    ``remote`` says a call waits on the network: the digest then keeps ``DIGEST_CONCURRENCY``
    calls in flight at once. One that computes in place gains nothing from threads, and one at
    a time keeps what a crash point leaves behind exact (the README's walk-through).
    """

    name: str
    remote: bool

    def summarize(self, item: Update, model: str | None = None) -> Completion:
        """One item's summary from ``model`` (None: the primary), one attempt, maybe retried."""
        ...

    def compose(self, pairs: Sequence[tuple[Update, str]], model: str | None = None) -> Completion:
        """The opening paragraph, from each item and its recorded summary."""
        ...


class AnthropicSummarizer:
    """Summaries and the opening paragraph from the Anthropic Messages API.

    Args:
        connect: Builds the SDK client, with ``max_retries=0`` and a timeout (see ``from_env``):
            one method call is exactly one HTTP request, and it ends in bounded time. Called
            once, by the first call: a run that replays every step never pays for the SDK.
        summary_model: The model for each item's summary.
        intro_model: The model for the opening paragraph.
        limiter: The rate limits shared with every process on the API key: each call waits
            for room in them first, and teaches them what the answer says (None: no limiter).
    """

    remote = True

    def __init__(
        self,
        connect: Callable[[], anthropic.Anthropic],
        summary_model: str,
        intro_model: str,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._connect = connect
        self._limiter = limiter
        self._client: anthropic.Anthropic | None = None
        self._connecting = threading.Lock()  # a map's first calls arrive together
        self._summary_model = summary_model
        self._intro_model = intro_model
        self.name = f"anthropic ({summary_model}, {intro_model})"

    @classmethod
    def from_env(
        cls,
        timeout_s: float,
        summary_model: str = DEFAULT_SUMMARY_MODEL,
        intro_model: str = DEFAULT_INTRO_MODEL,
        limiter: RateLimiter | None = None,
    ) -> AnthropicSummarizer:
        """Build from the SDK's own variables (the key, the base URL) and the model ids.

        Args:
            timeout_s: The longest one call may wait for its answer. Keep it well under the lease
                TTL and the task time limit, so a hung call fails as a transient error that the
                step policy retries, rather than outliving the worker's lease.
            summary_model: The model of each summary.
            intro_model: The model of the opening paragraph.
            limiter: The shared rate limits (see the class).
        """
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")

        def connect() -> anthropic.Anthropic:
            import anthropic

            return anthropic.Anthropic(
                max_retries=0,
                timeout=anthropic.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            )

        return cls(connect, summary_model=summary_model, intro_model=intro_model, limiter=limiter)

    @property
    def summary_model(self) -> str:
        """The model of each summary."""
        return self._summary_model

    @property
    def intro_model(self) -> str:
        """The model of the opening paragraph."""
        return self._intro_model

    def client(self) -> anthropic.Anthropic:
        """The SDK client, built by the first call (shared with the batch endpoints)."""
        with self._connecting:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def summary_request(self, item: Update) -> dict[str, Any]:
        """The parameters of one item's summary request, as a batch asks for it."""
        return request_params(self._summary_model, SUMMARY_SYSTEM, summary_prompt(item))

    def intro_request(self, pairs: Sequence[tuple[Update, str]]) -> dict[str, Any]:
        """The parameters of the opening paragraph's request, as a batch asks for it."""
        return request_params(
            self._intro_model, INTRO_SYSTEM, intro_prompt(pairs), output_config=INTRO_OUTPUT
        )

    def summarize(self, item: Update, model: str | None = None) -> Completion:
        """One request to ``model`` (None: the primary); errors are for the step to judge.

        Raises:
            ModelRefused: The API refused the account or the request (``ModelAuthFailed`` for
                the key): every item would fail alike.
            ItemRefused: The API refused this item's prompt.
            anthropic.APIError: A transient failure, for the step's retry policy.
        """
        return self._complete(
            model or self._summary_model,
            "DIGEST_SUMMARY_MODEL",
            SUMMARY_SYSTEM,
            summary_prompt(item),
        )

    def compose(self, pairs: Sequence[tuple[Update, str]], model: str | None = None) -> Completion:
        """One request to ``model`` (None: the primary); errors as for ``summarize``."""
        return self._complete(
            model or self._intro_model,
            "DIGEST_INTRO_MODEL",
            INTRO_SYSTEM,
            intro_prompt(pairs),
            output_config=INTRO_OUTPUT,
        )

    def _complete(
        self,
        model: str,
        setting: str,
        system: str,
        prompt: str,
        output_config: OutputConfigParam | None = None,
    ) -> Completion:
        import anthropic

        client = self.client()
        limiter = self._limiter
        take = None
        if limiter is not None:
            tokens = estimated_tokens(system, prompt)
            take = limiter.take(model, tokens, MAX_TOKENS, _WAIT_UNTIL.get())
        started = time.monotonic()
        try:
            check = _BEFORE_CALL.get()
            if check is not None:
                check()  # after the wait for room: the lease may have run out meanwhile
            raw = client.messages.with_raw_response.create(
                model=model,
                max_tokens=MAX_TOKENS,
                system=system_blocks(model, system),  # type: ignore[arg-type]
                messages=[{"role": "user", "content": prompt}],
                output_config=anthropic.omit if output_config is None else output_config,
            )
        except anthropic.APIStatusError as exc:
            if limiter and take:
                limiter.settle(
                    take,
                    exc.response.headers,
                    refused=exc.status_code == 429,
                    retry_after=retry_after_seconds(exc),
                )
            error = ApiError.of(exc)
            refusal = refusal_for(error)
            if refusal is None:
                raise  # transient: the step's retry policy decides
            where = f"the Anthropic API at {client.base_url}"
            raise refusal.error(refusal.describe(error, where, model, setting)) from exc
        except BaseException:
            if limiter and take:
                limiter.settle(take, {})  # no answer: what it took stays taken
            raise
        finally:
            emit("model_call_seconds", model, time.monotonic() - started)
        message = raw.parse()
        if limiter and take:
            used = (message.usage.input_tokens, message.usage.output_tokens)
            limiter.settle(take, raw.headers, used=used)
            return replace(_answered(message, model), waited_ms=take.waited_ms)
        return _answered(message, model)


def _answered(message: Message, model: str) -> Completion:
    """A synchronous call's answer as a completion.

    Raises:
        ItemRefused: the model declined to answer (``stop_reason`` refusal): the item only.
    """
    if message.stop_reason == "refusal":
        raise ItemRefused(
            f"model {model} declined to answer (stop_reason refusal); the item stays unseen "
            "for next week: reword or remove it"
        )
    text = "".join(block.text for block in message.content if block.type == "text")
    usage = message.usage
    return Completion(
        text=text.strip(),
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        model=message.model,
        cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
        cache_read_input_tokens=usage.cache_read_input_tokens or 0,
    )


class OfflineSummarizer:
    """A stand-in that never touches the network, for running the digest without a key.

    The summary is the body's first sentence and the opening lists the titles, so a run is
    deterministic and free, and its email still reads sensibly.

    Attributes:
        used: Whether it made a summary or an opening (a run that only replays makes none), so
            the CLI says the summaries are offline only when there are some.
    """

    name = OFFLINE_MODEL
    remote = False

    def __init__(self) -> None:
        self.used = False

    def summarize(self, item: Update, model: str | None = None) -> Completion:
        """The body's first sentence, with its line breaks folded into spaces (any model)."""
        self.used = True
        first = _SENTENCE_END.split(" ".join(item.body.split()), maxsplit=1)[0]
        return Completion(text=first, input_tokens=0, output_tokens=0, model=self.name)

    def compose(self, pairs: Sequence[tuple[Update, str]], model: str | None = None) -> Completion:
        """A fixed sentence naming every title, in order (any model)."""
        self.used = True
        titles = [item.title for item, _ in pairs]
        listed = titles[0] if len(titles) == 1 else f"{', '.join(titles[:-1])} and {titles[-1]}"
        count = "one update" if len(titles) == 1 else f"{len(titles)} updates"
        text = f"This week brings {count}: {listed}. Each is summarized below."
        return Completion(text=text, input_tokens=0, output_tokens=0, model=self.name)


def is_transient(exc: BaseException) -> bool:
    """Whether another attempt at the same request may succeed.

    Mirrors the SDK's own retry rule, which ``max_retries=0`` switches off: connection errors and
    timeouts, 408, 409, 429 and every 5xx (529 is ``overloaded_error``), unless the server sent
    ``x-should-retry: false``. A wait for the shared rate limits' room (``CapacityWait``) is
    transient too.
    """
    if isinstance(exc, CapacityWait):
        return True
    if not _sdk_loaded():
        return False
    import anthropic

    if isinstance(exc, anthropic.APIConnectionError):  # APITimeoutError included
        return True
    if not isinstance(exc, anthropic.APIStatusError):
        return False
    should_retry = exc.response.headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        return should_retry == "true"
    return exc.status_code in (408, 409, 429) or exc.status_code >= 500


# Statuses that say the model is overloaded or down, not that the request is wrong: 503
# (unavailable), 504 (the API's timeout_error) and 529 (overloaded_error).
UNAVAILABLE_STATUSES = (503, 504, 529)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the model asked is overloaded or out of reach.

    The next model of a fallback chain may then answer where it cannot: 529, 503 and 504,
    timeouts and connection errors. Not a 429 (the key's own rate limit: the shared limiter
    waits for room instead), nor any refusal: a request one model refuses, every model would.
    """
    if not _sdk_loaded():
        return False
    import anthropic

    if isinstance(exc, anthropic.APIConnectionError):  # APITimeoutError included
        return True
    return isinstance(exc, anthropic.APIStatusError) and exc.status_code in UNAVAILABLE_STATUSES


def retry_after_seconds(
    exc: BaseException, *, now: Callable[[], float] = time.time
) -> float | None:
    """The wait the server asked for, in seconds, or None if it gave no usable hint.

    ``retry-after-ms`` wins (it is the more precise), then ``retry-after`` as seconds, then as an
    HTTP date (a date already past means 0).

    Args:
        exc: Any exception; only an API status error can carry the headers, and a
            ``CapacityWait`` its wait for the shared rate limits.
        now: The clock that turns an HTTP date into a wait.
    """
    if isinstance(exc, CapacityWait):
        return exc.seconds
    if not _sdk_loaded():
        return None
    import anthropic

    if not isinstance(exc, anthropic.APIStatusError):
        return None
    headers = exc.response.headers
    millis = _non_negative(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # a "-0000" zone; HTTP dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now())


def _sdk_loaded() -> bool:
    """Whether a model call imported the SDK: until one did, no error can be one of the SDK's.

    So judging any other error (a lost lease, an offline run's) never pays for the import.
    """
    return "anthropic" in sys.modules


def _non_negative(value: str | None) -> float | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


@dataclass(frozen=True)
class Refusal:
    """One row of ``REFUSALS``: an API error that retrying cannot fix, and what it means.

    Attributes:
        error: ``ItemRefused`` when only this item's prompt is at fault, else ``ModelRefused``
            (or its subclass ``ModelAuthFailed``): the run fails.
        cause: What went wrong, for the operator; ``{model}`` is the model asked for.
        fix: What to do about it; ``{setting}`` names the variable that chose the model.
        error_type: The body's ``error.type`` this row matches (any, if None).
        pattern: A regular expression searched in the body's ``error.message`` (any, if None).
        error_code: The body's ``error.details.error_code`` this row matches (any, if None).
    """

    error: type[DigestError]
    cause: str
    fix: str
    error_type: str | None = None
    pattern: str | None = None
    error_code: str | None = None

    def matches(self, error: ApiError) -> bool:
        """Whether the API's answer is the one this row describes."""
        return (
            (self.error_type is None or error.type == self.error_type)
            and (self.error_code is None or error.code == self.error_code)
            and (
                self.pattern is None
                or re.search(self.pattern, error.message, re.IGNORECASE) is not None
            )
        )

    def describe(self, error: ApiError, where: str, model: str, setting: str) -> str:
        """One line: the cause, the API's own answer, and what to do."""
        said = " ".join(error.message.split())[:300]
        how = "in a batch" if error.status is None else f"HTTP {error.status}"
        return (
            f"{self.cause.format(model=model)} ({where} answered {how} "
            f"{error.type or 'error'}: {said}); {self.fix.format(setting=setting)}"
        )


# Error types of an errored batch entry that another attempt may not meet: it is asked again,
# synchronously (the API's own transient types, as their statuses are in ``is_transient``).
TRANSIENT_TYPES = ("api_error", "overloaded_error", "rate_limit_error", "timeout_error")


@dataclass(frozen=True)
class ApiError:
    """An error the API answered, from an exception or from an ``errored`` batch entry.

    Attributes:
        status: the HTTP status; None for a batch entry's (it has none).
        type: the body's ``error.type``.
        code: the body's ``error.details.error_code``, if any.
        message: the body's ``error.message``.
        transient: another attempt may succeed (``is_transient`` for an exception; the
            type, ``TRANSIENT_TYPES``, for a batch entry).
    """

    status: int | None
    type: str | None
    code: str | None
    message: str
    transient: bool

    @classmethod
    def of(cls, exc: anthropic.APIStatusError) -> ApiError:
        """The SDK's exception, read."""
        message = str(exc.api_message or exc.message)
        return cls(exc.status_code, exc.type, exc.error_code, message, is_transient(exc))

    @classmethod
    def of_body(cls, body: Mapping[str, Any]) -> ApiError:
        """An errored batch entry's body: ``{"type": "error", "error": {...}}``."""
        error = body.get("error") if isinstance(body.get("error"), Mapping) else {}
        assert isinstance(error, Mapping)
        details = error.get("details")
        code = details.get("error_code") if isinstance(details, Mapping) else None
        kind = error.get("type")
        return cls(
            None,
            str(kind) if kind is not None else None,
            code if isinstance(code, str) else None,
            str(error.get("message") or ""),
            kind in TRANSIENT_TYPES,
        )


# The opening's output settings: two sentences need no deliberation; low effort keeps the call
# short and cheap.
INTRO_OUTPUT: OutputConfigParam = {"effort": "low"}

_RERUN = "then run the digest again"

# First match wins. Matched on the body's type, stable code and message, never on the status
# alone: a 400 may mean "this prompt" or "this account", and a 429 may be a monthly limit.
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        ItemRefused,
        "the prompt is too long for model {model}",
        "the item stays unseen for next week: shorten its body",
        error_type="invalid_request_error",
        pattern=r"prompt is too long|exceed.*context",
    ),
    Refusal(
        ItemRefused,
        "the API's content filter blocked the answer of model {model}",
        "the item stays unseen for next week: reword or remove it",
        error_type="invalid_request_error",
        pattern=r"content filtering",
    ),
    Refusal(
        ItemRefused,
        "the request is too large for the API",
        "the item stays unseen for next week: shorten its body",
        error_type="request_too_large",
    ),
    Refusal(
        ModelRefused,
        "the Anthropic account's credit balance is too low",
        f"buy credits or upgrade under Plans & Billing in the Anthropic Console, {_RERUN}",
        error_type="invalid_request_error",
        pattern=r"credit balance",
    ),
    Refusal(
        ModelRefused,
        "the Anthropic account has a billing problem",
        f"fix it under Plans & Billing in the Anthropic Console, {_RERUN}",
        error_type="billing_error",
    ),
    Refusal(
        ModelRefused,
        "the Anthropic organization reached its monthly spend limit",
        f"raise the limit under Limits in the Anthropic Console, {_RERUN}",
        error_code="enforced_spend_limit_reached",
    ),
    Refusal(
        ModelRefused,
        "the Anthropic organization reached its contract spend limit",
        f"ask the organization's admin to raise it, {_RERUN}",
        error_code="contract_spend_limit_reached",
    ),
    Refusal(
        ModelRefused,
        "the Anthropic organization is on hold",
        "see the notice in the Anthropic Console; no request can succeed until it is lifted",
        error_code="organization_on_hold",
    ),
    Refusal(
        ModelAuthFailed,
        "the API key was refused",
        f"set ANTHROPIC_API_KEY to a valid key with access to the model, {_RERUN}",
        error_type="authentication_error",
    ),
    Refusal(
        ModelAuthFailed,
        "the API key may not use model {model}",
        f"set ANTHROPIC_API_KEY to a key with access to it, or {{setting}} to a model it may "
        f"use, {_RERUN}",
        error_type="permission_error",
    ),
    Refusal(
        ModelRefused,
        "model {model} does not exist or is not available to this key",
        f"set {{setting}} to a current model id, {_RERUN}",
        error_type="not_found_error",
    ),
    Refusal(
        ModelRefused,
        "model {model} is not a valid model id",
        f"set {{setting}} to a current model id, {_RERUN}",
        error_type="invalid_request_error",
        pattern=r"^model:",
    ),
)

# Any other error nobody called transient: the request itself is wrong, so every item's
# would be too. Failing the run names it; skipping items would hide it.
REQUEST_REFUSED = Refusal(
    ModelRefused,
    "the API refused the request for model {model}",
    f"check {{setting}} and ANTHROPIC_BASE_URL; if both are right, this version sends requests "
    f"the API no longer accepts: upgrade it, {_RERUN}",
)


def refusal_for(error: ApiError) -> Refusal | None:
    """What an API error means: a row of ``REFUSALS``, or None when it is worth retrying.

    The table comes first: some account-level answers (a spend limit) arrive as a 429, which
    the status alone would call transient.
    """
    for row in REFUSALS:
        if row.matches(error):
            return row
    return None if error.transient else REQUEST_REFUSED

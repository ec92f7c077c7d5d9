"""One rate limiter per API key and model, in Redis, shared by every worker and command line.

The Anthropic API limits requests, input tokens and output tokens per minute, per model, per
organization. Each process retrying its own 429s learns nothing from the others: together they
keep hitting the limit. Here every call first takes its estimate from the shared limits (one
request; the prompt's estimated input tokens, scaled by what earlier calls used; ``max_tokens``
output tokens, or the learned average), in one script that checks all three (GCRA token
buckets, ``tasks/lua/ratelimit_reserve.lua``). Without room it waits for it, so the API is not
asked in vain. After the call, the take is settled with the answer's ``usage``, in the round
trip of the step's record (``journal.send_with_record``), and the limits and their state are
learned from the answer's ``anthropic-ratelimit-*`` headers (limit per minute, remaining,
reset), so nothing needs configuring (``DIGEST_RATE_LIMITS`` overrides a
model's limits where the headers are wrong or missing, as behind a proxy); a 429 without those
headers holds every caller for its ``retry-after``. Until the first answer teaches anything,
one call at a time asks: the other calls of its process wait until its settle is written,
then ask once each; a call elsewhere asks again every 50 ms.

The limits live under one hash tag per API key (a hash of it and the API's URL, never the key)
and model, so the script touches one slot of a Redis Cluster.

A wait longer than the step's back-off threshold is not slept: ``CapacityWait`` carries it to
the step's retry policy, which suspends the run durably, as for a long ``retry-after``. A wait
that would outlast the run's deadline (``DIGEST_DEGRADE_AT``) ends at it: ``NoRoomByDeadline``
tells the step to write its answer offline instead.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from journal import Client, send_with_record
from journal.events import emit
from tasks.config.limits import Overrides
from tasks.errors import DigestError
from tasks.keys import DigestKeys, text
from tasks.scripts import script

KINDS = ("requests", "input-tokens", "output-tokens")
# A probing call (nothing learned yet) holds the probe at most this long.
PROBE_MS = 10_000
# Learned limits are forgotten after an hour unused: a key's tier may change meanwhile.
KEEP_MS = 3_600_000


@dataclass(eq=False)
class CapacityWait(DigestError):
    """The model's rate limits have no room for longer than a step may wait in a worker.

    Transient, with the wait as its ``retry-after``: the step's retry policy turns it into a
    durable wait.
    """

    transient = True

    model: str
    seconds: float

    def __str__(self) -> str:
        return (
            f"the API's rate limits for {self.model} have no room for {self.seconds:.1f} s "
            "(shared by every process on this API key)"
        )


@dataclass(eq=False)
class NoRoomByDeadline(DigestError):
    """The model's rate limits have no room before the run's deadline, which has now come.

    Not transient: past the deadline the step writes its answer offline, never asks again.
    """

    model: str
    deadline: float

    def __str__(self) -> str:
        return f"the API's rate limits for {self.model} had no room before the run's deadline"


def account_of(base_url: str, api_key: str) -> str:
    """What names an API key in Redis: a hash of the API's URL and the key, never the key."""
    return hashlib.sha256(f"{base_url}\n{api_key}".encode()).hexdigest()[:16]


@dataclass
class Take:
    """One call's take from the limits, to be settled when the call ends."""

    key: str
    model: str
    estimated_input: int
    input: int
    output: int
    waited_ms: int
    probe: bool = False


class RateLimiter:
    """The shared limits of every model called with one API key.

    Args:
        client: the store shared by every process.
        keys: where the limits hash of an API key and model lives.
        account: ``account_of(base_url, api_key)``.
        wait_over: waits longer than this (the step's back-off threshold) raise ``CapacityWait``.
        overrides: limits the operator set over the API's.
        sleep: how a call waits for room.
        now: the clock ``reset`` headers are read against.
    """

    def __init__(
        self,
        client: Client,
        keys: DigestKeys,
        account: str,
        wait_over: float,
        overrides: Overrides | None = None,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.keys = keys
        self.account = account
        self.wait_over = wait_over
        self.overrides = overrides or Overrides()
        self._sleep = sleep
        self._now = now
        self._reserve = script(client, "ratelimit_reserve")
        self._settle = script(client, "ratelimit_settle")
        # A limits key -> set when this process's probe of it has settled.
        self._probing: dict[str, threading.Event] = {}

    def take(
        self, model: str, input_tokens: int, max_tokens: int, until: float | None = None
    ) -> Take:
        """Wait until the model's limits have room for this call, and take its estimate.

        Args:
            model: the model the call asks.
            input_tokens: the prompt's estimated input tokens.
            max_tokens: the call's output tokens at most.
            until: the run's deadline (on the ``now`` clock): a wait for room past it is
                slept only up to it, so the step is awake to write its answer offline then.

        Raises:
            NoRoomByDeadline: the room comes after ``until``, which has now come.
            CapacityWait: the room is further away than ``wait_over`` (counting the wait so far).
        """
        key = self.keys.model_limits(self.account, model)
        waited = 0.0
        while True:
            reply = self._reserve(
                keys=[key],
                args=[input_tokens, max_tokens, PROBE_MS, KEEP_MS, *self.overrides.of(model)],
            )
            if int(reply[0]) == 1:
                probe = len(reply) > 4
                if probe:
                    self._probing[key] = threading.Event()
                if waited:
                    emit("capacity_wait_seconds", model, waited)
                return Take(
                    key,
                    model,
                    input_tokens,
                    int(reply[2]),
                    int(reply[3]),
                    int(waited * 1000),
                    probe,
                )
            wait = int(reply[1]) / 1000
            left = math.inf if until is None else max(0.0, until - self._now())
            if wait >= left and waited + left <= self.wait_over:
                self._sleep(left)
                emit("capacity_wait_seconds", model, waited + left)
                raise NoRoomByDeadline(model, float(until or 0.0))
            if waited + wait > self.wait_over:
                raise CapacityWait(model, wait)
            probed = self._probing.get(key)
            if probed is not None and len(reply) > 2:
                # This process's own call probes: its answer, not a poll, says when to ask.
                started = time.monotonic()
                probed.wait(min(int(reply[2]) / 1000, left))
                waited += time.monotonic() - started
                continue
            # A little jitter, so callers woken together do not all ask at the same instant.
            pause = wait + random.uniform(0, 0.005)
            self._sleep(pause)
            waited += pause

    def settle(
        self,
        take: Take,
        headers: Mapping[str, str],
        *,
        used: tuple[int, int] | None = None,
        refused: bool = False,
        retry_after: float | None = None,
    ) -> None:
        """End a call: give back what it did not use, and learn from the answer's headers.

        Args:
            take: what ``take`` took.
            headers: the answer's headers (empty when there was no answer).
            used: the input and output tokens the answer's usage reports, if it answered.
            refused: the API refused the call for its rate limit (a 429): it counted nothing.
            retry_after: a 429's wait, which holds every caller when it came without the
                state headers.
        """
        now = self._now()
        learned: list[str] = []
        for kind, override in zip(KINDS, self.overrides.of(take.model), strict=True):
            learned += ["", "", ""] if override else _limit_state(headers, kind)
        hold = ""
        if refused and retry_after is not None and not any(learned):
            hold = str(int((now + retry_after) * 1000))
        if refused:
            emit("rate_limited", take.model)
        args: list[str | int] = [
            take.input,
            "" if used is None else used[0],
            take.output,
            "" if used is None else used[1],
            1 if refused else 0,
            *learned,
            hold,
            take.estimated_input,
            take.waited_ms,
            1 if refused else 0,
            KEEP_MS,
        ]
        heard = self._probing.pop(take.key, None) if take.probe else None
        if refused:  # at once: what a refusal teaches holds back every other caller now
            self._settle(keys=[take.key], args=args)
            if heard is not None:
                heard.set()
        else:  # with the step's record, in its round trip (at once if the step fails)
            answered = None if heard is None else (lambda _reply: heard.set())
            send_with_record(self._settle, [take.key], args, answered)

    def state(self, model: str) -> LimitState | None:
        """What is known of ``model``'s limits now (``digest show``, metrics); None: nothing."""
        raw = self.client.hgetall(self.keys.model_limits(self.account, model))
        if not raw:
            return None
        return LimitState.decode(model, {text(k): text(v) for k, v in raw.items()})

    def states(self, models: Iterable[str]) -> list[LimitState]:
        """The state of each of ``models`` something is known of, once each."""
        found = (self.state(model) for model in dict.fromkeys(models))
        return [state for state in found if state is not None]


@dataclass(frozen=True)
class KindState:
    """One limit as the API's last answer described it.

    Attributes:
        per_minute: the limit, per minute.
        burst: the bucket's size as learned (at most ``per_minute``).
        remaining: what the API said was left.
        reset: when it said the bucket would be full again (seconds since the epoch).
    """

    per_minute: int
    burst: int
    remaining: int
    reset: float


@dataclass(frozen=True)
class LimitState:
    """A model's shared limits and what waiting on them cost, decoded once from the hash."""

    model: str
    calls: int
    waited_s: float
    refused: int
    kinds: dict[str, KindState]

    @classmethod
    def decode(cls, model: str, fields: Mapping[str, str]) -> LimitState:
        """From the limits hash; a field another version wrote unreadably counts as absent."""

        def number(name: str) -> float:
            try:
                return float(fields.get(name, "0"))
            except ValueError:
                return 0.0

        kinds = {
            kind: KindState(
                int(number(f"{kind}:limit")),
                int(number(f"{kind}:cap")),
                int(number(f"{kind}:remaining")),
                number(f"{kind}:reset") / 1000,
            )
            for kind in ("requests", "input", "output")
            if number(f"{kind}:limit") > 0
        }
        return cls(
            model, int(number("calls")), number("waited_ms") / 1000, int(number("refused")), kinds
        )

    def line(self) -> str:
        """``claude-haiku-5-5: 41 calls, 3.2 s waited for room, 0 refused (429); requests ...``."""
        described = [
            f"{_KIND_NAMES[kind]} {state.per_minute}/min (burst {state.burst}, "
            f"{state.remaining} left at the last answer)"
            for kind, state in self.kinds.items()
        ]
        limits = "; ".join(described) or "no limits stated by the API"
        return (
            f"{self.model}: {self.calls} calls, {self.waited_s:.1f} s waited for room, "
            f"{self.refused} refused (429); {limits}"
        )

    def to_json(self) -> dict[str, object]:
        """For ``digest show --json``."""
        return {
            "calls": self.calls,
            "waited_s": round(self.waited_s, 3),
            "refused": self.refused,
            "limits": {kind: vars(state) for kind, state in self.kinds.items()},
        }


_KIND_NAMES = {"requests": "requests", "input": "input tokens", "output": "output tokens"}


def _limit_state(headers: Mapping[str, str], kind: str) -> list[str]:
    """Limit, remaining and reset (ms since the epoch) of one kind, or three blanks."""
    prefix = f"anthropic-ratelimit-{kind}"
    limit, remaining = headers.get(f"{prefix}-limit"), headers.get(f"{prefix}-remaining")
    reset = headers.get(f"{prefix}-reset")
    try:
        if limit is None or remaining is None or reset is None:
            raise ValueError(kind)
        at = datetime.fromisoformat(reset.replace("Z", "+00:00")).timestamp()
        values = [float(limit), float(remaining), at * 1000]
    except ValueError:
        return ["", "", ""]
    if not all(math.isfinite(v) and v >= 0 for v in values):
        return ["", "", ""]
    return [str(int(values[0])), str(int(values[1])), str(int(values[2]))]

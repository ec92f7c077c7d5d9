"""What a run's model calls cost: tokens times a per-model price, journaled with each call.

The price of a call is computed when the call returns and recorded in its step's result
(``cost_usd``), beside the tokens. A run's spend is the sum over its journal: exact across
crashes and replays (a replayed step costs nothing in this attempt but its recorded cost still
counts), and unchanged by a later edit of the price table. A call whose model has no price is
recorded with ``cost_usd: null`` and counted as unpriced, never as free.

A call is priced by the model it asked for: the API answers an alias (``claude-haiku-5-5``)
with a dated id (``claude-haiku-5-5-20261001``), which is the same model at the same price, so
a dated id is priced as its alias. Cache writes and reads are priced as the API bills them.
A request of a Message Batch costs half (``BATCH_DISCOUNT``), cache writes and reads
included: the API applies the batch discount and the cache multipliers together.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.errors import BadInput, DigestError

MILLION = 1_000_000
# What a Message Batch request costs, as a share of the same request made synchronously.
BATCH_DISCOUNT = 0.5


# A dated snapshot id: the alias, then the snapshot's date.
_DATED = re.compile(r"(?P<alias>.+)-\d{8}")


def alias_of(model: str) -> str:
    """The alias a dated model id is a snapshot of (``claude-haiku-5-5-20261001``), else itself."""
    dated = _DATED.fullmatch(model)
    return dated.group("alias") if dated else model


@dataclass(frozen=True)
class Price:
    """US dollars per million input, output, cache-write and cache-read tokens.

    A cache write costs 1.25x the input price and a read 0.1x, as the API bills its
    five-minute cache, unless the table gives them.
    """

    input: float
    output: float
    cache_write: float | None = None
    cache_read: float | None = None

    def of(
        self,
        input_tokens: float,
        output_tokens: float,
        cache_write: float,
        cache_read: float,
        *,
        batch: bool = False,
    ) -> float:
        """The dollars of these tokens; half of it in a batch."""
        write = self.input * 1.25 if self.cache_write is None else self.cache_write
        read = self.input * 0.1 if self.cache_read is None else self.cache_read
        per_million = (
            input_tokens * self.input
            + output_tokens * self.output
            + cache_write * write
            + cache_read * read
        )
        return per_million / MILLION * (BATCH_DISCOUNT if batch else 1.0)


# The two default models' list prices, and the offline summarizer's (free).
DEFAULT_PRICES: dict[str, Price] = {
    "claude-haiku-5-5": Price(1.0, 5.0),
    "claude-sonnet-5-5": Price(3.0, 15.0),
    "offline": Price(0.0, 0.0),
}


@dataclass(frozen=True)
class PriceTable:
    """Prices by model id: the defaults, overridden by a file, then by the environment."""

    prices: Mapping[str, Price] = field(default_factory=lambda: dict(DEFAULT_PRICES))

    def price(self, model: str) -> Price | None:
        """The model's price, a dated id's its alias's, or None when it has none."""
        return self.prices.get(model) or self.prices.get(alias_of(model))

    def cost(
        self,
        model: str,
        input_tokens: float,
        output_tokens: float,
        *,
        cache_write: float = 0,
        cache_read: float = 0,
        batch: bool = False,
    ) -> float | None:
        """One call's price in dollars (a batch request's, if ``batch``); None: no price."""
        price = self.price(model)
        if price is None:
            return None
        return price.of(input_tokens, output_tokens, cache_write, cache_read, batch=batch)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PriceTable:
        """The defaults, then ``DIGEST_PRICES_FILE`` (a JSON file), then ``DIGEST_PRICES`` (JSON).

        Both hold ``{"<model>": {"input": <usd per million>, "output": <usd per million>}}``,
        and optionally ``cache_write`` and ``cache_read`` (USD per million).

        Raises:
            BadInput: naming the variable and what is wrong.
        """
        env = os.environ if env is None else env
        prices = dict(DEFAULT_PRICES)
        path = env.get("DIGEST_PRICES_FILE")
        if path:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as exc:
                raise BadInput(
                    f"DIGEST_PRICES_FILE={path!r}: cannot read it ({exc.strerror})"
                ) from None
            prices |= _parse("DIGEST_PRICES_FILE", path, text)
        inline = env.get("DIGEST_PRICES")
        if inline:
            prices |= _parse("DIGEST_PRICES", inline, inline)
        return cls(prices)


_CACHE = ("cache_write", "cache_read")


def _is_price(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _parse(name: str, where: str, text: str) -> dict[str, Price]:
    example = '{"claude-haiku-5-5": {"input": 1.0, "output": 5.0}} (USD per million tokens)'
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{name}={where!r:.80}: not JSON ({exc}); use {example}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{name}={where!r:.80}: not a JSON object; use {example}")
    parsed: dict[str, Price] = {}
    for model, entry in data.items():
        ok = (
            isinstance(entry, dict)
            and all(_is_price(entry.get(k)) for k in ("input", "output"))
            and all(entry.get(k) is None or _is_price(entry[k]) for k in _CACHE)
        )
        if not ok:
            raise BadInput(
                f"{name}: the price of {model!r} is not {{input, output}} >= 0 (and optionally "
                f"cache_write, cache_read >= 0); use {example}"
            )
        cache = [None if entry.get(k) is None else float(entry[k]) for k in _CACHE]
        parsed[str(model)] = Price(float(entry["input"]), float(entry["output"]), *cache)
    return parsed


@dataclass(frozen=True)
class Usage:
    """Model calls, tokens and dollars, summed over step results.

    Attributes:
        offline: completions the offline summarizer made: no model call, not in ``calls``.
    """

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced: int = 0
    offline: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    batched: int = 0

    @property
    def tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    @property
    def cache_hit_ratio(self) -> float:
        """The share of prompt tokens read from the cache (0 when nothing was cached)."""
        prompt = self.input_tokens + self.cache_write_tokens + self.cache_read_tokens
        return self.cache_read_tokens / prompt if prompt else 0.0


# The model name the offline summarizer's completions carry (``tasks.llm.client``).
OFFLINE_MODEL = "offline"


def is_completion(result: Any) -> bool:
    """Whether a step result records a completion with its usage, offline ones included."""
    return isinstance(result, dict) and "input_tokens" in result and "output_tokens" in result


def is_call(result: Any) -> bool:
    """Whether a step result records a model call: a completion the model API made."""
    return is_completion(result) and result.get("model") != OFFLINE_MODEL


def usage_of(results: Iterable[Any]) -> Usage:
    """The usage recorded in these step results (anything not a model call is skipped)."""
    calls = input_tokens = output_tokens = unpriced = offline = written = read = batched = 0
    cost = 0.0
    for result in results:
        if is_completion(result) and not is_call(result):
            offline += 1
        if not is_call(result):
            continue
        calls += 1
        batched += bool(result.get("batch"))
        input_tokens += int(result["input_tokens"])
        output_tokens += int(result["output_tokens"])
        written += int(result.get("cache_creation_input_tokens") or 0)
        read += int(result.get("cache_read_input_tokens") or 0)
        if isinstance(result.get("cost_usd"), int | float):
            cost += float(result["cost_usd"])
        else:
            unpriced += 1
    return Usage(
        calls, input_tokens, output_tokens, cost, unpriced, offline, written, read, batched
    )


def dollars(amount: float) -> str:
    """A cost as people read it: ``$0.0123`` (one call costs fractions of a cent)."""
    return f"${amount:.4f}"


class BudgetExceeded(DigestError):
    """The run has spent its ``DIGEST_MAX_COST_USD``: it stops before its next model call."""

    def __init__(self, run: str, spent: float, budget: float, step: str) -> None:
        super().__init__(run, spent, budget, step)
        self.run = run
        self.spent = spent
        self.budget = budget
        self.step = step

    def __str__(self) -> str:
        run_id = self.run.partition(":")[2]
        return (
            f"run {self.run} has spent {dollars(self.spent)} of its {dollars(self.budget)} budget "
            f"(DIGEST_MAX_COST_USD) and stopped before {self.step}; nothing was sent: raise the "
            f"budget, then `digest retry {run_id}`"
        )


class UnpricedAnswer(DigestError):
    """A call was answered by a model the price table lacks, while a budget is set.

    Counting it as free would let the run spend past ``DIGEST_MAX_COST_USD`` unseen, so the
    run fails at once instead.
    """

    def __init__(self, run: str, requested: str, answered: str) -> None:
        super().__init__(run, requested, answered)
        self.run = run
        self.requested = requested
        self.answered = answered

    def __str__(self) -> str:
        run_id = self.run.partition(":")[2]
        return (
            f"run {self.run} asked for model {self.requested} and was answered by "
            f"{self.answered}, which has no price, so DIGEST_MAX_COST_USD cannot count it; add "
            f"its price to DIGEST_PRICES or DIGEST_PRICES_FILE, then `digest retry {run_id}`"
        )

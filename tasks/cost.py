"""What a run's model calls cost: tokens times a per-model price, journaled with each call.

The price of a call is computed when the call returns and recorded in its step's result
(``cost_usd``), beside the tokens. A run's spend is the sum over its journal: exact across
crashes and replays (a replayed step costs nothing in this attempt but its recorded cost still
counts), and unchanged by a later edit of the price table. A call whose model has no price is
recorded with ``cost_usd: null`` and counted as unpriced, never as free.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.errors import BadInput, DigestError

MILLION = 1_000_000


@dataclass(frozen=True)
class Price:
    """US dollars per million input and output tokens."""

    input: float
    output: float


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

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """The price of one call in dollars, or None when the model has no price."""
        price = self.prices.get(model)
        if price is None:
            return None
        return (input_tokens * price.input + output_tokens * price.output) / MILLION

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PriceTable:
        """The defaults, then ``DIGEST_PRICES_FILE`` (a JSON file), then ``DIGEST_PRICES`` (JSON).

        Both hold ``{"<model>": {"input": <usd per million>, "output": <usd per million>}}``.

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
        ok = isinstance(entry, dict) and all(
            isinstance(entry.get(k), int | float) and entry[k] >= 0 for k in ("input", "output")
        )
        if not ok:
            raise BadInput(
                f"{name}: the price of {model!r} is not {{input, output}} >= 0; use {example}"
            )
        parsed[str(model)] = Price(float(entry["input"]), float(entry["output"]))
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

    @property
    def tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens


# The model name the offline summarizer's completions carry (``tasks.model``).
OFFLINE_MODEL = "offline"


def is_completion(result: Any) -> bool:
    """Whether a step result records a completion with its usage, offline ones included."""
    return isinstance(result, dict) and "input_tokens" in result and "output_tokens" in result


def is_call(result: Any) -> bool:
    """Whether a step result records a model call: a completion the model API made."""
    return is_completion(result) and result.get("model") != OFFLINE_MODEL


def usage_of(results: Iterable[Any]) -> Usage:
    """The usage recorded in these step results (anything not a model call is skipped)."""
    calls = input_tokens = output_tokens = unpriced = offline = 0
    cost = 0.0
    for result in results:
        if is_completion(result) and not is_call(result):
            offline += 1
        if not is_call(result):
            continue
        calls += 1
        input_tokens += int(result["input_tokens"])
        output_tokens += int(result["output_tokens"])
        if isinstance(result.get("cost_usd"), int | float):
            cost += float(result["cost_usd"])
        else:
            unpriced += 1
    return Usage(calls, input_tokens, output_tokens, cost, unpriced, offline)


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

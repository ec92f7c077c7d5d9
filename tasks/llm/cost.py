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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tasks.errors import DigestError


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


@dataclass(eq=False)
class BudgetExceeded(DigestError):
    """The run has spent its ``DIGEST_MAX_COST_USD``: it stops before its next model call."""

    run: str
    spent: float
    budget: float
    step: str

    def __str__(self) -> str:
        run_id = self.run.partition(":")[2]
        return (
            f"run {self.run} has spent {dollars(self.spent)} of its {dollars(self.budget)} budget "
            f"(DIGEST_MAX_COST_USD) and stopped before {self.step}; nothing was sent: raise the "
            f"budget, then `digest retry {run_id}`"
        )


@dataclass(eq=False)
class UnpricedAnswer(DigestError):
    """A call was answered by a model the price table lacks, while a budget is set.

    Counting it as free would let the run spend past ``DIGEST_MAX_COST_USD`` unseen, so the
    run fails at once instead.
    """

    run: str
    requested: str
    answered: str

    def __str__(self) -> str:
        run_id = self.run.partition(":")[2]
        return (
            f"run {self.run} asked for model {self.requested} and was answered by "
            f"{self.answered}, which has no price, so DIGEST_MAX_COST_USD cannot count it; add "
            f"its price to DIGEST_PRICES or DIGEST_PRICES_FILE, then `digest retry {run_id}`"
        )

"""The price table (``DIGEST_PRICES``, ``DIGEST_PRICES_FILE``): dollars per million tokens.

A setting like any other, parsed once at start: the defaults for the two default models and
the offline summarizer, overridden by a file, then inline JSON. A dated model id
(``claude-haiku-5-5-20261001``) is priced as its alias; a Message Batch request at
``BATCH_DISCOUNT`` of the price, cache writes and reads included.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tasks.errors import BadInput

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

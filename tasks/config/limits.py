"""Model API rate limits the operator sets (``DIGEST_RATE_LIMITS``), over what the API says.

Parsed once at start like every setting; the shared limiter (``tasks.llm.ratelimit``) takes
them as buckets of that size, refilled each minute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from tasks.errors import BadInput

# The kinds an override may set, in the order the scripts take them.
OVERRIDE_KINDS = ("requests", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class Overrides:
    """Limits per minute the operator sets (``DIGEST_RATE_LIMITS``), over what the API says.

    A kind set here is a bucket of that size, refilled over a minute; the API's headers no
    longer change it. The others are still learned.
    """

    limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def of(self, model: str) -> tuple[int, int, int]:
        """Requests, input and output tokens per minute set for ``model`` (0: learned)."""
        given = self.limits.get(model, {})
        return (
            given.get("requests", 0),
            given.get("input_tokens", 0),
            given.get("output_tokens", 0),
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Overrides:
        """``DIGEST_RATE_LIMITS``: ``{"<model>": {"requests": 50, "input_tokens": 50000}}``.

        Raises:
            BadInput: one line naming the variable and what is wrong.
        """
        text = env.get("DIGEST_RATE_LIMITS")
        if not text:
            return cls()
        example = '{"claude-haiku-5-5": {"requests": 50, "input_tokens": 50000} (per minute)'
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BadInput(f"DIGEST_RATE_LIMITS: not JSON ({exc}); use {example}") from None
        ok = isinstance(data, dict) and all(
            isinstance(limits, dict)
            and all(
                kind in OVERRIDE_KINDS and isinstance(n, int) and not isinstance(n, bool) and n > 0
                for kind, n in limits.items()
            )
            for limits in data.values()
        )
        if not ok:
            raise BadInput(
                f"DIGEST_RATE_LIMITS: each model takes whole numbers > 0 of "
                f"{', '.join(OVERRIDE_KINDS)}; use {example}"
            )
        return cls({str(model): dict(limits) for model, limits in data.items()})

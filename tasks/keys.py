"""The one place the digest's own Redis keys are built.

They sit beside the journal's keys under the same prefix, so one prefix isolates a whole
deployment (or a test).
"""

from __future__ import annotations

from dataclasses import dataclass


def text(raw: bytes | str) -> str:
    """A value read back from Redis as text (clients may or may not decode responses)."""
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class DigestKeys:
    """Keys that outlive single runs: what earlier digests covered, and dispatch markers.

    Attributes:
        cluster: the store is a Redis Cluster: ``seen`` and ``claims``, written in one MULTI
            when a digest marks its items seen, share a hash tag so they share a slot. On one
            server they keep the names they have always had.
    """

    prefix: str = "journal"
    cluster: bool = False

    @property
    def _items(self) -> str:
        return f"{self.prefix}:{{digest}}" if self.cluster else f"{self.prefix}:digest"

    @property
    def seen(self) -> str:
        """Set: ids of items covered by earlier digests (updated as a set union)."""
        return f"{self._items}:seen"

    @property
    def claims(self) -> str:
        """Hash: item id -> the run (``digest:<run_id>``) that selected it and has not ended."""
        return f"{self._items}:claims"

    def dispatched(self, run_id: str) -> str:
        """String: set once when beat enqueues a weekly run, so restarts never enqueue twice."""
        return f"{self.prefix}:digest:dispatched:{run_id}"

    def model_limits(self, account: str, model: str) -> str:
        """Hash: the rate limits of one API key (``account``, a hash of it) and model.

        Its own hash tag, so the limiter's script runs on a Redis Cluster: every process on the
        key shares it, whatever run it serves.
        """
        if "{" in model or "}" in model:
            raise ValueError(f"model id {model!r} must not contain braces")
        return f"{self.prefix}:{{model-api:{account}:{model}}}:limits"

    @property
    def dispatch_watermark(self) -> str:
        """String: the latest weekly run id beat has dispatched, for catching up after outages."""
        return f"{self.prefix}:digest:dispatch-watermark"
